"""Test sets with other lips than the corpus's own (``avsr-lip-sets``).

An audio-visual recogniser must never be worse than its audio alone, whatever the video holds. These sets
measure that on a test set's own audio: each utterance keeps its wav and transcript and gets other video of
the same length:

- ``other_lips``: the mouth of another utterance of another speaker, repeated or cut to the length
  (:func:`avsr.data.dataset.untrusted_video`, as training makes it);
- ``frozen_mouth``: one of the utterance's own frames, held for its whole length (the same);
- ``photo_lips``: the mouth of a real photograph opening and closing with the utterance's own mouth
  (:func:`avsr.data.photo_mouth.photo_mouth`): lips in time with the speech, but of another look than the
  renderer's.

The choices are a function of the seed and the utterance ids only, so the sets are the same on every machine.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_datadir
from avsr.data.dataset import untrusted_video
from avsr.data.media import read_video, write_video
from avsr.data.noise import stable_seed
from avsr.data.photo_mouth import mouth_openness, photo_mouth
from avsr.fileio import settled_media_dir, write_text_atomic

__all__ = ["LIP_SETS", "make_lip_set"]

logger = logging.getLogger("avsr.lip_sets")

#: set suffix -> the video it holds (a kind of :func:`avsr.data.dataset.untrusted_video`, or ``photo_lips``)
LIP_SETS = {"other_lips": "other", "frozen_mouth": "frozen", "photo_lips": "photo_lips"}


def _donor(utts: list[Utterance], i: int, seed: int) -> Utterance:
    """The utterance whose lips utterance ``i`` gets: drawn by the seed and its id among those of another
    speaker (any other one when all share a speaker)."""
    others = [u for u in utts if u.speaker != utts[i].speaker] or [u for j, u in enumerate(utts) if j != i]
    return others[stable_seed(seed, utts[i].utt_id, "other_lips") % len(others)]


def make_lip_set(src: Path, dst: Path, name: str, seed: int = 0, progress: bool = True
                       ) -> list[Utterance]:
    """Write data dir ``dst``: ``src``'s utterances (wav, transcript, speaker) with the video of kind
    ``name`` (a key of :data:`LIP_SETS`) as ``<dst>/media/<utt-id>.mp4`` (25 fps, the source's frame
    count; the source's size, 96x96 for ``photo_lips``).

    ``<dst>/lip_set.json`` records the source and the options: media made from another source or
    with other options are made anew; otherwise an utterance whose mp4 exists is kept (an interrupted run
    resumes). ``<dst>/donors`` lists, for ``other_lips``, ``<utt-id> <donor utt-id>``.

    Returns:
        The new data dir's utterances, sorted by id.

    Raises:
        ValueError: an unknown ``name``.
        DataDirError: a bad source data dir, an utterance without video, or fewer than 2 utterances for
            ``other_lips``.
        avsr.data.media.MediaError: a file cannot be read or written.
    """
    if name not in LIP_SETS:
        raise ValueError(f"untrusted video set must be one of {list(LIP_SETS)}, got {name!r}")
    kind = LIP_SETS[name]
    utts = read_datadir(src)
    missing = [u.utt_id for u in utts if not u.video]
    if missing:
        raise DataDirError(f"{src}: utterance '{missing[0]}' has no video.scp entry")
    if kind == "other" and len(utts) < 2:
        raise DataDirError(f"{src}: other_lips needs at least 2 utterances, got {len(utts)}")
    media = settled_media_dir(dst, {"src": str(src.resolve()), "name": name, "seed": seed}, "lip_set.json")
    out, donors = [], {}
    for i, u in enumerate(tqdm(utts, desc=name, disable=not progress)):
        target = media / f"{u.utt_id}.mp4"
        donor = _donor(utts, i, seed) if kind == "other" else None
        if donor is not None:
            donors[u.utt_id] = donor.utt_id
        if not target.exists():
            video = read_video(u.video)
            if kind == "photo_lips":
                frames = photo_mouth(mouth_openness(video))
            else:
                g = torch.Generator().manual_seed(stable_seed(seed, u.utt_id, name))
                other = read_video(donor.video) if donor is not None else None
                frames = untrusted_video(video, kind, g, other)
            write_video(target, frames.numpy())
        out.append(replace(u, video=str(target)))
    write_datadir(dst, out)
    if donors:
        write_text_atomic(dst / "donors", "".join(f"{k} {v}\n" for k, v in sorted(donors.items())))
    return out
