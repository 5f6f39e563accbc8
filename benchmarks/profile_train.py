"""Where a training step's time goes: real batches of a data dir through the trainer, phase by phase.

Usage (from a recipe directory after its data stages, e.g. ``recipes/synthgrid/avsr1``)::

    python ../../../benchmarks/profile_train.py --config conf/train/avsr_synthgrid_cpu.yaml \\
        --train-data data/train --bpemodel data/token_list/bpe.model \\
        --train-noise corpus/noise/babble_train.wav --phone-lexicon corpus/lexicon.txt \\
        [--threads 2] [--steps 150] [--skip 80] [--set precision=bf16 ...] [--ops 25] [--json out.json]

Builds the model, datasets and :class:`avsr.train.trainer.Trainer` exactly as ``avsr.bin.train`` does, then
runs ``--skip`` untimed steps (the first epoch also decodes and caches the media) and ``--steps`` timed ones
with the trainer's own batching, modality dropout, augmentation, forward (``Trainer._forward``, so the
precision setting applies), backward, gradient clipping and AdamW step. Prints, per phase (data: loading
and feature computation of the next batch; forward; backward; optimizer: clipping, step, scheduler,
zero_grad) and per batch kind (audio-only, video-only, audio-visual), the mean wall-clock and CPU
milliseconds per step, the wall time of the untimed steps (with ``--set compile=true``: compilation),
and with ``--ops N`` the N operators with the most CPU time (torch.profiler, over the timed steps; profiling
slows the steps down). ``--set key=value`` overrides training-YAML keys (YAML values). With one thread the
CPU time is the figure that other jobs on the machine disturb least.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avsr.config import ConfigError  # noqa: E402
from avsr.data.datadir import read_datadir  # noqa: E402
from avsr.data.dataset import AVDataset  # noqa: E402
from avsr.nn.precision import flush_denormal, machine_summary  # noqa: E402
from avsr.train.config import load_experiment_config  # noqa: E402
from avsr.train.experiment import ExperimentOptions, build_model, encoder_runtime  # noqa: E402
from avsr.train.trainer import Trainer, build_audio_augment, build_noise  # noqa: E402

PHASES = ("data", "forward", "backward", "optimizer")


def batch_kind(batch: dict) -> str:
    """``audio``, ``video`` or ``audiovisual``: the modalities a batch carries."""
    has_a, has_v = batch.get("audio") is not None, batch.get("video") is not None
    return "audiovisual" if has_a and has_v else "audio" if has_a else "video"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--train-data", required=True, type=Path)
    p.add_argument("--bpemodel", required=True, type=Path)
    p.add_argument("--train-noise", default=None)
    p.add_argument("--phone-lexicon", type=Path, default=None,
                   help="Kaldi lexicon.txt (the recipe's corpus/lexicon.txt): the phone targets of a config "
                        "with model_conf.phone_ctc_weight > 0, as avsr.bin.train --phone-lexicon")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--steps", type=int, default=150, help="timed steps")
    p.add_argument("--skip", type=int, default=80, help="untimed steps first (media decoding, warm-up)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override training-YAML keys")
    p.add_argument("--ops", type=int, default=0, help="print the N operators with most CPU time")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    print(machine_summary(getattr(args, "device", "cpu")), flush=True)  # where the figures come from
    if args.threads:
        torch.set_num_threads(args.threads)
    experiment = load_experiment_config(args.config)
    cfg = experiment.train
    for item in args.set:
        key, value = item.split("=", 1)
        if not hasattr(cfg, key):
            raise SystemExit(f"--set: the training config has no key {key!r}")
        cfg = dataclasses.replace(cfg, **{key: yaml.safe_load(value)})
    if cfg.flush_denormal:  # as avsr-train: before the first parallel op, so that every thread has it
        flush_denormal(True)
    torch.manual_seed(cfg.seed)
    opts = ExperimentOptions(config=args.config, train_data=args.train_data, valid_data=args.train_data,
                             exp_dir=Path("/tmp"), bpemodel=args.bpemodel, phone_lexicon=args.phone_lexicon)
    try:  # the model, tokenizer and phone lexicon as avsr.bin.train builds them (on the CPU)
        setup = build_model(opts, experiment.model, runtime=encoder_runtime(cfg, experiment.model, "cpu"))
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    model = setup.model
    config = model.config.to_dict()
    train_set = AVDataset(read_datadir(args.train_data), setup.tokenizer, train=True,
                          noise=build_noise(args.train_noise, cfg), seed=cfg.seed,
                          audio_augment=build_audio_augment(cfg), phone_lexicon=setup.phone_lexicon)
    trainer = Trainer(model, config, train_set, train_set, cfg, Path("/tmp") / f"profile_train_{os.getpid()}")
    trainer.model.train()

    def batches():
        for epoch in range(10**6):
            trainer.sampler.set_epoch(epoch)
            trainer.train_set.set_epoch(epoch)
            yield from trainer.loader

    it = batches()
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, list[float]] = defaultdict(list)
    prof = None
    start = time.perf_counter()
    warmup_s = 0.0
    for i in range(args.skip + args.steps):
        if i == args.skip:
            warmup_s = time.perf_counter() - start
        if i == args.skip and args.ops:
            prof = torch.profiler.profile()
            prof.__enter__()
        marks = [(time.perf_counter(), time.process_time())]
        batch = trainer._to(next(it))
        marks.append((time.perf_counter(), time.process_time()))
        loss, _ = trainer._forward(batch, trainer.ddp)
        marks.append((time.perf_counter(), time.process_time()))
        loss.backward()
        marks.append((time.perf_counter(), time.process_time()))
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), cfg.grad_clip)
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        marks.append((time.perf_counter(), time.process_time()))
        if i < args.skip:
            continue
        for name, (a, b) in zip(PHASES, zip(marks, marks[1:])):
            wall[name].append(b[0] - a[0])
            cpu[name].append(b[1] - a[1])
        kinds[batch_kind(batch)].append(marks[-1][0] - marks[0][0])
    if prof is not None:
        prof.__exit__(None, None, None)
    n = args.steps
    out = {
        "threads": torch.get_num_threads(), "steps": n, "settings": args.set, "load_avg": os.getloadavg()[0],
        "skipped_steps_wall_s": round(warmup_s, 1),
        "wall_ms": {k: round(sum(wall[k]) / n * 1e3, 1) for k in PHASES},
        "cpu_ms": {k: round(sum(cpu[k]) / n * 1e3, 1) for k in PHASES},
        "kinds": {k: {"batches": len(v), "wall_ms": round(sum(v) / len(v) * 1e3, 1)}
                  for k, v in sorted(kinds.items())},
    }
    out["wall_ms"]["step"] = round(sum(out["wall_ms"][k] for k in PHASES), 1)
    out["cpu_ms"]["step"] = round(sum(out["cpu_ms"][k] for k in PHASES), 1)
    print(f"{n} steps, {out['threads']} threads, load average {out['load_avg']:.2f}, settings {args.set}; "
          f"the {args.skip} untimed steps took {warmup_s:.1f} s (with compile: the compilations)")
    for unit in ("wall_ms", "cpu_ms"):
        print(f"  {unit:8s} " + "  ".join(f"{k} {v:7.1f}" for k, v in out[unit].items()))
    for k, v in out["kinds"].items():
        print(f"  {k:12s} {v['batches']:4d} batches  {v['wall_ms']:7.1f} ms/step (wall)")
    if prof is not None:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops,
                                        max_name_column_width=60))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
