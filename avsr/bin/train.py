"""Train a hybrid CTC/attention audio-visual speech recogniser (``AVSRModel``).

Reads a training YAML (``conf/train/*.yaml``: loop settings at the top level plus ``encoder_conf``,
``decoder_conf``, ``model_conf``), Kaldi data dirs and a sentencepiece model, and writes into ``--exp-dir``:
``config.yaml`` (the resolved configuration), ``bpe.model`` (a copy), ``train.log``, ``train_log.jsonl``
(one line per epoch), ``epoch<N>.pt`` and ``checkpoint.pt``. Re-running the same command resumes from
``checkpoint.pt``. For several GPUs run it under ``torchrun --nproc_per_node N``.

Usage: ``python -m avsr.bin.train --config conf/train/x.yaml --train-data data/train --valid-data data/valid
--bpemodel data/token_list/bpe.model --exp-dir exp/x [--train-noise noise.wav] [--ngpu 1]``
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
from pathlib import Path

import torch
import yaml

from avsr.data.datadir import read_datadir
from avsr.data.dataset import AVDataset
from avsr.data.tokenizer import Tokenizer
from avsr.train.trainer import Trainer, build_noise, load_train_config

logger = logging.getLogger("avsr.train")


def setup_logging(path: Path | None = None) -> None:
    """Log INFO to stderr and, when given, to ``path`` (appending)."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    from avsr.models.asr import AVSRModel

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--train-data", required=True, type=Path)
    p.add_argument("--valid-data", required=True, type=Path)
    p.add_argument("--bpemodel", required=True, type=Path)
    p.add_argument("--exp-dir", required=True, type=Path)
    p.add_argument("--train-noise", default=None, help="noise wav for training-time augmentation")
    p.add_argument("--ngpu", type=int, default=0, help="0: CPU; >=1: CUDA (several through torchrun)")
    p.add_argument("--max-epoch", type=int, default=None, help="override max_epoch of the config")
    args = p.parse_args(argv)
    setup_logging(args.exp_dir / "train.log")

    cfg, model_part = load_train_config(args.config)
    if args.max_epoch is not None:
        cfg.max_epoch = args.max_epoch
    torch.manual_seed(cfg.seed)
    tokenizer = Tokenizer(args.bpemodel)
    model_config = {"vocab_size": tokenizer.vocab_size, **model_part}
    model = AVSRModel.from_config(model_config)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("model: %.2fM parameters, vocabulary %d", n_params / 1e6, tokenizer.vocab_size)

    args.exp_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.bpemodel, args.exp_dir / "bpe.model")
    resolved = {**dataclasses.asdict(cfg), **model_part, "vocab_size": tokenizer.vocab_size}
    resolved["betas"] = list(resolved["betas"])
    (args.exp_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")

    train_set = AVDataset(
        read_datadir(args.train_data),
        tokenizer,
        train=True,
        noise=build_noise(args.train_noise, cfg),
        seed=cfg.seed,
    )
    valid_set = AVDataset(read_datadir(args.valid_data), tokenizer, train=False)
    device = "cuda" if args.ngpu > 0 else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    trainer = Trainer(model, model_config, train_set, valid_set, cfg, args.exp_dir, device=device)
    trainer.resume()
    trainer.run()


if __name__ == "__main__":
    main()
