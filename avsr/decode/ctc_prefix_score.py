"""Batched CTC prefix scoring for joint CTC/attention decoding, vectorised over time, hypotheses and tokens.

The CTC prefix probability ``psi(h) = p_ctc(h ... | x)`` of a hypothesis ``h = g + c`` (the probability that
the CTC label sequence of ``x`` starts with ``h``) follows Watanabe et al. (2017), "Hybrid CTC/attention
architecture for end-to-end speech recognition", Sec. III-B and Algorithm 2, with the semantics of ESPnet's
``CTCPrefixScoreTH`` (``espnet/nets/ctc_prefix_score.py``): log domain; ``r^n_t(g)`` / ``r^b_t(g)`` are the
probabilities of the prefix ``g`` over frames ``0..t`` with the last frame on a label / on blank;
``phi_t = r^n_t(g) + r^b_t(g)``, or ``r^b_t(g)`` alone when ``c`` repeats the last label of ``g``;
``psi(g + c) = sum_t phi_{t-1} * y^c_t`` (``phi_{-1} = 1`` for the empty ``g``); ``psi(g + eos) =
r^n_{T-1}(g) + r^b_{T-1}(g)``, the full CTC probability of ``g``; blank is never a label (``psi = -inf``).

Unlike ESPnet, no Python loop over frames is needed:

* ``psi(g + c)`` is a sum over frames, computed for all candidates ``c`` at once as a float64 matrix product
  of ``exp(log phi_{t-1} - max_t)`` with ``exp(log y^c_t - max_t)`` (both in ``[0, 1]``); a candidate whose
  ``psi`` lies more than ~700 nats below those maxima underflows to ``-inf`` (it could never be chosen).
* the recursions ``r^n_t = (r^n_{t-1} + phi_{t-1}) y^c_t`` and ``r^b_t = (r^n_{t-1} + r^b_{t-1}) y^blank_t``
  are first-order linear recurrences, solved in closed form with cumulative sums: with
  ``C_t = sum_{u<=t} log y^c_u``, ``log r^n_t = C_t + logcumsumexp_{s<=t}(log phi_{s-1} - C_{s-1})`` (the
  same for ``r^b``). They run in float64, so that the large cumulative sums cancel exactly enough (error
  ~1e-12 for 10^4 frames), and only for the hypotheses the beam search keeps.

Rows: the scorer works on ``N = B * group`` hypothesis rows, row ``n`` belonging to utterance ``n // group``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CTCPrefixState", "CTCPrefixScorer", "ctc_expected_label_count"]

NEG_INF = float("-inf")
# CTC log-probabilities are clamped to this value so that cumulative sums stay finite (exp(-1e4) == 0).
LOG_FLOOR = -1.0e4


@dataclass
class CTCPrefixState:
    """CTC prefix state of ``N`` hypotheses that all have ``length`` labels.

    Attributes:
        r: ``(T, 2, N)`` float64, ``log r^n_t`` (index 0) and ``log r^b_t`` (index 1) of each prefix.
        psi: ``(N,)`` float32, ``log psi`` of each prefix (0 for the empty prefix).
        last: ``(N,)`` int64, last label of each prefix (-1 for the empty prefix).
        length: number of labels in every prefix.
    """

    r: Tensor
    psi: Tensor
    last: Tensor
    length: int

    def select(self, rows: Tensor) -> CTCPrefixState:
        """The state of hypotheses ``rows`` (``(N',)`` int64), in that order."""
        return CTCPrefixState(
            self.r.index_select(2, rows),
            self.psi.index_select(0, rows),
            self.last.index_select(0, rows),
            self.length,
        )


class CTCPrefixScorer:
    """CTC prefix scores of hypotheses extended by one token, for ``B`` utterances x ``group`` hypotheses.

    Args:
        logp: ``(B, T, V)`` CTC log-probabilities (log-softmax output), any float dtype.
        lengths: ``(B,)`` int64 number of valid frames of each utterance (``1 <= lengths <= T``).
        group: hypotheses per utterance (beam size); rows ``n`` belong to utterance ``n // group``.
        blank: blank id.
        eos: end-of-sentence id; its score is the complete CTC probability of the prefix.

    Raises:
        ValueError: shapes disagree, a length is outside ``1..T``, or ``blank``/``eos`` are not token ids.
    """

    def __init__(self, logp: Tensor, lengths: Tensor, group: int = 1, blank: int = 0, eos: int | None = None):
        if logp.dim() != 3 or lengths.shape != (logp.size(0),):
            raise ValueError(
                f"logp must be (B, T, V) and lengths (B,), got {tuple(logp.shape)} and {tuple(lengths.shape)}"
            )
        b, t, v = logp.shape
        eos = v - 1 if eos is None else eos
        if not (0 <= blank < v and 0 <= eos < v):
            raise ValueError(f"blank ({blank}) and eos ({eos}) must be token ids below V={v}")
        lengths = lengths.to(logp.device, torch.long)
        if b and (int(lengths.min()) < 1 or int(lengths.max()) > t):
            raise ValueError(f"CTC lengths must lie in 1..{t}, got {lengths.tolist()}")
        valid = torch.arange(t, device=logp.device)[:, None] < lengths[None, :]  # (T, B)
        # time-major (T, B, V); frames past the end hold 0 (finite, never read into a score)
        self.x = (
            logp.detach().transpose(0, 1).float().clamp(min=LOG_FLOOR).masked_fill(~valid[..., None], 0.0)
        )
        # psi(g + c) = sum_t phi_{t-1} y^c_t is, for all c at once, a matrix product over t: keep
        # y^c_t = exp(x_max[c]) * e[t, c] with e in [0, 1] (float64; 0 on padded frames)
        x_valid = self.x.masked_fill(~valid[..., None], NEG_INF)
        self.x_max = x_valid.amax(dim=0)  # (B, V)
        self.e = torch.exp((x_valid - self.x_max).double()).transpose(0, 1).contiguous()  # (B, T, V)
        self.valid = valid
        self.lengths = lengths
        self.group = group
        self.blank = blank
        self.eos = eos

    @property
    def num_rows(self) -> int:
        """``N = B * group``."""
        return self.x.size(1) * self.group

    def _utt(self, n: int) -> Tensor:
        return torch.arange(n, device=self.x.device) // self.group

    def select(self, utts: Tensor) -> CTCPrefixScorer:
        """A scorer over utterances ``utts`` (``(B',)`` int64) only, in that order (the beam search drops
        finished utterances with it)."""
        new = object.__new__(CTCPrefixScorer)
        new.x = self.x.index_select(1, utts)
        new.x_max = self.x_max.index_select(0, utts)
        new.e = self.e.index_select(0, utts)
        new.valid = self.valid.index_select(1, utts)
        new.lengths = self.lengths.index_select(0, utts)
        new.group, new.blank, new.eos = self.group, self.blank, self.eos
        return new

    def init_state(self) -> CTCPrefixState:
        """The state of the empty prefix (``<sos>`` alone) for all ``N`` rows: ``r^n = 0``,
        ``r^b_t = prod_{u<=t} y^blank_u``, ``psi = 1`` (log domain)."""
        rb = torch.cumsum(self.x[:, :, self.blank].double(), dim=0).repeat_interleave(self.group, dim=1)
        r = torch.stack([torch.full_like(rb, NEG_INF), rb], dim=1)
        n = self.num_rows
        return CTCPrefixState(
            r=r,
            psi=torch.zeros(n, device=r.device),
            last=torch.full((n,), -1, dtype=torch.long, device=r.device),
            length=0,
        )

    def _shift(self, a: Tensor, first: float) -> Tensor:
        """``a`` shifted one frame later along dim 0, ``first`` at frame 0: ``out[t] = a[t-1]``."""
        return torch.cat([a.new_full(a[:1].shape, first), a[:-1]], dim=0)

    def _phi_shifted(self, state: CTCPrefixState) -> tuple[Tensor, Tensor]:
        """``log phi_{t-1}`` for a new label different from / equal to the last one, ``(T, N)`` each,
        ``-inf`` on frames past each utterance's end."""
        rn, rb = state.r[:, 0], state.r[:, 1]
        start = 0.0 if state.length == 0 else NEG_INF
        invalid = ~self.valid.repeat_interleave(self.group, dim=1)
        p_other = self._shift(torch.logaddexp(rn, rb), start).masked_fill(invalid, NEG_INF)
        p_same = self._shift(rb, start).masked_fill(invalid, NEG_INF)
        return p_other, p_same

    def score(self, state: CTCPrefixState, ids: Tensor | None = None) -> Tensor:
        """``log psi`` of every hypothesis extended by every candidate token.

        Args:
            state: the prefixes' state (``N`` rows).
            ids: ``(N, K)`` int64 candidate tokens per row (partial scoring), or None for all ``V`` tokens
                (full scoring).

        Returns:
            ``(N, K)`` (or ``(N, V)``) float32 ``log psi(g + c)``; ``-inf`` for blank, the complete CTC
            log-probability of ``g`` for ``eos``.
        """
        n = state.psi.size(0)
        utt = self._utt(n)
        p_other, p_same = self._phi_shifted(state)
        # log sum_t exp(p_t + x_t^c) = m + x_max^c + log sum_t exp(p_t - m) e_t^c, m = max_t p_t
        m = p_other.amax(dim=0)
        m = m.masked_fill(~m.isfinite(), 0.0)
        a = torch.exp(p_other - m).T  # (N, T), in [0, 1]
        if ids is None:
            b, t, v = self.e.shape
            s = torch.bmm(a.reshape(b, self.group, t), self.e).reshape(n, v)
            ids = torch.arange(v, device=a.device).expand(n, -1)
            x_max = self.x_max.index_select(0, utt)
        else:
            s = torch.einsum("nt,ntk->nk", a, self.e[utt[:, None], :, ids].transpose(1, 2))
            x_max = self.x_max[utt[:, None], ids]
        psi = (torch.log(s) + m[:, None]).float() + x_max
        # a repeated label needs a blank in between: phi from r^b alone
        last = state.last.clamp(min=0)
        x_last = self.x[:, utt, last]
        psi_same = torch.logsumexp(p_same.float() + x_last, dim=0)
        psi = torch.where(ids == state.last[:, None], psi_same[:, None], psi)
        # eos: the whole utterance spelled by g, read at each utterance's last frame
        end = (self.lengths.index_select(0, utt) - 1)[None, None, :].expand(1, 2, n)
        full = torch.logsumexp(state.r.gather(0, end)[0], dim=0).float()
        psi = torch.where(ids == self.eos, full[:, None], psi)
        return psi.masked_fill(ids == self.blank, NEG_INF)

    def extend(self, state: CTCPrefixState, parents: Tensor, tokens: Tensor, psi: Tensor) -> CTCPrefixState:
        """The state of hypotheses ``g_parents[n] + tokens[n]`` (the beam search's selection).

        Args:
            state: the parents' state (``N`` rows).
            parents: ``(N',)`` int64 parent row of each new hypothesis.
            tokens: ``(N',)`` int64 appended token.
            psi: ``(N',)`` their ``log psi`` (from :meth:`score`).

        Returns:
            The new state (``length + 1``). Rows whose token is ``eos`` or blank hold meaningless values.
        """
        parent = state.select(parents)
        utt = self._utt(parents.size(0))
        p_other, p_same = self._phi_shifted(parent)
        p = torch.where(tokens == parent.last, p_same, p_other)  # (T, N') log phi_{t-1}
        xc = self.x[:, utt, tokens].double()
        xb = self.x[:, utt, self.blank].double()
        # r^n_t = (r^n_{t-1} + phi_{t-1}) y^c_t  (frames past the end are never read back)
        c = torch.cumsum(xc, dim=0)
        rn = c + torch.logcumsumexp(p - self._shift(c, 0.0), dim=0)
        # r^b_t = (r^n_{t-1} + r^b_{t-1}) y^blank_t, with r^n_{-1} = r^b_{-1} = 0 (probabilities)
        bc = torch.cumsum(xb, dim=0)
        rb = bc + torch.logcumsumexp(self._shift(rn, NEG_INF) - self._shift(bc, 0.0), dim=0)
        return CTCPrefixState(torch.stack([rn, rb], dim=1), psi.float(), tokens, state.length + 1)


def ctc_expected_label_count(logp: Tensor, lengths: Tensor, blank: int = 0, eos: int | None = None) -> Tensor:
    """Expected number of labels in the CTC output of each utterance: how many tokens the input supports.

    Under CTC's output distribution the frames are independent (Graves et al. 2006, Eq. 2), and a label
    starts at frame ``t`` when frame ``t`` emits a label ``c`` that frame ``t-1`` does not (collapsing merges
    repeats; a blank in between keeps them apart). By linearity of expectation the number of labels of the
    collapsed output has the mean

        ``E[|y|] = sum_{t < T} sum_{c != blank, eos} y^c_t (1 - y^c_{t-1})``,  ``y^c_{-1} = 0``.

    A peaky distribution gives the length of its best path; silence (blank throughout) gives ~0; a
    time-stretched input (each spike several frames wide) gives the same count as the original. The joint
    beam search bounds hypothesis lengths with it (``DecodeConfig.ctc_maxlen_ratio``).

    Args:
        logp: ``(B, T, V)`` CTC log-probabilities (log-softmax output), any float dtype.
        lengths: ``(B,)`` int64 valid frames per utterance (frames past them are ignored).
        blank: blank id.
        eos: end-of-sentence id, not a CTC label (avsr's ``V - 1``), or None when every non-blank id is one.

    Returns:
        ``(B,)`` float32 expected label counts, each in ``[0, lengths]``.

    Raises:
        ValueError: shapes disagree, or ``blank``/``eos`` are not token ids.
    """
    if logp.dim() != 3 or lengths.shape != (logp.size(0),):
        raise ValueError(
            f"logp must be (B, T, V) and lengths (B,), got {tuple(logp.shape)} and {tuple(lengths.shape)}"
        )
    b, t, v = logp.shape
    if not 0 <= blank < v or (eos is not None and not 0 <= eos < v):
        raise ValueError(f"blank ({blank}) and eos ({eos}) must be token ids below V={v}")
    p = logp.detach().float().exp()
    prev = torch.cat([torch.zeros_like(p[:, :1]), p[:, :-1]], dim=1)
    label = torch.ones(v, dtype=torch.bool, device=p.device)
    label[blank] = False
    if eos is not None:
        label[eos] = False
    starts = (p * (1.0 - prev) * label).sum(dim=2)  # (B, T) probability that a label starts at frame t
    valid = torch.arange(t, device=p.device)[None, :] < lengths.to(p.device)[:, None]
    return (starts * valid).sum(dim=1)
