"""Decode dumped test conditions with ESPnet's Speech2Text, every input modality, in one process.

Writes ``OUT/<modality>/<condition>/{hyp,ref}`` (Kaldi text files), the layout ``python -m avsr.bin.score``
reads. The modality is the encoder's ``modality`` attribute (``avsr.espnet.AVHubertESPnetEncoder``); the
search
is the one ``Speech2Text`` builds (``BatchBeamSearch``), with the options of ``--decode-config``.

Usage: ``local/decode.py --exp exp/x --model exp/x/valid.acc.ave.pth --decode-config conf/decode_asr.yaml
--dump dump/test --conditions clean babble_0 --modalities audio video audiovisual --out exp/x/decode/test
[--nj 2]``

With ``--nj N`` the utterances of all (condition, modality) pairs still to decode are shared, in chunks of
``--chunk`` utterances, among N worker processes of one intra-op thread each (``Speech2Text`` decodes one
utterance at a time, whose small tensor operations gain nothing from a second thread; N processes keep N
cores busy). A pair's ``hyp`` and ``ref`` are written when its last chunk is done; pairs with a ``hyp``
already are skipped (an interrupted decoding resumes).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from avsr.data.datadir import read_kaldi_map, write_kaldi_map
from avsr.espnet import register

_S2T = None  # the worker's Speech2Text


def _init_worker(exp: Path, model: Path, decode_config: Path, pre_beam: str) -> None:
    """Build one ``Speech2Text`` per worker process (one thread)."""
    global _S2T
    torch.set_num_threads(1)
    register()
    from espnet2.bin.asr_inference import Speech2Text

    opts = yaml.safe_load(decode_config.read_text(encoding="utf-8"))
    _S2T = Speech2Text(asr_train_config=exp / "config.yaml", asr_model_file=model, device="cpu", **opts)
    if pre_beam == "avsr":
        from avsr.espnet.scorers import use_avsr_pre_beam

        use_avsr_pre_beam(_S2T.beam_search, eos=_S2T.asr_model.eos, blank=_S2T.asr_model.blank_id)


def _decode_chunk(job: tuple) -> tuple:
    """``(cond, modality, [(utt, npy path), ...])`` -> ``(cond, modality, {utt: hyp}, seconds)``."""
    cond, modality, items = job
    _S2T.asr_model.encoder.modality = modality
    t0, hyps = time.time(), {}
    for utt, path in items:
        with torch.no_grad():
            result = _S2T(torch.from_numpy(np.load(path).astype(np.float32)))
        hyps[utt] = result[0][0] if result else ""
    return cond, modality, hyps, time.time() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp", required=True, type=Path)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--decode-config", required=True, type=Path)
    p.add_argument("--dump", required=True, type=Path)
    p.add_argument("--conditions", nargs="+", required=True)
    p.add_argument("--modalities", nargs="+", default=["audio", "video", "audiovisual"])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--num-utts", type=int, default=None,
                   help="decode only the first N utterances (sorted ids) of each condition: a quick subset")
    p.add_argument("--nj", type=int, default=1, help="decoding processes (one thread each)")
    p.add_argument("--chunk", type=int, default=20, help="utterances per job handed to a process")
    p.add_argument(
        "--pre-beam",
        choices=["espnet", "avsr"],
        default="espnet",
        help="espnet: Speech2Text's own search; avsr: its pre-beam ranked as avsr's default "
        "(avsr.espnet.scorers.use_avsr_pre_beam), to compare the two on a trained model",
    )
    args = p.parse_args(argv)
    jobs, todo = [], {}
    for cond in args.conditions:
        feats = read_kaldi_map(args.dump / cond / "feats.scp")
        if args.num_utts is not None:
            feats = dict(sorted(feats.items())[: args.num_utts])
        refs = {k: v for k, v in read_kaldi_map(args.dump / cond / "text").items() if k in feats}
        items = sorted(feats.items())
        for modality in args.modalities:
            if (args.out / modality / cond / "hyp").is_file():
                continue
            chunks = [items[i:i + args.chunk] for i in range(0, len(items), args.chunk)]
            todo[cond, modality] = {"refs": refs, "hyps": {}, "left": len(chunks), "seconds": 0.0}
            jobs += [(cond, modality, c) for c in chunks]
    if not jobs:
        return 0
    init = (args.exp, args.model, args.decode_config, args.pre_beam)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(max(1, args.nj), initializer=_init_worker, initargs=init) as pool:
        for cond, modality, hyps, seconds in pool.imap_unordered(_decode_chunk, jobs):
            pair = todo[cond, modality]
            pair["hyps"].update(hyps)
            pair["seconds"] += seconds
            pair["left"] -= 1
            if pair["left"]:
                continue
            out = args.out / modality / cond
            out.mkdir(parents=True, exist_ok=True)
            write_kaldi_map(out / "ref", pair["refs"])
            write_kaldi_map(out / "hyp", dict(sorted(pair["hyps"].items())))
            print(f"[decode] {modality} {cond}: {len(pair['hyps'])} utterances, "
                  f"{pair['seconds']:.1f} process-s ({pair['seconds'] / len(pair['hyps']):.2f} s each)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
