"""The ASR model: AV-HuBERT encoder + CTC head + attention decoder, trained with the hybrid CTC/attention
loss.

Source: Watanabe et al. (2017), "Hybrid CTC/attention architecture for end-to-end speech recognition",
Sec. III-A (multi-task loss ``L = ctc_weight * L_ctc + (1 - ctc_weight) * L_att``), in the form of ESPnet2's
``ESPnetASRModel`` (``espnet2/asr/espnet_model.py``), with the encoder of AV-HuBERT (Shi et al., 2022).

Token ids follow ESPnet: ``[<blank>, <unk>, pieces..., <sos/eos>]``, so ``blank = 0`` and
``sos = eos = vocab_size - 1``; target padding is ``ignore_id = -1``. Models converted from fairseq AV-HuBERT
checkpoints use fairseq's dictionary instead (``token_convention: fairseq``): ``<s> = 0`` (also the CTC
blank, as AV-HuBERT's task ``blank_symbol``), ``<pad> = 1`` (never emitted), ``</s> = 2`` (both the first
decoder input and the end), ``<unk> = 3``, and decoder positions start at ``<pad> + 1 = 2`` (fairseq's
sinusoidal positions).

Loss normalisation (as ESPnet's defaults):

* CTC: :func:`torch.nn.functional.ctc_loss` with ``zero_infinity=True`` (an impossible alignment, e.g. more
  labels than frames, contributes 0 instead of inf), summed over the batch and divided by the batch size,
  i.e. the mean over utterances of each utterance's ``-log p_ctc(y|x)`` (ESPnet ``CTC(reduce=True)``).
* attention: label-smoothing loss of ESPnet's ``LabelSmoothingLoss``: the KL divergence between the
  smoothed target (``1 - lsm_weight`` on the true token, ``lsm_weight / (V - 1)`` on every other) and the
  decoder's distribution, summed over tokens (``eos`` included, padding ignored) and divided by the batch
  size, or by the number of tokens when ``length_normalized_loss`` is true.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from avsr.compat.fairseq_avhubert import (
    LoadedCheckpoint,
    load_state_strict,
    read_checkpoint,
    resolve_token_list,
)
from avsr.compat.safe_load import CheckpointError
from avsr.config import ConfigError, check_keys, config_path, load_yaml
from avsr.encoder import AVHubertEncoder, EncoderRuntime, VideoTrust
from avsr.models.config import ASR_KEYS, TOKEN_CONVENTIONS, VIEWS, AVSRModelConfig, ModelConfig
from avsr.nn.decoder import TransformerDecoder
from avsr.nn.precision import fp32_context

__all__ = ["AVSRModel", "AVSRModelConfig", "label_smoothing_loss"]


def label_smoothing_loss(
    logits: Tensor, target: Tensor, smoothing: float, ignore_id: int = -1, normalize_length: bool = False
) -> Tensor:
    """ESPnet's ``LabelSmoothingLoss``: ``sum KL(q || p)`` over non-ignored positions, normalised.

    Args:
        logits: ``(B, L, V)`` unnormalised decoder outputs.
        target: ``(B, L)`` int64 target ids, ``ignore_id`` on padding.
        smoothing: ``q = 1 - smoothing`` on the target, ``smoothing / (V - 1)`` on each other token.
        ignore_id: padding value of ``target``.
        normalize_length: divide by the number of non-ignored tokens (True) or by ``B`` (False).

    Returns:
        Scalar float32 loss (>= 0; 0 only for a perfect prediction of ``q``).
    """
    v = logits.size(-1)
    logp = torch.log_softmax(logits.float(), dim=-1)
    ignore = target == ignore_id
    tgt = target.masked_fill(ignore, 0)
    conf, other = 1.0 - smoothing, smoothing / (v - 1)
    # sum_v q_v log q_v (0 log 0 = 0)
    neg_entropy = (conf * math.log(conf) if conf > 0 else 0.0) + (
        smoothing * math.log(other) if other > 0 else 0.0
    )
    lp_target = logp.gather(-1, tgt[..., None])[..., 0]
    cross = conf * lp_target + other * (logp.sum(-1) - lp_target)
    kl = (neg_entropy - cross).masked_fill(ignore, 0.0)
    denom = (~ignore).sum().clamp(min=1) if normalize_length else target.size(0)
    return kl.sum() / denom


class AVSRModel(nn.Module):
    """Hybrid CTC/attention AVSR model over the AV-HuBERT encoder.

    Args:
        config: the model's configuration, :class:`avsr.models.config.ModelConfig` (or a mapping of it, as a
            model YAML holds): ``vocab_size`` ``V`` (including ``<blank>``, id 0, and ``<sos/eos>``, id
            ``V - 1``), ``encoder_conf`` (:class:`avsr.encoder.AVHubertEncoderConfig`), ``decoder_conf``
            (:class:`avsr.nn.decoder.TransformerDecoderConfig`), ``model_conf`` (:class:`AVSRModelConfig`:
            ``ctc_weight``, ``lsm_weight``, ``length_normalized_loss``, ``token_convention``,
            ``av_batch_views``), ``token_list`` (the symbol of each token id, kept as ``model.token_list``,
            e.g. the fairseq dictionary of a converted model) and ``decode_defaults`` (decoding options kept
            in every checkpoint's ``model_config``, e.g. the SynthGRID recipe's tuned view weights; the model
            does not read them: decoding does, :func:`avsr.inference.pretrained.checkpoint_decode_defaults`).
            Sections left None take their defaults.
        encoder: an already built encoder (ESPnet ``AbsEncoder`` interface: ``forward(xs_pad, ilens) ->
            (hidden, olens, None)``, ``output_size()``) to use instead of building one from ``encoder_conf``.
        runtime: the run-time switches of the encoder built from ``encoder_conf``
            (:class:`avsr.encoder.EncoderRuntime`: activation checkpointing, the video front-end's precision
            and layout, who draws the modality dropout; None: its defaults). Not saved with the
            configuration. With ``encoder`` it is refused: that encoder was built with its own.

    Attributes: ``config`` (the complete :class:`~avsr.models.config.ModelConfig`, defaults filled in),
    ``conf`` (its ``model_conf``), ``encoder``, ``ctc_lo`` (Linear ``D -> V``, None when ``ctc_weight == 0``),
    ``phone_ctc_lo`` (Linear ``D -> phone_vocab_size``, the phone CTC head; None when
    ``phone_ctc_weight == 0``),
    ``decoder`` (None when ``ctc_weight == 1``), ``sos``, ``eos``, ``blank``, ``pad`` (None in the ESPnet
    convention), ``unk``, ``ignore_id``, ``token_list``.

    :meth:`from_pretrained` loads avsr checkpoints and official fairseq AV-HuBERT fine-tuned ones;
    :meth:`from_yaml` builds from a model YAML. Decoding is not the model's: it gives the parts a search reads
    (:class:`avsr.decode.searcher.SearchModel`: :meth:`encode`, :meth:`ctc_log_probs`, :meth:`encode_video`,
    :meth:`gate_means`, :meth:`sync_margin`, ``decoder`` and the token ids), and
    :class:`avsr.decode.searcher.Searcher` (through :class:`avsr.inference.Transcriber`) decodes.

    Raises:
        avsr.config.ConfigError: an unknown option or a bad value (key named), no ``vocab_size``, a
            pretraining configuration, both ``encoder`` and ``encoder_conf`` (or ``runtime``),
            ``av_batch_views`` other than ``[audiovisual]`` with an ``encoder`` that lacks ``encode_video``.
    """

    def __init__(self, config: ModelConfig | Mapping[str, Any], encoder: nn.Module | None = None, *,
                 runtime: EncoderRuntime | None = None) -> None:
        super().__init__()
        config = ModelConfig.from_mapping(config)
        if encoder is not None and config.encoder_conf is not None:
            raise ConfigError("AVSRModel: give either encoder= or encoder_conf, not both")
        if encoder is not None and runtime is not None:
            raise ConfigError("AVSRModel: runtime= is for the encoder built from encoder_conf; an encoder= "
                              "given already has its run-time switches (build it with that runtime)")
        self.config = config = config.for_asr(with_encoder=encoder is None)
        self.conf: AVSRModelConfig = config.model_conf
        self.vocab_size = vocab_size = config.vocab_size
        ids = TOKEN_CONVENTIONS[self.conf.token_convention](vocab_size)
        self.blank, self.sos, self.eos = ids["blank"], ids["sos"], ids["eos"]
        self.pad, self.unk = ids["pad"], ids["unk"]
        self.ignore_id = -1
        self.token_list = list(config.token_list) if config.token_list is not None else None
        if encoder is None:
            encoder = AVHubertEncoder(config=config.encoder_conf, runtime=runtime)
        if self.conf.av_batch_views != ("audiovisual",) and not hasattr(encoder, "encode_video"):
            raise ConfigError(f"model_conf: av_batch_views {list(self.conf.av_batch_views)} needs an encoder "
                              f"with encode_video (AVHubertEncoder); {type(encoder).__name__} has none")
        self.encoder = encoder
        if "audiovisual_clean" in self.conf.av_batch_views:  # the trainer passes the batch's clean audio too
            self.batch_keys = ("audio", "video", "lengths", "ys_pad", "ys_lens", "audio_clean")
        d = encoder.output_size()
        self.ctc_lo = nn.Linear(d, vocab_size) if self.ctc_weight > 0 else None
        self.phone_ctc_lo = None
        if self.conf.phone_ctc_weight > 0:
            if self.conf.phone_vocab_size is None:
                raise ConfigError("model_conf: phone_ctc_weight > 0 needs phone_vocab_size (avsr.bin.train "
                                  "--phone-lexicon sets it from the lexicon)")
            self.phone_ctc_lo = nn.Linear(d, self.conf.phone_vocab_size)
            self.batch_keys = ("audio", "video", "lengths", "ys_pad", "ys_lens", "audio_clean", "phones_pad",
                               "phones_lens")
        if self.conf.video_gate_weight > 0:
            if getattr(encoder, "video_gate", None) is None:
                raise ConfigError("model_conf: video_gate_weight > 0 needs an encoder with a video gate "
                                  "(encoder_conf.video_gate: true)")
            self.batch_keys = ("audio", "video", "lengths", "ys_pad", "ys_lens", "audio_clean", "phones_pad",
                               "phones_lens", "video_trusted")
        offset = self.pad + 1 if self.pad is not None else 0  # fairseq positions start after <pad>
        self.decoder = None
        if self.ctc_weight < 1:
            self.decoder = TransformerDecoder(vocab_size, d, config.decoder_conf, position_offset=offset)

    @property
    def ctc_weight(self) -> float:
        """Weight of the CTC loss (``model_conf.ctc_weight``)."""
        return self.conf.ctc_weight

    @property
    def has_ctc(self) -> bool:
        """Whether the model has a CTC head (``ctc_weight > 0``)."""
        return self.ctc_lo is not None

    @property
    def has_audio_gate(self) -> bool:
        """Whether the encoder has an audio gate (``encoder_conf.audio_gate``)."""
        return getattr(self.encoder, "audio_gate", None) is not None

    @property
    def has_video_gate(self) -> bool:
        """Whether the encoder has a video trust gate (``encoder_conf.video_gate``)."""
        return getattr(self.encoder, "video_gate", None) is not None

    def encode_video(self, video: Tensor, lengths: Tensor) -> Tensor:
        """The video front-end's output ``(B, D, T)`` for ``(B, 1, T, H, W)`` video with ``lengths (B,)``
        valid frames (:meth:`avsr.encoder.AVHubertEncoder.encode_video`, whose errors it raises)."""
        return self.encoder.encode_video(video, lengths)

    def gate_means(self, audio: Tensor, video_features: Tensor, lengths: Tensor,
                   video_decision: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """Each utterance's mean audio gate and video trust gate for this two-stream input, ``(B,)`` float32
        each or None (:meth:`avsr.encoder.AVHubertEncoder.gate_means`, whose errors it raises)."""
        return self.encoder.gate_means(audio, video_features, lengths, video_decision)

    def sync_margin(self, audio: Tensor, video_features: Tensor, lengths: Tensor) -> Tensor | None:
        """Each utterance's sync margin ``(B,)`` float32, or None without a video trust gate
        (:meth:`avsr.encoder.AVHubertEncoder.sync_margin`, whose errors it raises)."""
        return self.encoder.sync_margin(audio, video_features, lengths)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu",
                        dictionary: Any = None, bpemodel: Any = None) -> AVSRModel:
        """Load a checkpoint: avsr's own (``model`` + ``model_config``, as the trainer and ``avsr-convert``
        write) or an official fairseq AV-HuBERT fine-tuned one (``av_hubert_seq2seq``: encoder, decoder and
        dictionary; ``av_hubert_ctc``: encoder and CTC projection), read safely by
        :func:`avsr.compat.read_checkpoint`. The model is returned in eval mode. ``dictionary`` and
        ``bpemodel`` give a fairseq model's token symbols (see :meth:`from_checkpoint`).

        Raises:
            FileNotFoundError: no such file.
            avsr.compat.CheckpointError: unreadable, not an AV-HuBERT/avsr checkpoint, a pretraining
                checkpoint (no ASR head), a dictionary of the wrong size, or weights that do not fit (keys
                named).
        """
        return cls.from_checkpoint(read_checkpoint(path, map_location), dictionary, bpemodel)

    @classmethod
    def from_checkpoint(cls, loaded: LoadedCheckpoint, dictionary: Any = None, bpemodel: Any = None
                        ) -> AVSRModel:
        """The model of a checkpoint already read by :func:`avsr.compat.read_checkpoint`, in eval mode.

        Args:
            loaded: a fine-tuned fairseq checkpoint or an avsr ASR one.
            dictionary: fairseq ``dict.txt`` path or :class:`avsr.compat.FairseqDictionary` giving the token
                symbols of a fairseq model (default: the one pickled in the file, else built from the
                sentencepiece model; :func:`avsr.compat.resolve_token_list`).
            bpemodel: sentencepiece model used to build that dictionary when the file pickles none.

        The returned model has ``model_config``: the complete configuration (as ``avsr-convert`` saves it).

        Raises:
            avsr.compat.CheckpointError: a pretraining checkpoint (no ASR head), dictionary size mismatch,
                weights that do not fit.
        """
        if loaded.model_config is None:
            raise CheckpointError(f"{loaded.path}: a {loaded.kind} encoder checkpoint has no ASR head; load "
                                  "it with AVHubertEncoder.from_pretrained")
        config = dict(loaded.model_config)
        if loaded.kind != "avsr":
            config["token_list"] = resolve_token_list(loaded, config["vocab_size"], dictionary, bpemodel)
            config["encoder_conf"] = loaded.encoder_conf
        model = cls.from_config(config, str(loaded.path))
        load_state_strict(model, loaded.model_state, str(loaded.path), "model")
        model.model_config = model.config.to_dict()
        return model.eval()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | ModelConfig, where: str = "model config", *,
                    runtime: EncoderRuntime | None = None) -> AVSRModel:
        """Build from a model configuration: a mapping with keys ``vocab_size``, ``encoder_conf``,
        ``decoder_conf``, ``model_conf`` and, optionally, ``token_list`` and ``decode_defaults`` (e.g. a
        ``conf/model/*.yaml`` file's content, a checkpoint's ``model_config``), or a
        :class:`~avsr.models.config.ModelConfig`.

        Args:
            config: the configuration.
            where: origin named in error messages (a file name).
            runtime: the encoder's run-time switches (:class:`avsr.encoder.EncoderRuntime`; None: its
                defaults), not part of the configuration.

        Raises:
            avsr.config.ConfigError: unknown key at any level (named with ``where``), missing ``vocab_size``,
                a bad value.
        """
        try:
            return cls(ModelConfig.from_mapping(config, where), runtime=runtime)
        except ConfigError as e:
            if str(e).startswith(where):
                raise
            raise ConfigError(f"{where}: {e}") from e

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, **overrides: Any) -> AVSRModel:
        """:meth:`from_config` on a YAML file, with ``overrides`` of its top-level keys; errors name the file.

        ``path`` is a file or the name of a shipped model configuration (``"avsr_synthgrid_cpu"``:
        ``avsr/conf/model/<name>.yaml``; an existing file wins over a name, see
        :func:`avsr.config.config_path`). ``overrides`` are keys of :meth:`from_config`: ``vocab_size``
        (which the shipped configurations leave to the tokenizer) and ``token_list`` replace the file's
        value; a mapping given for ``encoder_conf``, ``decoder_conf`` or ``model_conf`` is merged into the
        file's mapping (its keys win), e.g. ``AVSRModel.from_yaml("avsr_synthgrid_cpu", vocab_size=40,
        model_conf={"ctc_weight": 0.5})``. The weights are randomly initialised.

        Raises:
            avsr.config.ConfigError: missing/invalid file or unknown name (the shipped names are listed), an
                unknown key or override (named), missing ``vocab_size``.
        """
        check_keys(overrides, ASR_KEYS, f"{cls.__name__}.from_yaml override")
        path = config_path(path, "model")
        config = load_yaml(path)
        for key, value in overrides.items():
            if key.endswith("_conf") and isinstance(value, Mapping) and isinstance(config.get(key), Mapping):
                value = {**config[key], **value}
            config[key] = value
        return cls.from_config(config, str(path))

    def encode(self, audio: Tensor | None, video: Tensor | None, lengths: Tensor,
               video_features: Tensor | None = None, video_decision: Tensor | None = None
               ) -> tuple[Tensor, Tensor]:
        """Encoder output ``(B, T, D)`` and its lengths ``(B,)`` for audio ``(B, 104, T)`` and/or video
        ``(B, 1, T, H, W)`` features at 25 frames/s with ``lengths (B,)`` valid frames (see
        :meth:`avsr.encoder.AVHubertEncoder.forward`, whose errors it raises). ``video_features``: the video
        front-end's output ``(B, D, T)`` computed earlier (``encoder.encode_video``), used instead of
        ``video``; ``video_decision``: the search's ``(B,)`` 0/1 decision on the lips (None: the video trust
        gate's value). The output is float32 also when the encoder ran under a bfloat16 autocast (see
        :mod:`avsr.nn.precision`).
        """
        if video_features is not None:
            enc, enc_lens, _ = self.encoder({"audio": audio, "video": None}, lengths,
                                            video_features=video_features, video_decision=video_decision)
        else:
            enc, enc_lens, _ = self.encoder({"audio": audio, "video": video}, lengths,
                                            video_decision=video_decision)
        return enc.float(), enc_lens.to(enc.device, torch.long)

    def ctc_log_probs(self, enc: Tensor) -> Tensor | None:
        """CTC log-probabilities ``(B, T, V)`` float32 of an encoder output ``(B, T, D)`` (None: no CTC head,
        ``ctc_weight == 0``).

        The projection ``ctc_lo`` and the log-softmax are computed in float32 even under autocast (bfloat16
        logits would be rounded to 1/256 of their magnitude, e.g. steps of 1/8 at 20).
        """
        return None if self.ctc_lo is None else self._fp32_log_probs(self.ctc_lo, enc)

    @staticmethod
    def _fp32_log_probs(head: nn.Linear, enc: Tensor) -> Tensor:
        """``log_softmax(head(enc))`` ``(B, T, C)`` computed in float32 under any autocast."""
        with fp32_context(enc.device):
            return torch.log_softmax(head(enc.float()), dim=-1)

    def _targets(self, ys_pad: Tensor, ys_lens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Check targets; return ``ys (B, L)`` (padding -> ignore_id), ``ys_in (B, L+1)`` (sos + ys, padded
        with eos) and ``ys_out (B, L+1)`` (ys + eos, padded with ignore_id). On CPU an invalid target raises
        ValueError naming the batch item; on an accelerator the check runs on the device without stopping
        the host (``torch._assert_async``: a RuntimeError at a later synchronisation)."""
        b, length = ys_pad.shape
        if ys_lens.shape != (b,):
            raise ValueError(f"ys_lens must be ({b},), got {tuple(ys_lens.shape)}")
        ys_lens = ys_lens.to(ys_pad.device, torch.long)
        pad = torch.arange(length, device=ys_pad.device)[None, :] >= ys_lens[:, None]
        special = [i for i in (self.blank, self.sos, self.eos, self.pad) if i is not None]
        out_of_range = (ys_pad < 0) | (ys_pad >= self.vocab_size)
        bad = ~pad & (out_of_range | torch.isin(ys_pad, ys_pad.new_tensor(special)))
        if ys_pad.device.type != "cpu":  # no host synchronisation per step: checked on the device
            torch._assert_async(~bad.any() & ~(ys_lens > length).any(),
                                "invalid target: an id outside 0..V-1 or special, or ys_lens > L")
        elif bool(bad.any()) or bool((ys_lens > length).any()):
            u = int(bad.any(1).nonzero()[0]) if bool(bad.any()) else int((ys_lens > length).nonzero()[0])
            raise ValueError(
                f"target of batch item {u} is invalid: ids must lie in 0..{self.vocab_size - 1} and not be a "
                f"special id {sorted(set(special))} (blank, sos/eos, pad) and ys_lens <= {length}; got "
                f"{ys_pad[u].tolist()} with length {int(ys_lens[u])}"
            )
        ys = ys_pad.masked_fill(pad, self.ignore_id)
        ys_in = torch.cat([ys.new_full((b, 1), self.sos), ys.masked_fill(pad, self.eos)], dim=1)
        ys_out = torch.cat([ys, ys.new_full((b, 1), self.ignore_id)], dim=1)
        ys_out.scatter_(1, ys_lens[:, None], self.eos)
        return ys, ys_in, ys_out

    def forward(
        self, audio: Tensor | None, video: Tensor | None, lengths: Tensor, ys_pad: Tensor, ys_lens: Tensor,
        audio_clean: Tensor | None = None, phones_pad: Tensor | None = None,
        phones_lens: Tensor | None = None, video_trusted: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Hybrid CTC/attention loss of a batch.

        Args:
            audio: ``(B, 104, T)`` float audio features or None.
            video: ``(B, 1, T, H, W)`` float normalised video or None.
            lengths: ``(B,)`` int64 valid frames (25 Hz).
            ys_pad: ``(B, L)`` int64 token ids padded with -1 (ids in ``1..V-2``).
            ys_lens: ``(B,)`` int64 target lengths.
            audio_clean: ``(B, 104, T)`` float: the audio of the ``audiovisual_clean`` training view (the
                batch's audio without the loader's noise), or None (that view then takes ``audio``).
            phones_pad: ``(B, P)`` int64 phone ids (``1..phone_vocab_size-1``) padded with -1, the targets of
                the phone CTC head (``phone_ctc_weight > 0``; required then, ignored otherwise).
            phones_lens: ``(B,)`` int64 phone target lengths.
            video_trusted: ``(B,)`` float, 1 where an utterance shows its own lips and 0 where the loader gave
                it uninformative video (``AudioAugment.untrusted_video_prob``), or None (all 1): the target of
                the video trust gate's loss (``video_gate_weight``); 0-rows are left out of the ``video``
                view.

        Returns:
            ``loss`` (scalar float32, differentiable) and ``stats``: detached scalar float32 tensors on the
            loss's device (no host synchronisation; the trainer averages them and reads them once per log
            interval) ``loss``, ``loss_ctc``, ``loss_att``, ``acc`` (attention token accuracy, eos
            included), ``loss_phone`` (phone CTC models only), ``loss_trust`` and ``loss_sync`` (the video
            trust gate's losses, ``video_gate_weight > 0``, two-stream training batches only; not in
            ``loss``); a part the model does not have (CTC-only or attention-only model) is ``nan``. In
            training, a batch with both streams and more than one of ``av_batch_views`` gives the sum of the
            views' losses (and of their parts) and the mean of their accuracies.

        Precision: under a caller's bfloat16 autocast (:func:`avsr.nn.precision.autocast_context`) the
        encoder and the decoder run in bfloat16; the CTC projection, log-softmax and loss and the attention
        loss's log-softmax are computed in float32.

        Raises:
            ValueError: a target id outside ``0..V-1`` or special (blank, sos/eos, pad), or a target length
                over ``L`` (names the batch item);
                the encoder's input errors.
        """
        ys, ys_in, ys_out = self._targets(ys_pad, ys_lens)
        phones = None
        if self.phone_ctc_lo is not None:
            if phones_pad is None or phones_lens is None:
                raise ValueError("phone_ctc_weight > 0: forward needs phones_pad and phones_lens")
            phones = (phones_pad.clamp(min=0), phones_lens)
        views = self.conf.av_batch_views
        if not (self.training and audio is not None and video is not None) or views == ("audiovisual",):
            return self._loss(self.encode(audio, video, lengths), ys, ys_lens, ys_in, ys_out, phones)
        video_features = self.encoder.encode_video(video, lengths) if set(views) != {"audio"} else None
        gate_loss = self.conf.video_gate_weight > 0
        loss, stats = None, {}
        for view in views:  # 1-4 views; each a whole batch through the transformer and the decoder
            keep = VIEWS[view]
            view_audio = audio_clean if view == "audiovisual_clean" and audio_clean is not None else audio
            targets = (ys, ys_lens, ys_in, ys_out, phones)
            if gate_loss and keep == ("audio", "video"):  # the first two-stream view: the trust gate's loss
                enc, trust = self._encode_with_trust(view_audio, lengths, video_features)
                gate_terms = self._trust_losses(trust, video_trusted)
                gate_loss_sum = sum(gate_terms.values()) * self.conf.video_gate_weight
                loss = gate_loss_sum if loss is None else loss + gate_loss_sum
                stats.update({key: value.detach() for key, value in gate_terms.items()})
                gate_loss = False
            elif view == "video" and video_trusted is not None and not bool((video_trusted > 0.5).all()):
                rows = (video_trusted > 0.5).nonzero()[:, 0].to(lengths.device)  # the lips of the transcript
                if rows.numel() == 0:
                    continue
                enc = self.encode(None, None, lengths[rows], video_features=video_features[rows])
                targets = (ys[rows], ys_lens[rows], ys_in[rows], ys_out[rows],
                           None if phones is None else (phones[0][rows], phones[1][rows]))
            else:
                enc = self.encode(view_audio if "audio" in keep else None, None, lengths,
                                  video_features=video_features if "video" in keep else None)
            view_loss, view_stats = self._loss(enc, *targets)
            loss = view_loss if loss is None else loss + view_loss
            for key, value in view_stats.items():
                stats[key] = stats.get(key, 0.0) + (value / len(views) if key == "acc" else value)
        return loss, stats

    def _encode_with_trust(self, audio: Tensor, lengths: Tensor, video_features: Tensor
                           ) -> tuple[tuple[Tensor, Tensor], VideoTrust]:
        """:meth:`encode` of two-stream input (``video_features`` from ``encoder.encode_video``) that also
        returns what the video trust gate computed (:class:`avsr.encoder.VideoTrust`)."""
        emb = self.encoder.embed({"audio": audio, "video": None}, lengths, video_features)
        enc = self.encoder.encoder(emb.x, emb.padding_mask)
        return (enc.float(), emb.olens.to(enc.device, torch.long)), emb.video_trust

    @staticmethod
    def _trust_losses(trust: VideoTrust, video_trusted: Tensor | None) -> dict[str, Tensor]:
        """The video trust gate's losses (``video_gate_weight``): ``loss_trust``, the binary cross-entropy of
        its logit against ``video_trusted`` ``(B,)`` (None: all 1), and ``loss_sync``, for the rows that show
        their own lips, the cross-entropy of picking offset 0 among the gate's ``2K + 1`` offsets per valid
        frame from ``similarity / 0.1`` (InfoNCE), averaged over those frames; float32 scalars."""
        target = torch.ones_like(trust.logit) if video_trusted is None else video_trusted.to(trust.logit)
        with fp32_context(trust.logit.device):
            bce = F.binary_cross_entropy_with_logits(trust.logit.float(), target.float())
            k = trust.similarity.shape[2] // 2
            frames = trust.valid[:, :, k] & (target[:, None] > 0.5)  # (B, T): own lips, within the utterance
            logits = (trust.similarity / 0.1).masked_fill(~trust.valid, float("-inf"))[frames]  # (N, 2K+1)
            if logits.shape[0] == 0:
                sync = logits.sum()  # 0, attached to the graph
            else:
                sync = F.cross_entropy(logits, torch.full((logits.shape[0],), k, device=logits.device))
        return {"loss_trust": bce, "loss_sync": sync}

    def _loss(self, encoded: tuple[Tensor, Tensor], ys: Tensor, ys_lens: Tensor, ys_in: Tensor,
              ys_out: Tensor, phones: tuple[Tensor, Tensor] | None = None
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """The hybrid loss and stats of :meth:`forward` for one encoder output ``(enc, enc_lens)``, plus the
        phone CTC loss where ``phones`` (``(B, P)`` ids, padding clamped to 0; ``(B,)`` lengths) is given."""
        enc, enc_lens = encoded
        loss_ctc = loss_att = acc = loss_phone = None
        if self.ctc_lo is not None:
            loss_ctc = self._ctc_loss(self.ctc_log_probs(enc), enc_lens, ys.clamp(min=0), ys_lens, self.blank)
        if phones is not None:
            phone_logp = self._fp32_log_probs(self.phone_ctc_lo, enc)
            loss_phone = self._ctc_loss(phone_logp, enc_lens, *phones, blank=0)
        if self.decoder is not None:
            mask = torch.arange(enc.size(1), device=enc.device)[None, :] < enc_lens[:, None]
            logits = self.decoder(ys_in, enc, mask)
            with fp32_context(enc.device):
                loss_att = label_smoothing_loss(
                    logits, ys_out, self.conf.lsm_weight, self.ignore_id, self.conf.length_normalized_loss
                )
            with torch.no_grad():
                valid = ys_out != self.ignore_id
                correct = (logits.argmax(-1) == ys_out) & valid
                acc = correct.sum() / valid.sum().clamp(min=1)
        w = self.ctc_weight
        if loss_ctc is None:
            loss = loss_att
        elif loss_att is None:
            loss = loss_ctc
        else:
            loss = w * loss_ctc + (1.0 - w) * loss_att
        if loss_phone is not None:
            loss = loss + self.conf.phone_ctc_weight * loss_phone
        nan = torch.full((), float("nan"), device=loss.device)
        stats = {
            "loss": loss.detach(),
            "loss_ctc": loss_ctc.detach() if loss_ctc is not None else nan,
            "loss_att": loss_att.detach() if loss_att is not None else nan,
            "acc": acc.float() if acc is not None else nan,
        }
        if loss_phone is not None:
            stats["loss_phone"] = loss_phone.detach()
        return loss, stats

    @staticmethod
    def _ctc_loss(logp: Tensor, enc_lens: Tensor, targets: Tensor, target_lens: Tensor, blank: int) -> Tensor:
        """CTC loss of ``logp (B, T, C)`` log-probabilities (``blank`` id) against ``targets (B, L)``, summed
        over the batch and divided by ``B`` (ESPnet ``CTC(reduce=True)``), in float32 under any autocast."""
        with fp32_context(logp.device):
            return F.ctc_loss(logp.float().transpose(0, 1), targets, enc_lens, target_lens.to(enc_lens),
                              blank=blank, reduction="sum", zero_infinity=True) / logp.size(0)
