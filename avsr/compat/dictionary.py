"""fairseq's target dictionary and the sentencepiece mapping of AV-HuBERT's sequence-to-sequence models.

fairseq ``Dictionary`` (``fairseq/data/dictionary.py``): ids ``<s>=0, <pad>=1, </s>=2, <unk>=3``, then the
entries of ``dict.<label>.txt`` (one ``<symbol> <count>`` per line) in file order. AV-HuBERT's LRS3 dictionary
(``avhubert/preparation/gen_subword.py``) is the list of pieces of a sentencepiece unigram model trained with
``bos=0, pad=1, eos=2, unk=3``, minus those four, in piece-id order -- so dictionary id == sentencepiece id
for that model, but the mapping below goes through the piece strings and works for any sentencepiece model.

Text conventions of the original (``LabelEncoderS2SToken`` in ``avhubert/hubert_pretraining.py``, fairseq's
``SentencepieceBPE`` and ``Dictionary.string``, ``infer_s2s.py``): a transcript is lower-cased, split into
pieces, and each piece looked up (``<unk>`` when absent); a hypothesis drops ``<s>``, ``<pad>`` and ``</s>``,
writes ``<unk>`` for the unknown id, joins the pieces with spaces, then removes the spaces and turns ``▁``
into word breaks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from avsr.compat.safe_load import CheckpointError, PickledDictionary

__all__ = ["FairseqDictionary", "FairseqTokenizer", "SPECIAL_SYMBOLS"]

#: fairseq's special symbols in id order (bos, pad, eos, unk).
SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
WORD_BREAK = "\u2581"


@dataclass
class FairseqDictionary:
    """A fairseq target dictionary: ``symbols[i]`` is the symbol of id ``i``.

    Attributes:
        symbols: all symbols, specials first (``<s>``, ``<pad>``, ``</s>``, ``<unk>``).
        bos, pad, eos, unk: their ids (0, 1, 2, 3 in every AV-HuBERT dictionary).
    """

    symbols: list[str]
    bos: int = 0
    pad: int = 1
    eos: int = 2
    unk: int = 3
    indices: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.indices = {}
        for i, s in enumerate(self.symbols):
            self.indices.setdefault(s, i)

    def __len__(self) -> int:
        return len(self.symbols)

    @classmethod
    def from_pickled(cls, obj: PickledDictionary, where: str) -> FairseqDictionary:
        """From a ``Dictionary`` unpickled as :class:`avsr.compat.safe_load.PickledDictionary`.

        Raises:
            CheckpointError: its ``symbols`` are not a list of strings (names ``where``).
        """
        symbols = getattr(obj, "symbols", None)
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise CheckpointError(f"{where}: the pickled fairseq Dictionary has no list of string symbols")
        ids = {name: getattr(obj, f"{name}_index", default) for name, default in
               (("bos", 0), ("pad", 1), ("eos", 2), ("unk", 3))}
        return cls(list(symbols), **ids)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FairseqDictionary:
        """Read a fairseq ``dict.txt`` (``<symbol> <count> [#fairseq:overwrite]`` per line).

        Raises:
            FileNotFoundError: no such file.
            ValueError: a malformed or duplicated line (names the file and line number).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fairseq dictionary not found: {path}")
        symbols = list(SPECIAL_SYMBOLS)
        seen = set(symbols)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = line.rstrip()
            if not line:
                continue
            overwrite = line.endswith(" #fairseq:overwrite")
            if overwrite:
                line = line[: -len(" #fairseq:overwrite")]
            word, _, count = line.rpartition(" ")
            if not word or not count.lstrip("-").isdigit():
                raise ValueError(f"{path}:{n}: expected '<symbol> <count>', got {line!r}")
            if word in seen and not overwrite:
                raise ValueError(f"{path}:{n}: duplicate symbol {word!r} (fairseq needs #fairseq:overwrite)")
            if word not in seen:
                symbols.append(word)
                seen.add(word)
        return cls(symbols)

    @classmethod
    def from_sentencepiece(cls, sp: spm.SentencePieceProcessor) -> FairseqDictionary:
        """The dictionary AV-HuBERT's ``gen_subword.py`` writes for a sentencepiece model: the four specials,
        then every piece that is not one of them, in piece-id order."""
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        return cls(list(SPECIAL_SYMBOLS) + [p for p in pieces if p not in SPECIAL_SYMBOLS])

    @classmethod
    def placeholder(cls, size: int) -> FairseqDictionary:
        """A dictionary of ``size`` ids whose non-special symbols are unknown (named ``<id_N>``)."""
        return cls(list(SPECIAL_SYMBOLS) + [f"<id_{i}>" for i in range(len(SPECIAL_SYMBOLS), size)])

    def index(self, symbol: str) -> int:
        """Id of ``symbol``, ``unk`` when absent (fairseq ``Dictionary.index``)."""
        return self.indices.get(symbol, self.unk)

    def string(self, ids: list[int]) -> str:
        """fairseq ``Dictionary.string``: symbols joined by spaces; ``bos``, ``pad``, ``eos`` dropped; the
        unknown id written ``<unk>``; ids past the end read as ``<unk>``."""
        out = []
        for i in ids:
            if i in (self.bos, self.pad, self.eos):
                continue
            out.append(self.symbols[self.unk] if i == self.unk or not 0 <= i < len(self) else self.symbols[i])
        return " ".join(out)


class FairseqTokenizer:
    """Text <-> fairseq dictionary ids through a sentencepiece model, as AV-HuBERT's seq2seq models.

    Duck-types :class:`avsr.data.tokenizer.Tokenizer` (``encode``, ``decode``, ``vocab_size``,
    ``token_list``), so the decoding tool takes either.

    Args:
        model: the sentencepiece ``.model`` file, or its bytes.
        dictionary: the model's target dictionary; built from the sentencepiece model (as
            ``gen_subword.py``) when None.

    Raises:
        FileNotFoundError: no such model file.
    """

    def __init__(self, model: str | os.PathLike | bytes, dictionary: FairseqDictionary | None = None) -> None:
        if isinstance(model, (bytes, bytearray)):
            self.sp = spm.SentencePieceProcessor(model_proto=bytes(model))
        else:
            if not Path(model).is_file():
                raise FileNotFoundError(f"sentencepiece model not found: {model}")
            self.sp = spm.SentencePieceProcessor(model_file=str(model))
        if dictionary is None:
            dictionary = FairseqDictionary.from_sentencepiece(self.sp)
        self.dictionary = dictionary

    @property
    def vocab_size(self) -> int:
        """Number of dictionary ids."""
        return len(self.dictionary)

    @property
    def token_list(self) -> list[str]:
        """The dictionary's symbols in id order."""
        return list(self.dictionary.symbols)

    def encode(self, text: str) -> list[int]:
        """Transcript -> dictionary ids (no ``</s>``): lower-cased, sentencepiece pieces, looked up."""
        return [self.dictionary.index(p) for p in self.sp.encode(text.lower(), out_type=str)]

    def decode(self, ids: list[int]) -> str:
        """Dictionary ids -> transcript, as fairseq's ``Dictionary.string`` + ``SentencepieceBPE.decode``."""
        return self.dictionary.string(list(ids)).replace(" ", "").replace(WORD_BREAK, " ").strip()

    def check(self, where: str) -> dict[str, Any]:
        """How many dictionary entries are sentencepiece pieces; raises when none is (a wrong model).

        Raises:
            CheckpointError: no non-special dictionary symbol is a piece of the sentencepiece model.
        """
        pieces = {self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())}
        entries = self.dictionary.symbols[len(SPECIAL_SYMBOLS):]
        found = sum(s in pieces for s in entries)
        if entries and found == 0:
            raise CheckpointError(f"{where}: none of the {len(entries)} dictionary symbols is a piece of the "
                                  "sentencepiece model; wrong --bpemodel?")
        return {"entries": len(entries), "pieces": len(pieces), "entries_in_model": found}
