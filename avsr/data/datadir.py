"""Kaldi/ESPnet-style data directories for audio-visual corpora.

A data dir holds, sorted by utterance id:

- ``wav.scp``: ``<utt-id> <path to 16 kHz mono wav>``
- ``video.scp``: ``<utt-id> <path to 96x96 grayscale 25 fps mp4>``
- ``text``: ``<utt-id> <TRANSCRIPT>``
- ``utt2spk`` / ``spk2utt``
- ``utt2num_frames`` (optional): ``<utt-id> <number of 25 fps video frames>``

:func:`read_datadir` checks that every file lists the same utterances and names the file and utterance of
any problem; :func:`write_datadir` writes all files atomically; :func:`choose_subset` draws a subset spread
over the speakers (``avsr-subset-data``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from avsr.fileio import write_text_atomic


class DataDirError(ValueError):
    """A data directory is inconsistent; the message names the file and the utterance."""


@dataclass
class Utterance:
    """One entry of a data dir.

    Attributes:
        utt_id: utterance id (starts with the speaker id, Kaldi convention).
        speaker: speaker id.
        wav: path of the 16 kHz mono wav, or None for a video-only corpus.
        video: path of the 25 fps mouth-ROI mp4, or None for an audio-only corpus.
        text: transcript (may be None for unlabeled data).
        num_frames: number of 25 fps frames if known.
    """

    utt_id: str
    speaker: str
    wav: str | None = None
    video: str | None = None
    text: str | None = None
    num_frames: int | None = None
    extra: dict = field(default_factory=dict)


def read_kaldi_map(path: str | os.PathLike, allow_empty_value: bool = False) -> dict[str, str]:
    """Read a Kaldi ``<key> <value...>`` file into an ordered dict.

    Raises:
        DataDirError: a line has no value (unless ``allow_empty_value``), a key repeats, or a line is not
            UTF-8; the message names the file, the line and the key.
    """
    path = Path(path)
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\n")
            except UnicodeDecodeError as e:
                key = raw.split(maxsplit=1)[0].decode("utf-8", errors="replace") if raw.split() else ""
                raise DataDirError(
                    f"{path}:{lineno}: utterance '{key}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                    f"byte {e.start + 1} of the line); convert the file to UTF-8") from None
            if not line.strip():
                continue
            parts = line.split(maxsplit=1)
            key = parts[0]
            value = parts[1].strip() if len(parts) > 1 else ""
            if not value and not allow_empty_value:
                raise DataDirError(f"{path}:{lineno}: utterance '{key}' has an empty value")
            if key in out:
                raise DataDirError(f"{path}:{lineno}: duplicate key '{key}'")
            out[key] = value
    return out


def write_kaldi_map(path: str | os.PathLike, mapping: dict[str, str]) -> None:
    """Write ``<key> <value>`` lines sorted by key, atomically (temporary file + rename)."""
    write_text_atomic(path, "".join(f"{key} {mapping[key]}\n" for key in sorted(mapping)))


def read_datadir(path: str | os.PathLike, require_text: bool = True) -> list[Utterance]:
    """Read and validate a data dir.

    Args:
        path: the directory.
        require_text: every utterance must have a non-empty transcript in ``text``.

    Returns:
        Utterances sorted by id.

    Raises:
        DataDirError: the directory or its ``utt2spk`` is missing, neither ``wav.scp`` nor ``video.scp``
            exists, the files disagree on the utterance list (the message names the file and one utterance),
            or a transcript is empty.
    """
    path = Path(path)
    if not path.is_dir():
        raise DataDirError(f"data dir not found: {path}")
    if not (path / "utt2spk").is_file():
        raise DataDirError(f"{path}: missing utt2spk")
    utt2spk = read_kaldi_map(path / "utt2spk")
    tables: dict[str, dict[str, str]] = {}
    for name in ("wav.scp", "video.scp", "utt2num_frames"):
        if (path / name).is_file():
            tables[name] = read_kaldi_map(path / name)
    if "wav.scp" not in tables and "video.scp" not in tables:
        raise DataDirError(f"{path}: neither wav.scp nor video.scp exists")
    if (path / "text").is_file():
        tables["text"] = read_kaldi_map(path / "text", allow_empty_value=True)
    elif require_text:
        raise DataDirError(f"{path}: missing text")
    for name, table in tables.items():
        missing = [u for u in utt2spk if u not in table]
        extra = [u for u in table if u not in utt2spk]
        if missing:
            raise DataDirError(
                f"{path / name}: utterance '{missing[0]}' of utt2spk is missing ({len(missing)} in all)"
            )
        if extra:
            raise DataDirError(
                f"{path / name}: utterance '{extra[0]}' is not in utt2spk ({len(extra)} in all)"
            )
    utts = []
    for utt_id in sorted(utt2spk):
        text = tables.get("text", {}).get(utt_id)
        if require_text and not (text or "").strip():
            raise DataDirError(f"{path / 'text'}: utterance '{utt_id}' has an empty transcript")
        nf = tables.get("utt2num_frames", {}).get(utt_id)
        utts.append(
            Utterance(
                utt_id=utt_id,
                speaker=utt2spk[utt_id],
                wav=tables.get("wav.scp", {}).get(utt_id),
                video=tables.get("video.scp", {}).get(utt_id),
                text=text,
                num_frames=int(nf) if nf is not None else None,
            )
        )
    return utts


def write_datadir(path: str | os.PathLike, utts: list[Utterance]) -> None:
    """Write ``wav.scp``, ``video.scp``, ``text``, ``utt2spk``, ``spk2utt`` (and ``utt2num_frames`` when every
    utterance knows its length), each atomically and sorted by utterance id.

    Raises:
        DataDirError: duplicate utterance ids, or an utterance id that does not start with its speaker id
            (Kaldi's sorting convention).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for u in utts:
        if u.utt_id in seen:
            raise DataDirError(f"{path}: duplicate utterance id '{u.utt_id}'")
        if not u.utt_id.startswith(u.speaker):
            raise DataDirError(
                f"{path}: utterance id '{u.utt_id}' does not start with its speaker id '{u.speaker}'"
            )
        seen.add(u.utt_id)
    write_kaldi_map(path / "utt2spk", {u.utt_id: u.speaker for u in utts})
    spk2utt: dict[str, list[str]] = {}
    for u in sorted(utts, key=lambda u: u.utt_id):
        spk2utt.setdefault(u.speaker, []).append(u.utt_id)
    write_kaldi_map(path / "spk2utt", {s: " ".join(v) for s, v in spk2utt.items()})
    if any(u.wav for u in utts):
        write_kaldi_map(path / "wav.scp", {u.utt_id: u.wav for u in utts})
    if any(u.video for u in utts):
        write_kaldi_map(path / "video.scp", {u.utt_id: u.video for u in utts})
    if any(u.text is not None for u in utts):
        write_kaldi_map(path / "text", {u.utt_id: u.text or "" for u in utts})
    if all(u.num_frames is not None for u in utts):
        write_kaldi_map(path / "utt2num_frames", {u.utt_id: str(u.num_frames) for u in utts})


def choose_subset(utts: list[Utterance], num: int, seed: int = 0) -> list[Utterance]:
    """``num`` utterances of ``utts``, drawn at random but spread over the speakers.

    One utterance per speaker is taken first (in a random speaker order, as long as ``num`` allows), the
    rest uniformly from the remaining utterances; the result is sorted by utterance id.

    Raises:
        ValueError: ``num`` is not in ``1..len(utts)``.
    """
    import torch  # its generator makes the choice (the same on every machine); not needed by the rest

    if not 1 <= num <= len(utts):
        raise ValueError(f"subset size must lie in 1..{len(utts)}, got {num}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(utts), generator=g).tolist()
    chosen: list[int] = []
    seen: set[str] = set()
    for i in order:  # first utterance of each speaker in the random order
        if len(chosen) < num and utts[i].speaker not in seen:
            seen.add(utts[i].speaker)
            chosen.append(i)
    taken = set(chosen)
    chosen += [i for i in order if i not in taken][: num - len(chosen)]
    return sorted((utts[i] for i in chosen), key=lambda u: u.utt_id)
