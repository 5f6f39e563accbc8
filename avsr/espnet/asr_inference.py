"""ESPnet's ASR decoder (``espnet2.bin.asr_inference``) with avsr's encoder registered, and ``--modality``.

Usage: as ESPnet's tool, plus ``--modality audiovisual|audio|video`` (the encoder's input; default: the
trained configuration's, ``audiovisual``)::

    python -m avsr.espnet.asr_inference --modality audio --asr_train_config exp/asr/config.yaml \\
        --asr_model_file exp/asr/valid.acc.ave.pth \\
        --data_path_and_name_and_type dump/test/feats.scp,speech,npy \\
        --key_file dump/test/feats.scp --output_dir exp/asr/decode/test/audio/clean --beam_size 10 \\
        --ctc_weight 0.3 --batch_size 1

``--modality`` writes a copy of the training configuration with ``encoder_conf.modality`` set, next to the
outputs (``OUTPUT_DIR/asr_config_<modality>.yaml``), and decodes with it; nothing else of ESPnet's tool
changes. The hypotheses are in ``OUTPUT_DIR/1best_recog/text``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from avsr.espnet import register
from avsr.modalities import MODALITIES


def with_modality(cmd: list[str]) -> list[str]:
    """``cmd`` without ``--modality M``, its ``--asr_train_config`` replaced by a copy with
    ``encoder_conf.modality: M`` written into ``--output_dir`` (``cmd`` unchanged without ``--modality``).

    Raises:
        SystemExit: an unknown modality, or ``--modality`` without ``--asr_train_config`` and
            ``--output_dir`` (argparse's message).
    """
    p = argparse.ArgumentParser(prog="python -m avsr.espnet.asr_inference", add_help=False)
    p.add_argument("--modality", choices=MODALITIES, default=None)
    p.add_argument("--asr_train_config", default=None)
    p.add_argument("--output_dir", default=None)
    known, _ = p.parse_known_args(cmd)
    if known.modality is None:
        return cmd
    if known.asr_train_config is None or known.output_dir is None:
        p.error("--modality needs --asr_train_config and --output_dir")
    with open(known.asr_train_config, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config.setdefault("encoder_conf", {})["modality"] = known.modality
    out = Path(known.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"asr_config_{known.modality}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    rest, skip = [], False
    for i, arg in enumerate(cmd):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--modality", "--asr_train_config"):
            skip = "=" not in arg and i + 1 < len(cmd)
            continue
        rest.append(arg)
    return [*rest, "--asr_train_config", str(path)]


def main(cmd: list[str] | None = None) -> None:
    """Register the encoder, then run ``espnet2.bin.asr_inference.main`` (see the module docstring).

    Raises:
        ImportError: ESPnet is not installed (``bash scripts/install_espnet.sh``).
    """
    register()
    from espnet2.bin.asr_inference import main as espnet_main

    espnet_main(with_modality(list(sys.argv[1:] if cmd is None else cmd)))


if __name__ == "__main__":
    main()
