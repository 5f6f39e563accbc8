"""How well eSpeak NG's and flite's word timings match their audio (the timings that move the mouth).

Each GRID sentence is said with a comma after every word, so that the engine puts a pause between the words
and each word is an island of energy in the waveform. A word's boundaries from the engine (eSpeak NG's
phoneme events, flite's segment end times) are compared with the edges of the energy islands they overlap
(10 ms frames, speech where the frame energy is within 35 dB of the loudest frame, gaps under 60 ms closed).
Prints the median, 90th percentile and maximum absolute error of word starts and ends per engine.

Usage: ``PYTHONPATH=. python recipes/synthgrid/avsr1/local/engine_timing.py [--sentences 5]``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from avsr.corpora.synthgrid.engines import ESPEAK_ACCENTS, FLITE_VOICES, EngineRequest
from avsr.corpora.synthgrid.grammar import sample_sentence

HOP = 160  # 10 ms at 16 kHz


def islands(wav: np.ndarray) -> list[tuple[float, float]]:
    """Speech islands ``(start_s, end_s)`` of a 16 kHz waveform (energy within 35 dB of the maximum)."""
    frames = wav[: len(wav) // HOP * HOP].reshape(-1, HOP).astype(np.float64)
    energy = 10 * np.log10((frames**2).mean(axis=1) + 1e-12)
    active = energy > energy.max() - 35.0
    spans, start, gap = [], None, 0
    for i, on in enumerate(active):
        if on:
            if start is None:
                start = i
            gap = 0
            end = i + 1
        elif start is not None:
            gap += 1
            if gap * HOP / 16000 >= 0.06:
                spans.append((start, end))
                start = None
    if start is not None:
        spans.append((start, end))
    return [(s * HOP / 16000, e * HOP / 16000) for s, e in spans]


def errors(result) -> list[tuple[float, float]]:
    """``(start error, end error)`` in seconds of every word against the islands it overlaps."""
    found = islands(result.wav)
    out = []
    for start, end in result.words:
        overlap = [(s, e) for s, e in found if s < end and e > start]
        if overlap:
            out.append((abs(start - overlap[0][0]), abs(end - overlap[-1][1])))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    sentences = [sample_sentence(rng) for _ in range(args.sentences)]
    voices = [("espeak-ng", a, v) for a in ESPEAK_ACCENTS for v in (None, "f2", "klatt4")]
    voices += [("flite", v, None) for v in FLITE_VOICES]
    table: dict[str, list] = {"espeak-ng": [], "flite": []}
    for engine, voice, variant in voices:
        for words in sentences:
            request = EngineRequest("t", words, engine, voice, variant)
            result = _with_commas(request)
            table[engine] += errors(result)
    print("engine     words  start: median p90 max (ms)   end: median p90 max (ms)")
    for engine, errs in table.items():
        e = np.array(errs) * 1000
        print(f"{engine:10s} {len(e):5d}  {np.median(e[:, 0]):6.1f} {np.percentile(e[:, 0], 90):5.1f} "
              f"{e[:, 0].max():5.1f}        {np.median(e[:, 1]):6.1f} {np.percentile(e[:, 1], 90):5.1f} "
              f"{e[:, 1].max():5.1f}")
    return 0


def _with_commas(request: EngineRequest):
    """Synthesise ``request`` with a comma after every word (engine text as in the corpus otherwise)."""
    from avsr.corpora.synthgrid import engines, espeak, flite

    text = ", ".join(engines.engine_text(request.engine, request.words).split())
    if request.engine == "espeak-ng":
        return espeak.synthesize(request.name, text, espeak.EspeakVoice(request.voice, request.variant))
    return flite.synthesize(request.name, text, flite.FliteVoice(request.voice), words=request.words)


if __name__ == "__main__":
    sys.exit(main())
