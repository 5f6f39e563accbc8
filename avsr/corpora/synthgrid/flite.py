"""Speech synthesis with CMU flite (Debian package ``flite``), with phone timings.

flite is festival's small C cousin: the same US English front end (CMU lexicon, festival's phone set) and
built-in voices -- ``kal`` (diphone, 8 kHz), ``kal16`` (the same diphones at 16 kHz), ``awb``, ``rms`` and
``slt`` (clustergen statistical parametric voices, 16 kHz). ``awb_time`` is a limited-domain voice that says
only the time of day and is not used. One ``flite`` process per utterance writes the waveform (``-o``) and
prints the end time of every phone segment (``-psdur``: ``phone:end_s`` in festival's phone names), which are
the segments the waveform was made from. Pitch and rate are flite features: ``int_f0_target_mean`` and
``int_f0_target_stddev`` (Hz; ``rms`` ignores them and keeps its own pitch) and ``duration_stretch``
(``1 / rate``).

The audio is resampled to 16 kHz with the speaker's tape factor (as for festival); ``kal`` is 8 kHz audio
upsampled, so it has no energy above 4 kHz (a narrowband voice). The phone segments are made contiguous from
0 and the last pause ends with the audio (flite's ``kal`` reports a final pause 0.1 s longer than its audio).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from avsr.corpora.synthgrid.festival import SAMPLE_RATE, Synthesis, resample
from avsr.corpora.synthgrid.voices import ENGLISH_PRONUNCIATIONS

#: flite's voices that speak any English text (``flite -lv`` also lists ``awb_time``, a talking clock)
FLITE_VOICE_NAMES = ("kal", "kal16", "awb", "rms", "slt")

#: GRID words that a flite voice says with other phones than festival's lexicon (checked for every GRID word
#: and voice by ``tests/test_engines.py``): the 8 kHz ``kal`` diphone voice's older lexicon has /aa/ in ONE
VOICE_PRONUNCIATIONS: dict[str, dict[str, tuple[str, ...]]] = {"kal": {"ONE": ("w", "aa", "n")}}


class FliteError(RuntimeError):
    """flite is missing or failed, or a request is invalid (names the utterance)."""


@dataclass(frozen=True)
class FliteVoice:
    """A flite voice with prosody.

    Attributes:
        voice: one of :data:`FLITE_VOICE_NAMES`.  rate: speaking-rate factor (> 1 faster).
        f0_mean, f0_std: target mean pitch and pitch standard deviation in Hz (None: the voice's own).
    """

    voice: str
    rate: float = 1.0
    f0_mean: float | None = None
    f0_std: float | None = None


def flite_available(executable: str = "flite") -> bool:
    """Whether the flite executable is on ``PATH``."""
    return shutil.which(executable) is not None


def parse_psdur(text: str) -> list[tuple[float, float, str]]:
    """Contiguous segments from flite's ``-psdur`` output (``phone:end_s`` separated by spaces).

    Raises:
        ValueError: a token that is not ``phone:number``, or no segment.
    """
    segments = []
    start = 0.0
    for token in text.split():
        phone, sep, end = token.rpartition(":")
        if not sep or not phone:
            raise ValueError(f"not a flite segment: {token!r}")
        end_s = max(float(end), start)
        segments.append((start, end_s, phone))
        start = end_s
    if not segments:
        raise ValueError("flite printed no segment")
    return segments


def word_spans(
    segments: list[tuple[float, float, str]], words: tuple[str, ...], voice: str | None = None
) -> list[tuple[float, float]]:
    """The span of each word, reading the non-pause segments as the words' festival pronunciations in order.

    flite's lexicon is the CMU lexicon of festival's English voices, so the phones of a GRID sentence are the
    concatenated :data:`~avsr.corpora.synthgrid.voices.ENGLISH_PRONUNCIATIONS` of its words, except where
    ``voice`` has a pronunciation of its own (:data:`VOICE_PRONUNCIATIONS`).

    Raises:
        ValueError: the phones are not those of ``words`` (names the first word that differs).
    """
    speech = [s for s in segments if s[2] != "pau"]
    spans, i = [], 0
    for word in words:
        own = VOICE_PRONUNCIATIONS.get(voice or "", {}).get(word)
        expected = list(own) if own else [p for p, _ in ENGLISH_PRONUNCIATIONS[word]]
        got = [p for _, _, p in speech[i : i + len(expected)]]
        if got != expected:
            raise ValueError(f"word {word}: phones {got}, expected {expected}")
        spans.append((speech[i][0], speech[i + len(expected) - 1][1]))
        i += len(expected)
    if i != len(speech):
        raise ValueError(f"{len(speech) - i} phones after the last word")
    return spans


def synthesize(
    name: str, text: str, voice: FliteVoice, tape: float = 1.0, words: tuple[str, ...] | None = None,
    executable: str = "flite", timeout: float = 60.0,
) -> Synthesis:
    """Synthesise one utterance with one flite process.

    Args:
        name: utterance id (for messages).  text: what to say.  voice: voice and prosody.
        tape: tape-speed factor of the resampling to 16 kHz.
        words: the GRID words of ``text``: the word spans are read from the phones (None: no word spans).

    Returns:
        16 kHz audio, festival phone segments and (with ``words``) word spans, in seconds.

    Raises:
        FliteError: flite missing, an unknown voice, flite failing, or output that cannot be read.
    """
    if voice.voice not in FLITE_VOICE_NAMES:
        raise FliteError(f"utterance {name}: unknown flite voice {voice.voice!r}, known: {FLITE_VOICE_NAMES}")
    if not 0.25 <= voice.rate <= 4.0:
        raise FliteError(f"utterance {name}: rate {voice.rate} out of range")
    if shutil.which(executable) is None:
        raise FliteError(f"flite executable {executable!r} not found on PATH (install the Debian package "
                         "flite: bash scripts/install.sh)")
    features = [("duration_stretch", 1.0 / voice.rate)]
    if voice.f0_mean is not None:
        features.append(("int_f0_target_mean", voice.f0_mean))
    if voice.f0_std is not None:
        features.append(("int_f0_target_stddev", voice.f0_std))
    with tempfile.TemporaryDirectory(prefix="avsr_flite_") as tmp:
        path = Path(tmp) / "out.wav"
        command = [executable, "-voice", voice.voice, "-psdur"]
        for feature, value in features:
            command += ["--setf", f"{feature}={value:.4f}"]
        command += ["-t", text, "-o", str(path)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            wav, rate = soundfile.read(str(path), dtype="float32")
            segments = parse_psdur(proc.stdout)
        except (subprocess.TimeoutExpired, OSError, RuntimeError, ValueError) as exc:
            stderr = proc.stderr.strip() if "proc" in locals() else ""
            raise FliteError(f"flite failed on utterance {name} (voice {voice.voice}, text {text!r}): {exc}; "
                             f"stderr: {stderr}") from exc
    if wav.ndim != 1 or wav.shape[0] == 0:
        raise FliteError(f"utterance {name}: flite wrote an empty or multi-channel wav")
    duration = wav.shape[0] / rate
    if segments[-1][2] == "pau":  # the last pause ends with the audio
        segments[-1] = (segments[-1][0], max(duration, segments[-1][0]), "pau")
    spans = None
    if words is not None:
        try:
            spans = word_spans(segments, words, voice.voice)
        except ValueError as exc:
            raise FliteError(f"utterance {name} (voice {voice.voice}, text {text!r}): {exc}") from exc
    wav = resample(wav, int(round(wav.shape[0] * SAMPLE_RATE / (rate * tape))))
    scaled = [(s / tape, e / tape, p) for s, e, p in segments]
    return Synthesis(np.asarray(wav, np.float32), scaled,
                     None if spans is None else [(s / tape, e / tape) for s, e in spans])
