"""fairseq's ``SequenceGenerator`` beam search (the ``search: fairseq`` mode of the batched beam search).

Reproduces the search AV-HuBERT decodes its sequence-to-sequence models with
(``avhubert/sequence_generator.py``, a copy of fairseq's ``SequenceGenerator`` with ``search.BeamSearch``;
options from ``avhubert/conf/s2s_decode.yaml``), batched over utterances and beams like
:func:`avsr.decode.beam_search.batch_beam_search`:

* ``beam = min(beam_size, V - 1)``; every hypothesis starts with ``</s>`` (fairseq feeds ``eos`` as the first
  decoder input) and its score is the sum of the decoder's log-probabilities;
* at each step ``s`` (``s = 0 .. max_len``): ``<pad>`` is never chosen, ``unkpen`` is subtracted from
  ``<unk>``, at ``s >= max_len`` only ``</s>`` is allowed, and else, while ``s < min_len``, ``</s>`` is
  refused; at ``s = 0`` only the first beam is expanded;
* the ``2 * beam`` best (hypothesis, token) candidates of each utterance are taken (``V - 1`` at step 0,
  ``beam * V - 1`` at most later); a candidate ending in ``</s>`` among the first ``beam`` of them, with a
  finite score, is finished with score ``sum log p / (s + 1) ** lenpen`` (``s + 1`` tokens, ``</s>``
  included; no division when ``normalize_scores`` is false), in candidate order and as long as the utterance
  has fewer than ``beam`` finished hypotheses; the first ``beam`` candidates that are not finite ``</s>``
  candidates become the next beams;
* an utterance stops when it has ``beam`` finished hypotheses, or at step ``max_len``; its hypotheses are
  sorted by score;
* ``max_len = min(int(max_len_a * src_len + max_len_b), max_target_positions - 1)``, one value for the whole
  batch, where ``src_len`` is what the original reads as the source length (see ``src_len`` below).
"""

from __future__ import annotations

import torch
from torch import Tensor

from avsr.decode.hypothesis import Hypothesis
from avsr.nn.decoder import TransformerDecoder

__all__ = ["fairseq_beam_search", "fairseq_max_len"]

NEG_INF = float("-inf")


def fairseq_max_len(src_len: int, max_len_a: float, max_len_b: int, max_target_positions: int) -> int:
    """fairseq's output length limit ``min(int(a * src_len + b), max_target_positions - 1)`` (tokens,
    ``</s>`` excluded)."""
    return min(int(max_len_a * src_len + max_len_b), max_target_positions - 1)


def _checked_max_len(config, src_len: int, max_target_positions: int) -> int:
    """:func:`fairseq_max_len` of ``config``; ValueError when ``min_len`` exceeds it (fairseq's assertion)."""
    max_len = fairseq_max_len(src_len, config.max_len_a, config.max_len_b, max_target_positions)
    if config.min_len > max_len:
        raise ValueError(f"min_len ({config.min_len}) cannot be larger than max_len ({max_len} = "
                         f"min(int(max_len_a * src_len + max_len_b), max_target_positions - 1))")
    return max_len


def _step_log_probs(lprobs: Tensor, step: int, max_len: int, config, eos: int, pad: int | None,
                    unk: int | None) -> Tensor:
    """The decoder's ``(N, V)`` log-probabilities at ``step`` as fairseq's generator uses them: NaN and
    ``<pad>`` impossible, ``unkpen`` subtracted from ``<unk>``, only ``</s>`` at the maximum length and no
    ``</s>`` before ``min_len``. Modifies and returns the (fresh) tensor ``lprobs``."""
    lprobs = lprobs.masked_fill(lprobs.isnan(), NEG_INF)
    if pad is not None:
        lprobs[:, pad] = NEG_INF
    if unk is not None and config.unkpen:
        lprobs[:, unk] -= config.unkpen
    if step >= max_len:
        keep_eos = lprobs[:, eos].clone()
        lprobs.fill_(NEG_INF)
        lprobs[:, eos] = keep_eos
    elif step < config.min_len:
        lprobs[:, eos] = NEG_INF
    return lprobs


def _finish(is_eos: Tensor, cand_scores: Tensor, cand_beams: Tensor, tokens: Tensor, utt_ids: Tensor,
            num_done: Tensor, k: int, step: int, config, finished: list[list[Hypothesis]]) -> Tensor:
    """Move the finite-score ``</s>`` candidates among the first ``k`` of each utterance (``(b, 2k)`` bool
    ``is_eos``) to ``finished``, up to ``k`` per utterance in all, with fairseq's score ``sum log p /
    (step + 1) ** lenpen``; returns the updated ``(b,)`` count of finished hypotheses."""
    fin = is_eos[:, :k]
    rank = fin.long().cumsum(dim=1) - 1
    accept = fin & (rank < (k - num_done)[:, None])
    if not bool(accept.any()):
        return num_done
    rows, cols = accept.nonzero(as_tuple=True)
    parents = rows * k + cand_beams[rows, cols]
    raw = cand_scores[rows, cols]
    norm = raw / (step + 1) ** config.lenpen if config.normalize_scores else raw
    seqs = tokens[parents, 1:].tolist()
    for u, s, a, seq in zip(utt_ids[rows].tolist(), norm.tolist(), raw.tolist(), seqs):
        finished[u].append(Hypothesis(seq, s, a, 0.0))
    return num_done + accept.sum(dim=1)


def _next_beams(is_eos: Tensor, cand_scores: Tensor, cand_beams: Tensor, cand_tokens: Tensor, tokens: Tensor,
                k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The next beams: per utterance the first ``k`` of the ``(b, 2k)`` candidates that are not finished
    (finite-score ``</s>``) ones. Returns ``(parent (b*k,) rows, tokens (b*k, L+1), scores (b*k,))``."""
    b, n_cand = cand_scores.shape
    device = cand_scores.device
    order = is_eos.long() * n_cand + torch.arange(n_cand, device=device)
    active = order.topk(k, dim=1, largest=False).indices  # ascending: candidate order
    parent = (cand_beams.gather(1, active) + torch.arange(b, device=device)[:, None] * k).view(-1)
    new_tokens = cand_tokens.gather(1, active).view(-1)
    scores = cand_scores.gather(1, active).view(-1)
    return parent, torch.cat([tokens[parent], new_tokens[:, None]], dim=1), scores


@torch.no_grad()
def fairseq_beam_search(
    memory: Tensor,
    memory_lens: Tensor,
    config,
    *,
    decoder: TransformerDecoder,
    eos: int,
    pad: int | None = None,
    unk: int | None = None,
    src_len: int | None = None,
) -> list:
    """fairseq ``SequenceGenerator`` beam search over a batch (see the module docstring).

    Args:
        memory: ``(B, T, D)`` encoder output.
        memory_lens: ``(B,)`` int64 valid frames per utterance, each in ``1..T``.
        config: a :class:`avsr.decode.config.FairseqConfig` (``beam_size``, ``nbest``, ``lenpen``,
            ``max_len_a``, ``max_len_b``, ``min_len``, ``unkpen``, ``normalize_scores``).
        decoder: the attention decoder, in eval mode.
        eos: ``</s>`` (also the first decoder input); pad, unk: ``<pad>`` and ``<unk>`` ids, or None.
        src_len: the source length of the ``max_len_a`` rule; the original's generator takes
            ``source['audio'].size(1)`` when audio is given -- the feature dimension, 104, since audio is
            ``(B, F, T)`` -- and the padded number of frames ``T`` otherwise. Default: ``T``.

    Returns:
        For each utterance up to ``config.nbest`` :class:`avsr.decode.hypothesis.Hypothesis`, best first:
        ``tokens`` without ``</s>``, ``score`` the normalised score, ``att_score`` the summed log-probability
        (``unkpen`` included), ``ctc_score`` 0.

    Raises:
        ValueError: ``min_len > max_len`` (as fairseq's assertion) or shapes disagree.
    """

    bsz, t_max = memory.shape[:2]
    if memory_lens.shape != (bsz,):
        raise ValueError(f"memory_lens must be ({bsz},), got {tuple(memory_lens.shape)}")
    device = memory.device
    vocab = decoder.vocab_size
    k = min(config.beam_size, vocab - 1)
    src_len = t_max if src_len is None else src_len
    max_len = _checked_max_len(config, src_len, decoder.cfg.max_target_positions)
    lens = memory_lens.to(device, torch.long)
    mask = torch.arange(t_max, device=device)[None, :] < lens[:, None]
    state = decoder.init_state(memory, mask, group=k)

    scores = torch.zeros(bsz * k, device=device)
    tokens = torch.full((bsz * k, 1), eos, dtype=torch.long, device=device)
    utt_ids = torch.arange(bsz, device=device)
    num_done = torch.zeros(bsz, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    for step in range(max_len + 1):
        b = utt_ids.numel()
        lprobs, state = decoder.step(tokens[:, -1], state)  # (b * k, V), a fresh tensor
        lprobs = _step_log_probs(lprobs, step, max_len, config, eos, pad, unk)
        lp = lprobs.view(b, k, vocab)
        if step == 0:  # all beams hold the same prefix: expand the first only
            flat = lp[:, 0]
        else:
            flat = (lp + scores.view(b, k, 1)).view(b, k * vocab)
        n_cand = min(2 * k, flat.size(1) - 1)
        cand_scores, idx = flat.topk(n_cand, dim=1)
        cand_beams, cand_tokens = idx // vocab, idx % vocab
        is_eos = (cand_tokens == eos) & (cand_scores != NEG_INF)
        num_done = _finish(is_eos, cand_scores, cand_beams, tokens, utt_ids, num_done, k, step, config,
                           finished)
        if step >= max_len:
            break
        done = num_done >= k
        parent, tokens, scores = _next_beams(is_eos, cand_scores, cand_beams, cand_tokens, tokens, k)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            tokens, scores = tokens[rows], scores[rows]
            state = state.select(parent[rows], keep)
            utt_ids, num_done = utt_ids[keep], num_done[keep]
        else:
            state = state.select(parent)
    return [sorted(h, key=lambda x: -x.score)[: config.nbest] for h in finished]

