"""Transcripts from a search's result: the text of each piece's best hypothesis, its word timings and the
facts of its decoding, on the time line of the piece as read.

:class:`TranscriptWriter` turns a :class:`avsr.decode.searcher.SearchResult` into one
:class:`avsr.inference.types.Transcript` per piece for :class:`avsr.inference.Transcriber`: the tokenizer's
text (upper-cased for fairseq tokenizers, as avsr's references), word timings from a CTC forced alignment
(:func:`avsr.decode.align.word_timings`), the gates fusion reported (``info``), the views' own transcripts,
and the edges the piece was given taken back out (:func:`avsr.inference.segments.restore_edges`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from avsr.compat import FairseqTokenizer
from avsr.data.tokenizer import Tokenizer
from avsr.decode.align import AlignmentError, WordTiming, word_timings
from avsr.decode.hypothesis import Hypothesis
from avsr.decode.searcher import SearchResult
from avsr.inference.segments import restore_edges
from avsr.inference.types import Media, Transcript

__all__ = ["TranscriptWriter"]


class TranscriptWriter:
    """Writes the transcripts of a batch of pieces from their search result.

    Args:
        tokenizer: :class:`avsr.data.tokenizer.Tokenizer` or :class:`avsr.compat.FairseqTokenizer` (its
            lower-case text is upper-cased).
        token_list: the symbol of each token id (word timings split the tokens into words by it).
        blank: the CTC blank id.
    """

    def __init__(self, tokenizer: Tokenizer | FairseqTokenizer, token_list: Sequence[str], blank: int
                 ) -> None:
        self.tokenizer, self.token_list, self.blank = tokenizer, list(token_list), blank
        self.upper = isinstance(tokenizer, FairseqTokenizer)

    def text(self, tokens: Sequence[int]) -> str:
        """The words of token ids ``tokens``."""
        text = self.tokenizer.decode(list(tokens))
        return text.upper() if self.upper else text

    def transcripts(self, units: list[Media], result: SearchResult, modality: str, words: bool, views: bool
                    ) -> list[Transcript]:
        """One transcript per piece of ``units`` (the batch ``result`` decoded), on its time line as read.

        Args:
            units: the batch's pieces.  result: their search result.  modality: the modality decoded.
            words: add word timings (``info["words_note"]`` says why there are none, where none).
            views: add the views' own transcripts (:attr:`Transcript.views`) where the search ranked with
                them.
        """
        return [self._transcript(m, j, result, modality, words, views) for j, m in enumerate(units)]

    def _transcript(self, m: Media, j: int, result: SearchResult, modality: str, words: bool, views: bool
                    ) -> Transcript:
        info = {**m.info, **{name: round(float(value[j]), 4) for name, value in result.gates.items()}}
        timings, note = self._words(result, j) if words else (None, None)
        if note is not None:
            info["words_note"] = note
        seen = {name: restore_edges(self._best(m, lists[j], name, m.info), m.change)
                for name, lists in result.views.items()} if views and result.views else None
        return restore_edges(self._best(m, result.hypotheses[j], modality, info, timings, seen), m.change)

    def _best(self, m: Media, hyps: list[Hypothesis], modality: str, info: dict[str, Any],
              words: list[WordTiming] | None = None, views: dict[str, Transcript] | None = None
              ) -> Transcript:
        """The transcript of piece ``m`` from its best hypothesis (if any), before :func:`restore_edges`."""
        best = hyps[0] if hyps else None
        tokens = list(best.tokens) if best is not None else []
        return Transcript(key=m.key, text=self.text(tokens), tokens=tokens,
                          score=float(best.score) if best is not None else math.nan, words=words,
                          modality=modality, num_frames=m.num_frames, info=dict(info), views=views)

    def _words(self, result: SearchResult, j: int) -> tuple[list[WordTiming] | None, str | None]:
        """``(word timings, None)`` of batch item ``j``'s best hypothesis (CTC forced alignment), or
        ``(None, why not)``."""
        if result.ctc_logp is None:
            return None, "the model has no CTC head: no word timings"
        hyps = result.hypotheses[j]
        try:
            frame_logp = result.ctc_logp[j, : int(result.enc_lens[j])].float()
            return word_timings(frame_logp, list(hyps[0].tokens) if hyps else [], self.token_list,
                                blank=self.blank, decode=self.text), None
        except AlignmentError as exc:
            return None, f"no word timings: {exc}"
