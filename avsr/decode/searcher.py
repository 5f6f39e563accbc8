"""The searcher: one decoding configuration applied to one model, from its inputs to ranked hypotheses.

:class:`Searcher` owns everything that happens after the encoder: the beam search of the configuration's type
(:func:`avsr.decode.beam_search.batch_beam_search`: the joint CTC/attention search or fairseq's) and, for
audio-visual input of a model with an audio gate, the final ranking with the model's single-stream views
(:mod:`avsr.decode.rescore`): the fused input's n-best list joined with the video-only view's own, each
candidate scored ``s_av + g * (video_weight * gv * s_v + audio_weight * s_a)`` (``g``: the utterance's mean
audio gate, ``gv``: its video trust gate, 1 for a model without one;
:meth:`avsr.encoder.AVHubertEncoder.gate_means`). Lips that the model takes for another utterance's, or for a
frozen mouth, thus lose their say in the ranking as they lose it in the fused input. With
``audio_confidence`` above 0 the audio-only view's own n-best list joins the candidates too, and its weight
shrinks with how unsure the audio-only view is of its best hypothesis
(:class:`avsr.decode.config.DecodeConfig`): a confidence check that lets clean audio outvote lips unlike the
training data, and keeps noisy audio from outvoting good lips.

The view weights come from the configuration; where it leaves them None, from the decoding defaults the
searcher is given (a checkpoint's decode section,
:func:`avsr.inference.pretrained.checkpoint_decode_defaults`, e.g. the SynthGRID recipe's tuned weights), else
0 (one search, as ESPnet and the original AV-HuBERT). The model holds no decoding defaults.

The model is any object with the decoding parts that :class:`SearchModel` names (an
:class:`avsr.models.AVSRModel` has them), so this module does not import the models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from avsr.decode.beam_search import batch_beam_search
from avsr.decode.config import SearchConfig, ViewWeights, default_view_weights, searched_views
from avsr.decode.hypothesis import Hypothesis
from avsr.decode.rescore import rescore_with_views, sequence_scores

__all__ = ["Searcher", "SearchModel", "SearchResult"]


class SearchModel(Protocol):
    """The parts of a model that :class:`Searcher` reads (:class:`avsr.models.AVSRModel` has them).

    Attributes: ``decoder`` (an attention decoder or None), the token ids ``sos``, ``eos``, ``blank``,
    ``pad``, ``unk``, ``has_ctc`` / ``has_audio_gate`` / ``has_video_gate`` (whether the model has a CTC head
    and the encoder an audio gate / a video trust gate), ``training``. Methods, with the shapes of
    :class:`avsr.models.AVSRModel`: ``encode``, ``ctc_log_probs``, ``encode_video``, ``gate_means``,
    ``sync_margin``, ``train``, ``eval``.
    """

    decoder: Any
    sos: int
    eos: int
    blank: int
    pad: int | None
    unk: int | None
    training: bool

    @property
    def has_ctc(self) -> bool: ...

    @property
    def has_audio_gate(self) -> bool: ...

    @property
    def has_video_gate(self) -> bool: ...

    def encode(self, audio: Tensor | None, video: Tensor | None, lengths: Tensor,
               video_features: Tensor | None = None, video_decision: Tensor | None = None
               ) -> tuple[Tensor, Tensor]: ...

    def ctc_log_probs(self, enc: Tensor) -> Tensor | None: ...

    def encode_video(self, video: Tensor, lengths: Tensor) -> Tensor: ...

    def gate_means(self, audio: Tensor, video_features: Tensor, lengths: Tensor,
                   video_decision: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]: ...

    def sync_margin(self, audio: Tensor, video_features: Tensor, lengths: Tensor) -> Tensor | None: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...


class SearchResult(NamedTuple):
    """What :meth:`Searcher.decode` returns.

    Attributes:
        hypotheses: up to ``nbest`` hypotheses per utterance, best first.
        ctc_logp: the fused view's ``(B, T, V)`` float32 CTC log-probabilities (None without a CTC head).
        enc_lens: ``(B,)`` int64 encoder lengths (word timings need these two).
        views: under ``"video"`` and ``"audio"``, the hypotheses of each single-stream view that was searched
            for the ranking (the video-only view with a video weight, the audio-only view with the confidence
            check), best first, cut to ``nbest``: the same as decoding that view's stream alone with this
            configuration. Empty when no view was searched.
        gates: what fusion did with two-stream input where the views are ranked or the search decides on the
            lips: ``"audio_gate"`` and ``"video_trust"``, each ``(B,)`` float32 in (0, 1), the utterances'
            mean audio gate and video trust gate (:meth:`avsr.encoder.AVHubertEncoder.gate_means`; no
            ``video_trust`` for a model without a video gate; 0 or 1 where the search decides, and then also
            ``"video_sync"``, ``"audio_ctc_confidence"`` and, with ``video_max_entropy``,
            ``"video_ctc_entropy"``, see :meth:`Searcher.decode`). Empty otherwise.
    """

    hypotheses: list[list[Hypothesis]]
    ctc_logp: Tensor | None
    enc_lens: Tensor
    views: dict[str, list[list[Hypothesis]]]
    gates: dict[str, Tensor]


class Searcher:
    """Decode with ``config`` on ``model``: the beam search and the ranking with the views (see the module).

    Args:
        model: the decoding parts of a model (:class:`SearchModel`, e.g. an :class:`avsr.models.AVSRModel`).
        config: a :class:`avsr.decode.config.DecodeConfig` or :class:`avsr.decode.config.FairseqConfig`.
        defaults: the model's decoding defaults (its checkpoint's decode section,
            :func:`avsr.inference.pretrained.checkpoint_decode_defaults`): the view weights and the decision
            rule where ``config`` leaves them None. None: none (view weights 0, the soft gate).

    Attributes:
        view_weights: the :class:`avsr.decode.config.ViewWeights` used for audio-visual input (both weights
            0: one search).
        sync_rule: ``(video_sync_margin, video_sync_slope)``: the per-utterance decision whether to use the
            lips (:class:`avsr.decode.config.DecodeConfig`; passed to the encoder as ``video_decision``), or
            None (the gate's soft scaling, and always for a model without a video gate).
        video_max_entropy: the decision's second condition (``video_max_entropy``: the lips are used only
            where the video-only view's mean CTC entropy per frame is at most this), or None (not checked,
            and always without a decision).

    Raises:
        ValueError: a view weight > 0 for a model without an audio gate (names the key and where it came
            from); a ``video_sync_margin`` for a model without a CTC head; a ``video_max_entropy`` without a
            ``video_sync_margin`` for a model with a video gate.
    """

    def __init__(self, model: SearchModel, config: SearchConfig, defaults: Mapping[str, Any] | None = None
                 ) -> None:
        self.model, self.config = model, config
        self.view_weights = config.view_weights(default_view_weights(defaults))
        rule = config.sync_rule(defaults)
        self.sync_rule = rule if model.has_video_gate else None
        if self.sync_rule is not None and not model.has_ctc:
            raise ValueError("video_sync_margin weighs the audio-only view's CTC confidence: this model has "
                             "no CTC head; set video_sync_margin: null")
        entropy = config.entropy_bar(defaults)
        if entropy is not None and model.has_video_gate and self.sync_rule is None:
            raise ValueError(f"video_max_entropy {entropy:g} is a condition of the search's decision on the "
                             f"lips: set video_sync_margin too, or video_max_entropy: null")
        self.video_max_entropy = entropy if self.sync_rule is not None else None
        if self._ranked(self.view_weights) and not model.has_audio_gate:
            name = "video_weight" if self.view_weights.video_weight > 0 else "audio_weight"
            raise ValueError(f"{name} {getattr(self.view_weights, name):g} needs a model with an audio gate "
                             f"(encoder_conf.audio_gate: true); set {name}: 0 for this model")

    @torch.no_grad()
    def search(self, enc: Tensor, enc_lens: Tensor, ctc_logp: Tensor | None = None,
               src_len: int | None = None, config: SearchConfig | None = None) -> list[list[Hypothesis]]:
        """The beam search over an encoder output, with the model in eval mode.

        Args:
            enc: ``(B, T, D)`` float encoder output.  enc_lens: ``(B,)`` int64 valid frames.
            ctc_logp: ``(B, T, V)`` float32 CTC log-probabilities; computed here when None.
            src_len: the source length of fairseq's ``max_len_a``; default ``T``.
            config: another configuration than the searcher's (the views' wider search).

        Returns:
            Up to ``nbest`` hypotheses per utterance, best first.

        Raises:
            ValueError: ``ctc_weight`` needs a part the model lacks.
        """
        model = self.model
        was_training = model.training
        model.eval()
        try:
            if ctc_logp is None:
                ctc_logp = model.ctc_log_probs(enc)
            return batch_beam_search(
                enc, enc_lens, config or self.config, decoder=model.decoder, ctc_logp=ctc_logp, sos=model.sos,
                eos=model.eos, blank=model.blank, pad=model.pad, unk=model.unk,
                src_len=enc.size(1) if src_len is None else src_len,
            )
        finally:
            model.train(was_training)

    @torch.no_grad()
    def decode(self, audio: Tensor | None, video: Tensor | None, lengths: Tensor,
               video_features: Tensor | None = None) -> SearchResult:
        """Encode the inputs and search; with both streams and a view weight above 0, rank with the views.

        Args:
            audio: ``(B, 104, T)`` float audio features at 25 Hz, or None.
            video: ``(B, 1, T, 88, 88)`` float video, or None (or given as ``video_features``).
            lengths: ``(B,)`` int64 valid frames.
            video_features: ``(B, D, T)`` the video front-end's output, when already computed.

        Where the search decides on the lips (``sync_rule``), the result's gates also hold ``"video_sync"``
        (the sync margins) and ``"audio_ctc_confidence"`` (``q``, the audio-only view's mean largest CTC log
        probability per frame), and with ``video_max_entropy`` ``"video_ctc_entropy"`` (the video-only
        view's mean CTC entropy per frame, nats), each ``(B,)`` float32.

        Returns:
            the :class:`SearchResult`.

        Raises:
            ValueError: inputs the encoder refuses, or a part the search needs is missing.
        """
        model = self.model
        views: dict[str, list[list[Hypothesis]]] = {}
        gates: dict[str, Tensor] = {}
        was_training = model.training
        model.eval()
        try:
            both = audio is not None and (video is not None or video_features is not None)
            weights = self.view_weights if both else ViewWeights()
            decide = both and self.sync_rule is not None
            if (self._ranked(weights) or decide) and video_features is None:  # computed once for every view
                video_features, video = model.encode_video(video, lengths), None
            audio_view = video_view = decision = None
            if decide:
                audio_view = self._single_view(lengths, audio=audio)
                if self.video_max_entropy is not None:
                    video_view = self._single_view(lengths, video_features=video_features)
                decision = self._sync_decision(audio, video_features, lengths, audio_view[1], gates,
                                               None if video_view is None else video_view[1])
            enc, enc_lens = model.encode(audio, video, lengths, video_features, decision)
            ctc_logp = model.ctc_log_probs(enc)
            # fairseq's generator reads the source length as source['audio'].size(1) -- the feature dim of
            # (B, F, T) audio -- when audio is given, else the padded frame count (only max_len_a uses it)
            src_len = audio.shape[1] if audio is not None else enc.size(1)
            if not self._ranked(weights):
                return SearchResult(self.search(enc, enc_lens, ctc_logp, src_len), ctc_logp, enc_lens, views,
                                    gates)
            hyps = self._ranked_with_views(audio, video_features, lengths, weights, enc, enc_lens, ctc_logp,
                                           src_len, views, gates, audio_view, decision, video_view)
            return SearchResult(hyps, ctc_logp, enc_lens, views, gates)
        finally:
            model.train(was_training)

    @staticmethod
    def _ranked(weights: ViewWeights) -> bool:
        """Whether ``weights`` rank the fused input's hypotheses with a single-stream view."""
        return weights.video_weight > 0 or weights.audio_weight > 0

    def _single_view(self, lengths: Tensor, audio: Tensor | None = None,
                     video_features: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The audio-only (``audio``) or video-only (``video_features``) view: encoder output ``(B, T, D)``
        and CTC log-probabilities ``(B, T, V)``."""
        enc, _ = self.model.encode(audio, None, lengths, video_features)
        return enc, self.model.ctc_log_probs(enc)

    def _sync_decision(self, audio: Tensor, video_features: Tensor, lengths: Tensor, ctc_a: Tensor,
                       gates: dict[str, Tensor], ctc_v: Tensor | None = None) -> Tensor:
        """``(B,)`` float32 1 where the lips are used (their sync margin reaches ``video_sync_margin +
        video_sync_slope * q``, ``q``: the audio-only view's mean largest CTC log probability per frame, and
        where ``ctc_v`` is given -- the video-only view's CTC log-probabilities ``(B, T, V)``, with
        ``video_max_entropy`` -- their mean entropy per frame is at most that), else 0; ``gates`` (the
        result's, being built) receives ``"video_sync"`` (the margins), ``"audio_ctc_confidence"`` (``q``) and
        ``"video_ctc_entropy"``."""
        margin = self.model.sync_margin(audio, video_features, lengths).float()
        valid = torch.arange(ctc_a.size(1), device=ctc_a.device)[None, :] < lengths.to(ctc_a.device)[:, None]
        frames = valid.sum(dim=1)
        q = (ctc_a.amax(dim=-1) * valid).sum(dim=1) / frames
        gates["video_sync"], gates["audio_ctc_confidence"] = margin, q
        bar, slope = self.sync_rule  # type: ignore[misc]
        use = margin >= bar + slope * q
        if ctc_v is not None:
            logp = ctc_v.float()
            entropy = (-(logp.exp() * logp).sum(dim=-1) * valid).sum(dim=1) / frames
            gates["video_ctc_entropy"] = entropy
            use &= entropy <= self.video_max_entropy
        return use.float()

    def _ranked_with_views(self, audio: Tensor, video_features: Tensor, lengths: Tensor,
                           weights: ViewWeights, enc: Tensor, enc_lens: Tensor,
                           ctc_logp: Tensor | None, src_len: int,
                           views: dict[str, list[list[Hypothesis]]],
                           gates: dict[str, Tensor],
                           audio_view: tuple[Tensor, Tensor] | None = None,
                           decision: Tensor | None = None,
                           video_view: tuple[Tensor, Tensor] | None = None) -> list[list[Hypothesis]]:
        """The fused input's beam search and, with a video weight, the video-only view's (and with an audio
        confidence, the audio-only view's; ``beam_size`` hypotheses each), ranked with the single-stream
        views' scores (:func:`avsr.decode.rescore.rescore_with_views`); ``views`` (the result's, being built)
        receives the views' own hypotheses, cut to ``nbest``, and ``gates`` the mean gates; ``audio_view``:
        the audio-only view's encoder output and CTC log-probabilities when computed already (``video_view``
        the video-only view's); ``decision``: the search's decision on the lips (:meth:`_sync_decision`), or
        None."""
        model, config = self.model, self.config
        wide = replace(config, nbest=config.beam_size)
        lists = [self.search(enc, enc_lens, ctc_logp, src_len, wide)]
        gate, trust = model.gate_means(audio, video_features, lengths, decision)
        gate = gate.float()
        gates["audio_gate"] = gate
        if trust is not None:
            gates["video_trust"] = trust.float()
        trust = torch.ones_like(gate) if trust is None else trust.float()
        ids = {"decoder": model.decoder, "ctc_weight": config.ctc_weight, "sos": model.sos, "eos": model.eos,
               "blank": model.blank}

        def scorer(e: Tensor, logp: Tensor | None):
            return lambda cands, index: sequence_scores(cands, index, e, enc_lens, ctc_logp=logp, **ids)

        searched = searched_views(weights)
        scored, own = [], []  # (weight, scorer) of each view; the position of its own search's list
        if "video" in searched:
            enc_v, ctc_v = video_view or self._single_view(lengths, video_features=video_features)
            lists.append(self.search(enc_v, enc_lens, ctc_v, src_len, wide))
            scored.append((weights.video_weight * gate * trust, scorer(enc_v, ctc_v)))
            own.append(len(lists) - 1)
            views["video"] = [h[: config.nbest] for h in lists[-1]]
        if weights.audio_weight > 0:
            enc_a, ctc_a = audio_view or self._single_view(lengths, audio=audio)
            weight_a = weights.audio_weight * gate
            own.append(None)
            if "audio" in searched:  # the confidence check: the audio-only view's best, per token
                audio_lists = self.search(enc_a, enc_lens, ctc_a, src_len, wide)
                lists.append(audio_lists)
                own[-1] = len(lists) - 1
                views["audio"] = [h[: config.nbest] for h in audio_lists]
                steps = [len(h[0].tokens) + 1 if h else 1 for h in audio_lists]
                conf = torch.tensor([(h[0].score - config.penalty * n) / n if h else -math.inf
                                     for h, n in zip(audio_lists, steps)], device=gate.device)
                weight_a = weight_a * torch.exp(weights.audio_confidence * conf).clamp(max=1.0)
            scored.append((weight_a, scorer(enc_a, ctc_a)))
        return rescore_with_views(lists, scorer(enc, ctc_logp), scored, penalty=config.penalty,
                                  nbest=config.nbest, own_lists=own)
