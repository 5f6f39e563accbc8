"""Batched joint CTC/attention beam search, and greedy CTC decoding.

Hybrid decoding of Watanabe et al. (2017), "Hybrid CTC/attention architecture for end-to-end speech
recognition", Sec. III-B (one-pass rescoring with CTC prefix scores), organised as ESPnet's
``BatchBeamSearch`` with ``CTCPrefixScorer`` (``espnet/nets/batch_beam_search.py``, ``beam_search.py``):

* every hypothesis ``h`` carries ``score(h) = (1 - ctc_weight) * log p_att(h) + ctc_weight * log psi_ctc(h)
  + penalty * len(h)`` (``len`` counts ``eos``; ``penalty`` is ESPnet's length bonus);
* one step extends all ``B * beam_size`` running hypotheses of all ``B`` utterances at once: the cached
  decoder scores the next token of every row, the CTC prefix scorer scores either all tokens (full
  scoring) or the ``int(pre_beam_ratio * beam_size)`` best tokens of the attention decoder plus ``eos``
  (partial scoring; ``DecodeConfig.pre_beam`` chooses this pre-beam or ESPnet's exact one), and the
  ``beam_size`` best extensions per utterance are kept;
* extensions ending in ``eos`` move to the utterance's ended hypotheses (the live beam shrinks for that
  step, as in ESPnet); an utterance stops when it has no live hypothesis, when it reaches its maximum
  length, or -- with ``maxlenratio == 0`` -- by ESPnet's ``end_detect`` (the best ended hypotheses of the
  last 3 lengths all scored more than 10 nats below the best one); finished utterances are dropped from
  the batch;
* a hypothesis ends where the speech ends (joint search only; ``DecodeConfig.ctc_end_prob``,
  ``ctc_maxlen_ratio``): the attention decoder of a model that meets input it was not trained on (another
  voice or recording chain, slower speech, long silences) may never want to stop, and a log-linear CTC weight
  of 0.3 cannot hold it back -- an extension that CTC does not support costs only ``0.3 * log psi``, while
  ``eos`` would cost ``0.7 * log p_att(eos)``, so ``eos`` never makes the beam and the hypothesis runs on to
  the maximum length. Two rules from CTC, which is frame-synchronous and cannot loop, stop it: (1) the CTC end
  gate -- once CTC's probability that the prefix ``g`` is complete, ``p_ctc(g) / psi(g)`` (its ``eos``
  score), reaches ``ctc_end_prob``, the input is used up and ``g`` can only take ``eos``; (2) the CTC length
  limit -- no hypothesis is longer than ``ceil(ctc_maxlen_ratio * E[|y|]) + ctc_maxlen_margin`` tokens,
  ``E[|y|]`` being the expected number of labels of the CTC output
  (:func:`avsr.decode.ctc_prefix_score.ctc_expected_label_count`).

Differences from ESPnet, all documented on :class:`DecodeConfig`: a hypothesis that reaches the maximum
length gets the score of ``eos`` (ESPnet appends ``eos`` unscored); hypotheses shorter than the minimum
length cannot take ``eos`` (ESPnet drops them after the fact); blank is never emitted, even with
``ctc_weight == 0``; partial scoring always scores ``eos`` too and keeps ``eos`` and blank out of the
pre-beam (unless ``pre_beam`` is ``espnet`` or ``espnet_nonbatch``); the CTC end gate and length limit (off by
default with ``pre_beam`` ``espnet`` or ``espnet_nonbatch``, which reproduce ESPnet).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from avsr.decode.config import DecodeConfig, SearchConfig, load_decode_config
from avsr.decode.ctc_prefix_score import CTCPrefixScorer, ctc_expected_label_count
from avsr.decode.fairseq_search import fairseq_beam_search
from avsr.decode.hypothesis import Hypothesis
from avsr.nn.decoder import TransformerDecoder

__all__ = ["DecodeConfig", "Hypothesis", "JointSearch", "batch_beam_search", "ctc_greedy_decode",
           "load_decode_config"]  # DecodeConfig and load_decode_config: from avsr.decode.config

NEG_INF = float("-inf")
END_DETECT_M = 3  # ESPnet end_detect: number of recent lengths checked
END_DETECT_D = -10.0  # ESPnet end_detect: log(1 * exp(-10))


def _max_min_lengths(lens: Tensor, cfg: DecodeConfig) -> tuple[Tensor, Tensor]:
    """Per-utterance maximum and minimum output lengths ``(B,)`` int64 (ESPnet's rules)."""
    if cfg.maxlenratio == 0:
        maxlen = lens.clone()
    elif cfg.maxlenratio < 0:
        maxlen = torch.full_like(lens, -int(cfg.maxlenratio))
    else:
        maxlen = (cfg.maxlenratio * lens.double()).long().clamp(min=1)
    return maxlen, (cfg.minlenratio * lens.double()).long()


def _end_detect(best_by_len: Tensor, i: int) -> Tensor:
    """ESPnet ``end_detect`` per utterance: True where, for each of the last ``M`` lengths checked at step
    ``i`` (ESPnet's ``len(yseq) in {i, i-1, i-2}``, i.e. ``i-2 .. i-4`` tokens), some hypothesis ended with
    a score more than ``|D|`` below the best ended one. ``best_by_len``: ``(B, L)``; returns ``(B,)`` bool."""
    best = best_by_len.max(dim=1).values
    count = torch.zeros_like(best, dtype=torch.long)
    for m in range(END_DETECT_M):
        length = i - m - 2
        if 0 <= length < best_by_len.size(1):
            at = best_by_len[:, length]
            count += (at.isfinite() & (at - best < END_DETECT_D)).long()
    return count == END_DETECT_M


def _pre_beam_ids(att: Tensor, config: DecodeConfig, pre_beam: int, eos: int, blank: int
                  ) -> tuple[Tensor, Tensor | None]:
    """The token ids that CTC scores in partial scoring, per running hypothesis (``config.pre_beam``).

    Args:
        att: ``(N, V)`` float attention log-probabilities of the next token of each running hypothesis.
        config: search options (``pre_beam``, ``ctc_weight``, ``penalty``).
        pre_beam: pre-beam size ``int(pre_beam_ratio * beam_size)``, ``< V - 1``.
        eos, blank: token ids.

    Returns:
        ``(ids, extra_eos)``: ``ids`` ``(N, pre_beam + 1)`` int64 with ``eos`` in the last column;
        ``extra_eos`` ``(N,)`` bool, True where that last column repeats an ``eos`` already in the pre-beam
        (ESPnet's modes; the repeat must not be a second candidate), or None (``avsr``). With
        ``espnet_nonbatch`` the caller allows the last column only at the maximum length.

    Source: ``BatchBeamSearch.search`` / ``BeamSearch.search`` of ESPnet
    (``espnet/nets/batch_beam_search.py``,
    ``beam_search.py``): ``torch.topk(weighted_scores, pre_beam_size)`` over the whole vocabulary, where
    ``weighted_scores`` sums the weighted full scorers (decoder, then length bonus) in that order.
    """
    n = att.size(0)
    if config.pre_beam == "avsr":
        vocab = torch.arange(att.size(1), device=att.device)
        ids = att.masked_fill((vocab == eos) | (vocab == blank), NEG_INF).topk(pre_beam).indices
        return torch.cat([ids, ids.new_full((n, 1), eos)], dim=1), None
    # ESPnet's pre-beam score: 0 + (1 - ctc_weight) * att, + penalty * 1 -- the same float32 operations, so
    # that ties (and hence topk's choice) fall as in ESPnet
    weighted = torch.zeros_like(att)
    weighted += (1.0 - config.ctc_weight) * att
    weighted += config.penalty * torch.ones_like(att)
    ids = weighted.topk(pre_beam).indices
    return torch.cat([ids, ids.new_full((n, 1), eos)], dim=1), (ids == eos).any(dim=1)


@torch.no_grad()
def batch_beam_search(
    memory: Tensor,
    memory_lens: Tensor,
    config: SearchConfig,
    *,
    decoder: TransformerDecoder | None,
    ctc_logp: Tensor | None,
    sos: int,
    eos: int,
    blank: int = 0,
    pad: int | None = None,
    unk: int | None = None,
    src_len: int | None = None,
) -> list[list[Hypothesis]]:
    """Joint CTC/attention beam search over a batch of utterances (or, with ``config.search == "fairseq"``,
    fairseq's beam search: :func:`avsr.decode.fairseq_search.fairseq_beam_search`).

    Args:
        memory: ``(B, T, D)`` encoder output (the decoder's cross-attention input).
        memory_lens: ``(B,)`` int64 valid frames per utterance, each in ``1..T``.
        config: search options.
        decoder: the attention decoder (put in eval mode by the caller); None only when
            ``config.ctc_weight == 1``.
        ctc_logp: ``(B, T, V)`` CTC log-probabilities; None only when ``config.ctc_weight == 0``.
        sos, eos, blank: token ids (``sos == eos == V - 1`` and ``blank == 0`` in avsr; ``sos == eos == 2``
            and ``blank == 0`` for fairseq dictionaries).
        pad: a token never emitted (fairseq's ``<pad>``), or None.
        unk, src_len: fairseq mode only (``<unk>`` for ``unkpen``; the source length of ``max_len_a``).

    Returns:
        For each utterance, up to ``config.nbest`` hypotheses, best first. An utterance whose hypotheses
        all became impossible (score ``-inf``) gets an empty list and a :class:`RuntimeWarning`.

    Raises:
        ValueError: a scorer needed by ``ctc_weight`` is missing, or shapes disagree.
    """
    if config.search == "fairseq":
        if decoder is None:
            raise ValueError("search 'fairseq' needs an attention decoder, but the model has none")
        if sos != eos:
            raise ValueError(
                f"search 'fairseq' starts hypotheses with eos: sos ({sos}) must equal eos ({eos})"
            )
        return fairseq_beam_search(memory, memory_lens, config, decoder=decoder, eos=eos, pad=pad, unk=unk,
                                   src_len=src_len)
    search = JointSearch(config, decoder, ctc_logp, sos=sos, eos=eos, blank=blank, pad=pad)
    return search.run(memory, memory_lens)


@dataclass
class _Candidates:
    """The scored extensions of the ``N`` running hypotheses at one step.

    Attributes:
        ids: ``(N, C)`` int64 candidate tokens (the whole vocabulary, or the pre-beam plus ``eos``).
        att: ``(N, V)`` float attention log-probabilities of the next token (zeros without a decoder).
        att_c, ctc_c: ``(N, C)`` float attention and CTC scores of the candidates (CTC: ``log psi(g + c) -
            log psi(g)``).
        psi: ``(N, C)`` float ``log psi(g + c)`` (what the CTC state keeps for the chosen extensions).
        total: ``(N, C)`` float score of each extended hypothesis, ``-inf`` where the rules refuse it.
        extra_eos: ``(N,)`` bool or None: the appended ``eos`` column repeats an ``eos`` of the pre-beam.
    """

    ids: Tensor
    att: Tensor
    att_c: Tensor
    ctc_c: Tensor
    psi: Tensor
    total: Tensor
    extra_eos: Tensor | None


class JointSearch:
    """The batched joint CTC/attention beam search of one configuration over one batch (see the module
    docstring); :func:`batch_beam_search` is its entry point.

    Each step has four named phases over the ``N = b * beam_size`` running hypotheses of the ``b``
    utterances still searched: :meth:`_candidates` (the decoder's and CTC's scores of every extension),
    :meth:`_refuse` (the rules: blank and pad never, ``eos`` only between the minimum and maximum length, the
    CTC end gate, impossible parents), :meth:`_select` (the ``beam_size`` best extensions per utterance, ended
    ones moved aside, the scorers' states following the kept rows) and :meth:`_prune` (finished utterances
    dropped from the batch).

    Args:
        config: search options (``config.search`` must be ``espnet``).
        decoder: the attention decoder, or None when ``ctc_weight == 1``.
        ctc_logp: ``(B, T, V)`` CTC log-probabilities, or None when ``ctc_weight == 0``.
        sos, eos, blank, pad: token ids (``pad``: never emitted, or None).

    Raises:
        ValueError: a scorer needed by ``ctc_weight`` is missing.
    """

    def __init__(self, config: DecodeConfig, decoder: TransformerDecoder | None, ctc_logp: Tensor | None, *,
                 sos: int, eos: int, blank: int = 0, pad: int | None = None) -> None:
        w = config.ctc_weight
        self.use_att, self.use_ctc = w < 1.0, w > 0.0
        if self.use_att and decoder is None:
            raise ValueError(f"ctc_weight={w} < 1 needs an attention decoder, but the model has none")
        if self.use_ctc and ctc_logp is None:
            raise ValueError(f"ctc_weight={w} > 0 needs a CTC head, but the model has none")
        self.config, self.decoder, self.ctc_logp = config, decoder, ctc_logp
        self.sos, self.eos, self.blank, self.pad = sos, eos, blank, pad
        self.k = config.beam_size
        self.vocab = decoder.vocab_size if self.use_att else ctc_logp.size(-1)
        self.pre_beam = int(config.pre_beam_ratio * self.k)
        # ESPnet pre-beams while pre_beam < V; ours leaves out eos and blank, so it needs pre_beam < V - 1
        self.partial = (self.use_att and self.use_ctc and config.ctc_scoring == "partial"
                        and self.pre_beam < (self.vocab - 1 if config.pre_beam == "avsr" else self.vocab))
        end_prob, self.maxlen_ratio = config.ctc_end_rules()
        self.gate = self.use_att and self.use_ctc and end_prob < 1.0
        self.log_end_prob = math.log(end_prob)

    def run(self, memory: Tensor, memory_lens: Tensor) -> list[list[Hypothesis]]:
        """Search ``memory`` ``(B, T, D)`` with ``memory_lens`` ``(B,)``; returns up to ``nbest`` hypotheses
        per utterance, best first (see :func:`batch_beam_search`).

        Raises:
            ValueError: shapes disagree.
        """
        self._start(memory, memory_lens)
        while self.utt_ids.numel() > 0:
            cand = self._candidates()
            self._refuse(cand)
            self._select(cand)
            self._prune()
        return self._results()

    def _start(self, memory: Tensor, memory_lens: Tensor) -> None:
        """Check the shapes; set the lengths, the scorers' initial states and one empty hypothesis per
        utterance."""
        bsz, t_max = memory.shape[:2]
        if memory_lens.shape != (bsz,):
            raise ValueError(f"memory_lens must be ({bsz},), got {tuple(memory_lens.shape)}")
        if self.use_ctc and self.ctc_logp.shape != (bsz, t_max, self.vocab):
            raise ValueError(f"ctc_logp must be ({bsz}, {t_max}, {self.vocab}), "
                             f"got {tuple(self.ctc_logp.shape)}")
        k, device = self.k, memory.device
        self.device = device
        lens = memory_lens.to(device, torch.long)
        self.maxlen, self.minlen = self._length_limits(lens)
        mask = torch.arange(t_max, device=device)[None, :] < lens[:, None]
        self.dec_state = self.decoder.init_state(memory, mask, group=k) if self.use_att else None
        self.ctc = (CTCPrefixScorer(self.ctc_logp, lens, group=k, blank=self.blank, eos=self.eos)
                    if self.use_ctc else None)
        self.ctc_state = self.ctc.init_state() if self.use_ctc else None
        n = bsz * k
        score = torch.zeros(bsz, k, device=device)
        score[:, 1:] = NEG_INF  # all beams start as the same empty hypothesis: keep one
        self.score = score.view(n)
        self.att_cum = torch.zeros(n, device=device)
        self.ctc_cum = torch.zeros(n, device=device)
        self.yseq = torch.full((n, 1), self.sos, dtype=torch.long, device=device)
        self.utt_ids = torch.arange(bsz, device=device)  # original index of each utterance still searched
        self.best_by_len = torch.full((bsz, int(self.maxlen.max()) + 1), NEG_INF, device=device)
        self.ended: list[list[Hypothesis]] = [[] for _ in range(bsz)]
        self.all_tokens = torch.arange(self.vocab, device=device)
        self.i = 0

    def _length_limits(self, lens: Tensor) -> tuple[Tensor, Tensor]:
        """Per-utterance ``(maxlen, minlen)`` ``(B,)`` int64: ESPnet's rules, and in joint search the CTC
        length limit (no longer than what the input holds)."""
        maxlen, minlen = _max_min_lengths(lens, self.config)
        if self.use_att and self.use_ctc and self.maxlen_ratio > 0:
            eos = self.eos if self.eos != self.blank else None
            expected = ctc_expected_label_count(self.ctc_logp, lens, blank=self.blank, eos=eos)
            limit = torch.ceil(self.maxlen_ratio * expected).long() + self.config.ctc_maxlen_margin
            maxlen = torch.minimum(maxlen, torch.maximum(limit, minlen))
        return maxlen, minlen

    def _candidates(self) -> _Candidates:
        """Phase 1: the decoder scores the next token of every running hypothesis; CTC scores the whole
        vocabulary or the pre-beam (partial scoring); ``total`` is each extension's joint score."""
        n, w = self.score.numel(), self.config.ctc_weight
        if self.use_att:
            att, self.dec_state = self.decoder.step(self.yseq[:, -1], self.dec_state)
        else:
            att = torch.zeros(n, self.vocab, device=self.device)
        extra_eos = None
        if self.partial:
            ids, extra_eos = _pre_beam_ids(att, self.config, self.pre_beam, self.eos, self.blank)
        else:
            ids = self.all_tokens.expand(n, -1)
        att_c = att.gather(1, ids) if self.partial else att
        if self.use_ctc:
            psi = self.ctc.score(self.ctc_state, ids if self.partial else None)
            ctc_c = psi - self.ctc_state.psi[:, None]
        else:
            psi = ctc_c = torch.zeros_like(att_c)
        total = self.score[:, None] + ((1.0 - w) * att_c + w * ctc_c + self.config.penalty)
        return _Candidates(ids, att, att_c, ctc_c, psi, total, extra_eos)

    def _refuse(self, cand: _Candidates) -> None:
        """Phase 2: the rules, as ``-inf`` in ``cand.total``: blank and pad are never emitted; ``eos`` not
        before the minimum length; only ``eos`` at the maximum length or once the CTC end gate says the
        input is used up -- such a hypothesis ends at once, outside the beam (:meth:`_finish`)."""
        ids, i, n = cand.ids, self.i, self.score.numel()
        is_eos = ids == self.eos
        rows_utt = torch.arange(n, device=self.device) // self.k
        refuse = (ids == self.blank) & (self.blank != self.eos)
        if self.pad is not None:
            refuse |= ids == self.pad
        refuse |= is_eos & (i < self.minlen)[rows_utt, None]
        at_end = (i >= self.maxlen)[rows_utt]  # (n,) bool: only eos is left
        used_up = None
        if self.gate:  # CTC end gate: log p_ctc(g) - log psi(g) (eos's CTC score) says the input is used up
            end_logp = cand.ctc_c.masked_fill(~is_eos, NEG_INF).amax(dim=1)
            used_up = (end_logp >= self.log_end_prob) & (i >= self.minlen)[rows_utt] & self.score.isfinite()
            at_end = at_end | used_up
        refuse |= ~is_eos & at_end[:, None]
        refuse |= ~self.score.isfinite()[:, None]
        if cand.extra_eos is not None:
            refuse[:, -1] |= cand.extra_eos
            if self.config.pre_beam == "espnet_nonbatch":  # eos outside the pre-beam only at the end
                refuse[:, -1] |= ~at_end
        cand.total = cand.total.masked_fill(refuse, NEG_INF)
        if used_up is not None and bool(used_up.any()):
            # a hypothesis that CTC says is complete ends now, outside the beam: its eos, which pays the
            # decoder's eos score at once, must not compete for a slot with extensions that pay it later
            rows = used_up.nonzero().squeeze(1)
            eos_total = cand.total[rows].masked_fill(~is_eos[rows], NEG_INF).amax(dim=1)
            self._finish(rows, eos_total, self.att_cum[rows] + cand.att[rows, self.eos],
                         self.ctc_cum[rows] + end_logp[rows], self.yseq[rows, 1:])
            cand.total[rows] = NEG_INF

    def _select(self, cand: _Candidates) -> None:
        """Phase 3: the ``beam_size`` best extensions per utterance become the running hypotheses; those
        ending in ``eos`` move to the ended ones; the decoder and CTC states follow the kept rows."""
        b, k = self.utt_ids.numel(), self.k
        c = cand.total.size(1)
        top, idx = cand.total.view(b, k * c).topk(k, dim=1)
        parent = (idx // c + torch.arange(b, device=self.device)[:, None] * k).view(-1)
        col = (idx % c).view(-1)
        token = cand.ids[parent, col]
        self.score = top.view(-1)
        self.att_cum = self.att_cum[parent] + cand.att_c[parent, col]
        self.ctc_cum = self.ctc_cum[parent] + cand.ctc_c[parent, col]
        self.yseq = torch.cat([self.yseq[parent], token[:, None]], dim=1)
        done_rows = (token == self.eos) & self.score.isfinite()
        if bool(done_rows.any()):
            rows = done_rows.nonzero().squeeze(1)
            self._finish(rows, self.score[rows], self.att_cum[rows], self.ctc_cum[rows],
                         self.yseq[rows, 1:-1])
        self.score = self.score.masked_fill(token == self.eos, NEG_INF)
        if self.use_att:
            self.dec_state = self.dec_state.select(parent)
        if self.use_ctc:
            self.ctc_state = self.ctc.extend(self.ctc_state, parent, token, cand.psi[parent, col])

    def _prune(self) -> None:
        """Phase 4: utterances with no running hypothesis, at their maximum length or (``maxlenratio == 0``)
        stopped by ESPnet's end detection leave the batch, with their rows of every state."""
        b, k, i = self.utt_ids.numel(), self.k, self.i
        done = ~self.score.view(b, k).isfinite().any(dim=1) | (i >= self.maxlen)
        if self.config.maxlenratio == 0:
            done |= _end_detect(self.best_by_len, i)
        self.i += 1
        if not bool(done.any()):
            return
        keep = (~done).nonzero().squeeze(1)
        rows = (keep[:, None] * k + torch.arange(k, device=self.device)).view(-1)
        self.score, self.att_cum = self.score[rows], self.att_cum[rows]
        self.ctc_cum, self.yseq = self.ctc_cum[rows], self.yseq[rows]
        self.utt_ids, self.maxlen, self.minlen = self.utt_ids[keep], self.maxlen[keep], self.minlen[keep]
        self.best_by_len = self.best_by_len[keep]
        if self.use_att:
            self.dec_state = self.dec_state.select(rows, keep)
        if self.use_ctc:
            self.ctc, self.ctc_state = self.ctc.select(keep), self.ctc_state.select(rows)

    def _finish(self, rows: Tensor, s: Tensor, a: Tensor, cs: Tensor, seqs: Tensor) -> None:
        """Hypotheses ``seqs`` (``(R, i)``, sos and eos left out) of rows ``rows`` ended at this step with
        total, attention and CTC scores ``s``, ``a``, ``cs`` (``(R,)`` each); impossible ones are left out."""
        ok = s.isfinite()
        rows, s, a, cs, seqs = rows[ok], s[ok], a[ok], cs[ok], seqs[ok]
        self.best_by_len[:, self.i].scatter_reduce_(0, rows // self.k, s, reduce="amax")
        utts = self.utt_ids[rows // self.k].tolist()
        for u, *hyp in zip(utts, seqs.tolist(), s.tolist(), a.tolist(), cs.tolist()):
            self.ended[u].append(Hypothesis(*hyp))

    def _results(self) -> list[list[Hypothesis]]:
        """Up to ``nbest`` ended hypotheses per utterance, best first (warns for an utterance with none)."""
        results = []
        for u, hyps in enumerate(self.ended):
            if not hyps:
                warnings.warn(
                    f"beam search: utterance {u} of the batch ended with no finite-score hypothesis",
                    RuntimeWarning,
                    stacklevel=4,  # the caller of batch_beam_search
                )
            results.append(sorted(hyps, key=lambda h: -h.score)[: self.config.nbest])
        return results


def ctc_greedy_decode(logp: Tensor, lengths: Tensor, blank: int = 0) -> list[list[int]]:
    """Best-path CTC decoding: frame-wise argmax, repeats merged, blanks removed.

    Source: Graves et al. (2006), Sec. 3.2 (best path decoding).

    Args:
        logp: ``(B, T, V)`` CTC (log-)probabilities or logits.
        lengths: ``(B,)`` valid frames per utterance.
        blank: blank id.

    Returns:
        Token ids per utterance.
    """
    best = logp.argmax(dim=-1)  # (B, T)
    t = torch.arange(best.size(1), device=best.device)
    prev = torch.cat([best.new_full((best.size(0), 1), -1), best[:, :-1]], dim=1)
    keep = (best != blank) & (best != prev) & (t[None, :] < lengths.to(best.device)[:, None])
    return [row[m].tolist() for row, m in zip(best, keep)]
