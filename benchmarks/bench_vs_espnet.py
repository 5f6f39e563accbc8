"""avsr's batched beam search against ESPnet's own, on the same model: hypothesis agreement and speed.

Run in the ESPnet environment (``bash scripts/install_espnet.sh``)::

    .venv-espnet/bin/python benchmarks/bench_vs_espnet.py [--utts 64] [--beam 10] [--threads 1 2]
        [--scoring partial full] [--vocab 122] [--dim 192] [--layers 2] [--frames 75]

The model is a random ``avsr`` transformer decoder (the SynthGRID CPU size by default: 2 layers, D=192,
122 tokens) and a CTC head over synthetic encoder outputs whose CTC posteriors follow a random label path
(:func:`avsr.espnet.scorers.peaky_utterances`), so that hypotheses end on their own as a trained model's do.
ESPnet decodes with ``BatchBeamSearch`` -- what ``Speech2Text`` runs -- over the same decoder and CTC
log-probabilities (:func:`avsr.espnet.scorers.espnet_beam_search`: ``decoder``, ``ctc``, ``length_bonus``
scorers, ``pre_beam_score_key: full``), one utterance at a time, as ``Speech2Text`` does. avsr decodes one
utterance at a time and all utterances in one batch, with ``pre_beam: espnet`` (ESPnet-exact) and with its
default ``pre_beam: avsr``. Joint CTC/attention, ``ctc_weight`` 0.3, ``maxlenratio`` 0 (end detection).

Prints, per setting (CTC scoring x threads): the number of utterances whose best hypothesis equals ESPnet's,
for each avsr mode, and the times (utterances/s) with the speed ratio ESPnet time / avsr time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from avsr.decode import DecodeConfig, batch_beam_search  # noqa: E402
from avsr.espnet.scorers import espnet_beam_search, peaky_utterances  # noqa: E402
from avsr.nn.decoder import TransformerDecoder  # noqa: E402
from avsr.nn.precision import machine_summary  # noqa: E402


def espnet_tokens(search: Any, mem: torch.Tensor, lens: torch.Tensor, eos: int) -> list[list[int]]:
    """ESPnet's best hypothesis per utterance (token ids without sos/eos), one utterance at a time."""
    out = []
    with torch.no_grad():
        for i in range(mem.size(0)):
            y = search(x=mem[i, : lens[i]], maxlenratio=0.0, minlenratio=0.0)[0].yseq[1:].tolist()
            while y and y[-1] == eos:
                y.pop()
            out.append(y)
    return out


def avsr_tokens(mem: torch.Tensor, lens: torch.Tensor, cfg: DecodeConfig, dec: TransformerDecoder,
                logp: torch.Tensor, eos: int, batched: bool) -> list[list[int]]:
    """avsr's best hypothesis per utterance, all at once (``batched``) or one at a time."""
    if batched:
        hyps = batch_beam_search(mem, lens, cfg, decoder=dec, ctc_logp=logp, sos=eos, eos=eos)
        return [h[0].tokens if h else [] for h in hyps]
    out = []
    for i in range(mem.size(0)):
        n = int(lens[i])
        h = batch_beam_search(
            mem[i : i + 1, :n],
            lens[i : i + 1],
            cfg,
            decoder=dec,
            ctc_logp=logp[i : i + 1, :n],
            sos=eos,
            eos=eos,
        )[0]
        out.append(h[0].tokens if h else [])
    return out


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), wall seconds)``."""
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utts", type=int, default=64)
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--ctc-weight", type=float, default=0.3)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--scoring", nargs="+", default=["partial", "full"], choices=["partial", "full"])
    p.add_argument("--vocab", type=int, default=122)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--frames", type=int, default=75, help="longest utterance, 25 Hz encoder frames")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(machine_summary(getattr(args, "device", "cpu")), flush=True)  # where the figures come from
    v, d, eos = args.vocab, args.dim, args.vocab - 1
    torch.manual_seed(args.seed)
    dec = TransformerDecoder(
        v,
        d,
        dict(
            decoder_layers=args.layers,
            decoder_embed_dim=d,
            decoder_ffn_embed_dim=4 * d,
            decoder_attention_heads=4,
        ),
    ).eval()
    mem, lens, ctc_lo = peaky_utterances(args.utts, args.frames, d, v, seed=args.seed)
    with torch.no_grad():
        logp = torch.log_softmax(ctc_lo(mem).float(), -1)
    print(
        f"{args.utts} utterances of {int(lens.min())}-{int(lens.max())} frames, vocab {v}, decoder "
        f"{args.layers}x{d}, beam {args.beam}, ctc_weight {args.ctc_weight}; ESPnet: BatchBeamSearch, one "
        "utterance at a time"
    )
    print(
        "| scoring | threads | same as ESPnet: pre_beam espnet (1 at a time / batched) | pre_beam avsr "
        "(batched) | ESPnet utt/s | avsr utt/s 1 at a time | avsr utt/s batched | speed ratio 1 at a time | "
        "speed ratio batched |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scoring in args.scoring:
        search = espnet_beam_search(
            dec,
            ctc_lo,
            v,
            eos,
            eos,
            beam_size=args.beam,
            ctc_weight=args.ctc_weight,
            full_ctc=scoring == "full",
            batch=True,
        )
        for threads in args.threads:
            torch.set_num_threads(threads)
            ref, t_esp = timed(espnet_tokens, search, mem, lens, eos)
            cfg = DecodeConfig(
                beam_size=args.beam, ctc_weight=args.ctc_weight, ctc_scoring=scoring, pre_beam="espnet"
            )
            single, t_single = timed(avsr_tokens, mem, lens, cfg, dec, logp, eos, batched=False)
            batched, t_batch = timed(avsr_tokens, mem, lens, cfg, dec, logp, eos, batched=True)
            own = avsr_tokens(
                mem,
                lens,
                DecodeConfig(beam_size=args.beam, ctc_weight=args.ctc_weight, ctc_scoring=scoring),
                dec,
                logp,
                eos,
                batched=True,
            )
            n = args.utts
            same = [sum(a == b for a, b in zip(x, ref)) for x in (single, batched, own)]
            print(
                f"| {scoring} | {threads} | {same[0]}/{n} / {same[1]}/{n} | {same[2]}/{n} "
                f"| {n / t_esp:.1f} | {n / t_single:.1f} | {n / t_batch:.1f} "
                f"| {t_esp / t_single:.1f}x | {t_esp / t_batch:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
