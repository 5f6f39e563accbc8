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
For several GPUs run it under ``torchrun --nproc_per_node N``.

Fine-tuning: ``--init-encoder CKPT`` starts the encoder from the encoder of a pretraining (or any avsr)
checkpoint. Pretraining (masked multimodal cluster prediction, ``AVHubertPretrainModel``): a YAML with a
``pretrain_conf`` mapping (``conf/pretrain/*.yaml``), ``--labels`` naming the cluster label files (one per
label set, ``<name>.km`` with its ``.km.json``) found in both data dirs, and no ``--bpemodel``.

Usage: ``python -m avsr.bin.train --config conf/train/x.yaml --train-data data/train --valid-data data/valid
--bpemodel data/token_list/bpe.model --exp-dir exp/x [--train-noise noise.wav] [--ngpu 1]
[--init-encoder exp/pretrain/epoch10.pt] [--precision auto|fp32|bf16] [--video-precision auto|fp32|bf16]
[--compile true|false] [--checkpoint-activations true|false]`` (the last four override the YAML's speed
settings);
``python -m avsr.bin.train --config conf/pretrain/x.yaml --train-data data/train --valid-data data/valid
--labels iter1.km --exp-dir exp/pretrain_iter1``
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import shutil
import sys
from pathlib import Path

import torch
import yaml

from avsr.bin.runner import UsageError, tool
from avsr.config import ConfigError, parse_yaml
from avsr.data.datadir import read_datadir
from avsr.data.dataset import AVDataset, LabelSet
from avsr.data.tokenizer import Tokenizer
from avsr.fileio import remove_stale_tmp, write_text_atomic
from avsr.nn.precision import PRECISIONS, flush_denormal
from avsr.train.trainer import Trainer, build_audio_augment, build_noise, load_train_config

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


def load_label_sets(data_dir: Path, names: list[str]) -> list[LabelSet]:
    """The cluster label files ``data_dir/<name>`` (``.km``, with ``<name>.json`` metadata) as label sets.

    Raises:
        FileNotFoundError: a label file or its metadata is missing (named).
        ValueError: a malformed line (file and line named, by :func:`avsr.clustering.read_labels`).
    """
    from avsr.clustering import read_label_meta, read_labels

    sets = []
    for name in names:
        path = data_dir / name
        meta = read_label_meta(path)
        rate, k = float(meta["label_rate"]), int(meta["num_classes"])
        sets.append(LabelSet(str(path), read_labels(path), rate, k))
    return sets


def init_encoder(model: torch.nn.Module, path: Path) -> None:
    """Copy the encoder weights of a checkpoint into ``model.encoder`` (fine-tuning a pretrained encoder).

    Accepts avsr checkpoints (pretraining or ASR models, an encoder written by ``avsr-convert``) and official
    fairseq AV-HuBERT checkpoints (``av_hubert`` pretraining, fine-tuned ones), read safely and mapped by
    :func:`avsr.compat.read_checkpoint`.

    Raises:
        ConfigError: not a checkpoint with an AV-HuBERT encoder, or weights that do not fit this model's
            encoder (missing/unexpected keys or shapes named; e.g. another ``encoder_embed_dim``).
    """
    from avsr.compat import CheckpointError, load_state_strict, read_checkpoint

    try:
        enc = read_checkpoint(path).encoder_state
        load_state_strict(model.encoder, enc, str(path), "encoder of this model")
    except (CheckpointError, FileNotFoundError) as e:  # the messages name the file
        raise ConfigError(f"--init-encoder: {e}") from e
    logger.info("encoder initialised from %s (%d tensors)", path, len(enc))


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


#: Settings a resumed run may change without --allow-config-change: a longer schedule, and the speed
#: settings, which change no result beyond float rounding.
FREE_ON_RESUME = frozenset({"max_epoch", "precision", "video_precision", "compile", "checkpoint_activations",
                            "cache_limit_mb", "flush_denormal"})


def keep_promise(exp_dir: Path, resolved: dict, allow_change: bool) -> None:
    """Refuse to resume an experiment trained with other settings (see the module docstring).

    Raises:
        UsageError: ``exp_dir`` holds checkpoints and a ``config.yaml`` that differs from ``resolved`` (the
            differing keys named), and ``allow_change`` is False.
    """
    path = exp_dir / "config.yaml"
    trained = (exp_dir / "checkpoint.pt").is_file() or any(exp_dir.glob("epoch*.pt"))
    if not (path.is_file() and trained):
        return
    old = _flatten(parse_yaml(path.read_text(encoding="utf-8"), str(path)) or {})
    new = _flatten(yaml.safe_load(yaml.safe_dump(resolved)))  # as it would be written
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    free = [k for k in differ if k in FREE_ON_RESUME]
    if free:  # written to config.yaml by the caller, the change logged here
        logger.info("resuming %s with %s", exp_dir,
                    ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in free))
        differ = [k for k in differ if k not in FREE_ON_RESUME]
    if not differ:
        return
    changes = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ)
    if not allow_change:
        raise UsageError(f"{exp_dir} holds checkpoints trained with other settings ({changes}); train into "
                         "another --exp-dir, or pass --allow-config-change to resume with the new settings")
    n = 1
    while (exp_dir / f"config.{n}.yaml").exists():
        n += 1
    shutil.copyfile(path, exp_dir / f"config.{n}.yaml")
    with open(exp_dir / "config_changes.log", "a", encoding="utf-8") as log:
        log.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} resumed with {changes} "
                  f"(previous config: config.{n}.yaml)\n")
    logger.warning("resuming %s with changed settings: %s (previous config kept as config.%d.yaml)", exp_dir,
                   changes, n)


@tool("avsr-train")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    from avsr.models.asr import AVSRModel

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--train-data", required=True, type=Path)
    p.add_argument("--valid-data", required=True, type=Path)
    p.add_argument("--bpemodel", type=Path, help="sentencepiece model (ASR training)")
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
    args = p.parse_args(argv)
    setup_logging(args.exp_dir / "train.log")

    cfg, model_part = load_train_config(args.config)
    if args.max_epoch is not None:
        cfg.max_epoch = args.max_epoch
    if args.precision is not None:
        cfg.precision = args.precision
    if args.video_precision is not None:
        cfg.video_precision = args.video_precision
    if args.compile is not None:
        cfg.compile = args.compile == "true"
    if args.checkpoint_activations is not None:
        cfg.checkpoint_activations = args.checkpoint_activations == "true"
    if cfg.flush_denormal:  # before any parallel op: the intra-op threads inherit the flag when created
        flush_denormal(True)
    torch.manual_seed(cfg.seed)
    pretrain = "pretrain_conf" in model_part
    tokenizer = train_labels = valid_labels = None
    if pretrain:
        from avsr.models.pretrain import AVHubertPretrainModel

        if not args.labels:
            raise ConfigError(f"{args.config} has pretrain_conf (pretraining) but no --labels were given")
        train_labels = load_label_sets(args.train_data, args.labels)
        valid_labels = load_label_sets(args.valid_data, args.labels)
        num_classes = [s.num_classes for s in train_labels]
        rates = {s.label_rate for s in train_labels}
        if len(rates) != 1:
            raise ConfigError(f"--labels {args.labels}: label sets differ in label rate {sorted(rates)}")
        ignored = [k for k in ("decoder_conf", "model_conf") if k in model_part]
        if ignored:
            logger.info("pretraining: %s of %s not used", ignored, args.config)
        model_part = {k: v for k, v in model_part.items() if k not in ignored}
        # the label rate is the labels' own (100 Hz MFCC clusters, 25 Hz layer clusters)
        model_part["pretrain_conf"] = {**model_part["pretrain_conf"], "label_rate": rates.pop()}
        model_config = {**model_part, "num_classes": num_classes}
        model = AVHubertPretrainModel.from_config(model_config)
        logger.info("pretraining: label sets %s, classes %s", args.labels, num_classes)
    else:
        if args.bpemodel is None:
            raise ConfigError(f"{args.config} is an ASR training config: --bpemodel is required")
        tokenizer = Tokenizer(args.bpemodel)
        model_config = {"vocab_size": tokenizer.vocab_size, **model_part}
        model = AVSRModel.from_config(model_config)
    if args.init_encoder is not None:
        init_encoder(model, args.init_encoder)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("model: %.2fM parameters", n_params / 1e6)

    args.exp_dir.mkdir(parents=True, exist_ok=True)
    for path in remove_stale_tmp(args.exp_dir):
        logger.info("removed %s, left by an interrupted write", path)
    resolved = {**dataclasses.asdict(cfg), **model_config}
    resolved["betas"] = list(resolved["betas"])
    keep_promise(args.exp_dir, resolved, args.allow_config_change)
    if tokenizer is not None:
        shutil.copyfile(args.bpemodel, args.exp_dir / "bpe.model")
    write_text_atomic(args.exp_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))

    train_utts = read_datadir(args.train_data, require_text=not pretrain)
    valid_utts = read_datadir(args.valid_data, require_text=not pretrain)
    if tokenizer is not None:  # every training target must be tokens the model can learn: no <unk>
        tokenizer.check_texts({u.utt_id: u.text for u in train_utts}, str(args.train_data / "text"))
        unknown = tokenizer.check_texts({u.utt_id: u.text for u in valid_utts}, str(args.valid_data / "text"),
                                        strict=False)
        if unknown:  # validation text may hold characters the training text lacks: <unk> in its loss
            logger.warning("%s", unknown)
    train_set = AVDataset(
        train_utts,
        tokenizer,
        train=True,
        noise=build_noise(args.train_noise, cfg),
        seed=cfg.seed,
        label_sets=train_labels or (),
        audio_augment=build_audio_augment(cfg),
        cache_limit_mb=cfg.cache_limit_mb,
    )
    valid_set = AVDataset(valid_utts, tokenizer, train=False,
                          label_sets=valid_labels or (), cache_limit_mb=cfg.cache_limit_mb)
    for name, dataset in (("--train-data", train_set), ("--valid-data", valid_set)):
        longest = max(range(len(dataset)), key=dataset.num_frames, default=None)
        if longest is not None and dataset.num_frames(longest) > cfg.batch_frames:
            raise ConfigError(
                f"{args.config}: batch_frames is {cfg.batch_frames}, but utterance "
                f"'{dataset.utts[longest].utt_id}' of {name} has {dataset.num_frames(longest)} frames; raise "
                "batch_frames or leave the utterance out of the data dir")
    device = "cuda" if args.ngpu > 0 else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    trainer = Trainer(model, model_config, train_set, valid_set, cfg, args.exp_dir, device=device)
    trainer.resume()
    trainer.run()


if __name__ == "__main__":
    sys.exit(main())
