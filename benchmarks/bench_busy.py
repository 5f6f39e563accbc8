"""Training steps alone and beside a process that keeps one core busy, with the automatic thread choice.

Usage::

    python benchmarks/bench_busy.py [--steps 40] [--warmup 3] [--threads auto|N]
        [--config avsr/conf/train/avsr_synthgrid_cpu.yaml] [--json out.json]

Runs the default recipe's training step -- the model of ``--config`` (the SynthGRID recipe's
``avsr_synthgrid_cpu.yaml``: its encoder, decoder, phone CTC head and video trust gate, its ``precision`` and
``video_precision``) with its fused AdamW, gradient clipping and autocast as the trainer runs them -- on
synthetic batches shaped like the recipe's: ``batch_frames`` 400 padded frames (utterances of 50-80 frames,
2-3 s, as many as fit), 104-dim stacked filterbanks, 88x88 video, 120 BPE tokens and 41 phone classes;
each batch audio-only or audio-visual as the config's modality dropout draws them (80% audio-only), 30% of
the audio-visual rows with untrusted video. The same seeded sequence of batches runs in two fresh processes:

* ``quiet``: alone;
* ``busy``: beside a Python busy loop in another process (one core kept busy), started 1 s before.

Each process starts as ``avsr train`` does by default: ``import avsr.bin`` before torch (OpenMP wait
policy, :func:`avsr.threads.prepare_openmp`), then the thread choice (:func:`avsr.threads.apply_threads`,
``--threads``: auto). An ``OMP_NUM_THREADS`` or ``OMP_WAIT_POLICY`` in the environment is kept, as the tools
keep it (the script says so). Prints, per run, the choice (threads, wait policy, reason), the median wall
time of a step (all steps, and per batch kind) after ``--warmup`` untimed steps, and as its last line
``busy/quiet X.XX``: the ratio of the two medians (1.00: the busy core costs nothing; 2 threads on 2 cores
without the choice gave 3-14 s against 0.24 s per step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_CONFIG = REPO / "avsr" / "conf" / "train" / "avsr_synthgrid_cpu.yaml"
VOCAB, PHONES = 120, 41  # the recipe's BPE vocabulary (run.sh --vocab-size 120) and phone classes + blank
BUSY_LOOP = "while True:\n    pass\n"


def worker(args: argparse.Namespace) -> dict:
    """One run in this (fresh) process: the thread choice as ``avsr train`` makes it, then the steps."""
    import avsr.bin  # noqa: F401  -- as every tool: the OpenMP wait policy, before torch loads
    from avsr.threads import apply_threads

    choice = apply_threads(args.threads, source="--threads")  # before the model is built, as avsr train

    import dataclasses
    import random

    import torch

    from avsr.encoder import EncoderRuntime
    from avsr.models.asr import AVSRModel
    from avsr.nn.precision import autocast_context, flush_denormal, machine_summary
    from avsr.train.config import load_experiment_config
    from avsr.train.trainer import make_adamw

    experiment = load_experiment_config(args.config)
    cfg, config = experiment.train, experiment.model
    if cfg.flush_denormal:
        flush_denormal(True)
    torch.manual_seed(cfg.seed)
    config = dataclasses.replace(config, vocab_size=VOCAB)
    if config.model_conf.phone_ctc_weight > 0:
        config = dataclasses.replace(config, model_conf=dataclasses.replace(config.model_conf,
                                                                            phone_vocab_size=PHONES))
    device = torch.device("cpu")
    # the encoder as the trainer's: its settings, and the batches below carry the drawn modalities
    runtime = EncoderRuntime(checkpoint_activations=cfg.checkpoint_activations,
                             video_precision=cfg.resolved_video_precision(device),
                             modality_dropout_by_loader=True)
    model = AVSRModel.from_config(config, str(args.config), runtime=runtime).train()
    precision = cfg.resolved_precision(device)
    optimizer = make_adamw(model.parameters(), cfg)
    enc = config.encoder_conf
    rng, g = random.Random(cfg.seed), torch.Generator().manual_seed(cfg.seed)

    def batch() -> tuple[str, dict]:
        t = rng.randint(50, 80)
        b = min(cfg.max_batch_size, cfg.batch_frames // t)
        kind = "audiovisual"
        if rng.random() < enc.modality_dropout:
            kind = "video" if rng.random() < enc.audio_dropout else "audio"
        lengths = torch.tensor([t] + [rng.randint(max(20, t - 10), t) for _ in range(b - 1)])
        ys_lens = torch.tensor([rng.randint(10, 20) for _ in range(b)])
        ph_lens = torch.tensor([rng.randint(15, 25) for _ in range(b)])
        ys = torch.randint(1, VOCAB - 1, (b, 20), generator=g)
        ph = torch.randint(1, PHONES, (b, 25), generator=g)
        return kind, dict(
            audio=torch.randn(b, 104, t, generator=g) if kind != "video" else None,
            video=torch.randn(b, 1, t, 88, 88, generator=g) if kind != "audio" else None,
            lengths=lengths,
            ys_pad=ys.masked_fill(torch.arange(20)[None] >= ys_lens[:, None], -1), ys_lens=ys_lens,
            phones_pad=ph.masked_fill(torch.arange(25)[None] >= ph_lens[:, None], -1)
            if config.model_conf.phone_ctc_weight > 0 else None,
            phones_lens=ph_lens if config.model_conf.phone_ctc_weight > 0 else None,
            video_trusted=(torch.rand(b, generator=g) >= cfg.untrusted_video_prob).float()
            if kind == "audiovisual" else None)

    times: list[float] = []
    kinds: list[str] = []
    for i in range(args.warmup + args.steps):
        kind, inputs = batch()
        start = time.perf_counter()
        with autocast_context(device, precision):
            loss, _ = model(**inputs)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
            kinds.append(kind)
    return {"machine": machine_summary(device), "threads": choice.threads, "wait_policy": choice.wait_policy,
            "usable": choice.usable, "load": round(choice.load, 2), "reason": choice.reason,
            "torch_threads": torch.get_num_threads(), "step_s": times, "kinds": kinds}


def run(args: argparse.Namespace, busy: bool) -> dict:
    """A worker process (beside a busy loop when ``busy``); its figures."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--config", str(args.config), "--threads", args.threads_text]
    loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        if loop is not None:
            time.sleep(1.0)  # running, so that the worker's start-up sample sees it
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return json.loads(out.strip().splitlines()[-1])


def median_ms(values: list[float]) -> float:
    """The median in milliseconds (nan for none)."""
    return statistics.median(values) * 1e3 if values else float("nan")


def main() -> None:
    """Run the benchmark and print the figures (the last line: ``busy/quiet X.XX``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="timed training steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", dest="threads_text", default="auto",
                   help="as avsr train --threads: auto (default: the automatic choice) or a count")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="training YAML (its model and settings)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    from avsr.threads import parse_threads  # no torch: the parent stays light

    args.threads = parse_threads(args.threads_text)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    kept = {k: os.environ[k] for k in names if k in os.environ}
    if kept:
        print(f"note: the environment sets {kept}; the automatic choice keeps it")
    results = {}
    for name in ("quiet", "busy"):
        r = results[name] = run(args, busy=name == "busy")
        if name == "quiet":
            print(r["machine"])
        by_kind = {k: [t for t, kk in zip(r["step_s"], r["kinds"]) if kk == k]
                   for k in sorted(set(r["kinds"]))}
        per_kind = "  ".join(f"{k} {median_ms(v):.0f} ms ({len(v)})" for k, v in by_kind.items())
        print(f"{name:5s}: {r['threads']} thread(s) (torch {r['torch_threads']}), OpenMP wait policy "
              f"{r['wait_policy']}, load {r['load']:.1f} of {r['usable']:g} usable cores: {r['reason']}")
        print(f"       median step {median_ms(r['step_s']):.0f} ms over {len(r['step_s'])} steps; {per_kind}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    ratio = statistics.median(results["busy"]["step_s"]) / statistics.median(results["quiet"]["step_s"])
    print(f"busy/quiet {ratio:.2f}")


if __name__ == "__main__":
    main()
