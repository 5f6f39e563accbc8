"""SynthGRID speakers: a festival voice with its own prosody, vocal tract, microphone and mouth appearance.

A speaker is a voice (:data:`avsr.corpora.synthgrid.voices.VOICES`) times prosody (mean pitch and pitch range
for the diphone voices, speaking rate), vocal-tract length (see below), loudness, a microphone
(:class:`avsr.corpora.synthgrid.augment.Channel`) and an :class:`~avsr.corpora.synthgrid.render.Appearance`.
Speakers are drawn per split (train, valid, test, test_unseen_voice, and the babble sets that are in none of
them) with their own ids, so the splits never share a speaker; voices are cycled within each split. The
speakers of ``train_accented`` (the accented voices added to the English training corpus, see
:attr:`avsr.corpora.synthgrid.generate.SynthGridConfig.num_train_accented`) are training speakers of their
own.

Vocal-tract length apart from pitch (formant shift independent of F0, the aim of VTLP): every voice is
resampled by a "tape speed" factor (formants, pitch and tempo x ``tape``); diphone voices then get their
pitch from the intonation targets (``f0_mean / tape``, so the heard pitch is ``f0_mean``), HTS voices a
warped all-pass constant ``alpha`` (formants move against the tape factor or with it, pitch stays), the
cluster-unit voice keeps the tape factor alone. Ranges (:func:`sample_speaker`):

================= ============================ ==============================================
quantity          range                        note
================= ============================ ==============================================
heard mean pitch  the voice's ``f0_range``     diphone voices; pitch range 8-25% of it
tape (VTL)        0.88-1.12                    x0.9 / x1.1 per utterance (Kaldi speed perturbation)
alpha             voice's own +-0.06           HTS voices (0.45 slt, 0.42 ona)
rate              0.8-1.25                     speaking rate (festival durations x 1/rate)
level             -6..+3 dB                    loudness around the corpus level
================= ============================ ==============================================

The test split and the test babble keep the speakers of the first SynthGRID corpora (the three English
voices, :func:`sample_legacy_speaker`), so that their files, and the results on them, stay comparable.

Other engines (:mod:`avsr.corpora.synthgrid.engines`): a speaker whose voice is a voice key
(``espeak-ng:en-gb-scotland+m3``, ``flite:slt``) is drawn by :func:`sample_engine_speaker`: the same tape,
rate, level, appearance and microphone ranges as above; eSpeak NG speakers draw its pitch (25-75) and pitch
range (20-80) parameters, flite speakers a heard mean pitch in the voice's range
(:data:`~avsr.corpora.synthgrid.engines.FLITE_F0_RANGE`). A festival speaker's ``engine`` is ``festival`` and
its dict (``speakers.json``) is what it always was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from avsr.corpora.synthgrid.augment import AugmentConfig, Channel
from avsr.corpora.synthgrid.engines import FLITE_F0_RANGE, EngineRequest, parse_voice_key
from avsr.corpora.synthgrid.festival import SynthRequest
from avsr.corpora.synthgrid.render import Appearance
from avsr.corpora.synthgrid.voices import LEGACY_VOICES, VOICES, htsvoice_alpha, htsvoice_file

#: split name -> speaker id prefix; ids are ``<prefix><index:03d>`` (fixed width, so Kaldi sorting holds).
#: The order is part of the seeding: new splits are appended.
SPLIT_PREFIX = {
    "train": "tr",
    "valid": "va",
    "test": "te",
    "babble_train": "bn",
    "babble_test": "bt",
    "test_unseen_voice": "tu",
    "train_accented": "ta",
    "test_espeak_ng": "ue",
    "test_flite": "uf",
}

#: splits whose speakers are drawn as in the first corpora (:func:`sample_legacy_speaker`)
LEGACY_SPLITS = ("test", "babble_test")

#: splits whose utterances pass through the acoustic augmentation (:mod:`avsr.corpora.synthgrid.augment`)
AUGMENTED_SPLITS = ("train", "valid")

#: the all-pass constant of the HTS voices' own models (read from the htsvoice files when installed)
_DEFAULT_ALPHA = {"cmu_us_slt_arctic_hts": 0.45, "upc_ca_ona_hts": 0.42}


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker.

    Attributes:
        id: speaker id, e.g. ``tr007``.  split: a key of :data:`SPLIT_PREFIX`.  voice: festival voice.
        f0_mean, f0_std: intonation target mean and standard deviation in Hz (None where the voice takes
            its pitch from its own models: HTS, cluster units).  rate: speaking-rate factor (> 1 faster).
        tape: tape-speed factor (pitch and formants x tape, durations / tape).  alpha: HTS all-pass
            constant (None: the voice's own).  level_db: loudness relative to the corpus level (dB).
        appearance: the mouth's look.  channel: the speaker's microphone (EQ).
        engine: ``festival``, ``espeak-ng`` or ``flite``; ``voice`` is then the eSpeak accent or the flite
            voice.  variant: the eSpeak variant (None: the accent's own).  pitch, pitch_range: eSpeak's
            pitch and range parameters (0-99); flite speakers use ``f0_mean`` and ``f0_std``.
    """

    id: str
    split: str
    voice: str
    f0_mean: float | None
    f0_std: float | None
    rate: float
    tape: float
    level_db: float
    appearance: Appearance
    alpha: float | None = None
    channel: Channel = field(default_factory=Channel)
    engine: str = "festival"
    variant: str | None = None
    pitch: int | None = None
    pitch_range: int | None = None

    def engine_request(self, name: str, words: tuple[str, ...], speed: float = 1.0) -> EngineRequest:
        """The eSpeak NG / flite request for saying ``words`` as utterance ``name`` (``speed`` multiplies the
        tape factor)."""
        return EngineRequest(name, tuple(words), self.engine, self.voice, self.variant, self.rate, self.pitch,
                             self.pitch_range, self.f0_mean, self.f0_std, self.tape * speed)

    def request(self, name: str, text: str, speed: float = 1.0) -> SynthRequest:
        """The festival request for saying ``text`` as utterance ``name`` in this speaker's voice.

        Args:
            speed: per-utterance speed perturbation, multiplies the tape factor.
        """
        low, high = VOICES[self.voice].f0_range
        return SynthRequest(
            name=name,
            text=text,
            voice=self.voice,
            f0_mean=self.f0_mean if self.f0_mean is not None else 0.5 * (low + high),
            f0_std=self.f0_std if self.f0_std is not None else 0.15 * (low + high) / 2,
            rate=self.rate,
            tape=self.tape * speed,
            alpha=self.alpha,
        )

    def to_dict(self) -> dict:
        """JSON-ready dict (appearance and channel as nested dicts)."""
        out = asdict(self)
        out["appearance"] = self.appearance.to_dict()
        out["channel"] = self.channel.to_dict()
        if self.engine == "festival":  # a festival speaker's record is what it always was
            for key in ("engine", "variant", "pitch", "pitch_range"):
                del out[key]
        return out


def sample_legacy_speaker(speaker_id: str, split: str, voice: str, rng: np.random.Generator) -> Speaker:
    """A speaker as the first SynthGRID corpora drew them (the English voices, the test split).

    Diphone voices: target pitch 80-150 Hz, pitch range 8-30 Hz, tape 0.93-1.07; HTS: tape 0.86-1.1;
    rate 0.85-1.2, level -3..+3 dB. Same draws in the same order as then, so the files are the same.

    Raises:
        KeyError: unknown voice.
    """
    if VOICES[voice].engine == "diphone":
        f0_mean, f0_std = float(rng.uniform(80.0, 150.0)), float(rng.uniform(8.0, 30.0))
        tape = float(rng.uniform(0.93, 1.07))
    else:
        f0_mean = f0_std = None
        tape = float(rng.uniform(0.86, 1.1))
    return Speaker(
        id=speaker_id,
        split=split,
        voice=voice,
        f0_mean=f0_mean,
        f0_std=f0_std,
        rate=float(rng.uniform(0.85, 1.2)),
        tape=tape,
        level_db=float(rng.uniform(-3.0, 3.0)),
        appearance=Appearance.sample(rng),
    )


def voice_alpha(voice: str) -> float:
    """The all-pass constant of an HTS voice's own model (from its installed htsvoice file if possible)."""
    try:
        return htsvoice_alpha(htsvoice_file(voice).read_bytes()[:8192])
    except (OSError, ValueError):
        return _DEFAULT_ALPHA[voice]


def sample_speaker(
    speaker_id: str,
    split: str,
    voice: str,
    rng: np.random.Generator,
    augment: AugmentConfig | None = None,
    warp: tuple[float, float] = (-0.06, 0.06),
) -> Speaker:
    """Draw prosody, vocal tract, loudness, microphone and appearance of one speaker of ``voice``.

    Args:
        augment: the ranges of the microphone EQ (None: a flat microphone).
        warp: range of the HTS all-pass constant around the voice's own.

    Raises:
        KeyError: unknown voice.
    """
    v = VOICES[voice]
    heard = float(rng.uniform(*v.f0_range))
    spread = float(rng.uniform(0.08, 0.25))
    tape = float(rng.uniform(0.88, 1.12))
    rate = float(rng.uniform(0.8, 1.25))
    level = float(rng.uniform(-6.0, 3.0))
    shift = float(rng.uniform(*warp))
    appearance = Appearance.sample(rng)
    channel = Channel.sample(rng, augment) if augment is not None else Channel()
    f0_mean = f0_std = alpha = None
    if v.engine == "diphone":
        f0_mean, f0_std = heard / tape, spread * heard / tape
    elif v.engine == "hts":
        alpha = round(voice_alpha(voice) + shift, 4)
    return Speaker(speaker_id, split, voice, f0_mean, f0_std, rate, tape, level, appearance, alpha, channel)


def sample_engine_speaker(
    speaker_id: str, split: str, key: str, rng: np.random.Generator, augment: AugmentConfig | None = None
) -> Speaker:
    """Draw a speaker of an eSpeak NG or flite voice (``key``: a voice key, see
    :func:`avsr.corpora.synthgrid.engines.parse_voice_key`).

    Raises:
        ValueError: an invalid key or a festival voice.
    """
    engine, voice, variant = parse_voice_key(key)
    if engine == "festival":
        raise ValueError(f"sample_engine_speaker: {key!r} is a festival voice (sample_speaker draws those)")
    tape = float(rng.uniform(0.88, 1.12))
    rate = float(rng.uniform(0.8, 1.25))
    level = float(rng.uniform(-6.0, 3.0))
    pitch, spread = int(rng.integers(25, 76)), int(rng.integers(20, 81))
    heard = float(rng.uniform(0.0, 1.0))
    appearance = Appearance.sample(rng)
    channel = Channel.sample(rng, augment) if augment is not None else Channel()
    f0_mean = f0_std = None
    if engine == "flite" and FLITE_F0_RANGE[voice] is not None:
        low, high = FLITE_F0_RANGE[voice]
        f0 = low + heard * (high - low)
        f0_mean, f0_std = f0 / tape, (0.08 + 0.17 * spread / 100.0) * f0 / tape
    espeak = engine == "espeak-ng"
    return Speaker(speaker_id, split, voice, f0_mean, f0_std, rate, tape, level, appearance, None, channel,
                   engine, variant, pitch if espeak else None, spread if espeak else None)


def _known_voice(key: str) -> bool:
    try:
        engine, voice, _ = parse_voice_key(key)
    except ValueError:
        return False
    return engine != "festival" or voice in VOICES


def make_speakers(
    counts: dict[str, int],
    seed: int,
    voices: dict[str, tuple[str, ...]] | None = None,
    augment: AugmentConfig | None = None,
) -> list[Speaker]:
    """Draw the speakers of every split, deterministically from ``seed``.

    Args:
        counts: split name (a key of :data:`SPLIT_PREFIX`) -> number of speakers (>= 1).
        seed: random seed.
        voices: split -> the voices its speakers cycle through (festival voices or voice keys of other
            engines); a split not given (and every split of :data:`LEGACY_SPLITS`) uses
            :data:`~avsr.corpora.synthgrid.voices.LEGACY_VOICES`.
        augment: microphone EQ ranges for the speakers of the augmented splits (:data:`AUGMENTED_SPLITS`;
            the others, and all with None, get a flat microphone).

    Returns:
        speakers ordered by split (in :data:`SPLIT_PREFIX` order) and index. A split's speakers depend only
        on ``seed``, the split, its voices and their index, not on the other counts.

    Raises:
        ValueError: unknown split or voice, or a count below 1 (names it).
    """
    voices = voices or {}
    unknown = set(counts) - set(SPLIT_PREFIX)
    if unknown:
        raise ValueError(f"unknown speaker split(s) {sorted(unknown)}; known: {list(SPLIT_PREFIX)}")
    speakers = []
    for split_index, (split, prefix) in enumerate(SPLIT_PREFIX.items()):
        if split not in counts:
            continue
        if counts[split] < 1:
            raise ValueError(f"number of {split} speakers must be >= 1, got {counts[split]}")
        legacy = split in LEGACY_SPLITS or split not in voices
        pool = sorted(LEGACY_VOICES) if legacy else list(voices[split])
        if not pool or not all(map(_known_voice, pool)):
            unknown = [v for v in pool if not _known_voice(v)]
            raise ValueError(f"split {split}: unknown or no voices {unknown}; "
                             f"known: {sorted(VOICES)} and the voice keys of avsr.corpora.synthgrid.engines")
        for index in range(counts[split]):
            rng = np.random.default_rng([seed, 1000 + split_index, index])
            voice = pool[(index + split_index) % len(pool)]
            aug = augment if split in AUGMENTED_SPLITS else None
            if legacy:
                speakers.append(sample_legacy_speaker(f"{prefix}{index:03d}", split, voice, rng))
            elif ":" in voice:
                speakers.append(sample_engine_speaker(f"{prefix}{index:03d}", split, voice, rng, aug))
            else:
                speakers.append(sample_speaker(f"{prefix}{index:03d}", split, voice, rng, aug))
    return speakers
