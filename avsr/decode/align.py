"""Word timings of a hypothesis by CTC forced alignment.

The CTC head gives per-frame log-probabilities ``(T, V)`` at the encoder's frame rate (25 Hz for AV-HuBERT:
one frame per video frame). The best CTC path that emits exactly the hypothesis tokens (Viterbi, with
blanks and repeats, Graves et al. 2006) is found by :func:`torchaudio.functional.forced_align`; the frames
of each token are merged into spans (:func:`torchaudio.functional.merge_tokens`), and consecutive tokens
are grouped into words at sentencepiece word boundaries: a piece starting with ``▁`` (U+2581) begins a new
word, as in torchaudio's CTC forced-alignment tutorial and CTC-segmentation (Kürzinger et al., 2020).

A word's time span is from the first frame of its first token to the end of the last frame of its last
token: ``start = first_frame / frame_rate``, ``end = (last_frame + 1) / frame_rate`` seconds, so spans are
ordered, do not overlap and lie within ``[0, T / frame_rate]``. Its score is the mean posterior probability
of its token frames.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "WORD_BOUNDARY",
    "AlignmentError",
    "TokenSpan",
    "WordTiming",
    "ctc_align",
    "group_words",
    "word_timings",
]

#: sentencepiece's word-boundary mark (``▁``, U+2581).
WORD_BOUNDARY = "\u2581"


class AlignmentError(ValueError):
    """The hypothesis cannot be aligned (too many tokens for the frames, blank among them, bad shapes)."""


@dataclass(frozen=True)
class TokenSpan:
    """One token of the aligned path: ``token`` id, frames ``start`` (inclusive) .. ``end`` (exclusive), and
    ``score``: its mean per-frame posterior probability."""

    token: int
    start: int
    end: int
    score: float


@dataclass(frozen=True)
class WordTiming:
    """A word of the hypothesis: its text, ``start`` and ``end`` in seconds, and ``score`` in [0, 1]."""

    word: str
    start: float
    end: float
    score: float

    def to_dict(self) -> dict:
        """JSON-ready ``{"word", "start", "end", "score"}`` (times rounded to ms)."""
        return {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "score": round(self.score, 4),
        }


def ctc_align(log_probs: Tensor, tokens: Sequence[int], blank: int = 0) -> list[TokenSpan]:
    """The frames of each token on the best CTC path that emits ``tokens``.

    Args:
        log_probs: ``(T, V)`` float CTC log-probabilities of one utterance (log-softmax output), no padding.
        tokens: the ``L`` token ids to align (no blank).
        blank: the blank id.

    Returns:
        ``L`` spans in order (an empty list for no tokens).

    Raises:
        AlignmentError: ``log_probs`` is not 2-d, a token is the blank or out of range, or the frames are too
            few (a CTC path needs ``L`` frames plus one per repeated neighbour).
    """
    if log_probs.ndim != 2:
        raise AlignmentError(f"log_probs must be (T, V), got {tuple(log_probs.shape)}")
    tokens = [int(t) for t in tokens]
    if not tokens:
        return []
    num_frames, vocab = log_probs.shape
    bad = [t for t in tokens if t == blank or not 0 <= t < vocab]
    if bad:
        raise AlignmentError(f"tokens must lie in 0..{vocab - 1} and not be the blank {blank}, got {bad[:5]}")
    needed = len(tokens) + sum(a == b for a, b in zip(tokens, tokens[1:]))
    if needed > num_frames:
        raise AlignmentError(
            f"{len(tokens)} tokens need at least {needed} frames, the input has {num_frames}"
        )
    import torchaudio.functional as taf

    lp = log_probs.detach().float().cpu()[None]
    targets = torch.tensor([tokens], dtype=torch.int32)
    path, scores = taf.forced_align(lp, targets, blank=blank)
    spans = taf.merge_tokens(path[0], scores[0].exp(), blank=blank)
    if len(spans) != len(tokens):  # cannot happen for a valid path; guards against API changes
        raise AlignmentError(f"forced alignment gave {len(spans)} spans for {len(tokens)} tokens")
    return [TokenSpan(int(s.token), int(s.start), int(s.end), float(s.score)) for s in spans]


def group_words(
    spans: Sequence[TokenSpan],
    token_list: Sequence[str],
    decode: Callable[[list[int]], str] | None = None,
    frame_rate: float = 25.0,
) -> list[WordTiming]:
    """Group token spans into words at sentencepiece word boundaries.

    Args:
        spans: aligned tokens in order (:func:`ctc_align`).
        token_list: the symbol of every token id (a sentencepiece piece, ``▁`` marking a word start).
        decode: token ids -> text of one word (e.g. a tokenizer's ``decode``); default: the pieces joined
            with ``▁`` removed.
        frame_rate: frames per second of the log-probabilities.

    Returns:
        one :class:`WordTiming` per word (pieces without a word start before the first ``▁`` piece join the
        first word); words whose text is empty (a lone ``▁``) are merged into the next word.
    """
    groups: list[list[TokenSpan]] = []
    for span in spans:
        starts_word = token_list[span.token].startswith(WORD_BOUNDARY)
        if not groups or (
            starts_word and "".join(token_list[s.token] for s in groups[-1]).strip(WORD_BOUNDARY)
        ):
            groups.append([span])
        else:
            groups[-1].append(span)
    words = []
    for group in groups:
        ids = [s.token for s in group]
        text = (
            decode(ids)
            if decode is not None
            else "".join(token_list[i] for i in ids).replace(WORD_BOUNDARY, "")
        )
        frames = sum(s.end - s.start for s in group)
        score = sum(s.score * (s.end - s.start) for s in group) / max(1, frames)
        words.append(WordTiming(text.strip(), group[0].start / frame_rate, group[-1].end / frame_rate, score))
    return words


def word_timings(
    log_probs: Tensor,
    tokens: Sequence[int],
    token_list: Sequence[str],
    blank: int = 0,
    decode: Callable[[list[int]], str] | None = None,
    frame_rate: float = 25.0,
) -> list[WordTiming]:
    """:func:`ctc_align` then :func:`group_words`: the words of ``tokens`` with their times in seconds.

    Raises:
        AlignmentError: see :func:`ctc_align`.
    """
    return group_words(ctc_align(log_probs, tokens, blank), token_list, decode, frame_rate)
