"""Sentencepiece tokenizer with ESPnet's token-list convention.

Token ids are ``[<blank>, <unk>, piece_1, ..., piece_n, <sos/eos>]``: 0 is the CTC blank, 1 the unknown
piece, the last id is both start and end of sentence. The sentencepiece model is trained with ``<unk>`` at
id 0 and no bos/eos/pad, so piece ``i`` of the model is token ``i + 1``. :func:`train_tokenizer` trains one
on a data dir's transcripts and writes its token list (``avsr-tokenizer``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import sentencepiece as spm

logger = logging.getLogger("avsr.tokenizer")

BLANK = "<blank>"
SOS_EOS = "<sos/eos>"


class TokenizerError(ValueError):
    """A transcript the tokenizer cannot turn into tokens (empty, or with characters it does not know); the
    message names the utterance (and the file, where known)."""


def train_sentencepiece(
    texts: list[str], model_prefix: str | os.PathLike, vocab_size: int, model_type: str = "unigram"
) -> Path:
    """Train a sentencepiece model on ``texts`` and write ``<model_prefix>.model`` and ``.vocab``.

    Args:
        texts: training sentences (transcripts without utterance ids).
        model_prefix: output path without extension.
        vocab_size: number of pieces including ``<unk>`` (the token list adds ``<blank>`` and ``<sos/eos>``);
            a soft limit (sentencepiece's ``hard_vocab_limit=False``): a small corpus may yield fewer pieces.
        model_type: ``unigram`` (default, as ESPnet and AV-HuBERT's LRS3 recipe), ``bpe``, ``char`` or
            ``word``.

    Returns:
        Path of the ``.model`` file.

    Raises:
        ValueError: no training text.
    """
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("train_sentencepiece: no non-empty training text")
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        input_sentence_size=10_000_000,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


class Tokenizer:
    """Text <-> token ids with a sentencepiece model and ESPnet's token list.

    Args:
        model_path: the sentencepiece ``.model`` file.

    Raises:
        FileNotFoundError: the model file does not exist.
    """

    def __init__(self, model_path: str | os.PathLike):
        model_path = Path(model_path)
        if not model_path.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {model_path}")
        self.model_path = model_path
        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.token_list = [BLANK, *pieces, SOS_EOS]

    @property
    def vocab_size(self) -> int:
        """Number of token ids, blank and sos/eos included."""
        return len(self.token_list)

    @property
    def blank_id(self) -> int:
        return 0

    @property
    def sos_eos_id(self) -> int:
        return len(self.token_list) - 1

    def encode(self, text: str, name: str | None = None, allow_unknown: bool = True) -> list[int]:
        """Transcript -> token ids (no sos/eos).

        Args:
            text: the transcript.
            name: what it is, for error messages (e.g. ``"data/train/text: utterance 'spk-001'"``).
            allow_unknown: whether characters the sentencepiece model does not know may become ``<unk>``
                (id 1); False: they are a :class:`TokenizerError` naming them (training targets).

        Returns:
            ``(L,)`` token ids, ``L >= 1``, each in ``[1, vocab_size - 2]``.

        Raises:
            TokenizerError: ``text`` is empty or blank; with ``allow_unknown=False``, it holds characters
                that become ``<unk>`` (each named with its code point).
        """
        what = name or "transcript"
        if not isinstance(text, str) or not text.strip():
            raise TokenizerError(f"{what}: empty transcript {text!r}: nothing to tokenize")
        ids = [i + 1 for i in self.sp.encode(text)]
        if not allow_unknown and 1 in ids:
            chars = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in self.unknown_chars(text)) or "some"
            raise TokenizerError(f"{what}: characters the tokenizer {self.model_path} cannot encode (they "
                                 f"would become <unk>): {chars}; train the tokenizer on text that has them, "
                                 "or normalise the transcript")
        return ids

    def unknown_chars(self, text: str) -> list[str]:
        """The distinct characters of ``text`` (in order of appearance, spaces left out) that the
        sentencepiece model maps to ``<unk>``."""
        unk = self.sp.unk_id()
        seen: list[str] = []
        for c in text:
            if not c.isspace() and c not in seen and unk in self.sp.encode(c):
                seen.append(c)
        return seen

    def check_texts(self, texts: Mapping[str, str | None], where: str, strict: bool = True) -> str | None:
        """Check transcripts as training targets: each must be non-empty and encode without ``<unk>``
        (:meth:`encode` with ``allow_unknown=False``).

        Args:
            texts: utterance id -> transcript.
            where: their file, for the message (e.g. ``"data/train/text"``).
            strict: raise on the first bad transcript (training targets); False: return the message instead
                for the caller to log (validation text, whose loss may count ``<unk>``; an empty transcript
                is refused either way).

        Returns:
            None when every transcript is fine; with ``strict=False``, the message naming the first
            transcript with characters the model cannot encode and how many there are.

        Raises:
            TokenizerError: the first bad utterance named with ``where`` (and how many are bad in all).
        """
        first, count = None, 0
        for utt_id, text in texts.items():
            if not strict:
                self.encode(text or "", f"{where}: utterance '{utt_id}'")  # empty text is still refused
            try:
                self.encode(text or "", f"{where}: utterance '{utt_id}'", allow_unknown=False)
            except TokenizerError as e:
                first, count = first or e, count + 1
        if first is None:
            return None
        more = f" ({count} utterances of {where} in all)" if count > 1 else ""
        if strict:
            raise TokenizerError(f"{first}{more}")
        return f"{first}{more}"

    def decode(self, ids: list[int]) -> str:
        """Token ids -> transcript; blank and sos/eos ids are dropped."""
        pieces = [i - 1 for i in ids if 0 < i < self.sos_eos_id]
        return self.sp.decode(pieces)


def train_tokenizer(text: str | os.PathLike, out: str | os.PathLike, vocab_size: int = 64,
                    model_type: str = "unigram") -> Tokenizer:
    """Train the sentencepiece tokenizer on the transcripts of a Kaldi text file and write the token list.

    Writes ``<out>/bpe.model``, ``<out>/bpe.vocab`` (:func:`train_sentencepiece`) and ``<out>/tokens.txt``
    (ESPnet token list: ``<blank>``, ``<unk>``, the pieces, ``<sos/eos>``, one per line, atomically), then
    checks that every transcript encodes without ``<unk>``.

    Raises:
        DataDirError: a missing or malformed text file (line and utterance named), or one with no transcript.
        TokenizerError: a transcript that does not encode without ``<unk>`` (named).
    """
    from avsr.data.datadir import DataDirError, read_kaldi_map
    from avsr.fileio import write_text_atomic

    transcripts = read_kaldi_map(text)
    if not transcripts:
        raise DataDirError(f"{text}: no transcripts (<utt-id> <transcript> lines): nothing to train the "
                           "tokenizer on")
    texts = list(transcripts.values())
    model = train_sentencepiece(texts, Path(out) / "bpe", vocab_size, model_type)
    tok = Tokenizer(model)
    tok.check_texts(transcripts, str(text))
    write_text_atomic(Path(out) / "tokens.txt", "\n".join(tok.token_list) + "\n")
    logger.info(
        "%s: %d tokens; example %s -> %s",
        model,
        tok.vocab_size,
        texts[0],
        [tok.token_list[i] for i in tok.encode(texts[0])],
    )
    return tok
