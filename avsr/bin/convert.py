"""Convert an official AV-HuBERT checkpoint (fairseq) into avsr's own checkpoint and YAML configuration.

In: a fairseq ``av_hubert`` (pretraining), ``av_hubert_seq2seq`` or ``av_hubert_ctc`` checkpoint (or an avsr
one, which is rewritten). Out:

* ``OUT.pt``: ``{"model": state_dict, "model_config": ..., "converted_from": {...}}`` -- the format the
  trainer writes, so ``AVSRModel.from_pretrained``, ``python -m avsr.bin.decode --checkpoint`` and
  fine-tuning read it; for a pretraining checkpoint the state dict is the encoder's and ``model_config`` is
  ``{"encoder_conf": ...}`` (read by ``AVHubertEncoder.from_pretrained``);
* ``OUT.yaml`` (or ``--config``): ``model_config`` as YAML (``vocab_size``, ``encoder_conf``,
  ``decoder_conf``, ``model_conf``, ``token_list``; or ``encoder_conf`` alone), usable as a model
  configuration;
* with ``--write-bpemodel PATH``: the sentencepiece model pickled inside a fine-tuned checkpoint, if any.

Usage: ``avsr-convert large_vox_433h.pt exp/avhubert/model.pt [--bpemodel spm1000/spm_unigram1000.model]``
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from avsr.bin.runner import tool

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
    from avsr.compat import CheckpointError, read_checkpoint
    from avsr.config import to_dict
    from avsr.encoder import AVHubertEncoder
    from avsr.fileio import write_text_atomic
    from avsr.models.asr import AVSRModel
    from avsr.train.checkpoint import save_atomic

    loaded = read_checkpoint(src)
    if loaded.model_config is None:
        module = AVHubertEncoder.from_checkpoint(loaded)
        model_config: dict[str, Any] = {"encoder_conf": to_dict(module.config)}
    else:
        module = AVSRModel.from_checkpoint(loaded, dictionary=dictionary, bpemodel=bpemodel)
        model_config = module.model_config
    dst = Path(dst)
    origin = {"path": str(src), "kind": loaded.kind, "ignored_keys": loaded.ignored}
    save_atomic({"model": module.state_dict(), "model_config": model_config, "converted_from": origin}, dst)
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


@tool("avsr-convert")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="official AV-HuBERT checkpoint (or an avsr one)")
    p.add_argument("output", type=Path, help="avsr checkpoint to write")
    p.add_argument("--config", type=Path, default=None,
                   help="YAML configuration to write (default: OUTPUT.yaml)")
    p.add_argument("--dict", type=Path, default=None, help="fairseq dict.txt of the target tokens")
    p.add_argument("--bpemodel", type=Path, default=None,
                   help="sentencepiece model the dictionary is built from, when the checkpoint pickles none")
    p.add_argument("--write-bpemodel", type=Path, default=None,
                   help="write the sentencepiece model pickled in the checkpoint here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    convert(args.checkpoint, args.output, args.config, args.dict, args.bpemodel, args.write_bpemodel)
    print(args.output)


if __name__ == "__main__":
    sys.exit(main())
