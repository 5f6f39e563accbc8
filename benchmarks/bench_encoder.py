"""Throughput of AVHubertEncoder on CPU: forward (inference) and forward+backward (training step).

Usage::

    python benchmarks/bench_encoder.py [--config conf/model/avhubert_base.yaml] [--batch 2] [--frames 50]
        [--modality av|audio|video] [--iters 3] [--threads N] [--set key=value ...]

Prints the median (and best) time per batch, frames/s (25 frames = 1 s of speech), the real-time factor
(compute time / speech duration) and the process's peak resident memory (``ru_maxrss``, so the
forward+backward figure includes the forward phase). Inputs are random: audio ``(B, 104, T)``, video
``(B, 1, T, 88, 88)``. The default run (BASE, 2 x 50 frames, 1 warm-up + 3 timed calls per phase) takes
about 15 s on 2 idle CPU cores; other jobs on the machine make timings noisy (hence median and best).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avsr.encoder import AVHubertEncoder  # noqa: E402

FPS = 25.0


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def parse_overrides(items: list[str]) -> dict:
    """``["dropout=0.0", "resnet_widths=[8,8,16,16]"]`` -> dict, values parsed as YAML scalars/lists."""
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def make_inputs(args: argparse.Namespace) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, t = args.batch, args.frames
    audio = torch.randn(b, 104, t, generator=g) if args.modality in ("av", "audio") else None
    video = torch.randn(b, 1, t, args.hw, args.hw, generator=g) if args.modality in ("av", "video") else None
    return {"audio": audio, "video": video}, torch.full((b,), t, dtype=torch.long)


def timed(fn, warmup: int, iters: int) -> tuple[float, float]:
    """(median, min) seconds per call of ``fn`` over ``iters`` calls after ``warmup`` untimed calls.

    The median and the minimum are both printed because a shared machine makes single timings noisy.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def report(name: str, sec: tuple[float, float], frames: int) -> None:
    """Print one timing line: ms/batch, frames/s and real-time factor from the median (and the best)."""
    med, best = sec
    print(f"{name}: median {med * 1e3:.0f} ms/batch (best {best * 1e3:.0f})  {frames / med:.0f} frames/s "
          f"(best {frames / best:.0f})  RTF {med / (frames / FPS):.3f}  peak RSS {peak_rss_mib():.0f} MiB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "conf/model/avhubert_base.yaml"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--frames", type=int, default=50, help="frames per utterance (25 fps)")
    parser.add_argument("--hw", type=int, default=88, help="video frame height = width")
    parser.add_argument("--modality", choices=("av", "audio", "video"), default="av")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--no-backward", action="store_true", help="time the forward pass only")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config options")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    enc = AVHubertEncoder.from_yaml(args.config, **parse_overrides(args.set))
    n_params = sum(p.numel() for p in enc.parameters())
    xs, ilens = make_inputs(args)
    frames = args.batch * args.frames
    print(f"config {args.config}  params {n_params / 1e6:.1f}M  batch {args.batch} x {args.frames} frames "
          f"({args.frames / FPS:.1f} s)  modality {args.modality}  video {args.hw}x{args.hw}  "
          f"threads {torch.get_num_threads()}  torch {torch.__version__}")
    print(f"after build: peak RSS {peak_rss_mib():.0f} MiB")

    enc.eval()

    def forward() -> None:
        with torch.inference_mode():
            enc(xs, ilens)

    report("forward (eval, inference_mode)", timed(forward, args.warmup, args.iters), frames)

    if not args.no_backward:
        enc.train()

        def step() -> None:
            enc.zero_grad(set_to_none=True)
            hidden, _, _ = enc(xs, ilens)
            hidden.float().pow(2).mean().backward()

        report("forward+backward (train)", timed(step, args.warmup, args.iters), frames)


if __name__ == "__main__":
    main()
