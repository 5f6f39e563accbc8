"""The result type of every search (:mod:`avsr.decode.beam_search`, :mod:`avsr.decode.fairseq_search`).

A module of its own so that the searches share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Hypothesis"]


@dataclass
class Hypothesis:
    """One decoded hypothesis.

    Attributes:
        tokens: token ids without sos/eos (never blank).
        score: total score (log domain, weighted as in :class:`avsr.decode.config.DecodeConfig`, length
            bonus included).
        att_score: ``log p_att(tokens + eos)`` (0 when the decoder is not used).
        ctc_score: ``log p_ctc(tokens)`` (0 when CTC is not used).
    """

    tokens: list[int]
    score: float
    att_score: float
    ctc_score: float
