"""Conversion of an official AV-HuBERT checkpoint (fairseq) into avsr's own checkpoint and YAML configuration
(what ``avsr-convert`` runs; :mod:`avsr.bin.convert` describes the files).

A pretraining checkpoint (``av_hubert``) becomes an ``AVHubertEncoder`` state dict with
``{"encoder_conf": ...}`` as its ``model_config``; a fine-tuned one (``av_hubert_seq2seq``,
``av_hubert_ctc``) or an avsr one an ``AVSRModel``'s. The reading and key mapping are :mod:`avsr.compat`'s,
which imports no model module; this module builds the models, so it lives with them.

Licence: the official checkpoints (and the sentencepiece models published with them) are Meta's, under the
AV-HuBERT License Agreement (non-commercial research use only), not under avsr's Apache-2.0 licence; a
converted checkpoint is the same weights under the same terms. The agreement:
https://github.com/facebookresearch/av_hubert/blob/main/LICENSE
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

__all__ = ["convert"]

logger = logging.getLogger("avsr.convert")


def convert(src: str | Path, dst: str | Path, config_out: str | Path | None = None, dictionary: Any = None,
            bpemodel: str | Path | None = None, bpemodel_out: str | Path | None = None) -> dict[str, Any]:
    """Convert ``src`` into avsr's checkpoint ``dst`` and YAML ``config_out`` (default: ``dst``, ``.yaml``).

    Args:
        src: the checkpoint to convert.
        dst: the avsr checkpoint to write (atomically).
        config_out: the YAML configuration to write.
        dictionary, bpemodel: token symbols of a fine-tuned model (see
            :meth:`avsr.models.asr.AVSRModel.from_checkpoint`).
        bpemodel_out: where to write the sentencepiece model pickled in ``src`` (error if it has none).

    Returns:
        The written ``model_config``.

    Raises:
        FileNotFoundError, avsr.compat.CheckpointError: as :func:`avsr.compat.read_checkpoint`; a
            ``bpemodel_out`` request for a file without a pickled sentencepiece model.
    """
    from avsr import __version__
    from avsr.checkpoint import save_atomic
    from avsr.compat import CheckpointError, read_checkpoint
    from avsr.config import to_dict
    from avsr.encoder import AVHubertEncoder
    from avsr.fileio import write_text_atomic
    from avsr.models.asr import AVSRModel

    loaded = read_checkpoint(src)
    if loaded.model_config is None:
        module = AVHubertEncoder.from_checkpoint(loaded)
        model_config: dict[str, Any] = {"encoder_conf": to_dict(module.config)}
    else:
        module = AVSRModel.from_checkpoint(loaded, dictionary=dictionary, bpemodel=bpemodel)
        model_config = module.model_config
    dst = Path(dst)
    origin = {"path": str(src), "kind": loaded.kind, "ignored_keys": loaded.ignored}
    save_atomic({"model": module.state_dict(), "model_config": model_config, "converted_from": origin,
                 "avsr_version": __version__}, dst)
    config_out = Path(config_out) if config_out is not None else dst.with_suffix(".yaml")
    config_out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(config_out, f"# converted by avsr-convert from {src} ({loaded.kind})\n"
                      + yaml.safe_dump(model_config, sort_keys=False, allow_unicode=True))
    if bpemodel_out is not None:
        if loaded.sentencepiece is None:
            raise CheckpointError(f"{src}: no sentencepiece model is pickled in this checkpoint")
        Path(bpemodel_out).parent.mkdir(parents=True, exist_ok=True)
        Path(bpemodel_out).write_bytes(loaded.sentencepiece)
    logger.info("%s (%s) -> %s, %s; not converted: %s", src, loaded.kind, dst, config_out,
                ", ".join(loaded.ignored) or "nothing")
    return model_config
