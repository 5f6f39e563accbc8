"""SynthGRID speakers: a festival voice with its own prosody, loudness and mouth appearance.

A speaker is a voice (:data:`avsr.data.synthgrid.festival.VOICES`) times prosody variants (mean pitch and
pitch range for the diphone voices, speaking rate, "tape speed" which shifts pitch and formants of every
voice) times an :class:`~avsr.data.synthgrid.render.Appearance`. Speakers are drawn per split (train,
valid, test, and the babble sets that are in none of them) with their own ids, so the splits never share a
speaker; voices are cycled within each split so that every split hears every voice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from avsr.data.synthgrid.festival import VOICES, SynthRequest
from avsr.data.synthgrid.render import Appearance

#: split name -> speaker id prefix; ids are ``<prefix><index:03d>`` (fixed width, so Kaldi sorting holds)
SPLIT_PREFIX = {"train": "tr", "valid": "va", "test": "te", "babble_train": "bn", "babble_test": "bt"}


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker.

    Attributes:
        id: speaker id, e.g. ``tr007``.  split: a key of :data:`SPLIT_PREFIX`.  voice: festival voice.
        f0_mean, f0_std: target pitch mean and standard deviation in Hz (None for HTS voices, whose pitch
            only ``tape`` changes).  rate: speaking-rate factor (> 1 faster).  tape: tape-speed factor
            (pitch and formants x tape, durations / tape).  level_db: loudness relative to the corpus level
            (dB).  appearance: the mouth's look.
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

    def request(self, name: str, text: str) -> SynthRequest:
        """The festival request for saying ``text`` as utterance ``name`` in this speaker's voice."""
        _, base_mean, base_std = VOICES[self.voice]
        return SynthRequest(
            name=name,
            text=text,
            voice=self.voice,
            f0_mean=self.f0_mean if self.f0_mean is not None else base_mean,
            f0_std=self.f0_std if self.f0_std is not None else base_std,
            rate=self.rate,
            tape=self.tape,
        )

    def to_dict(self) -> dict:
        """JSON-ready dict (the appearance as a nested dict)."""
        out = asdict(self)
        out["appearance"] = self.appearance.to_dict()
        return out


def sample_speaker(speaker_id: str, split: str, voice: str, rng: np.random.Generator) -> Speaker:
    """Draw prosody, loudness and appearance of one speaker of ``voice``.

    Raises:
        KeyError: unknown voice.
    """
    kind = VOICES[voice][0]
    if kind == "diphone":
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


def make_speakers(counts: dict[str, int], seed: int) -> list[Speaker]:
    """Draw the speakers of every split, deterministically from ``seed``.

    Args:
        counts: split name (a key of :data:`SPLIT_PREFIX`) -> number of speakers (>= 1).
        seed: random seed.

    Returns:
        speakers ordered by split (in :data:`SPLIT_PREFIX` order) and index. A split's speakers depend only
        on ``seed``, the split and their index, not on the other counts.

    Raises:
        ValueError: unknown split or a count below 1 (names it).
    """
    voices = sorted(VOICES)
    speakers = []
    for split_index, (split, prefix) in enumerate(SPLIT_PREFIX.items()):
        if split not in counts:
            continue
        if counts[split] < 1:
            raise ValueError(f"number of {split} speakers must be >= 1, got {counts[split]}")
        for index in range(counts[split]):
            rng = np.random.default_rng([seed, 1000 + split_index, index])
            voice = voices[(index + split_index) % len(voices)]
            speakers.append(sample_speaker(f"{prefix}{index:03d}", split, voice, rng))
    unknown = set(counts) - set(SPLIT_PREFIX)
    if unknown:
        raise ValueError(f"unknown speaker split(s) {sorted(unknown)}; known: {list(SPLIT_PREFIX)}")
    return speakers
