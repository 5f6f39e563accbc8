"""Batch speech synthesis with the festival speech synthesis system (Debian package ``festival``).

Starting festival costs a fraction of a second, so :func:`synthesize` writes one Scheme script for a whole
batch of utterances and runs one ``festival -b`` process for it. For each utterance the script selects the
voice, sets the prosody, synthesises the text, and saves the waveform (``utt.save.wave``) and the phone
segments (end time and phone per line). Reading the results back, the waveform is resampled to 16 kHz
together with a "tape speed" factor (pitch and formants scale by ``tape``, durations by ``1 / tape``), which
gives voices whose pitch festival cannot change (HTS, cluster units) a speaker-dependent pitch too; the
segment times are scaled to match.

Voices (:mod:`avsr.corpora.synthgrid.voices`): the English ones speak through festival's own pipeline --
``kal_diphone`` and ``ked_diphone`` (mean pitch and pitch range through festival's ``int_lr_params``, rate
through ``Duration_Stretch``) and ``cmu_us_slt_arctic_hts`` (rate through hts_engine's ``-r``). The other
voices speak English through ``kal_diphone``'s front end and their phone map (``avsr_front``,
``avsr_remap`` and ``avsr_repair`` below): the segments they write name the English phone each target
phone came from. HTS voices take an all-pass constant ``alpha`` (frequency warping of the spectral
envelope, :func:`avsr.corpora.synthgrid.voices.warp_htsvoice`) through a warped copy of their model file.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from avsr.corpora.synthgrid.voices import (
    FRONT_END_VOICE,
    VOICES,
    diphone_inventory,
    diphone_repairs,
    htsvoice_file,
    repairs_scheme,
    warp_htsvoice,
)

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
        alpha: HTS voices: the all-pass constant of the synthesis filter (None: the voice's own), see
            :func:`avsr.corpora.synthgrid.voices.warp_htsvoice`.
    """

    name: str
    text: str
    voice: str
    f0_mean: float = 105.0
    f0_std: float = 14.0
    rate: float = 1.0
    tape: float = 1.0
    alpha: float | None = None


@dataclass
class Synthesis:
    """Result of one :class:`SynthRequest`.

    Attributes:
        wav: ``float32`` ``(num_samples,)`` waveform at 16 kHz in [-1, 1].
        segments: phone segments ``(start_s, end_s, phone)`` in seconds, contiguous from 0, festival's
            phone names (``pau`` for silence).
        words: ``(start_s, end_s)`` of each spoken word as the engine reported it (eSpeak NG, flite; None
            where the engine gives no word timings).
    """

    wav: np.ndarray
    segments: list[tuple[float, float, str]]
    words: list[tuple[float, float]] | None = None


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
    if request.alpha is not None and (VOICES[request.voice].engine != "hts" or not 0.0 < request.alpha < 1.0):
        raise FestivalError(
            f"utterance {request.name}: alpha {request.alpha} needs an HTS voice and a value in (0, 1)"
        )


#: Scheme helpers of the mapped voices (see the module docstring): the English front end, the phone map
#: (each target segment keeps the index of its English segment in ``avsr_i`` and its name in ``avsr_en``),
#: the diphone repairs and the segment file (``end target english index`` per line).
SCHEME_HELPERS = r"""
(define (avsr_front text)
  (let ((u (eval (list 'Utterance 'Text text))))
    (Initialize u) (Text u) (Token_POS u) (Token u) (POS u) (Phrasify u) (Word u) (Pauses u)
    (Intonation u) (PostLex u) (Duration u) (Int_Targets u)
    u))
(define (avsr_split s to)
  (let ((start (item.feat s "segment_start")) (end (item.feat s "end")) (n (length to)) (i 1) (cur s)
        (prev nil))
    (item.set_name s (car to))
    (item.set_feat s "end" (+ start (/ (- end start) n)))
    (mapcar (lambda (p)
              (set! i (+ i 1))
              (set! prev cur)
              (set! cur (item.insert cur (list p) 'after))
              (if (item.relation prev 'SylStructure)
                  (item.insert (item.relation prev 'SylStructure) cur 'after))
              (item.set_feat cur "avsr_i" (item.feat s "avsr_i"))
              (item.set_feat cur "avsr_en" (item.feat s "avsr_en"))
              (item.set_feat cur "end" (+ start (* i (/ (- end start) n)))))
            (cdr to))))
(define (avsr_remap u table)
  (let ((i 0))
    (mapcar (lambda (s)
              (let ((entry (assoc_string (item.name s) table))
                    (stressed (equal? (item.feat s "R:SylStructure.parent.stress") 1))
                    (to nil))
                (if (null entry) (error (string-append "avsr: no phone map entry for " (item.name s))))
                (set! to (if (and stressed (cddr entry)) (car (cddr entry)) (cadr entry)))
                (item.set_feat s "avsr_i" i)
                (item.set_feat s "avsr_en" (item.name s))
                (set! i (+ i 1))
                (if (null to) (item.delete s) (avsr_split s to))))
            (utt.relation.items u 'Segment)))
  u)
(define (avsr_repair u repairs)
  (avsr_repair_pass u repairs) (avsr_repair_pass u repairs) (avsr_repair_pass u repairs))
(define (avsr_repair_pass u repairs)
  (mapcar (lambda (s)
            (let ((n (item.next s)) (fix nil))
              (if n (set! fix (assoc_string (string-append (item.name s) "-" (item.name n)) repairs)))
              (cond
               ((null fix) nil)
               ((equal? (cadr fix) 'first) (item.set_name s (car (cddr fix))))
               ((equal? (cadr fix) 'second) (item.set_name n (car (cddr fix))))
               (t (let ((start (item.feat s "segment_start")) (end (item.feat s "end")) (cut 0) (x nil))
                    (set! cut (if (< (* 0.5 (- end start)) 0.03) (* 0.5 (- end start)) 0.03))
                    (item.set_feat s "end" (- end cut))
                    (set! x (item.insert s (list (car (cddr fix))) 'after))
                    (item.set_feat x "avsr_i" (item.feat s "avsr_i"))
                    (item.set_feat x "avsr_en" (item.feat s "avsr_en"))
                    (item.set_feat x "end" end))))))
          (utt.relation.items u 'Segment))
  u)
(define (avsr_save_segs u file)
  (let ((fd (fopen file "w")))
    (mapcar (lambda (s)
              (format fd "%f %s %s %s\n" (item.feat s "end") (item.name s) (item.feat s "avsr_en")
                      (item.feat s "avsr_i")))
            (utt.relation.items u 'Segment))
    (fclose fd)))
"""


@functools.cache
def _repairs_scheme(voice: str) -> str:
    """The Scheme list of a diphone voice's repairs (computed once per process)."""
    return repairs_scheme(diphone_repairs(VOICES[voice].phone_map, diphone_inventory(voice)))


def _hts_params(request: SynthRequest, model: Path | None) -> list[str]:
    """Scheme lines that set hts_engine's model file and rate for ``request`` (``model``: a warped copy)."""
    default = f"{request.voice}::hts_engine_params"
    if model is None:
        return [f'(set! hts_engine_params (append {default} \'(("-r" {request.rate:.4f}))))',
                f"(set! current-voice '{request.voice})"]
    # festival's HTS module keeps the models of the last voice name: a new name makes it load the copy
    tag = f"{request.voice}_alpha{request.alpha:.4f}".replace(".", "_")
    return [f'(set! hts_engine_params (list (list "-m" {_scheme_string(str(model))})'
            f' (list "-r" {request.rate:.4f})))',
            f"(set! current-voice '{tag})"]


def build_script(
    requests: list[SynthRequest], outdir: Path, models: dict[tuple[str, float], Path] | None = None
) -> str:
    """The Scheme script that synthesises ``requests`` into ``outdir/<index>.wav`` and ``<index>.segs``.

    English voices: the voice is selected only when it changes (selecting resets the voice's parameters, so
    the prosody is set after it), and ``utt.save.segs`` writes the segments. Mapped voices: per utterance the
    English front end (:data:`~avsr.corpora.synthgrid.voices.FRONT_END_VOICE` with the request's pitch and
    rate), then the voice with its phone map and diphone repairs, and ``avsr_save_segs``. After each
    utterance the script prints ``AVSR_DONE <index>`` on stdout.

    Args:
        requests: the utterances.  outdir: where festival writes.
        models: ``(voice, alpha)`` -> the warped htsvoice copy of requests with an ``alpha``.
    """
    models = models or {}
    lines = [SCHEME_HELPERS]
    mapped = sorted({r.voice for r in requests if not VOICES[r.voice].english})
    for name in mapped:
        v = VOICES[name]
        lines.append(f"(set! avsr_map_{name} {v.phone_map.scheme()})")
        if v.engine == "diphone":
            lines.append(f"(set! avsr_rep_{name} {_repairs_scheme(name)})")
    current = None
    for index, request in enumerate(requests):
        v = VOICES[request.voice]
        wav = _scheme_string(str(outdir / f"{index}.wav"))
        segs = _scheme_string(str(outdir / f"{index}.segs"))
        model = models.get((request.voice, request.alpha)) if request.alpha is not None else None
        if v.english:
            if request.voice != current:
                lines.append(f"(voice_{request.voice})")
                if v.engine == "hts":
                    lines.append(f"(set! avsr_hts_params {request.voice}::hts_engine_params)")
                current = request.voice
            if v.engine == "diphone":
                lines.append(
                    f"(set! int_lr_params '((target_f0_mean {request.f0_mean:.2f})"
                    f" (target_f0_std {request.f0_std:.2f}) (model_f0_mean 170) (model_f0_std 34)))"
                )
                lines.append(f"(Parameter.set 'Duration_Stretch {1.0 / request.rate:.4f})")
            elif model is None:
                lines.append(
                    f'(set! hts_engine_params (append avsr_hts_params \'(("-r" {request.rate:.4f}))))'
                )
            else:
                lines += _hts_params(request, model)
            lines.append(f"(set! utt (utt.synth (Utterance Text {_scheme_string(request.text)})))")
            lines.append(f"(utt.save.wave utt {wav} 'riff)")
            lines.append(f"(utt.save.segs utt {segs})")
        else:
            lines.append(f"(voice_{FRONT_END_VOICE})")
            lines.append(
                f"(set! int_lr_params '((target_f0_mean {request.f0_mean:.2f})"
                f" (target_f0_std {request.f0_std:.2f}) (model_f0_mean 170) (model_f0_std 34)))"
            )
            lines.append(f"(Parameter.set 'Duration_Stretch {1.0 / request.rate:.4f})")
            lines.append(f"(set! utt (avsr_front {_scheme_string(request.text)}))")
            lines.append(f"(voice_{request.voice})")
            if v.engine == "hts":
                lines += _hts_params(request, model)
            lines.append(f"(avsr_remap utt avsr_map_{request.voice})")
            if v.engine == "diphone":
                lines.append(f"(avsr_repair utt avsr_rep_{request.voice})")
            lines.append("(Wave_Synth utt)")
            lines.append(f"(utt.save.wave utt {wav} 'riff)")
            lines.append(f"(avsr_save_segs utt {segs})")
            current = request.voice
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


def read_mapped_segs(path: Path, name: str) -> list[tuple[float, float, str]]:
    """Parse the segment file of a mapped voice (``end target english index`` per line, ``avsr_save_segs``).

    The target segments that came from one English segment (same index) become one segment named by the
    English phone, from the start of the first to the end of the last.

    Returns:
        contiguous English segments ``(start_s, end_s, phone)``.

    Raises:
        FestivalError: the file is malformed or has no segment (names utterance ``name``).
    """
    segments: list[tuple[float, float, str]] = []
    last_index = None
    start = 0.0
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4:
            raise FestivalError(f"utterance {name}: malformed segment line {line!r} in {path}")
        end, english, index = max(float(fields[0]), start), fields[2], fields[3]
        if index == last_index:
            segments[-1] = (segments[-1][0], end, english)
        else:
            segments.append((start, end, english))
        last_index, start = index, end
    if not segments:
        raise FestivalError(f"utterance {name}: festival produced no phone segments ({path})")
    return segments


def _warped_models(requests: list[SynthRequest], outdir: Path) -> dict[tuple[str, float], Path]:
    """Write the warped htsvoice copies the requests need (one per voice and alpha) into ``outdir``."""
    models = {}
    for voice, alpha in sorted({(r.voice, r.alpha) for r in requests if r.alpha is not None}):
        data = htsvoice_file(voice).read_bytes()
        path = outdir / f"{voice}_{len(models)}.htsvoice"
        path.write_bytes(warp_htsvoice(data, alpha))
        models[(voice, alpha)] = path
    return models


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
            "festvox-kallpc16k, festvox-kdlpc16k, festvox-us-slt-hts and the voices of "
            "avsr.corpora.synthgrid.voices: bash scripts/install.sh)"
        )
    for request in requests:
        _check_request(request)
    with tempfile.TemporaryDirectory(prefix="avsr_festival_") as tmp:
        outdir = Path(tmp)
        script = outdir / "batch.scm"
        try:
            models = _warped_models(requests, outdir)
        except (OSError, ValueError) as exc:
            raise FestivalError(f"batch starting with {requests[0].name}: {exc}") from exc
        script.write_text(build_script(requests, outdir, models))
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
    read = read_segs if VOICES[request.voice].english else read_mapped_segs
    segments = [(s / request.tape, e / request.tape, p) for s, e, p in read(segs_path, request.name)]
    return Synthesis(wav=wav, segments=segments)
