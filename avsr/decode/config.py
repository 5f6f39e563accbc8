"""Decoding configurations: one type per search, and the reader that picks the type from ``search:``.

* :class:`DecodeConfig` (``search: espnet``, the default): the batched joint CTC/attention beam search
  (:class:`avsr.decode.beam_search.JointSearch`) and the final ranking of audio-visual hypotheses with the
  model's single-stream views (:class:`avsr.decode.searcher.Searcher`);
* :class:`FairseqConfig` (``search: fairseq``): fairseq's ``SequenceGenerator`` as AV-HuBERT decodes
  (:func:`avsr.decode.fairseq_search.fairseq_beam_search`).

Each holds only what its search reads: a decoding YAML that sets a field of the other search is refused with
the field, the file and the search it belongs to named (:func:`search_config`), since it would change nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple, Union

from avsr.config import Config, ConfigError, config_path, from_dict, load_yaml, option, probability, to_dict

__all__ = ["DecodeConfig", "FairseqConfig", "SearchConfig", "SEARCHES", "ViewWeights", "default_view_weights",
           "searched_views", "search_config", "load_decode_config", "resolve_search_config"]

#: values of ``DecodeConfig.pre_beam``.
PRE_BEAMS = ("avsr", "espnet", "espnet_nonbatch")
#: what ``ctc_end_prob`` and ``ctc_maxlen_ratio`` of None mean with ``pre_beam: avsr`` (ESPnet's modes: off).
CTC_END_PROB = 0.99
CTC_MAXLEN_RATIO = 1.5


def _check_beam(beam_size: int, nbest: int) -> None:
    """ConfigError unless ``nbest <= beam_size`` (read by both searches)."""
    if nbest > beam_size:
        raise ConfigError(f"nbest: expected at most beam_size={beam_size}, got {nbest}")


class _Readers:
    """The readers shared by the configuration types; each returns the type that ``search:`` names."""

    @staticmethod
    def from_yaml(path: str | os.PathLike, **overrides: Any) -> SearchConfig:
        """:func:`load_decode_config` of ``path`` (the type follows its ``search:``)."""
        return load_decode_config(path, **overrides)

    @staticmethod
    def from_mapping(mapping: Mapping[str, Any], where: str = "decode options") -> SearchConfig:
        """:func:`search_config` of ``mapping``."""
        return search_config(mapping, where)


@dataclass
class DecodeConfig(_Readers, Config):
    """Options of the joint CTC/attention search (:class:`avsr.decode.beam_search.JointSearch`; ESPnet
    ``asr_inference`` names), ``search: espnet`` in a decoding YAML. The fairseq search has its own type,
    :class:`FairseqConfig`.

    Attributes:
        beam_size: hypotheses kept per utterance.
        ctc_weight: weight of the CTC prefix score; 1.0 = CTC prefix search alone (no decoder needed),
            0.0 = attention alone (no CTC head needed).
        penalty: length bonus added per emitted token (``eos`` included).
        maxlenratio: maximum output length: 0 -> the encoder length ``T`` (and end detection is on);
            > 0 -> ``max(1, int(maxlenratio * T))``; < 0 -> ``-int(maxlenratio)`` tokens; in joint search
            the CTC length limit (``ctc_maxlen_ratio``) may lower it.
        minlenratio: minimum output length ``int(minlenratio * T)``; ``eos`` is refused before it.
        nbest: hypotheses returned per utterance (at most ``beam_size``).
        ctc_scoring: "partial" (CTC scores the pre-beam of the attention decoder, plus eos) or "full"
            (the whole vocabulary). CTC-only decoding always scores the whole vocabulary.
        pre_beam_ratio: pre-beam size = ``int(pre_beam_ratio * beam_size)`` for partial scoring.
        pre_beam: how partial scoring picks the tokens that CTC scores, from the attention scores of each
            running hypothesis:

            * ``avsr`` (default): the ``pre_beam`` best tokens other than ``eos`` and blank, plus ``eos``
              (so every hypothesis can always end, and no pre-beam slot goes to blank, which is never
              emitted);
            * ``espnet``: as ESPnet's ``BatchBeamSearch`` (the search of ``Speech2Text`` and
              ``asr_inference``): the ``pre_beam`` best of the whole vocabulary ranked by ESPnet's
              weighted full scores ``(1 - ctc_weight) * att + penalty`` -- ``eos`` and blank included, so
              they can take pre-beam slots -- and ``eos`` always (ESPnet's ``CTCPrefixScoreTH`` gives
              ``eos`` its CTC score whether or not it is in the pre-beam); blank is refused (ESPnet scores
              it ``-1e10``);
            * ``espnet_nonbatch``: as ESPnet's ``BeamSearch`` (the class ESPnet falls back to when a
              scorer has no batch interface): the same pre-beam, and ``eos`` is a candidate only when it
              is in the pre-beam -- or at the maximum length, where only ``eos`` is (ESPnet appends it
              there unscored, avsr scores it, as in every mode).

            With the same weights and settings, ``espnet`` and ``espnet_nonbatch`` give the hypotheses of
            ESPnet's two classes (``benchmarks/bench_vs_espnet.py`` checks this against the installed
            ESPnet). Full scoring and CTC-only or attention-only search do not use a pre-beam.
        ctc_end_prob: the CTC end gate of joint search (``0 < ctc_weight < 1``): a running hypothesis ``g``
            whose CTC probability of being complete, ``p_ctc(g) / psi(g)`` (the CTC prefix score of ``eos``,
            Watanabe et al. 2017), is at least this can only take ``eos``: CTC says the input is used up, so
            the attention decoder cannot run on (its extension scores collapse to ``-inf``). Not applied
            before the minimum length. 1.0: off (ESPnet). None (default): 0.99 with ``pre_beam: avsr``, off
            with ``espnet`` and ``espnet_nonbatch``.
        ctc_maxlen_ratio, ctc_maxlen_margin: the CTC length limit of joint search: the maximum length becomes
            ``min(maxlen, max(minlen, ceil(ctc_maxlen_ratio * E[|y|]) + ctc_maxlen_margin))``, where
            ``E[|y|]`` is the expected number of labels of the CTC output
            (:func:`avsr.decode.ctc_prefix_score.ctc_expected_label_count`): room for the decoder to restore
            words that CTC missed, but no loop past what the input holds. ``ctc_maxlen_ratio`` 0: off
            (ESPnet); None (default): 1.5 with ``pre_beam: avsr``, off with ``espnet`` and
            ``espnet_nonbatch``. ``ctc_maxlen_margin``: tokens, default 2.
        video_weight, audio_weight: audio-visual input only: the weights of the model's video-only and
            audio-only views in a final ranking of the fused input's n-best list joined with the video-only
            view's own (:mod:`avsr.decode.rescore`). Each candidate scores
            ``s_av + g * (video_weight * s_v + audio_weight * s_a)``, where ``g`` is the utterance's mean
            audio gate (how far the fused input rests on the audio). None (default): the model's
            ``decode_defaults`` (recorded in its checkpoint from the training YAML's ``decode_defaults``: the
            SynthGRID recipe's 1.0 and 3.0), else 0; both 0: no ranking (one search, as ESPnet).
            Weights > 0 need a model with an audio gate. Audio-only and video-only input ignore them (one
            view).
        audio_confidence: audio-visual input with ``audio_weight`` > 0 only: a confidence check of the audio.
            Above 0, the audio-only view searches too, its n-best list joins the candidates, and its weight
            becomes ``g * audio_weight * min(1, exp(audio_confidence * c))``, where ``c`` is the mean log
            probability per token (``eos`` included, length bonus left out) of the audio-only view's best
            hypothesis: about -0.1 on clean speech the model hears well, below -0.5 in babble at 0 dB. Clean
            audio then outvotes lips unlike the training ROIs (a real face through the ROI stage), noisy
            audio does not. None (default): the model's ``decode_defaults``, else 0 (off).
        video_sync_margin, video_sync_slope: audio-visual input of a model with a video trust gate
            (``video_gate``) only: the search decides per utterance whether to use the lips at all, instead
            of the gate's soft scaling (:class:`avsr.encoder.VideoGate`). The lips are used whole where their
            sync margin (:attr:`avsr.encoder.VideoTrust.margin`) reaches ``video_sync_margin +
            video_sync_slope * q``, and not at all elsewhere (the utterance is then decoded exactly as its
            audio alone); ``q`` (<= 0) is the audio-only view's confidence, the mean over frames of its
            largest CTC log probability: about -0.015 on clean speech, -0.1 in babble at -5 dB. Noise
            lowers the margin of lips in sync, so the bar is lower where the audio is unsure, where the lips
            matter most. A model with a CTC head only. None (default): the model's ``decode_defaults``; a
            margin of None there too keeps the soft gate (a slope of None: 0).
        video_max_entropy: a second condition of that decision (nats, >= 0): the lips are used only where
            the video-only view reads them with confidence, its mean per-frame entropy of the CTC posteriors
            (over the utterance's frames) at most this. Lips in sync that the model cannot read -- a
            mouth of another look than its training ROIs, a real face it never saw, a still picture -- give
            flat posteriors (the SynthGRID model, three seeds: 0.19-1.14 for a frozen mouth or a
            photograph's mouth, 0.02-0.30 for its own lips, whatever the voice). It costs one encoder pass of
            the video-only view. None (default): the model's ``decode_defaults``, else not checked. Needs the
            decision (``video_sync_margin``) where it applies: a model with a video trust gate.

    Raises:
        avsr.config.ConfigError: a value out of range (named).
    """

    search: ClassVar[str] = "espnet"

    beam_size: int = option(10, ge=1)
    ctc_weight: float = probability(0.3)
    penalty: float = option(0.0, finite=True)
    maxlenratio: float = option(0.0, finite=True)
    minlenratio: float = option(0.0, ge=0, finite=True)
    nbest: int = option(1, ge=1)
    ctc_scoring: str = option("partial", choices=("partial", "full"))
    pre_beam_ratio: float = option(1.5, gt=0, finite=True)
    pre_beam: str = option("avsr", choices=PRE_BEAMS)
    ctc_end_prob: float | None = option(None, gt=0, le=1)
    ctc_maxlen_ratio: float | None = option(None, ge=0, finite=True)
    ctc_maxlen_margin: int = option(2, ge=0)
    video_weight: float | None = option(None, ge=0, finite=True)
    audio_weight: float | None = option(None, ge=0, finite=True)
    audio_confidence: float | None = option(None, ge=0, finite=True)
    video_sync_margin: float | None = option(None, ge=-2, le=2)
    video_sync_slope: float | None = option(None, ge=0, finite=True)
    video_max_entropy: float | None = option(None, ge=0, finite=True)

    def check(self) -> None:
        """``nbest <= beam_size``. Raises :class:`avsr.config.ConfigError`."""
        _check_beam(self.beam_size, self.nbest)

    def ctc_end_rules(self) -> tuple[float, float]:
        """``(ctc_end_prob, ctc_maxlen_ratio)`` with None resolved: :data:`CTC_END_PROB` and
        :data:`CTC_MAXLEN_RATIO` with ``pre_beam: avsr``, ``(1.0, 0.0)`` (off, as ESPnet) with ``espnet`` and
        ``espnet_nonbatch``."""
        ours = self.pre_beam == "avsr"
        end = self.ctc_end_prob if self.ctc_end_prob is not None else (CTC_END_PROB if ours else 1.0)
        ratio = self.ctc_maxlen_ratio if self.ctc_maxlen_ratio is not None else (
            CTC_MAXLEN_RATIO if ours else 0.0)
        return end, ratio

    def view_weights(self, default: ViewWeights) -> ViewWeights:
        """The view weights of this configuration, each ``default``'s where it is None."""
        own = (self.video_weight, self.audio_weight, self.audio_confidence)
        return ViewWeights(*(v if v is not None else d for v, d in zip(own, default)))

    def sync_rule(self, decode_defaults: Mapping[str, Any] | None) -> tuple[float, float] | None:
        """``(video_sync_margin, video_sync_slope)``, each the model's ``decode_defaults``' where None (a
        slope left unset: 0); None where no margin is set (the soft gate)."""
        return _sync_rule(self.video_sync_margin, self.video_sync_slope, decode_defaults)

    def entropy_bar(self, decode_defaults: Mapping[str, Any] | None) -> float | None:
        """``video_max_entropy``, the model's ``decode_defaults``' where None; None: not checked."""
        return _entropy_bar(self.video_max_entropy, decode_defaults)



@dataclass
class FairseqConfig(_Readers, Config):
    """Options of fairseq's beam search as AV-HuBERT decodes (``search: fairseq``;
    :func:`avsr.decode.fairseq_search.fairseq_beam_search`, fairseq's ``SequenceGenerator`` with
    ``search.BeamSearch``): attention only.

    Attributes:
        beam_size: hypotheses kept per utterance.
        ctc_weight: must be 0 (fairseq's generator has no CTC: the search is attention-only); accepted so
            that one key means the same in every decoding YAML.
        nbest: hypotheses returned per utterance (at most ``beam_size``).
        lenpen: fairseq's length penalty: a finished hypothesis scores ``sum log p / len ** lenpen``.
        max_len_a, max_len_b: fairseq's maximum output length ``int(max_len_a * src_len + max_len_b)``
            tokens (fairseq's defaults 0 and 200; AV-HuBERT's ``s2s_decode.yaml``: 1.0 and 0).
        min_len: fairseq's minimum output length (``</s>`` refused before it).
        unkpen: subtracted from the log-probability of ``<unk>`` (fairseq ``--unkpen``).
        normalize_scores: divide by ``len ** lenpen`` (fairseq's default; ``--unnormalized`` turns it off).

    Raises:
        avsr.config.ConfigError: a value out of range (named).
    """

    search: ClassVar[str] = "fairseq"

    beam_size: int = option(10, ge=1)
    ctc_weight: float = 0.0
    nbest: int = option(1, ge=1)
    lenpen: float = option(1.0, finite=True)
    max_len_a: float = option(0.0, finite=True)
    max_len_b: int = 200
    min_len: int = option(1, ge=0)
    unkpen: float = option(0.0, finite=True)
    normalize_scores: bool = True

    def check(self) -> None:
        """``nbest <= beam_size``, ``ctc_weight`` 0. Raises :class:`avsr.config.ConfigError`."""
        _check_beam(self.beam_size, self.nbest)
        if self.ctc_weight != 0:
            raise ConfigError(f"ctc_weight: search 'fairseq' is attention-only: "
                              f"set it to 0, got {self.ctc_weight}")

    def view_weights(self, default: ViewWeights) -> ViewWeights:
        """All 0: the fairseq search has no final ranking with the views."""
        return ViewWeights()

    def sync_rule(self, decode_defaults: Mapping[str, Any] | None) -> tuple[float, float] | None:
        """The model's ``decode_defaults``' ``(video_sync_margin, video_sync_slope)`` (None: the soft gate):
        the decision shapes the fused input, whichever search follows."""
        return _sync_rule(None, None, decode_defaults)

    def entropy_bar(self, decode_defaults: Mapping[str, Any] | None) -> float | None:
        """The model's ``decode_defaults``' ``video_max_entropy`` (None: not checked), a condition of that
        decision."""
        return _entropy_bar(None, decode_defaults)



#: a decoding configuration of either search.
SearchConfig = Union[DecodeConfig, FairseqConfig]  # noqa: UP007 (a runtime alias, also on Python 3.10)

#: the configuration type of each ``search:`` value.
SEARCHES: dict[str, type] = {"espnet": DecodeConfig, "fairseq": FairseqConfig}


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class ViewWeights(NamedTuple):
    """The weights of audio-visual decoding's final ranking with the single-stream views (the fields of
    :class:`DecodeConfig` of the same names); all 0: one search."""

    video_weight: float = 0.0
    audio_weight: float = 0.0
    audio_confidence: float = 0.0


def default_view_weights(decode_defaults: Mapping[str, Any] | None) -> ViewWeights:
    """The view weights of a model's ``decode_defaults`` (its configuration's decoding options, kept in
    checkpoints), 0 for one it does not set: what a configuration that leaves them None decodes with
    (:meth:`DecodeConfig.view_weights`)."""
    defaults = decode_defaults or {}
    return ViewWeights(*(float(defaults.get(k) or 0.0) for k in ViewWeights._fields))


def _sync_rule(margin: float | None, slope: float | None, decode_defaults: Mapping[str, Any] | None
               ) -> tuple[float, float] | None:
    """``(video_sync_margin, video_sync_slope)`` with None taken from ``decode_defaults``, None without a
    margin."""
    defaults = decode_defaults or {}
    margin = margin if margin is not None else defaults.get("video_sync_margin")
    slope = slope if slope is not None else defaults.get("video_sync_slope")
    return None if margin is None else (float(margin), float(slope or 0.0))


def _entropy_bar(bar: float | None, decode_defaults: Mapping[str, Any] | None) -> float | None:
    """``video_max_entropy`` with None taken from ``decode_defaults``."""
    bar = bar if bar is not None else (decode_defaults or {}).get("video_max_entropy")
    return None if bar is None else float(bar)


def searched_views(weights: ViewWeights) -> tuple[str, ...]:
    """The single-stream views that audio-visual decoding with ``(video_weight, audio_weight,
    audio_confidence)`` searches besides the fused input (:class:`avsr.decode.searcher.Searcher`):
    ``"video"`` with a video weight, ``"audio"`` with an audio weight and the confidence check (an audio
    weight alone only scores the candidates)."""
    weights = ViewWeights(*weights)  # also a plain (video_weight, audio_weight, audio_confidence)
    video = ("video",) if weights.video_weight > 0 else ()
    return video + (("audio",) if weights.audio_weight > 0 and weights.audio_confidence > 0 else ())


def search_config(mapping: Mapping[str, Any] | None, where: str = "decode options") -> SearchConfig:
    """The configuration of the search that ``mapping["search"]`` names (``espnet`` when absent), built from
    the other keys (:func:`avsr.config.from_dict`: types checked, unknown keys refused).

    Args:
        mapping: decoding options, e.g. a decoding YAML's top level.
        where: what the options come from, for messages (a file path).

    Raises:
        avsr.config.ConfigError: an unknown search; a key of the other search (named with the search it
            belongs to, and that search's fields); an unknown key or a bad value (named).
    """
    options = dict(mapping or {})
    name = options.pop("search", "espnet")
    if name not in SEARCHES:
        raise ConfigError(f"{where}: search must be one of {list(SEARCHES)}, got {name!r}")
    cls = SEARCHES[name]
    used = _field_names(cls)
    for other, other_cls in SEARCHES.items():
        foreign = sorted(k for k in options if k not in used and k in _field_names(other_cls))
        if other != name and foreign:
            raise ConfigError(
                f"{where}: {foreign[0]} is not used by search '{name}' (it reads {', '.join(used)}); "
                f"remove it, or set search: {other} if that is the search it belongs to"
            )
    return from_dict(cls, options, where)


def load_decode_config(path: str | os.PathLike | None = None, **overrides: Any) -> SearchConfig:
    """Read a decoding YAML file (its top level holds the fields; ``overrides`` win), or the defaults with
    ``overrides`` when ``path`` is None; the type follows ``search:`` (:func:`search_config`).

    ``path`` is a file or the name of a shipped decoding configuration: ``"default"`` (joint CTC/attention
    beam search) or ``"avhubert_s2s"`` (AV-HuBERT's fairseq generator), i.e. ``avsr/conf/decode/<name>.yaml``;
    an existing file wins over a name (see :func:`avsr.config.config_path`).

    Raises:
        avsr.config.ConfigError: missing/invalid file or unknown name (the shipped names are listed), unknown
            key (named with the file), bad value, a field the chosen search does not read.
    """
    if path is None:
        return search_config(overrides, "decode options")
    path = config_path(path, "decode")
    return search_config({**load_yaml(path), **overrides}, str(path))


def resolve_search_config(config: SearchConfig | Mapping[str, Any] | str | os.PathLike | None,
                          defaults: Mapping[str, Any] | None = None, **overrides: Any) -> SearchConfig:
    """The search configuration of a decoding call: ``config`` with ``overrides`` applied.

    Args:
        config: a :class:`DecodeConfig` / :class:`FairseqConfig` (taken as it is), a decoding YAML path or
            the name of a shipped one (:func:`load_decode_config`), a mapping of options over ``defaults``, or
            None: ``defaults`` alone.
        defaults: the model's decoding defaults (its checkpoint's decode section,
            :func:`avsr.inference.pretrained.checkpoint_decode_defaults`); a configuration object or a file
            keeps its own values, and leaves only its None view weights and decision rule to them (read by
            :class:`avsr.decode.searcher.Searcher`).
        overrides: options over all of these (e.g. ``beam_size=5``); the type follows ``search``.

    Raises:
        avsr.config.ConfigError: an unknown or misplaced key, a bad value, a missing file (named).
    """
    if isinstance(config, (str, os.PathLike)):
        config = load_decode_config(config)
    if isinstance(config, (DecodeConfig, FairseqConfig)):
        if not overrides:
            return config
        base: dict[str, Any] = {"search": config.search, **to_dict(config)}
    else:
        base = {**dict(defaults or {}), **dict(config or {})}
    return search_config({**base, **overrides}, "decode options")
