"""Long inputs: test utterances joined into one recording, decoded whole, cut at pauses, and cut with the
model's training edges given to every piece (``avsr.Transcriber``'s ``max_segment_s`` and ``edge_frames``).

Usage::

    python benchmarks/bench_long_input.py --exp-dir recipes/synthgrid/avsr1/exp/avsr_synthgrid_cpu \
        --data recipes/synthgrid/avsr1/data/test [--num 32] [--modalities audio audiovisual] \
        [--max-segment-s 2.8] [--edge-frames 5,4]

The first ``--num`` utterances of the data dir (sorted by id) are joined end to end, audio and mouth ROI
video, into one recording (their own pauses between them), and its reference is their transcripts joined.
Prints, per modality, the corpus WER (%) of: the utterances decoded one by one (as the recipe's decoding
stage), the recording decoded whole, cut at pauses into pieces of at most ``--max-segment-s`` (default: the
model's longest training utterance) with the inputs' edges as cut, and cut with each piece given the edges of
the model's training audio (``--edge-frames``, default: the checkpoint's ``data_stats``); with the distance
of each cut from the nearest true utterance boundary and the decoding time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from avsr.data.datadir import read_datadir  # noqa: E402
from avsr.data.media import read_video, read_wav  # noqa: E402
from avsr.eval.scoring import word_errors  # noqa: E402
from avsr.inference import TranscribeItem, Transcriber, model_edge_frames, parse_edge_frames  # noqa: E402
from avsr.nn.precision import machine_summary  # noqa: E402

FPS = 25


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exp-dir", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="a test data dir (wav.scp, video.scp, text)")
    p.add_argument("--num", type=int, default=32, help="utterances joined")
    p.add_argument("--modalities", nargs="+", default=["audio", "audiovisual"])
    p.add_argument("--max-segment-s", type=float, default=None, help="default: longest training utterance")
    p.add_argument("--edge-frames", default="model", help="'model' or START,END")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    print(machine_summary(getattr(args, "device", "cpu")), flush=True)  # where the figures come from
    torch.set_num_threads(args.threads)

    utts = sorted(read_datadir(args.data), key=lambda u: u.utt_id)[: args.num]
    wavs, videos, bounds, t = [], [], [], 0
    for u in utts:
        video = read_video(u.video)
        wav = read_wav(u.wav)[: video.shape[0] * 640]
        wav = torch.cat([wav, torch.zeros(video.shape[0] * 640 - wav.numel())])
        wavs.append(wav)
        videos.append(video)
        t += video.shape[0]
        bounds.append(t)
    wav, video = torch.cat(wavs), torch.cat(videos)
    ref = {"long": " ".join(u.text for u in utts)}
    edges = parse_edge_frames(args.edge_frames)
    if edges == "model":
        edges = model_edge_frames(args.exp_dir)
    print(f"{len(utts)} utterances of {args.data} joined: {t / FPS:.1f} s; training edges {edges}")

    plain = Transcriber.from_pretrained(args.exp_dir, edge_frames=None)
    seg_s = args.max_segment_s or plain.train_max_s
    print(f"pieces of at most {seg_s:.2f} s\n")
    print("| modality | decoding | WER (%) | cuts | farthest cut from an utterance boundary (frames) "
          "| time (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for modality in args.modalities:
        refs = {u.utt_id: u.text for u in utts}
        runs = []
        tr = Transcriber.from_pretrained(args.exp_dir, edge_frames=edges)
        t0 = time.time()
        one = tr.transcribe_batch(utts, modality=modality, progress=False, word_timings=False)
        e = word_errors(refs, {r.key: r.text for r in one})
        runs.append(("one by one (edges given)", e, None, time.time() - t0))
        ways = (("whole", None, None), ("cut", seg_s, None), ("cut, edges given", seg_s, edges))
        for name, segment, edge in ways:
            tr = Transcriber.from_pretrained(args.exp_dir, edge_frames=edge, max_segment_s=segment)
            t0 = time.time()
            item = TranscribeItem(video=video, audio=wav, key="long")
            (r,) = tr.transcribe_batch([item], modality=modality, progress=False, word_timings=False)
            elapsed = time.time() - t0
            cuts = [round(b * FPS) for _, b in r.info.get("segments_s", [])][:-1]
            runs.append((name, word_errors(ref, {"long": r.text}), cuts, elapsed))
        for name, e, cuts, elapsed in runs:
            wer = 100.0 * (e["sub"] + e["del"] + e["ins"]) / max(1, e["num_words"])
            off = max((min(abs(c - b) for b in bounds) for c in cuts), default=0) if cuts else "-"
            print(f"| {modality} | {name} | {wer:.2f} | {len(cuts) if cuts is not None else '-'} | {off} | "
                  f"{elapsed:.1f} |")


if __name__ == "__main__":
    main()
