"""LRS3 (Afouras et al., 2018) as AV-HuBERT prepares it: utterances, splits, transcripts, the ROI work list.

LRS3's layout is ``<root>/{pretrain,trainval,test}/<speaker>/<clip>.mp4`` (face videos with audio) with a
``<clip>.txt`` beside each whose first line is ``Text:  TRANSCRIPT`` (two spaces); the ``pretrain`` files
also list word timings after a ``WORD START END ASDSCORE`` header. The facts below follow AV-HuBERT's
``avhubert/preparation/lrs3_prepare.py`` (``make_short_manifest``, ``trim_video_frame``, ``trim_audio``) and
``lrs3_manifest.py``:

* a ``pretrain`` clip whose last word ends before 15 s is kept whole; a longer one is cut at every pause of
  more than 0.4 s between words; a piece starts (ends) half-way between its first (last) word and the
  previous (next) piece's last (first) word, the first piece at 0 s, the last at the clip's end; pieces are
  named ``<clip>_<k>`` (k from 0), their transcript is their words;
* the validation set is a held-out part of ``trainval``: AV-HuBERT's fixed list of 1,200 utterances
  (``avhubert/preparation/data/lrs3-valid.id``, 1,200 ``trainval/<speaker>/<clip>`` ids of 913 speakers:
  utterances drawn across speakers, not held-out speakers), given here as ``valid_ids``; without the list, as
  many utterances drawn at random (seeded) from ``trainval``;
* "30 h" labeled training data is ``trainval`` minus the validation utterances, "433 h" is that plus all
  ``pretrain`` pieces; ``test`` is the test set.

This module writes the corpus layout of :mod:`avsr.bin.prepare_data`: ``<corpus>/<split>/<speaker>/<utt>.txt``
(one upper-case line) with ``<utt> = <speaker>_<clip>[_<k>]``, and the work list of the ROI stage
(``python -m avsr.bin.preprocess_roi --list``): lines ``<src.mp4> <split>/<speaker>/<utt>.mp4`` plus
``<start_s> <end_s>`` for a ``pretrain`` piece (``end_s`` -1: to the end of the clip), which writes the
mp4 and wav beside the transcript.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from avsr.fileio import write_text_atomic

logger = logging.getLogger("avsr.lrs3")

__all__ = [
    "LRS3Error",
    "LRS3Utterance",
    "PARTS",
    "read_transcript",
    "read_word_timings",
    "split_long_clip",
    "scan_part",
    "choose_valid",
    "make_splits",
    "write_corpus",
]

#: LRS3's top-level directories.
PARTS = ("pretrain", "trainval", "test")
#: AV-HuBERT's ``make_short_manifest``: clips longer than this (s, last word end) are cut at pauses ...
MAX_DURATION = 15.0
#: ... longer than this (s).
MIN_PAUSE = 0.4
#: size of AV-HuBERT's validation list (``lrs3-valid.id``).
NUM_VALID = 1200


class LRS3Error(ValueError):
    """The LRS3 directory or one of its files is not as expected; the message names the file (and line)."""


@dataclass(frozen=True)
class LRS3Utterance:
    """One utterance: a whole LRS3 clip or a piece of a long ``pretrain`` clip.

    Attributes:
        part: ``pretrain``, ``trainval`` or ``test``.
        speaker: the speaker directory name (a YouTube id).
        clip: the clip's file stem (``00001``, ``50001``, ...).
        src: the clip's mp4.
        text: upper-case transcript, words separated by single spaces.
        start: start of the utterance in the clip (s).
        end: end in the clip (s), or None for the end of the clip.
        piece: index of the piece of a cut ``pretrain`` clip, None for a whole clip.
        duration: estimated length (s) from the word timings (``pretrain``: the piece's end, or the last
            word's end, minus its start), None when unknown.
    """

    part: str
    speaker: str
    clip: str
    src: Path
    text: str
    start: float = 0.0
    end: float | None = None
    piece: int | None = None
    duration: float | None = None

    @property
    def utt_id(self) -> str:
        """``<speaker>_<clip>`` or ``<speaker>_<clip>_<piece>`` (starts with the speaker id, as Kaldi)."""
        stem = f"{self.speaker}_{self.clip}"
        return stem if self.piece is None else f"{stem}_{self.piece}"

    @property
    def original_id(self) -> str:
        """AV-HuBERT's file id: ``<part>/<speaker>/<clip>`` (``short-pretrain/.../<clip>_<k>`` for pieces)."""
        if self.piece is None:
            return f"{self.part}/{self.speaker}/{self.clip}"
        return f"short-{self.part}/{self.speaker}/{self.clip}_{self.piece}"

    @property
    def trimmed(self) -> bool:
        """Whether the utterance is a piece of its clip (the ROI stage must cut it)."""
        return self.piece is not None and (self.start > 0.0 or self.end is not None)


def _normalise(text: str) -> str:
    return " ".join(text.split()).upper()


def read_transcript(txt: str | os.PathLike) -> str:
    """The transcript of an LRS3 ``.txt`` file: its first line after ``Text:``, upper-case.

    Raises:
        LRS3Error: the file is missing or unreadable, its first line does not start with ``Text:``, or the
            transcript is empty (the message names the file).
    """
    txt = Path(txt)
    try:
        with open(txt, encoding="utf-8") as f:
            first = f.readline()
    except OSError as exc:
        raise LRS3Error(f"cannot read transcript {txt}: {exc}") from exc
    head, sep, text = first.partition(":")
    if not sep or head.strip() != "Text":
        raise LRS3Error(f"{txt}: line 1 must start with 'Text:', got {first.strip()[:60]!r}")
    text = _normalise(text)
    if not text:
        raise LRS3Error(f"{txt}: empty transcript")
    return text


def read_word_timings(txt: str | os.PathLike) -> list[tuple[str, float, float]]:
    """The word timings of an LRS3 ``pretrain`` ``.txt`` file (the lines after ``WORD START END ASDSCORE``).

    Returns:
        ``(WORD, start_s, end_s)`` per word in file order (empty when the file has no ``WORD`` section).

    Raises:
        LRS3Error: a line of the section is not ``word start end score`` with numbers, or a word ends before
            it starts (the message names the file and line).
    """
    txt = Path(txt)
    lines = txt.read_text(encoding="utf-8").splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("WORD")), None)
    if header is None:
        return []
    words = []
    for lineno, line in enumerate(lines[header + 1 :], header + 2):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 4:
                raise ValueError(f"{len(fields)} fields")
            word, start, end = fields[0].upper(), float(fields[1]), float(fields[2])
        except ValueError as exc:
            raise LRS3Error(f"{txt}:{lineno}: expected 'WORD START END SCORE', got {line!r} ({exc})") from exc
        if end < start:
            raise LRS3Error(f"{txt}:{lineno}: word {word!r} ends ({end}) before it starts ({start})")
        words.append((word, start, end))
    return words


def split_long_clip(
    words: Sequence[tuple[str, float, float]],
    max_duration: float = MAX_DURATION,
    min_pause: float = MIN_PAUSE,
) -> list[tuple[str, float, float | None]] | None:
    """Cut a long ``pretrain`` clip at pauses, as AV-HuBERT's ``make_short_manifest``.

    Args:
        words: ``(word, start_s, end_s)`` in time order (:func:`read_word_timings`).
        max_duration: a clip whose last word ends before this (s) is kept whole.
        min_pause: a gap between words longer than this (s) ends a piece.

    Returns:
        None to keep the clip whole; else one ``(text, start_s, end_s)`` per piece, ``end_s`` None for the
        last piece (to the end of the clip); the first piece starts at 0.

    Raises:
        ValueError: words overlap in time (a word starts before the previous one ends).
    """
    if not words or words[-1][2] < max_duration:
        return None
    pieces: list[list[tuple[str, float, float]]] = [[words[0]]]
    for word in words[1:]:
        gap = word[1] - pieces[-1][-1][2]
        if gap < 0:
            raise ValueError(f"word {word[0]!r} starts at {word[1]} before the previous one ends")
        if gap > min_pause:
            pieces.append([word])
        else:
            pieces[-1].append(word)
    out: list[tuple[str, float, float | None]] = []
    for k, piece in enumerate(pieces):
        start = 0.0 if k == 0 else (piece[0][1] + pieces[k - 1][-1][2]) / 2
        end = None if k == len(pieces) - 1 else (piece[-1][2] + pieces[k + 1][0][1]) / 2
        out.append((" ".join(w for w, _, _ in piece), start, end))
    return out


def scan_part(root: str | os.PathLike, part: str) -> list[LRS3Utterance]:
    """The utterances of one LRS3 directory (``pretrain`` clips cut as :func:`split_long_clip`).

    Args:
        root: the LRS3 root (holding ``pretrain``, ``trainval``, ``test``).
        part: one of :data:`PARTS`.

    Returns:
        utterances sorted by utterance id.

    Raises:
        LRS3Error: the directory is missing or holds no ``<speaker>/<clip>.mp4``, a clip has no ``.txt``, a
            transcript or word timing is malformed (file named), or two utterances get the same id.
    """
    if part not in PARTS:
        raise LRS3Error(f"unknown LRS3 part {part!r}; expected one of {PARTS}")
    part_dir = Path(root) / part
    if not part_dir.is_dir():
        raise LRS3Error(f"LRS3 directory not found: {part_dir}")
    utts: list[LRS3Utterance] = []
    for mp4 in sorted(part_dir.glob("*/*.mp4")):
        txt = mp4.with_suffix(".txt")
        if not txt.is_file():
            raise LRS3Error(f"{txt} is missing (its video {mp4} exists)")
        speaker, clip = mp4.parent.name, mp4.stem
        text = read_transcript(txt)
        pieces, words = None, []
        if part == "pretrain":
            try:
                words = read_word_timings(txt)
                pieces = split_long_clip(words)
            except ValueError as exc:
                raise LRS3Error(f"{txt}: {exc}") from exc
        if pieces is None:
            duration = words[-1][2] if part == "pretrain" and words else None
            utts.append(LRS3Utterance(part, speaker, clip, mp4, text, duration=duration))
        else:
            last = words[-1][2]
            utts += [
                LRS3Utterance(
                    part,
                    speaker,
                    clip,
                    mp4,
                    piece_words,
                    start,
                    end,
                    k,
                    (last if end is None else end) - start,
                )
                for k, (piece_words, start, end) in enumerate(pieces)
            ]
    if not utts:
        raise LRS3Error(f"no <speaker>/<clip>.mp4 under {part_dir}")
    _check_unique(utts)
    return sorted(utts, key=lambda u: u.utt_id)


def _check_unique(utts: Iterable[LRS3Utterance]) -> None:
    seen: dict[str, LRS3Utterance] = {}
    for u in utts:
        if u.utt_id in seen:
            raise LRS3Error(
                f"utterance id {u.utt_id} is given to both {seen[u.utt_id].original_id} and {u.original_id}"
            )
        seen[u.utt_id] = u


def choose_valid(
    trainval: Sequence[LRS3Utterance],
    valid_ids: Iterable[str] | None = None,
    num_valid: int = NUM_VALID,
    seed: int = 0,
) -> set[str]:
    """The utterance ids of the validation set, a held-out part of ``trainval``.

    Args:
        trainval: the ``trainval`` utterances.
        valid_ids: AV-HuBERT's list (``trainval/<speaker>/<clip>`` per entry, as ``lrs3-valid.id``), or None.
        num_valid: without a list, how many utterances to draw at random.
        seed: seed of that draw.

    Returns:
        utterance ids (``<speaker>_<clip>``).

    Raises:
        LRS3Error: ``num_valid`` is not in ``1..len(trainval) - 1``, or none of the listed ids is in
            ``trainval`` (a list of another corpus); listed ids that are missing are logged.
    """
    if valid_ids is not None:
        wanted = {v.strip() for v in valid_ids if v.strip()}
        chosen = {u.utt_id for u in trainval if u.original_id in wanted}
        if wanted and not chosen:
            raise LRS3Error(
                f"none of the {len(wanted)} validation ids (e.g. {sorted(wanted)[0]}) is a trainval "
                "utterance of this LRS3 directory"
            )
        if len(chosen) < len(wanted):
            missing = sorted(wanted - {u.original_id for u in trainval})
            logger.warning(
                "%d of %d validation ids are not in trainval (e.g. %s); the validation set has %d",
                len(missing),
                len(wanted),
                missing[:3],
                len(chosen),
            )
        return chosen
    if not 1 <= num_valid < len(trainval):
        raise LRS3Error(
            f"--num-valid must lie in 1..{len(trainval) - 1} (trainval has {len(trainval)} "
            f"utterances), got {num_valid}"
        )
    ids = sorted(u.utt_id for u in trainval)
    return set(random.Random(seed).sample(ids, num_valid))


def make_splits(
    utts: dict[str, list[LRS3Utterance]],
    valid: set[str],
    labeled: str = "30h",
    include_pretrain: bool = False,
    max_seconds: float = 0.0,
) -> dict[str, list[LRS3Utterance]]:
    """The corpus splits, as AV-HuBERT's ``lrs3_manifest.py``.

    Args:
        utts: part -> utterances (:func:`scan_part`); ``pretrain`` needed for ``433h`` or
            ``include_pretrain``.
        valid: the validation utterance ids (:func:`choose_valid`).
        labeled: ``30h`` (labeled training set = trainval minus valid) or ``433h`` (+ pretrain).
        include_pretrain: with ``30h``, also make ``pretrain_all`` = pretrain + the 30 h set (433 h), the
            unlabeled data of AV-HuBERT pretraining.
        max_seconds: leave out of the training sets the utterances whose estimated duration is longer (the
            original's data loader skips utterances over ``max_sample_size``: 500 frames = 20 s in every LRS3
            configuration); 0 keeps all. The number left out is logged.

    Returns:
        ``train``, ``valid``, ``test`` (and ``pretrain_all``): utterances sorted by id.

    Raises:
        LRS3Error: unknown ``labeled``; ``pretrain`` needed but not given; a validation id is not in trainval.
    """
    if labeled not in ("30h", "433h"):
        raise LRS3Error(f"--labeled must be 30h or 433h, got {labeled!r}")
    need_pretrain = labeled == "433h" or include_pretrain
    if need_pretrain and not utts.get("pretrain"):
        raise LRS3Error(f"--labeled {labeled} / --include-pretrain needs the LRS3 pretrain directory")
    trainval = utts["trainval"]
    unknown = valid - {u.utt_id for u in trainval}
    if unknown:
        raise LRS3Error(f"validation ids not in trainval: {sorted(unknown)[:5]}")
    train30 = [u for u in trainval if u.utt_id not in valid]
    pretrain = list(utts.get("pretrain") or [])
    if max_seconds > 0:
        too_long = [u for u in train30 + pretrain if u.duration is not None and u.duration > max_seconds]
        if too_long:
            logger.warning(
                "%d training utterances longer than %g s left out (e.g. %s, %.1f s)",
                len(too_long),
                max_seconds,
                too_long[0].original_id,
                too_long[0].duration,
            )
            drop = {u.utt_id for u in too_long}
            train30 = [u for u in train30 if u.utt_id not in drop]
            pretrain = [u for u in pretrain if u.utt_id not in drop]
    splits = {
        "train": train30 + (pretrain if labeled == "433h" else []),
        "valid": [u for u in trainval if u.utt_id in valid],
        "test": list(utts["test"]),
    }
    if labeled == "30h" and include_pretrain:
        splits["pretrain_all"] = train30 + pretrain
    for name, items in splits.items():
        _check_unique(items)
        splits[name] = sorted(items, key=lambda u: u.utt_id)
    return splits


def _link(target: Path, link: Path) -> None:
    """A relative symlink ``link -> target`` (replaced if it exists)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.lnk")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)


def write_corpus(splits: dict[str, list[LRS3Utterance]], corpus: str | os.PathLike) -> list[str]:
    """Write every transcript ``<corpus>/<split>/<speaker>/<utt>.txt`` and return the ROI work list.

    A ``pretrain_all`` utterance that is also in ``train`` is not processed twice: its ``.txt``, ``.mp4``
    and ``.wav`` in ``pretrain_all`` are relative symlinks to the ``train`` files (the media ones dangle until
    the ROI stage writes their targets). Files are written atomically; running again rewrites the same
    content.

    Returns:
        ROI work-list lines, sorted: ``<src.mp4> <split>/<speaker>/<utt>.mp4`` and, for a cut ``pretrain``
        piece, `` <start_s> <end_s>`` (3 decimals; ``end_s`` -1 to the clip's end).
    """
    corpus = Path(corpus)
    lines = []
    in_train = {u.utt_id for u in splits.get("train", [])}
    for split, utts in splits.items():
        for u in utts:
            rel = Path(split) / u.speaker / u.utt_id
            if split == "pretrain_all" and u.utt_id in in_train:
                for ext in (".txt", ".mp4", ".wav"):
                    _link(corpus / "train" / u.speaker / f"{u.utt_id}{ext}", corpus / rel.with_suffix(ext))
                continue
            (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(corpus / rel.with_suffix(".txt"), u.text + "\n")
            line = f"{u.src.resolve()} {rel.with_suffix('.mp4').as_posix()}"
            if u.trimmed:
                line += f" {u.start:.3f} {-1 if u.end is None else round(u.end, 3):.3f}"
            lines.append(line)
    return sorted(lines)
