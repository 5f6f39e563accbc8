"""Throughput of the batched joint CTC/attention beam search on CPU, for a tiny random model.

Usage::

    python benchmarks/bench_decode.py [--batch 8] [--beam 10] [--frames 75] [--tokens 15] [--vocab 500]
        [--layers 2] [--dim 128] [--modes att joint-partial joint-full ctc] [--iters 2] [--threads N]
        [--device cpu|cuda] [--json PATH]

The encoder is not run: its output is random ``(B, T, dim)`` (the beam search is what is measured); the
decoder (``--layers`` x ``--dim``) and the CTC head are random. A random model rarely emits ``eos``, so the
hypothesis length is fixed with ``--tokens`` (``maxlenratio = -tokens``: every hypothesis runs
``tokens + 1`` steps), which makes runs comparable. Prints, per mode, utterances/s, decoder steps/s, the
real-time factor (search time / speech duration at 25 frames/s) and peak resident memory.
``--device cuda``: the decoder, encoder output and CTC posteriors on the GPU (timings between
``torch.cuda.synchronize()`` calls; the peak GPU memory of the search, ``torch.cuda.max_memory_allocated``,
is printed too). ``--json PATH``: one JSON line per mode appended to PATH (keys ``mode, ctc_weight,
ms_per_batch, utt_per_s, steps_per_s, rtf, peak_rss_mib, peak_cuda_mib`` and the settings).
Modes: ``att`` (ctc_weight 0), ``joint-partial`` (0.3, CTC on the pre-beam), ``joint-full`` (0.3, CTC on the
whole vocabulary), ``ctc`` (ctc_weight 1, CTC prefix search alone).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from avsr.decode import DecodeConfig, batch_beam_search  # noqa: E402
from avsr.nn.decoder import TransformerDecoder  # noqa: E402
from avsr.nn.precision import machine_summary  # noqa: E402

FPS = 25.0
MODES = {
    "att": (0.0, "partial"),
    "joint-partial": (0.3, "partial"),
    "joint-full": (0.3, "full"),
    "ctc": (1.0, "full"),
}


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="utterances per batch")
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--frames", type=int, default=75, help="encoder frames per utterance (25 fps)")
    p.add_argument("--tokens", type=int, default=15, help="hypothesis length (maxlenratio = -tokens)")
    p.add_argument("--vocab", type=int, default=500)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", default=None, help="append one JSON line per mode to this file")
    args = p.parse_args(argv)
    print(machine_summary(args.device), flush=True)  # where the figures come from
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    dec = (
        TransformerDecoder(
            args.vocab,
            args.dim,
            dict(
                decoder_layers=args.layers,
                decoder_embed_dim=args.dim,
                decoder_ffn_embed_dim=4 * args.dim,
                decoder_attention_heads=4,
            ),
        )
        .to(device)
        .eval()
    )
    ctc_lo = torch.nn.Linear(args.dim, args.vocab).to(device)
    b, t = args.batch, args.frames
    memory = torch.randn(b, t, args.dim, device=device)
    lens = torch.full((b,), t, dtype=torch.long, device=device)
    with torch.inference_mode():
        ctc_logp = torch.log_softmax(ctc_lo(memory), -1)
    speech_s = b * t / FPS
    print(
        f"batch {b} x {t} frames ({t / FPS:.1f} s)  beam {args.beam}  tokens {args.tokens}  "
        f"vocab {args.vocab}  "
        f"decoder {args.layers}x{args.dim}  threads {torch.get_num_threads()}  device {device}  "
        f"torch {torch.__version__}"
    )
    for mode in args.modes:
        w, scoring = MODES[mode]
        cfg = DecodeConfig(beam_size=args.beam, ctc_weight=w, ctc_scoring=scoring, maxlenratio=-args.tokens)

        def run(cfg: DecodeConfig = cfg, w: float = w) -> list:
            with torch.inference_mode():
                return batch_beam_search(
                    memory,
                    lens,
                    cfg,
                    decoder=dec if w < 1 else None,
                    ctc_logp=ctc_logp if w > 0 else None,
                    sos=args.vocab - 1,
                    eos=args.vocab - 1,
                )

        run()  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(args.iters):
            hyps = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        sec = (time.perf_counter() - start) / args.iters
        steps = max(len(h[0].tokens) for h in hyps if h) + 1
        cuda_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        print(
            f"{mode:<14} ctc_weight {w:<4} {sec * 1e3:8.1f} ms/batch  {b / sec:8.1f} utt/s  "
            f"{steps / sec:7.1f} steps/s  RTF {sec / speech_s:.4f}  peak RSS {peak_rss_mib():.0f} MiB"
            + (f"  peak GPU {cuda_mib:.0f} MiB" if cuda_mib is not None else "")
        )
        if args.json:
            row = {"mode": mode, "ctc_weight": w, "ms_per_batch": round(sec * 1e3, 3), "utt_per_s": b / sec,
                   "steps_per_s": steps / sec, "rtf": sec / speech_s,
                   "peak_rss_mib": round(peak_rss_mib(), 1),
                   "peak_cuda_mib": round(cuda_mib, 1) if cuda_mib is not None else None,
                   "device": str(device), "machine": machine_summary(device), "batch": b, "beam": args.beam,
                   "frames": t, "tokens": args.tokens, "vocab": args.vocab, "layers": args.layers,
                   "dim": args.dim, "iters": args.iters, "threads": torch.get_num_threads(),
                   "torch": torch.__version__}
            with open(args.json, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
