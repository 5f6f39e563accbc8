"""Pronunciation lexicon: the phone targets of the auxiliary phone CTC loss.

A lexicon is Kaldi's ``lexicon.txt``: one word per line, its phones after it separated by white space
(``BIN b ih n``). Phone ids follow the CTC convention of the token list: 0 is the blank, the phones of the
lexicon, sorted, are ``1..P``. :class:`avsr.models.asr.AVSRModel` with ``phone_ctc_weight > 0`` learns them
beside its tokens (``avsr.bin.train --phone-lexicon``), so the encoder's output must tell phones apart,
which words share (the letter ``B`` and ``BIN``, ``BLUE``, ``BY``), instead of only whole words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from avsr.fileio import write_text_atomic

__all__ = ["LexiconError", "PhoneLexicon"]


class LexiconError(ValueError):
    """A malformed lexicon file (line named) or a transcript word the lexicon lacks (utterance named)."""


class PhoneLexicon:
    """Words -> phone ids.

    Args:
        entries: word -> its phones (one pronunciation per word; words are matched as written in the
            transcripts, e.g. upper case for the SynthGRID corpus).
        name: where the entries come from (a file path), used in error messages.

    Attributes:
        phones: the phone inventory, sorted; phone ``phones[i]`` has id ``i + 1`` (0 is the CTC blank).
        num_classes: ``len(phones) + 1``, the output size of a phone CTC head.

    Raises:
        LexiconError: no entries, a word without phones, or a phone named ``<blank>``.
    """

    def __init__(self, entries: Mapping[str, Sequence[str]], name: str = "lexicon") -> None:
        if not entries:
            raise LexiconError(f"{name}: no entries")
        for word, phones in entries.items():
            if not phones:
                raise LexiconError(f"{name}: word '{word}' has no phones")
        self.name = name
        self.entries = {word: tuple(phones) for word, phones in entries.items()}
        self.phones = sorted({p for phones in self.entries.values() for p in phones})
        if "<blank>" in self.phones:
            raise LexiconError(f"{name}: '<blank>' is the CTC blank, not a phone")
        self._ids = {p: i + 1 for i, p in enumerate(self.phones)}

    @property
    def num_classes(self) -> int:
        """Phones plus the CTC blank."""
        return len(self.phones) + 1

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> PhoneLexicon:
        """Read a Kaldi ``lexicon.txt`` (UTF-8; blank lines and lines starting with ``#`` are skipped).

        Raises:
            FileNotFoundError: no such file.
            LexiconError: a line with a word and no phones, or a word given twice with different phones
                (file and line named).
        """
        entries: dict[str, tuple[str, ...]] = {}
        text = Path(path).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            word, phones = fields[0], tuple(fields[1:])
            if not phones:
                raise LexiconError(f"{path}:{n}: word '{word}' has no phones")
            if entries.get(word, phones) != phones:
                raise LexiconError(f"{path}:{n}: word '{word}' has a second pronunciation "
                                   f"({' '.join(phones)} after {' '.join(entries[word])}); one per word")
            entries[word] = phones
        return cls(entries, name=str(path))

    def write(self, path: str | os.PathLike) -> None:
        """Write the lexicon as a Kaldi ``lexicon.txt`` (atomically; words sorted)."""
        write_text_atomic(path, "".join(f"{w} {' '.join(p)}\n" for w, p in sorted(self.entries.items())))

    def encode(self, text: str, where: str = "transcript") -> list[int]:
        """The phone ids (``1..P``) of the words of ``text``, concatenated (no word boundaries).

        Raises:
            LexiconError: a word of ``text`` that the lexicon lacks (``where``, e.g. the utterance, named).
        """
        ids: list[int] = []
        for word in text.split():
            phones = self.entries.get(word)
            if phones is None:
                raise LexiconError(f"{where}: word '{word}' is not in the phone lexicon {self.name}")
            ids.extend(self._ids[p] for p in phones)
        return ids

    def check_texts(self, texts: Mapping[str, str], where: str) -> None:
        """Raise :class:`LexiconError` naming the first utterance of ``texts`` (utterance id -> transcript)
        with a word the lexicon lacks, and how many utterances have one; ``where`` names the file."""
        bad = [u for u, t in texts.items() if any(w not in self.entries for w in t.split())]
        if bad:
            missing = sorted({w for u in bad for w in texts[u].split() if w not in self.entries})
            raise LexiconError(f"{where}: {len(bad)} utterances have words without a pronunciation in "
                               f"{self.name}, e.g. '{bad[0]}' ({', '.join(missing[:5])})")
