"""Babble noise from SynthGRID utterances of speakers that are in none of the corpus splits.

Babble is built like the babble of the noise augmentation in AV-HuBERT (Shi et al., "Robust self-supervised
audio-visual speech recognition", 2022, section 4: babble made by mixing utterances of other speakers):
``overlap`` independent streams each chain utterances (silence trimmed, short random gaps) from a random
start offset, and the streams are summed, so nearly every sample is the sum of ``overlap`` talkers.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
#: RMS level of the babble file (dBFS)
BABBLE_DBFS = -20.0


def trim_silence(wav: np.ndarray, segments: list[tuple[float, float, str]]) -> np.ndarray:
    """Cut a waveform to its speech: from the start of the first to the end of the last non-``pau`` phone.

    Returns:
        float32 ``(M,)``, the whole waveform if every segment is a pause.
    """
    speech = [(s, e) for s, e, p in segments if p != "pau"]
    if not speech:
        return wav.astype(np.float32)
    start, end = int(speech[0][0] * SAMPLE_RATE), int(np.ceil(speech[-1][1] * SAMPLE_RATE))
    return wav[start:end].astype(np.float32)


def mix_babble(
    utterances: list[np.ndarray], num_samples: int, overlap: int, rng: np.random.Generator
) -> np.ndarray:
    """Sum ``overlap`` streams of chained utterances into a babble waveform.

    Args:
        utterances: float ``(N_i,)`` waveforms at 16 kHz, level-normalised, silence trimmed; each is used
            once before any is reused (random order).
        num_samples: length of the result (samples at 16 kHz).
        overlap: number of simultaneous talkers (streams).
        rng: random generator (order, offsets, gaps).

    Returns:
        float32 ``(num_samples,)`` with RMS :data:`BABBLE_DBFS` dBFS and peak <= 0.99.

    Raises:
        ValueError: no utterance, ``overlap < 1`` or ``num_samples < 1``.
    """
    if not utterances or overlap < 1 or num_samples < 1:
        raise ValueError(
            f"babble needs utterances, overlap >= 1 and num_samples >= 1 "
            f"(got {len(utterances)} utterances, overlap {overlap}, {num_samples} samples)"
        )
    out = np.zeros(num_samples, dtype=np.float64)
    order = list(rng.permutation(len(utterances)))
    for _ in range(overlap):
        position = -int(rng.uniform(0.0, 1.5) * SAMPLE_RATE)
        while position < num_samples:
            if not order:
                order = list(rng.permutation(len(utterances)))
            wav = utterances[order.pop()]
            start = max(position, 0)
            stop = min(position + wav.shape[0], num_samples)
            if stop > start:
                out[start:stop] += wav[start - position : stop - position]
            position += wav.shape[0] + int(rng.uniform(0.0, 0.25) * SAMPLE_RATE)
    rms = float(np.sqrt(np.mean(out**2))) + 1e-9
    out *= 10.0 ** (BABBLE_DBFS / 20.0) / rms
    peak = float(np.abs(out).max())
    if peak > 0.99:
        out *= 0.99 / peak
    return out.astype(np.float32)
