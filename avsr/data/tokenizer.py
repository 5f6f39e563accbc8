"""Sentencepiece tokenizer with ESPnet's token-list convention.

Token ids are ``[<blank>, <unk>, piece_1, ..., piece_n, <sos/eos>]``: 0 is the CTC blank, 1 the unknown
piece, the last id is both start and end of sentence. The sentencepiece model is trained with ``<unk>`` at
id 0 and no bos/eos/pad, so piece ``i`` of the model is token ``i + 1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import sentencepiece as spm

BLANK = "<blank>"
SOS_EOS = "<sos/eos>"


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

    def encode(self, text: str) -> list[int]:
        """Transcript -> token ids (no sos/eos)."""
        return [i + 1 for i in self.sp.encode(text)]

    def decode(self, ids: list[int]) -> str:
        """Token ids -> transcript; blank and sos/eos ids are dropped."""
        pieces = [i - 1 for i in ids if 0 < i < self.sos_eos_id]
        return self.sp.decode(pieces)
