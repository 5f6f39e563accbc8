"""Sequence scores of given hypotheses, and the ranking of an audio-visual n-best list with the model's
single-stream views (``video_weight``, ``audio_weight`` of :class:`avsr.decode.config.DecodeConfig`).

A hybrid CTC/attention model scores a token sequence ``y`` on an encoder output as the joint beam search does
at its end (Watanabe et al. 2017, Sec. III-B; ESPnet's ``BeamSearch``):
``(1 - ctc_weight) * log p_att(y + eos) + ctc_weight * log p_ctc(y) + penalty * (len(y) + 1)``.

A model trained with modality dropout is also a video-only and an audio-only recogniser: the same weights read
one stream when the other's features are zeroed (AV-HuBERT, Shi et al. 2022, Sec. 3.3).
:func:`rescore_with_views` joins the n-best lists of the fused input and of the video-only view and ranks
every candidate by ``s_av + w_v * s_v + w_a * s_a``, a weighted product of the views' sequence probabilities
(a product of experts, as the stream-weighted decision fusion of audio-visual ASR, e.g. Yu et al., "Fusing
information streams in end-to-end audio-visual speech recognition", ICASSP 2021; here the streams are views of
one model and the product is taken over whole hypotheses, whose alignments may differ, not frame by frame).
The weights of an utterance are ``video_weight`` and ``audio_weight`` times how far the fused input rests on
the audio (the mean of the model's audio gate, :meth:`avsr.encoder.AVHubertEncoder.gate_means`): where
the gate has already closed (babble), the fused view is mostly the lips and the single views add little;
where it is open, the lips get a say that the audio cannot overrule alone (clean speech from a voice the
audio path mishears), and the audio alone a say against a fusion that leans on the lips where the audio was
right. The audio-only view adds candidates of its own only with the confidence check (``audio_confidence``,
:class:`avsr.decode.searcher.Searcher`), which searches it. A candidate that a view's own search found keeps
the scores that search gave it; the decoder and CTC score only the others (``own_lists``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from avsr.decode.hypothesis import Hypothesis
from avsr.nn.decoder import TransformerDecoder
from avsr.nn.precision import fp32_context

__all__ = ["Scorer", "sequence_scores", "rescore_with_views"]

#: ``(candidates, index) -> (att, ctc, score)``: :func:`sequence_scores` bound to one view's encoder output.
Scorer = Callable[[list[list[int]], Tensor], tuple[Tensor, Tensor, Tensor]]


def sequence_scores(
    candidates: list[list[int]],
    index: Tensor,
    enc: Tensor,
    enc_lens: Tensor,
    *,
    decoder: TransformerDecoder | None,
    ctc_logp: Tensor | None,
    ctc_weight: float,
    sos: int,
    eos: int,
    blank: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The attention, CTC and weighted scores of ``N`` candidate token sequences, in one batch.

    Args:
        candidates: ``N`` token id lists (no sos/eos/blank); candidate ``n`` belongs to utterance
            ``index[n]``.
        index: ``(N,)`` int64 utterance of each candidate.
        enc: ``(B, T, D)`` float encoder output.  enc_lens: ``(B,)`` int64 valid frames.
        decoder: the attention decoder (None: ``ctc_weight`` must be 1).
        ctc_logp: ``(B, T, V)`` float CTC log-probabilities (None: ``ctc_weight`` must be 0).
        ctc_weight: weight of the CTC score, in [0, 1].
        sos, eos, blank: token ids.

    Returns:
        ``(att, ctc, score)``, each ``(N,)`` float32 on ``enc``'s device: ``log p_att(y + eos)`` (0 when
        ``ctc_weight`` is 1), ``log p_ctc(y)`` (0 when ``ctc_weight`` is 0; ``-inf`` for a sequence longer
        than its frames allow), and ``(1 - ctc_weight) * att + ctc_weight * ctc``.

    Raises:
        ValueError: no candidates, ``index`` of the wrong length, or a part that ``ctc_weight`` needs is
            missing.
    """
    n = len(candidates)
    if n == 0 or index.shape != (n,):
        raise ValueError(f"need N >= 1 candidates and an index of shape (N,), got {n} and "
                         f"{tuple(index.shape)}")
    if ctc_weight < 1 and decoder is None:
        raise ValueError("ctc_weight < 1 needs an attention decoder")
    if ctc_weight > 0 and ctc_logp is None:
        raise ValueError("ctc_weight > 0 needs CTC log-probabilities")
    device = enc.device
    index = index.to(device)
    lens = torch.tensor([len(c) for c in candidates], dtype=torch.long, device=device)
    width = max(1, int(lens.max()))
    tokens = torch.zeros(n, width, dtype=torch.long, device=device)
    for i, c in enumerate(candidates):  # building the padded batch (the scoring below is one batched pass)
        if c:
            tokens[i, : len(c)] = torch.tensor(c, dtype=torch.long, device=device)
    frames = enc_lens.to(device)[index]
    att = torch.zeros(n, device=device)
    ctc = torch.zeros(n, device=device)
    if ctc_weight < 1:
        pos = torch.arange(width + 1, device=device)[None, :]
        ys_in = torch.cat([tokens.new_full((n, 1), sos), tokens], dim=1).masked_fill(pos > lens[:, None], eos)
        ys_out = torch.cat([tokens, tokens.new_zeros(n, 1)], dim=1)
        ys_out = ys_out.scatter(1, lens[:, None], eos)
        # each utterance's keys and values of the encoder output are projected once for all its candidates
        mask = torch.arange(enc.size(1), device=device)[None, :] < enc_lens.to(device)[:, None]
        logits = decoder(ys_in, enc, mask, memory_index=index)
        with fp32_context(device):
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ys_out[..., None])[..., 0]
        att = (logp * (pos <= lens[:, None])).sum(dim=1)
    if ctc_weight > 0:
        with fp32_context(device):
            ctc = -F.ctc_loss(ctc_logp.float()[index].transpose(0, 1), tokens, frames, lens, blank=blank,
                              reduction="none", zero_infinity=False)
    return att, ctc, (1.0 - ctc_weight) * att + ctc_weight * ctc


def rescore_with_views(
    nbest_lists: list[list[list[Hypothesis]]],
    score_av: Scorer,
    views: list[tuple[Tensor, Scorer]],
    *,
    penalty: float = 0.0,
    nbest: int = 1,
    own_lists: Sequence[int | None] | None = None,
) -> list[list[Hypothesis]]:
    """Join n-best lists per utterance and rank the distinct candidates by ``s_av + sum_i w_i * s_i``.

    Args:
        nbest_lists: one or more lists of per-utterance hypotheses over the same ``B`` utterances (the fused
            input's first, then e.g. the video-only view's); their distinct token sequences are the
            candidates.
        score_av: a callable ``(candidates, index) -> (att, ctc, score)`` as :func:`sequence_scores` on the
            fused view's encoder output.
        views: ``(weights (B,) float, scorer)`` per further view (e.g. video-only, audio-only): its
            per-utterance weight ``w_i`` (0: ignored) and its scorer as ``score_av``.
        penalty: the search's length bonus per token (``eos`` included), added once.
        nbest: hypotheses returned per utterance.
        own_lists: per view, the position in ``nbest_lists`` of the list that the view's own beam search
            produced, or None (a view that scores without searching). ``nbest_lists[0]`` is always taken
            as the fused view's own. A candidate in a view's own list keeps the scores that search gave it
            (``score`` less the length bonus, ``att_score``, ``ctc_score``: the same sequence scores, summed
            token by token) and only the other candidates are scored by the view's scorer. None: every view
            scores every candidate.

    Returns:
        Up to ``nbest`` hypotheses per utterance, best first; ``score`` is
        ``s_av + sum_i w_i * s_i + penalty * (len + 1)``, ``att_score`` and ``ctc_score`` are the fused
        view's. An utterance without candidates gets ``[]``.

    Raises:
        ValueError: no lists, or lists or weights that disagree in the number of utterances.
    """
    if not nbest_lists:
        raise ValueError("need at least one n-best list")
    b = len(nbest_lists[0])
    if any(len(lst) != b for lst in nbest_lists) or any(w.shape != (b,) for w, _ in views):
        raise ValueError(f"n-best lists of {[len(lst) for lst in nbest_lists]} utterances and weights of "
                         f"shapes {[tuple(w.shape) for w, _ in views]} must agree")
    own = list(own_lists) if own_lists is not None else [None] * len(views)
    if len(own) != len(views) or any(j is not None and not 0 < j < len(nbest_lists) for j in own):
        raise ValueError(f"own_lists {own} must name, for each of the {len(views)} views, a list "
                         f"1..{len(nbest_lists) - 1} or None")
    candidates: list[list[int]] = []
    owner: list[int] = []
    found: list[dict[int, Hypothesis]] = []  # per candidate: list position -> that list's hypothesis
    for u in range(b):
        seen: dict[tuple[int, ...], int] = {}
        for j, lst in enumerate(nbest_lists):
            for hyp in lst[u]:
                key = tuple(hyp.tokens)
                if key not in seen:
                    seen[key] = len(candidates)
                    candidates.append(list(hyp.tokens))
                    owner.append(u)
                    found.append({})
                found[seen[key]].setdefault(j, hyp)
    if not candidates:
        return [[] for _ in range(b)]
    index = torch.tensor(owner, dtype=torch.long)
    att, ctc, total = _scores_of_view(score_av, 0 if own_lists is not None else None, candidates, index,
                                      found, penalty)
    total = total.clone()
    for (weights, scorer), j in zip(views, own):
        if bool((weights > 0).any()):
            w = weights.to(total)[index.to(total.device)]
            score = _scores_of_view(scorer, j, candidates, index, found, penalty)[2].to(total.device)
            # -inf (a sequence CTC cannot align) as a huge finite score: a weight of 0 then adds 0, not nan
            total += w * score.nan_to_num(neginf=-1e30)
    lens = torch.tensor([len(c) + 1 for c in candidates], dtype=torch.float32, device=total.device)
    total = (total + penalty * lens).cpu()
    att, ctc = att.cpu(), ctc.cpu()
    out: list[list[Hypothesis]] = [[] for _ in range(b)]
    for i in torch.argsort(total, descending=True, stable=True).tolist():
        u = owner[i]
        if len(out[u]) < nbest:
            out[u].append(Hypothesis(candidates[i], float(total[i]), float(att[i]), float(ctc[i])))
    return out


def _scores_of_view(scorer: Scorer, own: int | None, candidates: list[list[int]], index: Tensor,
                    found: list[dict[int, Hypothesis]], penalty: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(att, ctc, score)`` ``(N,)`` of every candidate under one view: from the view's own search where
    the candidate is in list ``own`` (its ``score`` less the length bonus ``penalty * (len + 1)``), from
    ``scorer`` for the rest (all of them when ``own`` is None)."""
    rows = [i for i, f in enumerate(found) if own is None or own not in f]
    if len(rows) == len(candidates):
        return scorer(candidates, index)
    known = [(i, found[i][own]) for i in range(len(candidates)) if own in found[i]]
    at = torch.tensor([i for i, _ in known], dtype=torch.long)
    values = torch.tensor([[h.att_score, h.ctc_score, h.score - penalty * (len(h.tokens) + 1)]
                           for _, h in known], dtype=torch.float32)
    if rows:
        scored = scorer([candidates[i] for i in rows], index[rows])
        device = scored[0].device
    else:
        scored, device = None, torch.device("cpu")
    out = torch.empty(3, len(candidates), dtype=torch.float32, device=device)
    out[:, at.to(device)] = values.T.to(device)
    if scored is not None:
        out[:, torch.tensor(rows, dtype=torch.long, device=device)] = torch.stack([v.float() for v in scored])
    return out[0], out[1], out[2]
