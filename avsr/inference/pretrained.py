"""What a trained model brings to inference: its weights and tokenizer, and the facts its trainer recorded.

A model is an experiment directory (its ``average_nbest`` ``epoch<N>.pt`` with the best validation accuracy
averaged, as ESPnet's ``valid.acc.ave``; tokenizer: its ``bpe.model``), an avsr checkpoint (tokenizer: the
``bpe.model`` beside it) or an official fairseq AV-HuBERT fine-tuned checkpoint (:mod:`avsr.compat`).
The trainer records ``data_stats`` in the checkpoint: the longest training utterance (``max_frames``), the
silent edges of the training audio (``edge_frames``) and whether the model heard 8 kHz audio
(``narrowband_prob``). The checkpoint's decode section (``decode_defaults`` of its model configuration, from
the training YAML's) gives the options a model decodes with unless told otherwise
(:func:`checkpoint_decode_defaults`); the model itself holds none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from avsr.checkpoint import average_state_dicts, best_checkpoints, load_checkpoint
from avsr.compat import FairseqTokenizer, read_checkpoint, tokenizer_for
from avsr.config import UsageError
from avsr.data.tokenizer import Tokenizer
from avsr.decode.config import ViewWeights, default_view_weights
from avsr.inference.segments import DEFAULT_SEGMENT_S, EdgeRanges, stats_edges
from avsr.inference.types import FPS, PathLike
from avsr.models.asr import AVSRModel
from avsr.models.config import AVSRModelConfig, ModelConfig
from avsr.threads import apply_threads

__all__ = ["ModelDefaults", "Pretrained", "checkpoint_decode_defaults", "inference_device", "load_pretrained",
           "model_defaults", "model_edge_frames", "model_view_weights"]

#: the original AV-HuBERT's decoding of its seq2seq models (``avhubert/conf/s2s_decode.yaml``): fairseq's beam
#: search, beam 50, ``max_len_a`` 1.0, ``max_len_b`` 0, ``lenpen`` 1.0.
AVHUBERT_S2S = {"search": "fairseq", "ctc_weight": 0.0, "beam_size": 50, "max_len_a": 1.0, "max_len_b": 0,
                "lenpen": 1.0}

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


def checkpoint_decode_defaults(model_config: ModelConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    """A checkpoint's decode section: the decoding options its model decodes with unless told otherwise.

    What the model's parts require comes first -- ``ctc_weight`` 1.0 for a CTC-only model (no decoder), 0.0
    for an attention-only one, and for an attention-only model with fairseq ids (an official AV-HuBERT
    seq2seq model, converted or not) the original's decoding, :data:`AVHUBERT_S2S` -- then the configuration's
    ``decode_defaults`` (from the training YAML, e.g. the SynthGRID recipe's tuned view weights) over them.

    Args:
        model_config: the checkpoint's ``model_config`` (:class:`avsr.models.config.ModelConfig` or its
            mapping; ``model_conf`` left out: its defaults), or None (an encoder checkpoint: ``{}``).

    Raises:
        avsr.config.ConfigError: a model configuration that does not parse (key named).
    """
    if model_config is None:
        return {}
    config = ModelConfig.from_mapping(model_config, "checkpoint model_config")
    conf = config.model_conf or AVSRModelConfig()
    if conf.ctc_weight >= 1:
        base: dict[str, Any] = {"ctc_weight": 1.0}
    elif conf.ctc_weight > 0:
        base = {}
    elif conf.token_convention == "fairseq":
        base = dict(AVHUBERT_S2S)
    else:
        base = {"ctc_weight": 0.0}
    return {**base, **dict(config.decode_defaults or {})}


class Pretrained(NamedTuple):
    """A trained model as :func:`load_pretrained` reads it."""

    #: the ASR model, in eval mode
    model: AVSRModel
    #: its tokenizer
    tokenizer: Tokenizer | FairseqTokenizer
    #: what its trainer recorded about the training data (``{}`` when nothing)
    data_stats: dict[str, Any]
    #: the checkpoint's decode section (:func:`checkpoint_decode_defaults`)
    decode_defaults: dict[str, Any]

    @property
    def train_max_s(self) -> float | None:
        """The longest training utterance in seconds, when the trainer recorded it (``max_frames``)."""
        frames = self.data_stats.get("max_frames")
        return frames / FPS if frames else None

    @property
    def edge_frames(self) -> EdgeRanges | None:
        """The first to third quartile of the silent edges of the training audio (:func:`model_edge_frames`),
        or None."""
        return stats_edges(self.data_stats)

    @property
    def narrowband_trained(self) -> bool:
        """Whether the model was trained with the 8 kHz channel (``narrowband_prob`` > 0)."""
        return bool(self.data_stats.get("narrowband_prob"))

    def settings(self, max_segment_s: float | str | None = None, edge_frames: Any = "model"
                 ) -> dict[str, Any]:
        """The :class:`avsr.inference.Transcriber` settings that this model brings: ``train_max_s``,
        ``narrowband_trained``, ``decode_defaults``, and ``max_segment_s`` / ``edge_frames`` as given or, for
        ``"model"``, the model's: the longest training utterance (else
        :data:`avsr.inference.segments.DEFAULT_SEGMENT_S`, 15 s) and :attr:`edge_frames` (logged; None when
        not recorded: inputs as given).

        Raises:
            ValueError: another string than ``"model"``.
        """
        for name, value in (("max_segment_s", max_segment_s), ("edge_frames", edge_frames)):
            if isinstance(value, str) and value != "model":
                raise ValueError(f"{name} must be 'model', None or "
                                 f"{'seconds' if name == 'max_segment_s' else '(start, end)'}, got {value!r}")
        if edge_frames == "model":
            edge_frames = self.edge_frames
            if edge_frames is not None:
                logger.info("inputs get the silent edges of the training audio: %d-%d frames (40 ms) before "
                            "the speech, %d-%d after", *edge_frames[0], *edge_frames[1])
        if max_segment_s == "model":
            max_segment_s = self.train_max_s or DEFAULT_SEGMENT_S
        return {"max_segment_s": max_segment_s, "edge_frames": edge_frames, "train_max_s": self.train_max_s,
                "narrowband_trained": self.narrowband_trained, "decode_defaults": self.decode_defaults}


def load_pretrained(source: PathLike, bpemodel: PathLike | None = None, average_nbest: int = 5) -> Pretrained:
    """The model, its tokenizer, its trainer's ``data_stats`` and its decode section, as :class:`Pretrained`.

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
        return Pretrained(model.eval(), tokenizer, first.get("data_stats") or {},
                          checkpoint_decode_defaults(first["model_config"]))
    if source.is_file():
        loaded = read_checkpoint(source)
        logger.info("model: %s (%s)", source, loaded.kind)
        if bpemodel is None and loaded.kind == "avsr" and (source.parent / "bpe.model").is_file():
            bpemodel = source.parent / "bpe.model"
        model = AVSRModel.from_checkpoint(loaded, bpemodel=bpemodel)
        return Pretrained(model, tokenizer_for(model, loaded, bpemodel), loaded.data_stats,
                          checkpoint_decode_defaults(model.config))
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
    """The view weights that a search config leaving them None gives this model: its checkpoint's decode
    section's (:func:`checkpoint_decode_defaults`, :class:`avsr.decode.searcher.Searcher`), else 0, read
    without building the model. ``source`` as :func:`load_pretrained`.

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
    #: the checkpoint's decode section (:func:`checkpoint_decode_defaults`)
    decode_defaults: dict[str, Any]


def model_defaults(source: PathLike, average_nbest: int = 5) -> ModelDefaults:
    """:func:`model_edge_frames`, :func:`model_view_weights` and the decode section they come from,
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
    decode_defaults = checkpoint_decode_defaults(config)
    return ModelDefaults(stats_edges(stats), default_view_weights(decode_defaults), decode_defaults)
