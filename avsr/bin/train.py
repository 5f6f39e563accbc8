"""Train a hybrid CTC/attention audio-visual speech recogniser (``AVSRModel``), or pretrain AV-HuBERT.

Reads a training YAML (``conf/train/*.yaml``: loop settings at the top level plus ``encoder_conf``,
``decoder_conf``, ``model_conf``), Kaldi data dirs and a sentencepiece model, and writes into ``--exp-dir``:
``config.yaml`` (the resolved configuration), ``bpe.model`` (a copy), ``train.log``, ``train_log.jsonl``
(one line per epoch), ``epoch<N>.pt`` and ``checkpoint.pt``. Re-running the same command resumes from
``checkpoint.pt`` -- with the same settings: resuming into an experiment whose ``config.yaml`` differs from
the new settings (and that holds checkpoints) is refused with the differing keys named, unless
``--allow-config-change`` is given; then the change is logged, appended to ``config_changes.log`` and the old
configuration kept as ``config.<N>.yaml``. A longer schedule (``max_epoch``) and the speed settings
(``precision``, ``video_precision``, ``compile``, ``checkpoint_activations``, ``cache_limit_mb``,
``flush_denormal``) may change on resume without the flag (logged). ``flush_denormal`` (default true) is
applied before the model is built, so that every intra-op thread treats subnormal floats as zero
(:func:`avsr.nn.precision.flush_denormal`).
Temporary files of interrupted writes are removed at the start.
For several GPUs run it under ``torchrun --nproc_per_node N``. See :mod:`avsr.train.experiment`.

Fine-tuning: ``--init-encoder CKPT`` starts the encoder from the encoder of a pretraining (or any avsr)
checkpoint. Pretraining (masked multimodal cluster prediction, ``AVHubertPretrainModel``): a YAML with a
``pretrain_conf`` mapping (``conf/pretrain/*.yaml``), ``--labels`` naming the cluster label files (one per
label set, ``<name>.km`` with its ``.km.json``) found in both data dirs, and no ``--bpemodel``.

Usage: ``python -m avsr.bin.train --config conf/train/x.yaml --train-data data/train --valid-data data/valid
--bpemodel data/token_list/bpe.model --exp-dir exp/x [--train-noise noise.wav] [--ngpu 1]
[--init-encoder exp/pretrain/epoch10.pt] [--precision auto|fp32|bf16] [--video-precision auto|fp32|bf16]
[--compile true|false] [--checkpoint-activations true|false] [--threads N|auto]`` (the four before
``--threads`` override the YAML's speed settings; ``--threads``, default auto, is the CPU's intra-op threads,
:mod:`avsr.threads`);
``python -m avsr.bin.train --config conf/pretrain/x.yaml --train-data data/train --valid-data data/valid
--labels iter1.km --exp-dir exp/pretrain_iter1``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.nn.precision import PRECISIONS
from avsr.threads import apply_threads, parse_threads
from avsr.train.experiment import ExperimentOptions, setup_experiment


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (its destinations are the fields of :class:`ExperimentOptions`)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--train-data", required=True, type=Path)
    p.add_argument("--valid-data", required=True, type=Path)
    p.add_argument("--bpemodel", type=Path, help="sentencepiece model (ASR training)")
    p.add_argument("--phone-lexicon", type=Path, default=None,
                   help="Kaldi lexicon.txt: phone targets of a model with model_conf.phone_ctc_weight > 0")
    p.add_argument("--labels", nargs="+", default=None,
                   help="pretraining: cluster label files (names inside each data dir), one per label set")
    p.add_argument("--init-encoder", type=Path, default=None,
                   help="fine-tuning: start the encoder from this checkpoint's encoder")
    p.add_argument("--exp-dir", required=True, type=Path)
    p.add_argument("--train-noise", default=None, help="noise wav for training-time augmentation")
    p.add_argument("--ngpu", type=int, default=0, help="0: CPU; >=1: CUDA (several through torchrun)")
    p.add_argument("--max-epoch", type=int, default=None, help="override max_epoch of the config")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume an experiment with settings other than its config.yaml (logged, old kept)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="override precision of the config (auto: bf16 where the device computes it "
                        "natively, else fp32; bf16: bfloat16 autocast, see avsr.nn.precision)")
    p.add_argument("--video-precision", choices=PRECISIONS, default=None,
                   help="override video_precision of the config (the video front-end's ResNet alone)")
    p.add_argument("--compile", choices=("true", "false"), default=None,
                   help="override compile of the config (torch.compile of the model's heavy parts)")
    p.add_argument("--checkpoint-activations", choices=("true", "false"), default=None,
                   help="override checkpoint_activations of the config (recompute layers in backward)")
    p.add_argument("--threads", type=parse_threads, default=None, metavar="N|auto",
                   help="CPU intra-op threads (default auto: OMP_NUM_THREADS if set, else the cores other "
                        "work leaves free when training starts; avsr.threads); not a training setting")
    return p


@tool("avsr-train")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.exp_dir / "train.log")
    threads = args.threads
    del args.threads  # a property of the machine, not of the experiment (not in config.yaml)
    apply_threads(threads, source="--threads")  # before the model is built
    for flag in ("compile", "checkpoint_activations"):
        if getattr(args, flag) is not None:
            setattr(args, flag, getattr(args, flag) == "true")
    trainer = setup_experiment(ExperimentOptions(**vars(args)))
    trainer.resume()
    trainer.run()


if __name__ == "__main__":
    sys.exit(main())
