"""avsr's attention decoder and CTC head as scorers of ESPnet's beam search (needs ESPnet).

With these, ESPnet's own ``BeamSearch`` / ``BatchBeamSearch`` (``espnet/nets/beam_search.py``,
``batch_beam_search.py``) decode an avsr model exactly as ``Speech2Text`` would decode an ESPnet model:
``decoder`` and ``length_bonus`` full scorers and a partial ``ctc`` scorer (ESPnet's ``CTCPrefixScorer``
over the same CTC log-probabilities). :func:`espnet_beam_search` builds that search; it is what
``benchmarks/bench_vs_espnet.py`` and ``tests/test_espnet_interop.py`` compare avsr's batched search with.
"""

from __future__ import annotations

from typing import Any

import torch
from espnet.nets.batch_beam_search import BatchBeamSearch
from espnet.nets.beam_search import BeamSearch
from espnet.nets.scorer_interface import BatchScorerInterface
from espnet.nets.scorers.ctc import CTCPrefixScorer
from espnet.nets.scorers.length_bonus import LengthBonus
from torch import Tensor

from avsr.nn.decoder import DecoderState, TransformerDecoder

__all__ = [
    "DecoderScorer",
    "CTCHead",
    "AvsrPreBeamScorer",
    "use_avsr_pre_beam",
    "espnet_beam_search",
    "peaky_utterances",
]


class DecoderScorer(BatchScorerInterface):
    """:class:`avsr.nn.decoder.TransformerDecoder` as an ESPnet (batch) full scorer.

    The state of a hypothesis is its self-attention key/value cache (per layer ``(1, H, L, D/H)`` tensors);
    a step feeds the last token of every running hypothesis through :meth:`TransformerDecoder.step`, as
    avsr's own search does, so both searches see the same attention scores. The encoder-side keys and values
    are projected at every step, as ESPnet's decoders do.
    """

    def __init__(self, decoder: TransformerDecoder) -> None:
        self.decoder = decoder

    def init_state(self, x: Tensor) -> Any:
        """No state before the first token."""
        return None

    def batch_init_state(self, x: Tensor) -> Any:
        """No state before the first token."""
        return None

    def score(self, y: Tensor, state: Any, x: Tensor) -> tuple[Tensor, Any]:
        """One hypothesis: ``y (L,)`` with sos, ``x (T, D)`` -> ``(V,)`` log-probabilities and its state."""
        logp, states = self.batch_score(y[None], [state], x[None])
        return logp[0], states[0]

    @torch.no_grad()
    def batch_score(self, ys: Tensor, states: list[Any], xs: Tensor) -> tuple[Tensor, list[Any]]:
        """Score the next token of ``n`` hypotheses of one utterance.

        Args:
            ys: ``(n, L)`` int64 prefixes (sos first).
            states: ``n`` states from the previous step (None at the first).
            xs: ``(n, T, D)`` the encoder output, repeated (ESPnet expands one utterance).

        Returns:
            ``(n, V)`` float32 log-probabilities and the ``n`` new states.
        """
        n, length = ys.shape
        memory = xs[:1]
        st: DecoderState = self.decoder.init_state(
            memory, torch.ones(memory.shape[:2], dtype=torch.bool, device=xs.device), group=n
        )
        if states[0] is not None:
            st.self_k = [torch.cat([s[0][i] for s in states]) for i in range(len(st.self_k))]
            st.self_v = [torch.cat([s[1][i] for s in states]) for i in range(len(st.self_v))]
            st.length = length - 1
        logp, st = self.decoder.step(ys[:, -1], st)
        upto = st.length
        new = [
            (
                [k[j : j + 1, :, :upto].clone() for k in st.self_k],
                [v[j : j + 1, :, :upto].clone() for v in st.self_v],
            )
            for j in range(n)
        ]
        return logp, new


class CTCHead(torch.nn.Module):
    """The ``ctc`` object ESPnet's ``CTCPrefixScorer`` expects: ``log_softmax(x (B, T, D)) -> (B, T, V)``,
    here ``log_softmax(ctc_lo(x).float())`` as ``avsr.models.AVSRModel`` computes its CTC
    log-probabilities."""

    def __init__(self, ctc_lo: torch.nn.Linear) -> None:
        super().__init__()
        self.ctc_lo = ctc_lo

    def log_softmax(self, x: Tensor) -> Tensor:
        """``(B, T, D) -> (B, T, V)`` float32 log-probabilities."""
        return torch.log_softmax(self.ctc_lo(x).float(), dim=-1)


def espnet_beam_search(
    decoder: TransformerDecoder | None,
    ctc_lo: torch.nn.Linear | None,
    vocab_size: int,
    sos: int,
    eos: int,
    beam_size: int = 10,
    ctc_weight: float = 0.3,
    penalty: float = 0.0,
    pre_beam_ratio: float = 1.5,
    full_ctc: bool = False,
    batch: bool = True,
) -> BeamSearch:
    """ESPnet's beam search over avsr's decoder and CTC head, set up as ``Speech2Text`` does.

    Args:
        decoder, ctc_lo: the model's parts (None when ``ctc_weight`` is 1 / 0).
        vocab_size, sos, eos: as the model.
        beam_size, ctc_weight, penalty, pre_beam_ratio: ``Speech2Text``'s options.
        full_ctc: score every token with CTC (ESPnet pre-beams only while ``int(pre_beam_ratio * beam_size)
            < vocab_size``; this makes the ratio large enough), avsr's ``ctc_scoring: full``.
        batch: ``BatchBeamSearch`` (what ``Speech2Text`` runs for these batch scorers) or ``BeamSearch``.

    Returns:
        The search; call it as ``search(x=enc (T, D), maxlenratio=..., minlenratio=...)``.
    """
    scorers: dict[str, Any] = {}  # Speech2Text's order: decoder, ctc, length_bonus
    if ctc_weight < 1.0:
        scorers["decoder"] = DecoderScorer(decoder)
    if ctc_weight > 0.0:
        scorers["ctc"] = CTCPrefixScorer(ctc=CTCHead(ctc_lo), eos=eos)
    scorers["length_bonus"] = LengthBonus(vocab_size)
    weights = {"decoder": 1.0 - ctc_weight, "ctc": ctc_weight, "length_bonus": penalty}
    if full_ctc:
        pre_beam_ratio = vocab_size / beam_size + 1.0
    search = BeamSearch(
        scorers=scorers,
        weights=weights,
        beam_size=beam_size,
        vocab_size=vocab_size,
        sos=sos,
        eos=eos,
        token_list=None,
        pre_beam_ratio=pre_beam_ratio,
        pre_beam_score_key=None if ctc_weight == 1.0 else "full",
    )
    if batch:
        search.__class__ = BatchBeamSearch
    return search.eval()


def peaky_utterances(b: int, t: int, d: int, v: int, seed: int = 0) -> tuple[Tensor, Tensor, torch.nn.Linear]:
    """Synthetic encoder outputs for comparing searches without a trained model: ``(memory (b, t, d), lens
    (b,), ctc_lo)``, whose CTC posteriors (through ``ctc_lo``, ``d -> v``) follow a random label path per
    utterance (blank, label, label, blank, ...; labels in ``1 .. v - 2``), so that hypotheses end well before
    the
    maximum length, as a trained model's do. Lengths are drawn in ``[t // 2, t]``."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(v, d, generator=g), dim=-1)
    ctc_lo = torch.nn.Linear(d, v)
    with torch.no_grad():
        ctc_lo.weight.copy_(5.0 * emb)
        ctc_lo.bias.zero_()
    lens = torch.randint(t // 2, t + 1, (b,), generator=g)
    mem = torch.zeros(b, t, d)
    for i in range(b):
        labels = torch.randint(1, v - 1, (int(lens[i]) // 3,), generator=g)
        path = torch.zeros(int(lens[i]), dtype=torch.long)  # blank, label, label, blank, ...
        path[1::3][: labels.numel()] = labels
        path[2::3][: labels.numel()] = labels[: path[2::3].numel()]
        mem[i, : lens[i]] = emb[path] + 0.3 * torch.randn(int(lens[i]), d, generator=g)
    return mem, lens, ctc_lo


class AvsrPreBeamScorer(BatchScorerInterface):
    """A zero-weight full scorer that makes ESPnet's search rank its pre-beam as avsr's ``pre_beam: avsr``:
    the decoder's scores with ``eos`` and blank pushed to ``-1e10`` (ESPnet's log-zero), used as
    ``pre_beam_score_key``. ``eos`` keeps its CTC score in ``BatchBeamSearch`` whether or not it is in the
    pre-beam, as in avsr. Wraps any ESPnet decoder scorer (it runs the decoder a second time).
    """

    def __init__(self, decoder: Any, eos: int, blank: int = 0) -> None:
        self.decoder, self.eos, self.blank = decoder, eos, blank

    def _mask(self, scores: Tensor) -> Tensor:
        scores = scores.clone()
        scores[..., [self.eos, self.blank]] = -1e10
        return scores

    def init_state(self, x: Tensor) -> Any:
        """The wrapped decoder's initial state."""
        return self.decoder.init_state(x)

    def batch_init_state(self, x: Tensor) -> Any:
        """The wrapped decoder's initial state."""
        return self.decoder.batch_init_state(x)

    def select_state(self, state: Any, i: int, new_id: int | None = None) -> Any:
        """As the wrapped decoder."""
        return self.decoder.select_state(state, i, new_id)

    def score(self, y: Tensor, state: Any, x: Tensor) -> tuple[Tensor, Any]:
        """The decoder's ``(V,)`` scores with eos and blank at -1e10, and its state."""
        scores, state = self.decoder.score(y, state, x)
        return self._mask(scores), state

    def batch_score(self, ys: Tensor, states: list[Any], xs: Tensor) -> tuple[Tensor, list[Any]]:
        """The decoder's ``(n, V)`` scores with eos and blank at -1e10, and its states."""
        scores, states = self.decoder.batch_score(ys, states, xs)
        return self._mask(scores), states


def use_avsr_pre_beam(search: BeamSearch, eos: int, blank: int = 0) -> BeamSearch:
    """Make an ESPnet search (e.g. ``Speech2Text(...).beam_search``) rank its pre-beam as avsr's default
    ``pre_beam: avsr`` (:class:`AvsrPreBeamScorer` as its ``pre_beam_score_key``, weight 0); returns it.

    Raises:
        ValueError: the search has no ``decoder`` full scorer or does no pre-beam.
    """
    if "decoder" not in search.full_scorers or not search.do_pre_beam:
        raise ValueError("the search needs a 'decoder' full scorer and a pre-beam (partial CTC scoring)")
    scorer = AvsrPreBeamScorer(search.full_scorers["decoder"], eos, blank)
    search.scorers["avsr_pre_beam"] = search.full_scorers["avsr_pre_beam"] = scorer
    search.weights["avsr_pre_beam"] = 0.0
    search.pre_beam_score_key = "avsr_pre_beam"
    return search
