"""Batch speech synthesis with the festival speech synthesis system (Debian package ``festival``).

Starting festival costs a fraction of a second, so :func:`synthesize` writes one Scheme script for a whole
batch of utterances and runs one ``festival -b`` process for it. For each utterance the script selects the
voice, sets the prosody, synthesises the text, and saves the waveform (``utt.save.wave``) and the phone
segments (``utt.save.segs``: end time and phone per line). Reading the results back, the waveform is
resampled to 16 kHz together with a "tape speed" factor (pitch and formants scale by ``tape``, durations by
``1 / tape``), which gives voices whose pitch festival cannot change (HTS) a speaker-dependent pitch too;
the segment times are scaled to match.

Voices (Debian packages ``festvox-kallpc16k``, ``festvox-kdlpc16k``, ``festvox-us-slt-hts``):
``kal_diphone`` and ``ked_diphone`` (male, diphone; mean pitch and pitch range through festival's
``int_lr_params``, rate through ``Duration_Stretch``) and ``cmu_us_slt_arctic_hts`` (female, HTS; rate
through hts_engine's ``-r`` option; festival's HTS module ignores pitch options).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

#: voice name -> (kind, mean F0 in Hz and F0 standard deviation in Hz of the voice's own intonation model)
VOICES: dict[str, tuple[str, float, float]] = {
    "kal_diphone": ("diphone", 105.0, 14.0),
    "ked_diphone": ("diphone", 105.0, 15.0),
    "cmu_us_slt_arctic_hts": ("hts", 170.0, 34.0),
}

SAMPLE_RATE = 16000
_TEXT_RE = re.compile(r"^[A-Za-z' ]+$")


class FestivalError(RuntimeError):
    """Festival is missing, failed, or gave no output for an utterance (named, with festival's stderr)."""


@dataclass(frozen=True)
class SynthRequest:
    """One utterance to synthesise.

    Attributes:
        name: utterance id, used in file names and error messages.
        text: plain text, letters, apostrophes and spaces only (see ``grammar.festival_text``).
        voice: a key of :data:`VOICES`.
        f0_mean: target mean F0 in Hz (diphone voices; ignored by HTS voices).
        f0_std: target F0 standard deviation in Hz (diphone voices; ignored by HTS voices).
        rate: speaking rate factor, > 1 is faster (diphone: ``Duration_Stretch = 1 / rate``; HTS: ``-r``).
        tape: tape-speed factor applied when resampling: pitch and formants x ``tape``, durations / ``tape``.
    """

    name: str
    text: str
    voice: str
    f0_mean: float = 105.0
    f0_std: float = 14.0
    rate: float = 1.0
    tape: float = 1.0


@dataclass
class Synthesis:
    """Result of one :class:`SynthRequest`.

    Attributes:
        wav: ``float32`` ``(num_samples,)`` waveform at 16 kHz in [-1, 1].
        segments: phone segments ``(start_s, end_s, phone)`` in seconds, contiguous from 0, festival's
            phone names (``pau`` for silence).
    """

    wav: np.ndarray
    segments: list[tuple[float, float, str]]


def festival_available(executable: str = "festival") -> bool:
    """Whether the festival executable is on ``PATH``."""
    return shutil.which(executable) is not None


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_request(request: SynthRequest) -> None:
    if request.voice not in VOICES:
        raise FestivalError(
            f"utterance {request.name}: unknown voice {request.voice!r}, known: {list(VOICES)}"
        )
    if not _TEXT_RE.match(request.text):
        raise FestivalError(
            f"utterance {request.name}: text {request.text!r} has characters other than letters"
        )
    if not (0.25 <= request.rate <= 4.0 and 0.5 <= request.tape <= 2.0):
        raise FestivalError(
            f"utterance {request.name}: rate {request.rate} or tape {request.tape} out of range"
        )


def build_script(requests: list[SynthRequest], outdir: Path) -> str:
    """The Scheme script that synthesises ``requests`` into ``outdir/<index>.wav`` and ``<index>.segs``.

    The voice is selected only when it changes (selecting resets the voice's parameters, so the prosody is
    set after it); after each utterance the script prints ``AVSR_DONE <index>`` on stdout.
    """
    lines = []
    current = None
    for index, request in enumerate(requests):
        kind = VOICES[request.voice][0]
        if request.voice != current:
            lines.append(f"(voice_{request.voice})")
            if kind == "hts":
                lines.append(f"(set! avsr_hts_params {request.voice}::hts_engine_params)")
            current = request.voice
        if kind == "diphone":
            lines.append(
                f"(set! int_lr_params '((target_f0_mean {request.f0_mean:.2f})"
                f" (target_f0_std {request.f0_std:.2f}) (model_f0_mean 170) (model_f0_std 34)))"
            )
            lines.append(f"(Parameter.set 'Duration_Stretch {1.0 / request.rate:.4f})")
        else:
            lines.append(f'(set! hts_engine_params (append avsr_hts_params \'(("-r" {request.rate:.4f}))))')
        wav = _scheme_string(str(outdir / f"{index}.wav"))
        segs = _scheme_string(str(outdir / f"{index}.segs"))
        lines.append(f"(set! utt (utt.synth (Utterance Text {_scheme_string(request.text)})))")
        lines.append(f"(utt.save.wave utt {wav} 'riff)")
        lines.append(f"(utt.save.segs utt {segs})")
        lines.append(f'(format t "AVSR_DONE {index}\\n")')
    return "\n".join(lines) + "\n"


def resample(wav: np.ndarray, num_samples: int) -> np.ndarray:
    """Band-limited resampling of a whole waveform to ``num_samples`` samples (FFT zero-padding/truncation).

    Args:
        wav: ``(N,)`` float waveform.
        num_samples: output length ``M``; the rate changes by ``M / N``.

    Returns:
        ``float32`` ``(M,)``.
    """
    n = wav.shape[0]
    if n == num_samples or n == 0:
        return wav.astype(np.float32)
    spectrum = np.fft.rfft(wav.astype(np.float64))
    bins = num_samples // 2 + 1
    if bins <= spectrum.shape[0]:
        spectrum = spectrum[:bins]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(bins - spectrum.shape[0], dtype=spectrum.dtype)])
    return (np.fft.irfft(spectrum, num_samples) * (num_samples / n)).astype(np.float32)


def read_segs(path: Path, name: str) -> list[tuple[float, float, str]]:
    """Parse festival's ``utt.save.segs`` file (a ``#`` line, then ``end_s score phone`` lines).

    Returns:
        contiguous segments ``(start_s, end_s, phone)``.

    Raises:
        FestivalError: the file is malformed or has no segment (names utterance ``name``).
    """
    segments = []
    start = 0.0
    body = path.read_text().split("#", 1)
    for line in body[-1].splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise FestivalError(f"utterance {name}: malformed festival segment line {line!r} in {path}")
        end = float(fields[0])
        segments.append((start, max(end, start), fields[2]))
        start = max(end, start)
    if not segments:
        raise FestivalError(f"utterance {name}: festival produced no phone segments ({path})")
    return segments


def synthesize(
    requests: list[SynthRequest], executable: str = "festival", timeout: float = 600.0
) -> list[Synthesis]:
    """Synthesise a batch of utterances with one festival process.

    Args:
        requests: the utterances (grouping them by voice saves voice switches).
        executable: the festival executable.
        timeout: seconds allowed for the whole batch.

    Returns:
        one :class:`Synthesis` per request, in order; audio at 16 kHz after the tape-speed change.

    Raises:
        FestivalError: festival is not installed, a request is invalid, festival fails or times out, or an
            utterance has no output; the message names the (first failing) utterance and ends with
            festival's stderr.
    """
    if not requests:
        return []
    if shutil.which(executable) is None:
        raise FestivalError(
            f"festival executable {executable!r} not found on PATH (install the Debian packages festival, "
            "festvox-kallpc16k, festvox-kdlpc16k, festvox-us-slt-hts)"
        )
    for request in requests:
        _check_request(request)
    with tempfile.TemporaryDirectory(prefix="avsr_festival_") as tmp:
        outdir = Path(tmp)
        script = outdir / "batch.scm"
        script.write_text(build_script(requests, outdir))
        try:
            proc = subprocess.run(
                [executable, "-b", str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp
            )
        except subprocess.TimeoutExpired as exc:
            raise FestivalError(
                f"festival timed out after {timeout} s on a batch of {len(requests)} utterances "
                f"starting with {requests[0].name}; stderr:\n{exc.stderr}"
            ) from exc
        done = set(re.findall(r"AVSR_DONE (\d+)", proc.stdout))
        results = []
        for index, request in enumerate(requests):
            wav_path, segs_path = outdir / f"{index}.wav", outdir / f"{index}.segs"
            if str(index) not in done or not wav_path.is_file() or not segs_path.is_file():
                raise FestivalError(
                    f"festival failed on utterance {request.name} (text {request.text!r}, voice "
                    f"{request.voice}, exit status {proc.returncode}); stderr:\n{proc.stderr.strip()}"
                )
            results.append(_load_result(request, wav_path, segs_path))
    return results


def _load_result(request: SynthRequest, wav_path: Path, segs_path: Path) -> Synthesis:
    """Read one utterance's festival output, resample to 16 kHz with the tape factor, scale the times."""
    try:
        wav, rate = soundfile.read(str(wav_path), dtype="float32")
    except Exception as exc:
        raise FestivalError(
            f"utterance {request.name}: cannot read festival's wav {wav_path}: {exc}"
        ) from exc
    if wav.ndim != 1 or wav.shape[0] == 0:
        raise FestivalError(f"utterance {request.name}: festival wrote an empty or multi-channel wav")
    num_samples = int(round(wav.shape[0] * SAMPLE_RATE / (rate * request.tape)))
    wav = resample(wav, num_samples)
    segments = [(s / request.tape, e / request.tape, p) for s, e, p in read_segs(segs_path, request.name)]
    return Synthesis(wav=wav, segments=segments)
