"""The configuration of a model, as one typed tree: :class:`ModelConfig` holds the encoder's
(:class:`avsr.encoder.AVHubertEncoderConfig`), the attention decoder's
(:class:`avsr.nn.decoder.TransformerDecoderConfig`), the ASR loss's (:class:`AVSRModelConfig`) or the
pretraining head's (:class:`AVHubertPretrainConfig`) sections and the model's decoding defaults.

One tree serves every place a model is described: a model YAML (``conf/model/*.yaml``), the model section of
a training YAML (:class:`avsr.train.config.ExperimentConfig`), a checkpoint's ``model_config`` (written from
:meth:`ModelConfig.to_dict`). It is built once (:meth:`ModelConfig.from_mapping`); the models'
constructors take it (:class:`avsr.models.asr.AVSRModel`,
:class:`avsr.models.pretrain.AVHubertPretrainModel`).
Types and ranges are in the field definitions (:mod:`avsr.config`); unknown keys are refused with the key and
the file named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from avsr.config import Config, ConfigError, from_dict, option, probability, to_dict
from avsr.decode.config import search_config
from avsr.encoder import AVHubertEncoderConfig
from avsr.nn.decoder import TransformerDecoderConfig

__all__ = ["ModelConfig", "AVSRModelConfig", "AVHubertPretrainConfig", "MODEL_KEYS", "ASR_KEYS", "VIEWS",
           "TOKEN_CONVENTIONS"]

#: the streams each training view of an audio-visual batch keeps (``AVSRModelConfig.av_batch_views``);
#: ``audiovisual_clean`` takes the batch's ``audio_clean`` (the audio without the loader's noise) as audio.
VIEWS = {"audiovisual": ("audio", "video"), "video": ("video",), "audio": ("audio",),
         "audiovisual_clean": ("audio", "video")}

#: special token ids (blank, sos, eos, pad, unk) of each token convention, as functions of the vocab size.
TOKEN_CONVENTIONS = {
    "espnet": lambda v: {"blank": 0, "sos": v - 1, "eos": v - 1, "pad": None, "unk": 1},
    "fairseq": lambda v: {"blank": 0, "sos": 2, "eos": 2, "pad": 1, "unk": 3},
}


@dataclass
class AVSRModelConfig(Config):
    """The ``model_conf`` section (ESPnet names).

    Attributes:
        ctc_weight: weight of the CTC loss; 1.0 = CTC only (no decoder is built), 0.0 = attention only (no
            CTC head is built).
        lsm_weight: label-smoothing weight of the attention loss.
        length_normalized_loss: divide the attention loss by the number of tokens instead of the batch size.
        token_convention: ``espnet`` (``[<blank>, <unk>, ..., <sos/eos>]``) or ``fairseq`` (fairseq
            ``Dictionary`` ids of converted AV-HuBERT models; see the module docstring).
        av_batch_views: in training, the views under which a batch that carries both streams is scored,
            from ``audiovisual``, ``video`` (audio features zeroed after the front-end, as modality dropout
            does), ``audio`` and ``audiovisual_clean`` (both streams, the audio as it was before the loader
            added noise or another utterance's audio: ``audio_clean`` of the batch, see
            :class:`avsr.data.dataset.AVDataset` ``keep_clean_audio``; the batch's audio where it has none);
            the loss is the sum of the views' losses. The video front-end runs once
            for all views, so on a CPU, where it costs 4-5x the rest of a step, ``[audiovisual, video]``
            trains the fused and the lip-reading path on every audio-visual batch for about 1.2x the cost of
            one view. Default ``[audiovisual]``: one view, as AV-HuBERT. Batches that carry one stream (the
            loader's modality dropout) and evaluation are not affected; with several views the encoder
            makes no modality-dropout draw of its own on a two-stream batch (the views decide).
        phone_ctc_weight: weight of an auxiliary CTC loss over the phones of the transcript (a second
            linear head on the encoder output; training only, decoding does not use it), added to the
            hybrid loss: ``L = ctc_weight * L_ctc + (1 - ctc_weight) * L_att + phone_ctc_weight * L_phone``.
            The phones come from a pronunciation lexicon (:class:`avsr.data.lexicon.PhoneLexicon`,
            ``avsr.bin.train --phone-lexicon``). 0 (default): no phone head.
        phone_vocab_size: output size of the phone head (the lexicon's phones plus the CTC blank, id 0); the
            trainer sets it from the lexicon; required when ``phone_ctc_weight > 0``.
        video_gate_weight: weight of the losses of the encoder's video trust gate
            (``encoder_conf.video_gate``, :class:`avsr.encoder.VideoGate`), added once per two-stream batch:
            a binary cross-entropy between its logit and whether each utterance shows its own lips
            (``video_trusted`` of the batch, 0 for the uninformative video of ``untrusted_video_prob``), and
            for the utterances that do, a contrastive loss that finds the audio's frame among the video's
            frames around it (InfoNCE over the gate's offsets). Utterances without their own lips are also
            left out of the ``video`` view's loss (their lips do not say the transcript). 0 (default): no
            such loss; needs an encoder with a video gate when above 0.
    """

    ctc_weight: float = probability(0.3)
    lsm_weight: float = option(0.1, ge=0.0, lt=1.0)
    length_normalized_loss: bool = False
    token_convention: str = option("espnet", choices=sorted(TOKEN_CONVENTIONS))
    av_batch_views: tuple[str, ...] = option(("audiovisual",), choices=list(VIEWS), non_empty=True)
    phone_ctc_weight: float = option(0.0, ge=0.0, finite=True)
    phone_vocab_size: int | None = option(None, ge=2)
    video_gate_weight: float = option(0.0, ge=0.0, finite=True)

    def check(self) -> None:
        """The views must be distinct. Raises :class:`avsr.config.ConfigError`."""
        if len(set(self.av_batch_views)) != len(self.av_batch_views):
            raise ConfigError(f"av_batch_views: expected distinct values from {list(VIEWS)}, got "
                              f"{list(self.av_batch_views)}")


MASKING_TYPES = ("input", "feature")
VIDEO_SELECTION_TYPES = ("same_seq", "same_other_seq", "zero")
LABEL_EMBEDDINGS = ("learned", "momentum")



@dataclass
class AVHubertPretrainConfig(Config):
    """The ``pretrain_conf`` section; names are AV-HuBERT's, defaults its iteration-5 BASE recipe
    (``avhubert/conf/pretrain/base_lrs3_iter5.yaml``) except ``label_rate``.

    Attributes:
        label_rate: frame rate of the cluster labels in Hz (100: MFCC labels of iteration 1; 25: labels from
            AV-HuBERT features, iterations 2-5).
        sample_rate: frame rate of the model input in Hz (AV-HuBERT task ``sample_rate``: 25).
        mask_prob_audio, mask_length_audio: audio span masking (0.8, 10 frames).
        mask_prob_image, mask_length_image: video span masking (0.3, 5 frames; iterations 1-4 used 0.8, 10).
        require_same_masks: every utterance of a batch keeps as many masked frames as the one with the
            fewest (the original always does this; see :func:`avsr.nn.masking.compute_span_mask`).
        selection_type: what replaces masked video frames: ``same_seq`` (a span of the same utterance),
            ``same_other_seq`` (the same frames of another utterance; the original's dataclass default) or
            ``zero``. Masked audio frames are replaced by the learned ``mask_emb``, as in the original.
        masking_type: ``input`` (mask audio and video before the front-ends, separate masks, loss on their
            union; iteration 5) or ``feature`` (one mask on the fused features after ``dropout_input``,
            filled with ``mask_emb``; iterations 1-4, needs equal audio and image mask settings).
        final_dim: size of the projected frames and label embeddings (0: ``encoder_embed_dim``).
        untie_final_proj: one projection per label set (``final_proj`` outputs ``final_dim`` x sets).
        logit_temp: the cosine similarities are divided by it.
        pred_masked_weight, pred_nomask_weight: weights of the loss on masked / unmasked frames (criterion
            ``av_hubert``); with ``pred_nomask_weight`` 0 the unmasked loss and accuracy are computed for the
            stats only, without gradient.
        loss_weights: ``[w]``: weight of the ``features_pen`` term (mean square of the fused front-end
            features); ``[]`` for none.
        label_embedding: ``learned`` (the original's ``label_embs_concat``) or ``momentum`` (a
            :class:`avsr.autograd.MomentumLabelMemory` per label set, temperature ``logit_temp``).
        label_memory_momentum: momentum ``m`` of the memory update (NPID's default 0.5).
    """

    label_rate: float = option(100, gt=0)
    sample_rate: float = option(25, gt=0)
    mask_prob_audio: float = probability(0.8)
    mask_length_audio: int = option(10, ge=1)
    mask_prob_image: float = probability(0.3)
    mask_length_image: int = option(5, ge=1)
    require_same_masks: bool = True
    selection_type: str = option("same_seq", choices=VIDEO_SELECTION_TYPES)
    masking_type: str = option("input", choices=MASKING_TYPES)
    final_dim: int = option(256, ge=0)
    untie_final_proj: bool = True
    logit_temp: float = option(0.1, gt=0)
    pred_masked_weight: float = option(1.0, ge=0)
    pred_nomask_weight: float = option(0.0, ge=0)
    loss_weights: list[float] = option(factory=lambda: [10.0], ge=0)
    label_embedding: str = option("learned", choices=LABEL_EMBEDDINGS)
    label_memory_momentum: float = probability(0.5)

    def check(self) -> None:
        """The rules between fields. Raises :class:`avsr.config.ConfigError` naming the keys."""
        if len(self.loss_weights) > 1:
            raise ConfigError(f"loss_weights: expected [] or [w] with w >= 0 (the features_pen weight), got "
                              f"{self.loss_weights!r}")
        if self.masking_type == "feature" and (self.mask_prob_audio != self.mask_prob_image
                                               or self.mask_length_audio != self.mask_length_image):
            raise ConfigError("masking_type 'feature' uses one mask for both modalities: mask_prob_audio/"
                              "mask_length_audio must equal mask_prob_image/mask_length_image, got "
                              f"{self.mask_prob_audio}/{self.mask_length_audio} and "
                              f"{self.mask_prob_image}/{self.mask_length_image}")


#: the keys of an ASR model's configuration (:class:`ModelConfig` without pretraining).
ASR_KEYS = ("vocab_size", "token_list", "encoder_conf", "decoder_conf", "model_conf", "decode_defaults")
#: every key of a model configuration: a model YAML, the model section of a training YAML, a checkpoint's
#: ``model_config`` (the fields of :class:`ModelConfig`).
MODEL_KEYS = ASR_KEYS + ("pretrain_conf", "num_classes")


@dataclass
class ModelConfig(Config):
    """A model's whole configuration: an ASR model (``pretrain_conf`` None) or a pretraining one.

    Attributes:
        encoder_conf: the encoder; None: AV-HuBERT BASE's defaults, or an encoder given to the model
            (:class:`avsr.models.asr.AVSRModel` ``encoder=``).
        decoder_conf: ASR: the attention decoder (None: its defaults).
        model_conf: ASR: the loss and token convention (None: its defaults).
        pretrain_conf: pretraining: the masked cluster prediction head; its presence makes the
            configuration a pretraining one, which has no ASR keys.
        num_classes: pretraining: clusters per label set (a single integer is taken as ``[K]``).
        vocab_size: ASR: output tokens ``V``, including ``<blank>`` and ``<sos/eos>`` (>= 3); the shipped
            model YAMLs leave it to the tokenizer.
        token_list: ASR: the symbol of each token id (``vocab_size`` of them), or None.
        decode_defaults: ASR: decoding options this model decodes with unless told otherwise (a partial
            decoding configuration of :func:`avsr.decode.config.search_config`, checked here; e.g. the
            SynthGRID recipe's ``{video_weight: 1.0, audio_weight: 3.0, audio_confidence: 2.0}``).

    Raises:
        avsr.config.ConfigError: a bad value (key named), ASR keys in a pretraining configuration, a
            ``token_list`` of another length than ``vocab_size``, a bad ``decode_defaults`` key.
    """

    encoder_conf: AVHubertEncoderConfig | None = None
    decoder_conf: TransformerDecoderConfig | None = None
    model_conf: AVSRModelConfig | None = None
    pretrain_conf: AVHubertPretrainConfig | None = None
    num_classes: list[int] | int | None = option(None, ge=1)
    vocab_size: int | None = option(None, ge=3)
    token_list: list[str] | None = None
    decode_defaults: dict[str, Any] | None = None

    @property
    def pretraining(self) -> bool:
        """Whether this configures a pretraining model (``pretrain_conf`` or ``num_classes`` given)."""
        return self.pretrain_conf is not None or self.num_classes is not None

    def check(self) -> None:
        """The rules between sections (see the class docstring)."""
        if isinstance(self.num_classes, int):
            self.num_classes = [self.num_classes]
        if self.pretraining:
            asr = [k for k in ASR_KEYS if k != "encoder_conf" and getattr(self, k) is not None]
            if asr:
                raise ConfigError(f"{asr[0]}: a pretraining model (pretrain_conf, num_classes) has no ASR "
                                  f"head; remove {', '.join(asr)}")
        tokens = self.token_list
        if tokens is not None and self.vocab_size is not None and len(tokens) != self.vocab_size:
            raise ConfigError(f"token_list has {len(tokens)} entries but vocab_size is {self.vocab_size}")
        if self.decode_defaults is not None:
            search_config(self.decode_defaults, "decode_defaults")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | ModelConfig | None, where: str = "model config"
                     ) -> ModelConfig:
        """The tree of a mapping (a model YAML's top level, a checkpoint's ``model_config``); a
        :class:`ModelConfig` is returned as it is.

        Raises:
            avsr.config.ConfigError: an unknown key at any level or a bad value (named with ``where``).
        """
        if isinstance(mapping, ModelConfig):
            return mapping
        return from_dict(cls, mapping, where)

    def for_asr(self, with_encoder: bool = True) -> ModelConfig:
        """This configuration with the ASR sections' defaults filled in (``decoder_conf``, ``model_conf`` and,
        unless ``with_encoder`` is False, ``encoder_conf``).

        Raises:
            avsr.config.ConfigError: a pretraining configuration, or no ``vocab_size``.
        """
        if self.pretraining:
            raise ConfigError("pretrain_conf: a pretraining configuration has no ASR head "
                              "(build an AVHubertPretrainModel)")
        if self.vocab_size is None:
            raise ConfigError("missing 'vocab_size'")
        encoder = self.encoder_conf or (AVHubertEncoderConfig() if with_encoder else None)
        return dataclasses.replace(self, encoder_conf=encoder,
                                   decoder_conf=self.decoder_conf or TransformerDecoderConfig(),
                                   model_conf=self.model_conf or AVSRModelConfig())

    def for_pretraining(self) -> ModelConfig:
        """This configuration with ``encoder_conf`` and ``pretrain_conf`` filled in (defaults where None).

        Raises:
            avsr.config.ConfigError: no ``num_classes``, or ASR keys.
        """
        if not self.num_classes:
            raise ConfigError("missing 'num_classes'")
        return dataclasses.replace(self, encoder_conf=self.encoder_conf or AVHubertEncoderConfig(),
                                   pretrain_conf=self.pretrain_conf or AVHubertPretrainConfig())

    def to_dict(self) -> dict[str, Any]:
        """The tree as plain YAML-serialisable data, without the sections that are None (what checkpoints
        save as ``model_config`` and ``config.yaml`` holds; :meth:`from_mapping` reads it back)."""
        return {k: v for k, v in to_dict(self).items() if v is not None}
