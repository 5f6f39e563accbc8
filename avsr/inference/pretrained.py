"""What a trained model brings to inference: its weights and tokenizer, and the facts its trainer recorded.

A model is an experiment directory (its ``average_nbest`` ``epoch<N>.pt`` with the best validation accuracy
averaged, as ESPnet's ``valid.acc.ave``; tokenizer: its ``bpe.model``), an avsr checkpoint (tokenizer: the
``bpe.model`` beside it) or an official fairseq AV-HuBERT fine-tuned checkpoint (:mod:`avsr.compat`).
The trainer records ``data_stats`` in the checkpoint: the longest training utterance (``max_frames``), the
silent edges of the training audio (``edge_frames``) and whether the model heard 8 kHz audio
(``narrowband_prob``); the model configuration may give the decoding's view weights (``decode_defaults``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

from avsr.checkpoint import average_state_dicts, best_checkpoints, load_checkpoint
from avsr.compat import FairseqTokenizer, read_checkpoint, tokenizer_for
from avsr.config import UsageError
from avsr.data.tokenizer import Tokenizer
from avsr.decode.config import ViewWeights, default_view_weights
from avsr.inference.segments import EdgeRanges, stats_edges
from avsr.inference.types import PathLike
from avsr.models.asr import AVSRModel
from avsr.threads import apply_threads

__all__ = ["ModelDefaults", "inference_device", "load_pretrained", "model_defaults", "model_edge_frames",
           "model_view_weights"]

logger = logging.getLogger("avsr.inference")


def inference_device(name: str, num_threads: int | None = 1, source: str = "num_threads") -> torch.device:
    """The device to decode on: ``"cpu"`` (with ``num_threads`` intra-op threads: the beam search's small
    tensor ops run fastest on 1; None: as many as the machine has free, :func:`avsr.threads.apply_threads`,
    which also logs the choice) or ``"cuda"``.

    Args:
        name: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        num_threads: CPU intra-op threads, or None to choose them (``OMP_NUM_THREADS`` wins then).
        source: what gave ``num_threads``, for the log line (e.g. ``"--num-threads"``).

    Raises:
        UsageError: ``"cuda"`` where CUDA is not available.
        ValueError: ``num_threads`` < 1.
    """
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r}: CUDA is not available here")
    if device.type == "cpu":
        apply_threads(num_threads, source=source)
    return device


def load_pretrained(source: PathLike, bpemodel: PathLike | None = None, average_nbest: int = 5
                    ) -> tuple[AVSRModel, Tokenizer | FairseqTokenizer, dict[str, Any]]:
    """The model, its tokenizer and its trainer's ``data_stats`` (``{}`` when not recorded).

    Args:
        source: an experiment directory, an avsr checkpoint or an official fine-tuned AV-HuBERT checkpoint
            (see the module docstring).
        bpemodel: the sentencepiece model (default: the experiment directory's or the one beside an avsr
            checkpoint; official checkpoints: else the one pickled in the checkpoint).
        average_nbest: checkpoints averaged from an experiment directory.

    Raises:
        FileNotFoundError: no such directory/file, no checkpoint in the directory, no tokenizer.
        avsr.compat.CheckpointError: an unreadable or foreign checkpoint, weights that do not fit.
    """
    source = Path(source)
    if source.is_dir():
        paths = best_checkpoints(source, average_nbest)
        logger.info("model: average of %s", ", ".join(p.name for p in paths))
        first = load_checkpoint(paths[0])
        model = AVSRModel.from_config(first["model_config"], str(paths[0]))
        model.load_state_dict(average_state_dicts(paths) if len(paths) > 1 else first["model"])
        tokenizer = Tokenizer(bpemodel if bpemodel is not None else source / "bpe.model")
        return model, tokenizer, first.get("data_stats") or {}
    if source.is_file():
        loaded = read_checkpoint(source)
        logger.info("model: %s (%s)", source, loaded.kind)
        if bpemodel is None and loaded.kind == "avsr" and (source.parent / "bpe.model").is_file():
            bpemodel = source.parent / "bpe.model"
        model = AVSRModel.from_checkpoint(loaded, bpemodel=bpemodel)
        return model, tokenizer_for(model, loaded, bpemodel), loaded.data_stats
    raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")


def model_edge_frames(source: PathLike, average_nbest: int = 5) -> EdgeRanges | None:
    """The silent edges of a model's training audio as its trainer recorded them
    (``data_stats["edge_frames"]``: the first to third quartile of the silent frames at the start and at the
    end), or None (not recorded: official checkpoints, avsr checkpoints whose trainer did not record them,
    video-only training). ``source`` as :func:`load_pretrained`.

    Raises:
        FileNotFoundError: no such directory/file or no checkpoint in it;
        avsr.compat.CheckpointError: an unreadable checkpoint file.
    """
    return model_defaults(source, average_nbest).edge_frames


def model_view_weights(source: PathLike, average_nbest: int = 5) -> ViewWeights:
    """The view weights that a search config leaving them None gives this model: its ``decode_defaults``
    (:class:`avsr.decode.searcher.Searcher`), else 0, read from the checkpoint's model configuration without
    building the model. ``source`` as :func:`load_pretrained`.

    Raises:
        FileNotFoundError: as :func:`model_edge_frames`.
        avsr.compat.CheckpointError: as :func:`model_edge_frames`.
    """
    return model_defaults(source, average_nbest).view_weights


class ModelDefaults(NamedTuple):
    """What a model's checkpoint says about how to decode it (:func:`model_defaults`)."""

    #: :func:`model_edge_frames`
    edge_frames: EdgeRanges | None
    #: :func:`model_view_weights`
    view_weights: ViewWeights
    #: the model configuration's ``decode_defaults`` (``{}`` when none)
    decode_defaults: dict[str, Any]


def model_defaults(source: PathLike, average_nbest: int = 5) -> ModelDefaults:
    """:func:`model_edge_frames`, :func:`model_view_weights` and the ``decode_defaults`` they come from,
    from one read of the checkpoint (the first of an experiment directory's best, or the file).

    Raises:
        FileNotFoundError: as :func:`model_edge_frames`.
        avsr.compat.CheckpointError: as :func:`model_edge_frames`.
    """
    source = Path(source)
    if source.is_dir():
        first = load_checkpoint(best_checkpoints(source, average_nbest)[0])
        stats, config = first.get("data_stats") or {}, first.get("model_config")
    elif source.is_file():
        loaded = read_checkpoint(source)
        stats, config = loaded.data_stats or {}, loaded.model_config
    else:
        raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")
    decode_defaults = dict((config or {}).get("decode_defaults") or {})
    return ModelDefaults(stats_edges(stats), default_view_weights(decode_defaults), decode_defaults)
