"""Decode dumped test conditions with ESPnet's Speech2Text, every input modality, in one process.

Writes ``OUT/<modality>/<condition>/{hyp,ref}`` (Kaldi text files), the layout ``python -m avsr.bin.score``
reads. The modality is the encoder's ``modality`` attribute (``avsr.espnet.AVHubertESPnetEncoder``); the
search
is the one ``Speech2Text`` builds (``BatchBeamSearch``), with the options of ``--decode-config``.

Usage: ``local/decode.py --exp exp/x --model exp/x/valid.acc.ave.pth --decode-config conf/decode_asr.yaml
--dump dump/test --conditions clean babble_0 --modalities audio video audiovisual --out exp/x/decode/test``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from avsr.data.datadir import read_kaldi_map, write_kaldi_map
from avsr.espnet import register


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
    p.add_argument(
        "--pre-beam",
        choices=["espnet", "avsr"],
        default="espnet",
        help="espnet: Speech2Text's own search; avsr: its pre-beam ranked as avsr's default "
        "(avsr.espnet.scorers.use_avsr_pre_beam), to compare the two on a trained model",
    )
    args = p.parse_args(argv)
    register()
    from espnet2.bin.asr_inference import Speech2Text

    opts = yaml.safe_load(args.decode_config.read_text(encoding="utf-8"))
    s2t = Speech2Text(
        asr_train_config=args.exp / "config.yaml", asr_model_file=args.model, device="cpu", **opts
    )
    encoder = s2t.asr_model.encoder
    if args.pre_beam == "avsr":
        from avsr.espnet.scorers import use_avsr_pre_beam

        use_avsr_pre_beam(s2t.beam_search, eos=s2t.asr_model.eos, blank=s2t.asr_model.blank_id)
    for cond in args.conditions:
        feats = read_kaldi_map(args.dump / cond / "feats.scp")
        if args.num_utts is not None:
            feats = dict(sorted(feats.items())[: args.num_utts])
        refs = {k: v for k, v in read_kaldi_map(args.dump / cond / "text").items() if k in feats}
        for modality in args.modalities:
            out = args.out / modality / cond
            if (out / "hyp").is_file():
                continue
            encoder.modality = modality
            t0, hyps = time.time(), {}
            for utt, path in feats.items():
                with torch.no_grad():
                    result = s2t(torch.from_numpy(np.load(path).astype(np.float32)))
                hyps[utt] = result[0][0] if result else ""
            out.mkdir(parents=True, exist_ok=True)
            write_kaldi_map(out / "ref", refs)
            write_kaldi_map(out / "hyp", hyps)
            print(
                f"[decode] {modality} {cond}: {len(hyps)} utterances in {time.time() - t0:.1f} s", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
