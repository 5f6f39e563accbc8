"""One SynthGRID utterance: from festival's output to the four files of the corpus layout.

``<corpus>/<split>/<spk>/<utt>.wav`` (16 kHz mono), ``.mp4`` (96x96 gray, 25 fps, H.264), ``.txt`` (the
upper-case transcript) and ``.phn`` (phone segments ``start_s end_s phone``), as in AV-HuBERT's
preprocessed LRS3: the audio has exactly 640 samples per video frame, ``T = round(duration_s * 25)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avsr.corpora.synthgrid.augment import AugmentConfig, AugmentError, apply_plan, plan
from avsr.corpora.synthgrid.festival import Synthesis
from avsr.corpora.synthgrid.grammar import sentence_code, transcript
from avsr.corpora.synthgrid.render import Nuisance, render_frames
from avsr.corpora.synthgrid.speakers import Speaker
from avsr.corpora.synthgrid.visemes import trajectory
from avsr.data.media import write_video, write_wav
from avsr.fileio import write_text_atomic

SAMPLE_RATE = 16000
FPS = 25
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS
EXTENSIONS = (".wav", ".mp4", ".txt", ".phn")
#: RMS level of the speech-active part of every utterance before the speaker's own level (dBFS)
LEVEL_DBFS = -23.0


@dataclass(frozen=True)
class UttSpec:
    """What to generate for one utterance; ``seed`` seeds all its randomness.

    The video (articulation jitter, nuisance, sensor noise) draws from ``default_rng(seed)``, the acoustic
    augmentation from ``default_rng(seed + (7,))``: both depend on the utterance alone, never on the order
    of work.

    Attributes:
        utt_id: ``<spk>_<sentence-code>_<n>``.  split: corpus split.  speaker: who says it.
        words: the sentence (six upper-case words).  seed: entropy for ``numpy.random.default_rng``.
        speed: speed perturbation (multiplies the speaker's tape factor).
        augment: the acoustic augmentation (None: clean).  corpus_seed: seeds the room bank.
    """

    utt_id: str
    split: str
    speaker: Speaker
    words: tuple[str, ...]
    seed: tuple[int, ...]
    speed: float = 1.0
    augment: AugmentConfig | None = None
    corpus_seed: int = 0

    @staticmethod
    def make(
        split: str,
        speaker: Speaker,
        index: int,
        words: tuple[str, ...],
        seed: tuple[int, ...],
        speed: float = 1.0,
        augment: AugmentConfig | None = None,
        corpus_seed: int = 0,
    ) -> UttSpec:
        """Build a spec, naming the utterance ``<spk>_<code>_<index:04d>``."""
        return UttSpec(f"{speaker.id}_{sentence_code(words)}_{index:04d}", split, speaker, tuple(words), seed,
                       speed, augment, corpus_seed)

    def augmentation(self) -> list[tuple[str, dict]]:
        """The acoustic augmentation steps of this utterance (:func:`avsr.corpora.synthgrid.augment.plan`)."""
        if self.augment is None:
            return []
        return plan(np.random.default_rng([*self.seed, 7]), self.augment)

    def path(self, root: Path, ext: str) -> Path:
        """``root/<split>/<spk>/<utt><ext>``."""
        return Path(root) / self.split / self.speaker.id / f"{self.utt_id}{ext}"

    def is_complete(self, root: Path) -> bool:
        """Whether all four files of the utterance exist."""
        return all(self.path(root, ext).is_file() for ext in EXTENSIONS)


def speech_mask(num_samples: int, segments: list[tuple[float, float, str]]) -> np.ndarray:
    """bool ``(num_samples,)``: the samples inside non-``pau`` phone segments."""
    mask = np.zeros(num_samples, dtype=bool)
    for start, end, phone in segments:
        if phone != "pau":
            mask[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)] = True
    return mask


def normalise_level(wav: np.ndarray, level_db: float, segments: list[tuple[float, float, str]]) -> np.ndarray:
    """Scale a waveform so that its non-pause part has RMS ``LEVEL_DBFS + level_db`` dBFS (peak <= 0.99).

    Args:
        wav: float ``(N,)`` at 16 kHz.  level_db: speaker loudness offset in dB.
        segments: phone segments; ``pau`` segments are left out of the RMS.

    Returns:
        float32 ``(N,)``.
    """
    mask = speech_mask(wav.shape[0], segments)
    active = wav[mask] if mask.any() else wav
    rms = float(np.sqrt(np.mean(active.astype(np.float64) ** 2))) + 1e-9
    gain = 10.0 ** ((LEVEL_DBFS + level_db) / 20.0) / rms
    peak = float(np.abs(wav).max()) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return (wav * gain).astype(np.float32)


def align_lengths(
    wav: np.ndarray, segments: list[tuple[float, float, str]]
) -> tuple[np.ndarray, list[tuple[float, float, str]], int]:
    """Make audio and phone segments cover exactly ``T`` video frames.

    ``T = round(duration_s * 25)`` with the duration the longer of the waveform and the last segment; the
    waveform is zero-padded or trimmed to ``T * 640`` samples, segments are clipped to ``T / 25`` seconds
    (segments starting after it are dropped, the last one is extended to it).

    Returns:
        ``(wav (T * 640,) float32, segments, T)``.
    """
    duration = max(wav.shape[0] / SAMPLE_RATE, segments[-1][1])
    num_frames = max(1, int(round(duration * FPS)))
    num_samples = num_frames * SAMPLES_PER_FRAME
    out = np.zeros(num_samples, dtype=np.float32)
    out[: min(num_samples, wav.shape[0])] = wav[:num_samples]
    end = num_frames / FPS
    clipped = [(s, min(e, end), p) for s, e, p in segments if s < end]
    clipped[-1] = (clipped[-1][0], end, clipped[-1][2])
    return out, clipped, num_frames


def render_video(
    segments: list[tuple[float, float, str]],
    num_frames: int,
    speaker: Speaker,
    rng: np.random.Generator,
    nuisance: float = 1.0,
    target_jitter: float = 0.05,
) -> np.ndarray:
    """The mouth ROI video of an utterance.

    Args:
        segments: phone segments in seconds.  num_frames: T.  speaker: gives the appearance.
        rng: the utterance's generator (articulation jitter, nuisance, sensor noise).
        nuisance: strength of the per-utterance nuisance (0 = none, 1 = default).
        target_jitter: token-to-token variation of the viseme targets.

    Returns:
        uint8 ``(T, 96, 96)``.
    """
    app = speaker.appearance
    params = trajectory(
        segments,
        num_frames,
        fps=FPS,
        coarticulation_s=app.coarticulation_s,
        target_jitter=target_jitter,
        rng=rng,
    )
    return render_frames(params, app, Nuisance.sample(rng, nuisance), rng, fps=FPS)


def write_utterance(
    spec: UttSpec, synthesis: Synthesis, root: Path, nuisance: float = 1.0, target_jitter: float = 0.05
) -> int:
    """Write the four files of one utterance (each atomically; the transcript last).

    The audio is level-normalised, passes through the utterance's acoustic augmentation (if any, then
    normalised again, so that the speaker's loudness holds), and is cut or padded to the video length.

    Returns:
        the number of video frames T.

    Raises:
        avsr.data.media.MediaError: a media file cannot be written.
        avsr.corpora.synthgrid.augment.AugmentError: an augmentation step failed (names the utterance).
        ValueError: festival produced a phone without viseme (names the utterance).
    """
    wav = normalise_level(synthesis.wav, spec.speaker.level_db, synthesis.segments)
    steps = spec.augmentation()
    if spec.augment is not None and (steps or spec.speaker.channel.eq):
        try:
            wav = apply_plan(wav, steps, spec.speaker.channel, spec.augment, spec.corpus_seed,
                             speech_mask(wav.shape[0], synthesis.segments))
        except AugmentError as exc:
            raise AugmentError(f"utterance {spec.utt_id}: {exc}") from exc
        wav = normalise_level(wav, spec.speaker.level_db, synthesis.segments)
    wav, segments, num_frames = align_lengths(wav, synthesis.segments)
    rng = np.random.default_rng(list(spec.seed))
    try:
        video = render_video(segments, num_frames, spec.speaker, rng, nuisance, target_jitter)
    except ValueError as exc:
        raise ValueError(f"utterance {spec.utt_id}: {exc}") from exc
    spec.path(root, ".wav").parent.mkdir(parents=True, exist_ok=True)
    write_wav(spec.path(root, ".wav"), wav, SAMPLE_RATE)
    write_video(spec.path(root, ".mp4"), video, fps=FPS)
    write_text_atomic(spec.path(root, ".phn"), "".join(f"{s:.4f} {e:.4f} {p}\n" for s, e, p in segments))
    write_text_atomic(spec.path(root, ".txt"), transcript(spec.words) + "\n")
    return num_frames
