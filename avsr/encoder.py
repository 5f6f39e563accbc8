"""AV-HuBERT encoder: audio and video front-ends, fusion, and the transformer encoder.

Follows ``AVHubertModel`` in ``avhubert/hubert.py`` of facebookresearch/av_hubert (Shi et al., "Learning
Audio-Visual Speech Representation by Masked Multimodal Cluster Prediction", ICLR 2022, Sec. 3 and
Appendix A; Shi et al., "Robust Self-Supervised Audio-Visual Speech Recognition", 2022), with the interface
of ESPnet's ``FairseqAVHubertEncoder`` (an ``AbsEncoder``)::

    audio (B, 104, T) --feature_extractor_audio.proj--> (B, D, T) --GradMultiply--+
                                                                                 +-- concat|add
    video (B, 1, T, H, W) --feature_extractor_video--> (B, D, T) --GradMultiply--+   (B, T, 2D|D)
      -> layer_norm -> post_extract_proj (concat only) -> dropout_input -> encoder -> (B, T, D)

Module attribute names are the original's, so the state dict of :class:`AVHubertEncoder` maps 1:1 onto the
encoder part of an official AV-HuBERT checkpoint (``feature_extractor_audio.proj.weight``,
``feature_extractor_video.resnet.trunk.layer1.0.conv1.weight``, ``layer_norm.weight``,
``post_extract_proj.weight``, ``encoder.pos_conv.0.weight_g``, ``encoder.layers.0.self_attn.q_proj.weight``,
``encoder.layer_norm.weight``, ...). Pretraining-only parameters (``mask_emb``, ``final_proj``,
``label_embs_concat``) belong to the pretraining model, not here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from avsr.autograd import grad_multiply
from avsr.compat.fairseq_avhubert import LoadedCheckpoint, load_state_strict, read_checkpoint
from avsr.config import (
    Config,
    ConfigError,
    check_keys,
    config_path,
    from_dict,
    load_yaml,
    option,
    probability,
)
from avsr.nn.modality import draw_modalities
from avsr.nn.precision import check_precision
from avsr.nn.resnet import RESNET_RELU_TYPES, VideoFrontEnd
from avsr.nn.transformer import ACTIVATIONS, TransformerEncoder

__all__ = ["AVHubertEncoderConfig", "AVHubertEncoder", "EncoderRuntime", "AudioFrontEnd", "AudioGate",
           "AVEmbedding", "MODALITY_FUSIONS"]

MODALITY_FUSIONS = ("concat", "add")


def valid_mean(x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
    """``(B, C, T)`` -> ``(B, C, 1)``: the mean over each utterance's valid frames (``padding_mask``:
    ``(B, T)`` bool, True at padding, or None for none); an utterance without valid frames gets 0."""
    if padding_mask is None:
        return x.mean(dim=2, keepdim=True)
    valid = (~padding_mask).to(x.dtype)[:, None, :]
    return (x * valid).sum(dim=2, keepdim=True) / valid.sum(dim=2, keepdim=True).clamp(min=1.0)


class AudioGate(nn.Module):
    """Reliability gate of the audio stream (``audio_gate``): ``(B, D, T)`` audio and video front-end outputs
    -> ``(B, 1, T)`` float gate in (0, 1) that scales the audio features before fusion.

    The gate of frame t is ``sigmoid(w . x_t + b)`` of ``x_t = [a_t; v_t; mean(a); mean(v)]``: the frame's
    audio and video features and their means over the utterance's valid frames (``padding_mask``: ``(B, T)``
    bool, True at padding, or None), so that it sees both the local and the utterance-level evidence of how
    much the audio can be trusted. With ``hidden > 0`` (``audio_gate_hidden``) ``x_t`` first passes through
    ``GELU(Linear(4D -> hidden))``, so that the gate can weigh interactions of the two streams (e.g. whether
    they agree), which a linear function of them cannot. ``w`` starts at 0 and ``b`` at +3 (gate 0.95): a new
    model starts as AV-HuBERT's plain fusion. An
    avsr extension in the spirit of reliability-weighted stream fusion (e.g. Yu et al., "Fusing information
    streams in end-to-end audio-visual speech recognition", ICASSP 2021); it is not in AV-HuBERT.

    Raises:
        ValueError: ``hidden < 0``.
    """

    def __init__(self, dim: int, hidden: int = 0) -> None:
        super().__init__()
        if hidden < 0:
            raise ValueError(f"audio_gate_hidden must be >= 0, got {hidden}")
        self.hidden = nn.Sequential(nn.Linear(4 * dim, hidden), nn.GELU()) if hidden else None
        self.proj = nn.Linear(hidden or 4 * dim, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.constant_(self.proj.bias, 3.0)

    def forward(self, audio: torch.Tensor, video: torch.Tensor,
                padding_mask: torch.Tensor | None) -> torch.Tensor:
        x = torch.cat([audio, video], dim=1)  # (B, 2D, T)
        x = torch.cat([x, valid_mean(x, padding_mask).expand_as(x)], dim=1).transpose(1, 2)  # (B, T, 4D)
        if self.hidden is not None:
            x = self.hidden(x)
        return torch.sigmoid(self.proj(x)).transpose(1, 2)


class VideoTrust(NamedTuple):
    """What :class:`VideoGate` computes for a two-stream batch.

    Attributes:
        gate: ``(B, 1, 1)`` gate in (0, 1), or 0 or 1 where the search decides (the input's dtype), that
            scales the video features.
        logit: ``(B,)`` float32, its logit.
        similarity: ``(B, T, 2K + 1)`` float32 cosine similarity of the audio embedding of frame ``t`` with
            the video embedding of frame ``t + j - K`` (``K``: ``max_offset``), the synchronisation evidence.
        valid: ``(B, T, 2K + 1)`` bool, where both frames lie within the utterance.
        margin: ``(B,)`` float32, the sync margin: the mean similarity at offset 0 less the mean of those
            at offsets of 3 frames or more (about 0.2-0.4 for lips in sync with clean audio, lower in noise;
            near 0 for lips that say something else).
    """

    gate: torch.Tensor
    logit: torch.Tensor
    similarity: torch.Tensor
    valid: torch.Tensor
    margin: torch.Tensor


class VideoGate(nn.Module):
    """Trust gate of the video stream (``video_gate``): do the lips belong to the sound?

    ``(B, D, T)`` audio and video front-end outputs -> :class:`VideoTrust`: a gate in (0, 1) per utterance
    that scales the video features before fusion. Each stream is embedded frame by frame (a temporal
    convolution of ``kernel`` frames, GELU, a 1x1 convolution, to ``hidden`` channels, unit length), and the
    audio embedding of every frame is compared with the video embeddings of the frames ``-K..K`` around it
    (``K``: ``max_offset``, 15 frames = 0.6 s) by cosine similarity, as SyncNet compares the two streams at
    candidate offsets (Chung & Zisserman, "Out of time: automated lip sync in the wild", ACCV 2016
    workshops). Lips in sync make the similarity at offset 0 stand out from the others, in clean audio and
    in noise alike; another utterance's lips, a frozen or blurred mouth, or lips out of sync do not. The
    logit is a learned linear function of how far the mean similarity at offset 0 lies above the mean and
    above the largest of the mean similarities at offsets of 3 frames or more, over the utterance's valid
    frames (``padding_mask``: ``(B, T)`` bool, True at padding, or None). Its weights start at 0 and its bias
    at +3 (gate 0.95): a new model starts as plain fusion.

    Training (:class:`avsr.models.asr.AVSRModel`, ``video_gate_weight``): a binary cross-entropy of the
    logit against whether the utterance shows its own lips (``AudioAugment.untrusted_video_prob``), and, for
    the utterances that do, a contrastive loss that picks offset 0 among the ``2K + 1`` per frame (InfoNCE
    over ``similarity / 0.1``). A closed gate gives exactly the fused input of audio-only input (the
    encoder's ``_gated``). An avsr extension; it is not in AV-HuBERT.

    Decoding: :class:`avsr.decode.searcher.Searcher` may decide per utterance instead (``decision``: ``(B,)``
    0 or 1, passed through the encoder's ``video_decision``): 1 uses the video whole, as the fused model was
    trained on it, 0 drops it (the utterance is decoded exactly as its audio alone). None (the default): the
    soft gate. :attr:`VideoTrust.margin` is the evidence the decision weighs.

    Raises:
        ValueError: ``hidden < 1``, an even ``kernel`` or ``max_offset < 3``.
    """

    #: offsets of at least this many frames count as "out of sync" in the logit's features
    MIN_OFF = 3

    def __init__(self, dim: int, hidden: int = 64, kernel: int = 5, max_offset: int = 15) -> None:
        super().__init__()
        if hidden < 1 or kernel < 1 or kernel % 2 == 0 or max_offset < self.MIN_OFF:
            raise ValueError(f"video_gate_hidden must be >= 1, video_gate_kernel odd and "
                             f"video_gate_max_offset >= {self.MIN_OFF}, got {hidden}, {kernel}, {max_offset}")
        self.max_offset = max_offset

        def embedding() -> nn.Sequential:
            return nn.Sequential(nn.Conv1d(dim, hidden, kernel, padding=kernel // 2), nn.GELU(),
                                 nn.Conv1d(hidden, hidden, 1))

        self.embed_audio, self.embed_video = embedding(), embedding()
        self.proj = nn.Linear(2, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.constant_(self.proj.bias, 3.0)

    def forward(self, audio: torch.Tensor, video: torch.Tensor, padding_mask: torch.Tensor | None,
                decision: torch.Tensor | None = None) -> VideoTrust:
        """See the class; ``audio``, ``video``: ``(B, D, T)``; ``decision``: ``(B,)`` 0/1 or None."""
        b, _, t = audio.shape
        k = self.max_offset
        if padding_mask is not None:
            audio = audio.masked_fill(padding_mask[:, None, :], 0.0)
            video = video.masked_fill(padding_mask[:, None, :], 0.0)
            lens = (~padding_mask).sum(dim=1)
        else:
            lens = torch.full((b,), t, dtype=torch.long, device=audio.device)
        ea = F.normalize(self.embed_audio(audio).float(), dim=1)  # (B, H, T)
        ev = F.normalize(self.embed_video(video).float(), dim=1)
        window = F.pad(ev, (k, k)).unfold(2, 2 * k + 1, 1)  # (B, H, T, 2K+1): ev at t + j - K
        similarity = torch.einsum("bht,bhtj->btj", ea, window)
        other = torch.arange(t, device=audio.device)[:, None] + torch.arange(-k, k + 1, device=audio.device)
        valid = ((other >= 0)[None] & (other < lens[:, None, None])
                 & (torch.arange(t, device=audio.device)[None, :, None] < lens[:, None, None]))
        count = valid.sum(dim=1)  # (B, 2K+1)
        mean = (similarity * valid).sum(dim=1) / count.clamp(min=1)  # (B, 2K+1)
        far = torch.ones(2 * k + 1, dtype=torch.bool, device=audio.device)
        far[k - self.MIN_OFF + 1 : k + self.MIN_OFF] = False
        far = far[None] & (count > 0)
        at_zero = mean[:, k]
        off_mean = (mean * far).sum(dim=1) / far.sum(dim=1).clamp(min=1)
        off_max = mean.masked_fill(~far, -2.0).amax(dim=1)
        features = 10.0 * torch.stack([at_zero - off_mean, at_zero - off_max], dim=1)  # (B, 2)
        logit = self.proj(features)[:, 0]
        gate = torch.sigmoid(logit)
        if decision is not None:
            gate = decision.to(gate)
        return VideoTrust(gate.to(video.dtype)[:, None, None], logit, similarity, valid, at_zero - off_mean)


@dataclass
class AVHubertEncoderConfig(Config):
    """Hyper-parameters of :class:`AVHubertEncoder`; names and defaults are AV-HuBERT BASE's.

    Defaults are the published BASE pretraining configuration (``avhubert/conf/pretrain/base_*_iter5.yaml``
    over ``AVHubertConfig``): 12 layers, D=768, FFN 3072, 12 heads, pre-LN, ``feature_grad_mult`` 0.1,
    modality dropout 0.5 / audio dropout 0.5, layerdrop 0.05. The published fine-tuning configurations
    override ``dropout: 0.0, attention_dropout: 0.0, activation_dropout: 0.1, encoder_layerdrop: 0.1,
    feature_grad_mult: 1.0`` (and the original applies no modality dropout when fine-tuning).

    Probabilities are in [0, 1].

    Attributes:
        encoder_layers, encoder_embed_dim, encoder_ffn_embed_dim, encoder_attention_heads: transformer size.
        layer_norm_first: pre-LN layers and a final LayerNorm (True, as BASE and LARGE) or post-LN.
        activation_fn: FFN activation, a fairseq name (``gelu``, ``relu``, ``gelu_accurate``, ...).
        feature_grad_mult: gradient factor on both front-ends' outputs; 0 runs them under ``no_grad``.
        dropout: transformer dropout (after pos-conv addition, attention output and FFN output).
        attention_dropout, activation_dropout: on attention weights / after the FFN activation.
        encoder_layerdrop: probability of skipping each transformer layer in training.
        dropout_input: dropout after ``post_extract_proj``.
        dropout_features: accepted for compatibility with AV-HuBERT configs; as in the original it does not
            change the encoder output (the original applies it to a copy of the features that is unused).
        conv_pos, conv_pos_groups: kernel size and groups of the convolutional positional embedding.
        modality_fuse: ``concat`` (fused dim 2D, then ``post_extract_proj`` to D) or ``add`` (fused dim D,
            no ``post_extract_proj``, as the original).
        modality_dropout: per batch in training, probability of dropping one modality (features
            zeroed); the dropped one is audio with probability ``audio_dropout``, else video.
        audio_gate: an avsr extension, off in AV-HuBERT: on two-stream input, scale the audio front-end's
            output by a learned gate in (0, 1) per frame before fusion (see :meth:`AVHubertEncoder.embed`).
            A closed gate gives exactly the fused input of video-only input (audio features zeroed), so a
            model trained with modality dropout can fall back to lip reading when the audio is noise.
        audio_gate_hidden: hidden units of the gate (:class:`AudioGate`; 0: a linear gate).
        video_gate: an avsr extension, off in AV-HuBERT: on two-stream input, scale the video front-end's
            output by a learned trust gate in (0, 1) per utterance (:class:`VideoGate`) that asks whether the
            lips are in sync with the sound; the audio gate opens as it closes (fused audio ``a * (1 - gv (1 -
            ga))``), so a closed video gate gives exactly the fused input of audio-only input.
        video_gate_hidden, video_gate_kernel, video_gate_max_offset: embedding channels, temporal kernel
            (frames, odd) and the largest offset compared (frames) of that gate.
        audio_cmn: an avsr extension, off in AV-HuBERT: subtract each utterance's mean over its valid frames
            from every audio input feature (per dimension) before the audio front-end -- cepstral mean
            normalisation, as Kaldi's per-utterance CMN, of the stacked log filterbanks. It removes the
            utterance's long-term spectral envelope (microphone, channel, part of a voice's timbre), so that
            the model does not learn the few training voices' envelopes. Train and decode with the same value.
        audio_feat_dim: input audio feature dim (104 = 26 log filterbanks x 4 stacked frames).
        resnet_relu_type: ``prelu`` or ``relu`` in the video ResNet.
        resnet_widths: the 4 stage widths of the video ResNet (stem channels = first); [64, 128, 256, 512]
            is ResNet-18 as the original.
        video_input_size: an avsr extension, None (the crop as given, 88 x 88) in AV-HuBERT: the side in
            pixels to which the video front-end area-averages each crop before its ResNet (44: 2 x 2 blocks,
            a quarter of the pixels; :class:`avsr.nn.resnet.VideoFrontEnd`). Train and decode with
            the same value (the checkpoint's configuration keeps it).
    """

    encoder_layers: int = option(12, ge=1)
    encoder_embed_dim: int = option(768, ge=1)
    encoder_ffn_embed_dim: int = option(3072, ge=1)
    encoder_attention_heads: int = option(12, ge=1)
    layer_norm_first: bool = True
    activation_fn: str = option("gelu", choices=sorted(ACTIVATIONS))
    feature_grad_mult: float = option(0.1, ge=0.0)
    dropout: float = probability(0.1)
    dropout_input: float = probability(0.1)
    dropout_features: float = probability(0.1)
    attention_dropout: float = probability(0.1)
    activation_dropout: float = probability(0.0)
    encoder_layerdrop: float = probability(0.05)
    conv_pos: int = option(128, ge=1)
    conv_pos_groups: int = option(16, ge=1)
    modality_fuse: str = option("concat", choices=MODALITY_FUSIONS)
    modality_dropout: float = probability(0.5)
    audio_dropout: float = probability(0.5)
    audio_gate: bool = False
    audio_gate_hidden: int = option(0, ge=0)
    video_gate: bool = False
    video_gate_hidden: int = option(64, ge=1)
    video_gate_kernel: int = option(5, ge=1)
    video_gate_max_offset: int = option(15, ge=3)
    audio_cmn: bool = False
    audio_feat_dim: int = option(104, ge=1)
    resnet_relu_type: str = option("prelu", choices=RESNET_RELU_TYPES)
    resnet_widths: list[int] = option(factory=lambda: [64, 128, 256, 512], ge=1)
    video_input_size: int | None = option(None, ge=8)

    def check(self) -> None:
        """The rules between fields. Raises :class:`avsr.config.ConfigError` naming the keys."""
        if len(self.resnet_widths) != 4:
            raise ConfigError(f"resnet_widths: expected 4 stage widths, got {self.resnet_widths!r}")
        if self.encoder_embed_dim % self.encoder_attention_heads:
            raise ConfigError(f"encoder_attention_heads ({self.encoder_attention_heads}) must divide "
                              f"encoder_embed_dim ({self.encoder_embed_dim})")
        if self.video_gate_kernel % 2 == 0:
            raise ConfigError(f"video_gate_kernel must be odd, got {self.video_gate_kernel}")
        if self.encoder_embed_dim % self.conv_pos_groups:
            raise ConfigError(f"conv_pos_groups ({self.conv_pos_groups}) must divide "
                              f"encoder_embed_dim ({self.encoder_embed_dim})")


@dataclass(frozen=True)
class EncoderRuntime:
    """The run-time switches of an :class:`AVHubertEncoder`, given when it is built.

    They say how the encoder computes, not what: they are not hyper-parameters, are not saved with the
    configuration or the weights (a checkpoint loads under any of them), and change no result beyond float
    rounding -- except ``modality_dropout_by_loader``, which says who draws the modality dropout. Built
    into the encoder's parts at construction and read back through the encoder's read-only properties of
    the same names; an encoder that should run otherwise is built again (and given the weights with
    ``load_state_dict``).

    Attributes:
        checkpoint_activations: in training with gradients, recompute each transformer layer in the backward
            pass instead of storing its activations (fairseq's option of that name): the same values and
            gradients, activation memory of the layers down to one ``(B, T, D)`` tensor each, for about one
            more forward pass of the layers in time. Default False.
        video_precision: the precision of the video front-end's ResNet (:class:`avsr.nn.resnet.ResEncoder`):
            None (default) = the caller's (float32, or the dtype of an autocast region around the encoder);
            ``"fp32"`` / ``"bf16"`` = that precision whatever the caller's, the ResNet's output in its input's
            dtype; ``"auto"`` = ``bf16`` where the input's device computes bfloat16 natively, else ``fp32``,
            resolved at each forward pass by :func:`avsr.nn.precision.resolve_precision` (``what``
            ``"video_precision"``, logged once). The training setting of that name
            (:class:`avsr.train.config.TrainConfig`) is given resolved for the training device.
        video_precision_in_eval: True (default): ``video_precision`` applies in training and in eval mode
            (avsr's trainer, whose validation runs as its training); False: in training mode only, eval mode
            computing in the caller's precision (the ESPnet wrapper, :mod:`avsr.espnet.encoder`).
        channels_last: the video front-end's layout (see :class:`avsr.nn.resnet.ResEncoder`): None (default)
            = channels-last under a bfloat16 autocast, for bfloat16 input and in training on CPU (where its
            BatchNorm layers run fused), else the original's layout (float32 inference, CUDA); True / False
            force it.
        modality_dropout_by_loader: False (default): the encoder draws its per-batch modality dropout itself
            in :meth:`AVHubertEncoder.forward` (training mode, both modalities given). True: the data loader
            draws it per batch (:class:`avsr.data.dataset.ModalityBatchSampler`, made by
            :meth:`AVHubertEncoder.modality_batch_sampler`) and loads only the modality a batch keeps (or a
            wrapper draws it before the forward pass, :mod:`avsr.espnet.encoder`), so the encoder does not
            draw again: it encodes the modalities it is given.

    Raises:
        ValueError: ``video_precision`` other than None or one of :data:`avsr.nn.precision.PRECISIONS` (the
            message names ``video_precision``).
        TypeError: a switch that is not a bool (``channels_last``: a bool or None), named.
    """

    checkpoint_activations: bool = False
    video_precision: str | None = None
    video_precision_in_eval: bool = True
    channels_last: bool | None = None
    modality_dropout_by_loader: bool = False

    def __post_init__(self) -> None:
        if self.video_precision is not None:
            check_precision(self.video_precision, "video_precision")
        for name in ("checkpoint_activations", "video_precision_in_eval", "channels_last",
                     "modality_dropout_by_loader"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "channels_last" and value is None):
                kind = "a bool or None" if name == "channels_last" else "a bool"
                raise TypeError(f"EncoderRuntime.{name} must be {kind}, got {value!r}")


class AVEmbedding(NamedTuple):
    """What :meth:`AVHubertEncoder.embed` returns (the transformer's input and friends).

    Attributes:
        x: ``(B, T, D)`` float, fused features after layer_norm, post_extract_proj and dropout_input.
        padding_mask: ``(B, T)`` bool, True at padded frames, or None when no frame is padded.
        olens: ``(B,)`` int64 valid frames per utterance (= ``ilens``; all T when ``ilens`` is None).
        features_pen: scalar float32, mean square of the fused front-end features (AV-HuBERT's
            ``features_pen`` extra loss term).
        video_trust: what the video trust gate computed (:class:`VideoTrust`, ``video_gate``) on two-stream
            input, else None.
    """

    x: torch.Tensor
    padding_mask: torch.Tensor | None
    olens: torch.Tensor
    features_pen: torch.Tensor
    video_trust: VideoTrust | None = None


class AudioFrontEnd(nn.Module):
    """Audio feature extractor of AV-HuBERT (``feature_extractor_audio``): one Linear, ``proj``.

    Input ``(B, audio_feat_dim, T)`` float (stacked log filterbanks at 25 Hz), output ``(B, embed_dim, T)``
    (channels first, as the original ``SubModel``).
    """

    def __init__(self, audio_feat_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(audio_feat_dim, embed_dim)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """``(B, F, T) -> (B, D, T)``."""
        return self.proj(audio.transpose(1, 2)).transpose(1, 2)


class AVHubertEncoder(nn.Module):
    """The AV-HuBERT encoder with ESPnet's ``AbsEncoder`` interface.

    Construct ESPnet-style with the options of :class:`AVHubertEncoderConfig` as keywords
    (``AVHubertEncoder(**encoder_conf)``), from a config object (``AVHubertEncoder(config=cfg)``) or from a
    YAML file (:meth:`from_yaml`).

    Inputs: ``xs_pad = {"audio": (B, audio_feat_dim, T) float or None, "video": (B, 1, T, H, W) float or
    None}`` at 25 frames/s (video: normalised grey mouth crops, 88x88 for the published models), zero-padded
    after each utterance's end; ``ilens`` ``(B,)`` int64, valid frames per utterance. A missing modality is
    fed as zeros after its front-end (as AV-HuBERT's ``extract_finetune``), so one model handles
    audio-only, video-only and audio-visual input.

    Behaviour in training (``model.train()``): dropouts, layerdrop, and per-batch modality dropout when both
    modalities are given (:func:`avsr.nn.modality.draw_modalities`) -- unless the encoder was built to leave
    that draw to the data loader (``EncoderRuntime(modality_dropout_by_loader=True)``, read back as
    :attr:`modality_dropout_by_loader`; the loader's sampler: :meth:`modality_batch_sampler`), which then
    drops the modality before loading it. In eval mode the
    output on an utterance's valid frames does not depend on the other utterances of the batch or on the
    padding. Before the video front-end, padded video frames are set to zero, so that the 5-frame temporal
    kernel of the 3-D stem sees zeros past the end whatever the padding value was. As in the original, in
    training the video front-end's BatchNorm statistics include the padded (zeroed) frames, and a layer
    skipped by layerdrop gets no gradient (use ``find_unused_parameters=True`` with DistributedDataParallel
    when ``encoder_layerdrop > 0``).

    Methods: :meth:`forward` (ESPnet ``(hidden, olens, None)``), :meth:`extract_layer_outputs` (every
    transformer layer's output, for clustering or probing), :meth:`embed` (the transformer's input, for a
    pretraining model), :meth:`output_size`, :meth:`from_yaml`.

    Speed and memory: the encoder runs under a caller's ``torch.autocast`` (bfloat16:
    :func:`avsr.nn.precision.autocast_context`; the output is then bfloat16, the feature penalty float32)
    and under ``torch.compile``; its run-time switches (:class:`EncoderRuntime`, given at construction as
    ``runtime``, not hyper-parameters: they change no result beyond float rounding and are not saved with
    the configuration) are :attr:`checkpoint_activations` (fairseq's option of that name: recompute each
    transformer layer in the backward pass instead of storing its activations), :attr:`video_precision`
    (the video front-end's ResNet in a precision of its own) and :attr:`channels_last` (the video
    front-end's layout: by default channels-last under bfloat16, 2-3x faster there on CPUs with AMX /
    AVX-512 BF16, and in training on CPU, where its BatchNorm layers run fused).
    ``benchmarks/bench_encoder.py`` measures them. They are read-only once built: an encoder that should run
    otherwise is built again with another runtime (and given the weights with ``load_state_dict``).

    Args:
        config: the hyper-parameters (:class:`AVHubertEncoderConfig`), or None to build them from
            ``encoder_conf``.
        runtime: the run-time switches (:class:`EncoderRuntime`; None: its defaults).
        **encoder_conf: options of :class:`AVHubertEncoderConfig` (ESPnet style).

    Raises:
        avsr.config.ConfigError: unknown option (named), bad option value, or both ``config`` and keywords.
        TypeError: ``runtime`` not an :class:`EncoderRuntime`.
    """

    def __init__(self, config: AVHubertEncoderConfig | None = None, *, runtime: EncoderRuntime | None = None,
                 **encoder_conf: Any) -> None:
        super().__init__()
        if config is None:
            config = from_dict(AVHubertEncoderConfig, encoder_conf, "AVHubertEncoder encoder_conf")
        elif encoder_conf:
            raise ConfigError("AVHubertEncoder: give either config=... or keyword options, not both "
                              f"(got keywords {sorted(encoder_conf)})")
        if runtime is None:
            runtime = EncoderRuntime()
        elif not isinstance(runtime, EncoderRuntime):
            raise TypeError(f"AVHubertEncoder: runtime must be an EncoderRuntime, got "
                            f"{type(runtime).__name__}")
        self.config = config
        self._runtime = runtime
        d = config.encoder_embed_dim
        self.feature_extractor_audio = AudioFrontEnd(config.audio_feat_dim, d)
        self.feature_extractor_video = VideoFrontEnd(
            d, config.resnet_widths, config.resnet_relu_type, channels_last=runtime.channels_last,
            precision=runtime.video_precision, precision_in_eval=runtime.video_precision_in_eval,
            input_size=config.video_input_size)
        self.embed_dim = 2 * d if config.modality_fuse == "concat" else d
        self.layer_norm = nn.LayerNorm(self.embed_dim)
        self.post_extract_proj = nn.Linear(self.embed_dim, d) if self.embed_dim != d else None
        self.audio_gate = AudioGate(d, config.audio_gate_hidden) if config.audio_gate else None
        self.video_gate = (VideoGate(d, config.video_gate_hidden, config.video_gate_kernel,
                                     config.video_gate_max_offset) if config.video_gate else None)
        self.dropout_input = nn.Dropout(config.dropout_input)
        self.encoder = TransformerEncoder(
            embed_dim=d,
            ffn_embed_dim=config.encoder_ffn_embed_dim,
            num_layers=config.encoder_layers,
            num_heads=config.encoder_attention_heads,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            activation_dropout=config.activation_dropout,
            layerdrop=config.encoder_layerdrop,
            conv_pos=config.conv_pos,
            conv_pos_groups=config.conv_pos_groups,
            activation_fn=config.activation_fn,
            layer_norm_first=config.layer_norm_first,
            checkpoint_activations=runtime.checkpoint_activations,
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, *, runtime: EncoderRuntime | None = None,
                  **overrides: Any) -> AVHubertEncoder:
        """Build from a YAML file whose top level, or whose ``encoder_conf`` key, holds the options.

        ``path`` is a file or the name of a shipped model configuration (``"avhubert_base"``,
        ``"avhubert_large"``, ``"avsr_synthgrid_cpu"``: ``avsr/conf/model/<name>.yaml``); an existing file
        wins over a name (:func:`avsr.config.config_path`). When the file has an ``encoder_conf`` mapping,
        only that mapping is read (sibling keys such as ``encoder:`` or ``decoder_conf:`` belong to other
        components). ``overrides`` (options of :class:`AVHubertEncoderConfig`) replace file values;
        ``runtime``: the run-time switches (:class:`EncoderRuntime`). The weights are randomly initialised;
        :meth:`from_pretrained` loads trained ones.

        Raises:
            avsr.config.ConfigError: missing/invalid file or unknown name (the shipped names are listed),
                ``encoder_conf`` not a mapping, an unknown key (the message names the key and the file) or an
                unknown override (named).
        """
        check_keys(overrides, {f.name for f in dataclasses.fields(AVHubertEncoderConfig)},
                   f"{cls.__name__}.from_yaml override")
        path = config_path(path, "model")
        data = load_yaml(path)
        where = str(path)
        if "encoder_conf" in data:
            data, where = data["encoder_conf"], f"{path}: encoder_conf"
            if data is None:
                data = {}
            if not isinstance(data, Mapping):
                raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
        conf = {**data, **overrides}
        return cls(config=from_dict(AVHubertEncoderConfig, conf, where), runtime=runtime)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
        runtime: EncoderRuntime | None = None,
    ) -> AVHubertEncoder:
        """Load the encoder of a checkpoint, with the architecture stored in it, in eval mode.

        Accepts official fairseq AV-HuBERT checkpoints -- pretraining (``av_hubert``) and fine-tuned
        (``av_hubert_seq2seq``, ``av_hubert_ctc``, whose architecture is in ``cfg.model.w2v_args``) -- and
        avsr's own (an ``AVSRModel`` checkpoint or an encoder written by ``avsr-convert``). Loading is safe
        (``torch.load(weights_only=True)``); see :mod:`avsr.compat` for the key mapping. ``runtime``: the
        run-time switches (:class:`EncoderRuntime`; None: its defaults).

        Raises:
            FileNotFoundError: no such file.
            avsr.compat.CheckpointError: truncated or not a checkpoint, not an AV-HuBERT one, an unsupported
                configuration field (named), or weights that do not fit (keys named).
        """
        return cls.from_checkpoint(read_checkpoint(path, map_location), runtime=runtime)

    @classmethod
    def from_checkpoint(cls, loaded: LoadedCheckpoint, *, runtime: EncoderRuntime | None = None
                        ) -> AVHubertEncoder:
        """The encoder of a checkpoint already read by :func:`avsr.compat.read_checkpoint`, in eval mode,
        with the run-time switches ``runtime`` (:class:`EncoderRuntime`; None: its defaults).

        Raises:
            avsr.compat.CheckpointError: the weights do not fit the configuration (keys named).
            avsr.config.ConfigError: an option value the encoder refuses (named).
        """
        encoder = cls(runtime=runtime, **loaded.encoder_conf)
        load_state_strict(encoder, loaded.encoder_state, str(loaded.path), "encoder")
        return encoder.eval()

    def output_size(self) -> int:
        """D, the size of the output vectors (``encoder_embed_dim``)."""
        return self.config.encoder_embed_dim

    @property
    def runtime(self) -> EncoderRuntime:
        """The run-time switches the encoder was built with (:class:`EncoderRuntime`); read-only."""
        return self._runtime

    @property
    def checkpoint_activations(self) -> bool:
        """In training with gradients, recompute each transformer layer in the backward pass instead of
        keeping its activations (fairseq's ``checkpoint_activations``): same values and gradients, activation
        memory of the layers down to one ``(B, T, D)`` tensor each, about one more forward pass of the
        layers in time. Default False; set at construction (:class:`EncoderRuntime`), read-only."""
        return self.encoder.checkpoint_activations

    @property
    def channels_last(self) -> bool | None:
        """Channels-last (NDHWC/NHWC) activations in the video front-end (see
        :class:`avsr.nn.resnet.ResEncoder`); same values up to float rounding. None (default): channels-last
        under a bfloat16 autocast and in training on CPU, else the original's layout (float32 inference,
        CUDA); True/False force it. Set at construction (:class:`EncoderRuntime`), read-only."""
        return self.feature_extractor_video.resnet.channels_last

    @property
    def video_precision(self) -> str | None:
        """Precision of the video front-end's ResNet (``ResEncoder.precision``, :mod:`avsr.nn.resnet`):
        None (default) = the caller's; ``"bf16"`` / ``"fp32"`` = that precision whatever the caller's,
        output in the input's dtype; ``"auto"`` = resolved for the input's device at each forward pass. In
        eval mode too unless built with ``video_precision_in_eval=False``. Set at construction
        (:class:`EncoderRuntime`; training gives its ``video_precision``,
        :class:`avsr.train.config.TrainConfig`, resolved for its device), read-only."""
        return self.feature_extractor_video.resnet.precision

    @property
    def modality_dropout_by_loader(self) -> bool:
        """Whether the data loader (or a wrapper) draws the per-batch modality dropout, so that the encoder
        does not draw again (:class:`EncoderRuntime`); False: the encoder draws it in :meth:`forward`. Set at
        construction, read-only."""
        return self._runtime.modality_dropout_by_loader

    def _front_end(self, extractor: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Run a front-end with AV-HuBERT's ``forward_features`` gradient handling."""
        scale = float(self.config.feature_grad_mult)
        if scale == 0.0:
            with torch.no_grad():
                return extractor(x)
        return grad_multiply(extractor(x), scale)

    def _check_inputs(
        self, xs_pad: Mapping[str, torch.Tensor | None], ilens: torch.Tensor | None,
        video_features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """Validate the inputs; return ``(audio, video, ilens)`` with ``ilens`` filled in when None.

        With ``video_features`` (the video front-end's output, ``(B, D, T)``) ``xs_pad["video"]`` is not used
        and may be None."""
        if video_features is not None:
            d = self.config.encoder_embed_dim
            if video_features.dim() != 3 or video_features.shape[1] != d:
                raise ValueError(f"video_features must be (B, encoder_embed_dim={d}, T), got shape "
                                 f"{tuple(video_features.shape)}")
            audio = xs_pad.get("audio") if isinstance(xs_pad, Mapping) else None
            if audio is not None:
                audio, _, ilens = self._check_inputs({"audio": audio, "video": None}, ilens)
                if (audio.shape[0], audio.shape[2]) != (video_features.shape[0], video_features.shape[2]):
                    raise ValueError(f"video_features {tuple(video_features.shape)} do not fit the audio "
                                     f"{tuple(audio.shape)} (B and T must agree)")
                return audio, None, ilens
            b, t = video_features.shape[0], video_features.shape[2]
            if ilens is None:
                return None, None, torch.full((b,), t, dtype=torch.long, device=video_features.device)
            if ilens.shape != (b,):
                raise ValueError(f"ilens must be an integer tensor of shape ({b},), got {tuple(ilens.shape)}")
            return None, None, ilens.to(video_features.device)
        if not isinstance(xs_pad, Mapping):
            raise ValueError(
                f"xs_pad must be a dict with keys 'audio' and 'video', got {type(xs_pad).__name__}"
            )
        unknown = set(xs_pad) - {"audio", "video"}
        if unknown:
            raise ValueError(
                f"xs_pad: unknown modality key(s) {sorted(unknown)}; expected 'audio' and 'video'"
            )
        audio, video = xs_pad.get("audio"), xs_pad.get("video")
        if audio is None and video is None:
            raise ValueError("xs_pad: both 'audio' and 'video' are None; at least one modality is needed")
        if audio is not None:
            if audio.dim() != 3 or audio.shape[1] != self.config.audio_feat_dim:
                raise ValueError(
                    f"xs_pad['audio'] must be (B, audio_feat_dim={self.config.audio_feat_dim}, T), "
                    f"got shape {tuple(audio.shape)}"
                )
            if not audio.is_floating_point():
                raise ValueError(f"xs_pad['audio'] must be floating point, got {audio.dtype}")
        if video is not None:
            if video.dim() != 5 or video.shape[1] != 1:
                raise ValueError(f"xs_pad['video'] must be (B, 1, T, H, W), got shape {tuple(video.shape)}")
            if not video.is_floating_point():
                raise ValueError(
                    f"xs_pad['video'] must be floating point (normalised frames), got {video.dtype}"
                )
        if audio is not None and video is not None:
            if audio.shape[0] != video.shape[0]:
                raise ValueError(f"batch size differs: audio has {audio.shape[0]}, video {video.shape[0]}")
            if audio.shape[2] != video.shape[2]:
                raise ValueError(f"number of frames T differs: audio has {audio.shape[2]} (dim 2), video "
                                 f"{video.shape[2]} (dim 2); both must be at 25 Hz and padded alike")
        ref = audio if audio is not None else video
        b, t = ref.shape[0], ref.shape[2]
        if ilens is None:
            return audio, video, torch.full((b,), t, dtype=torch.long, device=ref.device)
        if ilens.shape != (b,) or ilens.is_floating_point() or ilens.is_complex():
            raise ValueError(f"ilens must be an integer tensor of shape ({b},), got {ilens.dtype} "
                             f"{tuple(ilens.shape)}")
        if ilens.device.type != "cpu" and b > 0:  # checked on the device: no host synchronisation
            torch._assert_async(((ilens >= 1) & (ilens <= t)).all(), f"ilens must be in [1, T={t}]")
        elif not torch.compiler.is_compiling() and b > 0:
            lo, hi = int(ilens.min()), int(ilens.max())
            if lo < 1 or hi > t:
                raise ValueError(f"ilens must be in [1, T={t}], got min {lo} max {hi}")
        return audio, video, ilens.to(ref.device)

    def embed(self, xs_pad: Mapping[str, torch.Tensor | None], ilens: torch.Tensor | None,
              video_features: torch.Tensor | None = None, video_decision: torch.Tensor | None = None
              ) -> AVEmbedding:
        """Front-ends, modality dropout, the audio gate (``audio_gate``), fusion, layer_norm,
        post_extract_proj, dropout_input.

        Args and errors as :meth:`forward`. Returns an :class:`AVEmbedding` (``x`` is ``(B, T, D)``).
        """
        if video_features is not None:
            return self._embed(*self._check_inputs(xs_pad, ilens, video_features), video_features,
                               video_decision)
        return self._embed(*self._check_inputs(xs_pad, ilens), video_decision=video_decision)

    def _padding_mask(self, ilens: torch.Tensor, t: int) -> torch.Tensor | None:
        """``(B, T)`` bool, True at padded frames, or None when nothing is padded (outside compilation)."""
        padding_mask = torch.arange(t, device=ilens.device)[None, :] >= ilens[:, None]
        # an unpadded batch runs without a mask -- found on CPU only (elsewhere the check would stop the host)
        if (ilens.device.type == "cpu" and not torch.compiler.is_compiling()
                and not bool(padding_mask.any())):
            return None
        return padding_mask

    @staticmethod
    def _cmn(audio: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, F, T)`` audio features minus their mean over each utterance's valid frames (``audio_cmn``);
        padded frames stay zero."""
        centred = audio - valid_mean(audio, padding_mask)
        return centred if padding_mask is None else centred.masked_fill(padding_mask[:, None, :], 0.0)

    def _video_front_end(self, video: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, 1, T, H, W) -> (B, D, T)``: padded frames zeroed, then the video front-end (GradMultiply)."""
        if padding_mask is not None:
            video = video.masked_fill(padding_mask[:, None, :, None, None], 0.0)
        return self._front_end(self.feature_extractor_video, video)

    def _audio_front_end(self, audio: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, 104, T)`` audio features -> ``(B, D, T)`` audio front-end output (after ``audio_cmn``)."""
        if self.config.audio_cmn:
            audio = self._cmn(audio, padding_mask)
        return self._front_end(self.feature_extractor_audio, audio)

    def encode_video(self, video: torch.Tensor, ilens: torch.Tensor | None = None) -> torch.Tensor:
        """The video front-end's output alone, as :meth:`forward` computes it: ``(B, D, T)`` float.

        For callers that feed the same video with several audio inputs (decoding one test set under several
        noise conditions, :meth:`avsr.inference.Transcriber.transcribe_batch`): compute it once and pass it to
        :meth:`forward` as ``video_features``. Padded frames are zeroed first, so each utterance's valid
        frames do not depend on the padding; in eval mode they do not depend on the other utterances of the
        batch.

        Args:
            video: ``(B, 1, T, H, W)`` float normalised frames.  ilens: ``(B,)`` valid frames (None: all T).

        Raises:
            ValueError: as :meth:`forward` for the video input.
        """
        _, video, ilens = self._check_inputs({"audio": None, "video": video}, ilens)
        return self._video_front_end(video, self._padding_mask(ilens, video.shape[2]))

    def _embed(self, audio: torch.Tensor | None, video: torch.Tensor | None, ilens: torch.Tensor,
               video_features: torch.Tensor | None = None, video_decision: torch.Tensor | None = None
               ) -> AVEmbedding:
        ref = next(x for x in (audio, video, video_features) if x is not None)  # B at dim 0, T at dim 2
        b, t = ref.shape[0], ref.shape[2]
        padding_mask = self._padding_mask(ilens, t)

        d = self.config.encoder_embed_dim
        if (audio is not None and video is not None and self.training and self.config.modality_dropout > 0
                and not self.modality_dropout_by_loader):
            audio, video = self._modality_dropout(audio, video)
        feats_audio, feats_video = None, video_features
        if audio is not None:
            feats_audio = self._audio_front_end(audio, padding_mask)  # (B, D, T)
        if video is not None and video_features is None:
            feats_video = self._video_front_end(video, padding_mask)  # (B, D, T)
        trust = None
        if feats_audio is None:
            feats_audio = feats_video.new_zeros(b, d, t)
        elif feats_video is None:
            feats_video = feats_audio.new_zeros(b, d, t)
        else:
            feats_audio, feats_video, trust = self._gated(feats_audio, feats_video, padding_mask,
                                                          video_decision)

        if self.config.modality_fuse == "concat":
            features = torch.cat([feats_audio, feats_video], dim=1)
        else:
            features = feats_audio + feats_video
        features_pen = features.float().pow(2).mean()
        x = self.layer_norm(features.transpose(1, 2))
        if self.post_extract_proj is not None:
            x = self.post_extract_proj(x)
        return AVEmbedding(self.dropout_input(x), padding_mask, ilens, features_pen, trust)

    def _gated(self, audio: torch.Tensor, video: torch.Tensor, padding_mask: torch.Tensor | None,
               video_decision: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, VideoTrust | None]:
        """Two-stream ``(B, D, T)`` front-end outputs through the gates: the audio scaled by ``1 - gv (1 -
        ga)`` (``ga``: :class:`AudioGate`, 1 without one), the video by ``gv`` (:class:`VideoGate`, 1 without
        one); returns them and what the video gate computed (None without one)."""
        audio_gate, trust = self._gates(audio, video, padding_mask, video_decision)
        if audio_gate is not None:
            audio = audio * audio_gate
        return audio, (video if trust is None else video * trust.gate), trust

    def _gates(self, audio: torch.Tensor, video: torch.Tensor, padding_mask: torch.Tensor | None,
               video_decision: torch.Tensor | None = None) -> tuple[torch.Tensor | None, VideoTrust | None]:
        """The gates of two-stream ``(B, D, T)`` front-end outputs: the audio's ``(B, 1, T)``, ``1 - gv (1 -
        ga)`` (``ga``: :class:`AudioGate`, 1 without one; ``gv``: :class:`VideoGate`, 1 without one; None
        without an audio gate), and what the video gate computed (None without one; ``video_decision``: its
        per-utterance decision, see :class:`VideoGate`)."""
        audio_gate = self.audio_gate(audio, video, padding_mask) if self.audio_gate is not None else None
        trust = (self.video_gate(audio, video, padding_mask, video_decision) if self.video_gate is not None
                 else None)
        if audio_gate is not None and trust is not None:
            audio_gate = 1.0 - trust.gate * (1.0 - audio_gate)
        return audio_gate, trust

    def gate_means(self, audio: torch.Tensor, video_features: torch.Tensor, ilens: torch.Tensor | None = None,
                   video_decision: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The gates that fusion applies to this two-stream input, each utterance's mean over its valid
        frames: ``(audio_gate, video_gate)``, each ``(B,)`` float32 in (0, 1) or None when the encoder has no
        such gate. The audio gate is the one in effect, ``1 - gv (1 - ga)`` with a video gate.

        ``audio_gate`` says how far the fused input rests on the audio (near 1 on clean audio the model
        trusts, near 0 where it falls back to the lips in babble), ``video_gate`` whether the model takes the
        lips to belong to the sound (near 0 for another utterance's lips or a frozen mouth).
        :class:`avsr.decode.searcher.Searcher` scales the single-stream views' weights by them.

        Args:
            audio: ``(B, 104, T)`` float stacked log filterbanks (25 Hz).
            video_features: ``(B, D, T)`` float, the video front-end's output (:meth:`encode_video`).
            ilens: ``(B,)`` valid frames (None: all ``T``).
            video_decision: ``(B,)`` 0/1, the search's decision on the lips (:class:`VideoGate`), or None.

        Raises:
            ValueError: shapes that do not match (as :meth:`forward`).
        """
        if self.audio_gate is None and self.video_gate is None:
            return None, None
        padding_mask = self._two_streams(audio, video_features, ilens)
        gate, trust = self._gates(self._audio_front_end(audio, padding_mask), video_features, padding_mask,
                                  video_decision)
        return (None if gate is None else valid_mean(gate.float(), padding_mask)[:, 0, 0],
                None if trust is None else trust.gate.float()[:, 0, 0])

    def sync_margin(self, audio: torch.Tensor, video_features: torch.Tensor, ilens: torch.Tensor | None = None
                    ) -> torch.Tensor | None:
        """Each utterance's sync margin (:attr:`VideoTrust.margin`): ``(B,)`` float32, or None for an encoder
        without a video trust gate. Arguments and errors as :meth:`gate_means`."""
        if self.video_gate is None:
            return None
        padding_mask = self._two_streams(audio, video_features, ilens)
        audio_features = self._audio_front_end(audio, padding_mask)
        return self.video_gate(audio_features, video_features, padding_mask).margin

    def _two_streams(self, audio: torch.Tensor, video_features: torch.Tensor, ilens: torch.Tensor | None
                     ) -> torch.Tensor | None:
        """The padding mask (as :meth:`_padding_mask`) of ``(B, F, T)`` audio and ``(B, D, T)`` video
        features, checked to agree in B and T (ValueError)."""
        if audio.dim() != 3 or video_features.dim() != 3 or audio.shape[0] != video_features.shape[0] \
                or audio.shape[2] != video_features.shape[2]:
            raise ValueError(f"audio (B, F, T) and video_features (B, D, T) must agree in B and T, got "
                             f"{tuple(audio.shape)} and {tuple(video_features.shape)}")
        b, t = audio.shape[0], audio.shape[2]
        if ilens is None:
            ilens = torch.full((b,), t, dtype=torch.long, device=audio.device)
        return self._padding_mask(ilens, t)

    def _modality_dropout(self, audio: torch.Tensor, video: torch.Tensor
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Modality dropout as AV-HuBERT's ``forward`` (hubert.py): one draw per batch; with probability
        ``modality_dropout`` one modality is dropped -- audio with probability ``audio_dropout``, else video.

        The dropped modality is returned as None, so its front-end is not run and zeros take its place after
        the front-end -- the values the original gets from ``0 * features``, without the front-end's cost (its
        parameters then get no gradient in that step, and its BatchNorm statistics are not updated).
        """
        keep = self.draw_batch_modality()
        return (None if keep == "video" else audio), (None if keep == "audio" else video)

    def draw_batch_modality(self) -> str:
        """The modality dropout draw of one training batch: ``audiovisual``, ``audio`` (video dropped) or
        ``video`` (audio dropped), with ``modality_dropout`` and ``audio_dropout`` (AV-HuBERT's rule,
        :func:`avsr.nn.modality.draw_modalities`): one ``torch.rand`` draw from torch's global generator,
        none when ``modality_dropout`` is 0 (then ``audiovisual``). Callers that crop or load the video only
        when it is kept (the ESPnet wrapper) draw with it before the forward pass."""
        if self.config.modality_dropout <= 0:
            return "audiovisual"
        return draw_modalities(torch.rand(1, 2, dtype=torch.float64), self.config.modality_dropout,
                               self.config.audio_dropout)[0]

    def modality_batch_sampler(self, batch_sampler, seed: int = 0):
        """The training data loader's sampler that draws this encoder's per-batch modality dropout.

        The encoder owns modality dropout (its probabilities ``modality_dropout`` / ``audio_dropout`` and the
        rule :func:`avsr.nn.modality.draw_modalities`). An encoder built with
        ``EncoderRuntime(modality_dropout_by_loader=True)`` does not draw it in :meth:`forward`; the trainer
        that can then skip loading (and cropping, and adding noise to) a modality the draw drops takes this
        :class:`avsr.data.dataset.ModalityBatchSampler` over its ``batch_sampler``: the same draws, one per
        batch, seeded by ``seed`` and the epoch (so identical on every rank and after resumption). The
        encoder is not changed.

        Args:
            batch_sampler: yields lists of dataset indices (e.g.
                :class:`avsr.data.dataset.BucketBatchSampler`).
            seed: base of the draws' seed.

        Returns:
            A :class:`avsr.data.dataset.ModalityBatchSampler` yielding ``[(index, modality), ...]`` per batch.

        Raises:
            ValueError: ``modality_dropout`` is 0 (nothing to draw), or the encoder was not built with
                ``EncoderRuntime(modality_dropout_by_loader=True)`` (it draws itself: the modality dropout
                would be drawn twice).
        """
        if self.config.modality_dropout <= 0:
            raise ValueError("modality_dropout is 0: the encoder has no modality dropout for the loader to "
                             "draw")
        if not self.modality_dropout_by_loader:
            raise ValueError("the encoder draws its modality dropout itself: build it with "
                             "EncoderRuntime(modality_dropout_by_loader=True) for the loader to draw it "
                             "(else it would be drawn twice)")
        from avsr.data.dataset import ModalityBatchSampler

        return ModalityBatchSampler(batch_sampler, self.config.modality_dropout, self.config.audio_dropout,
                                    seed=seed)

    def forward(self, xs_pad: Mapping[str, torch.Tensor | None], ilens: torch.Tensor | None,
                prev_states: Any = None, video_features: torch.Tensor | None = None,
                video_decision: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Encode a padded batch (ESPnet ``AbsEncoder.forward``).

        Args:
            xs_pad: ``{"audio": (B, audio_feat_dim, T) float | None, "video": (B, 1, T, H, W) float | None}``.
            ilens: ``(B,)`` integer, valid frames (25 Hz) per utterance, each in ``[1, T]``; None means all T.
            prev_states: ignored (no streaming state), accepted for the ESPnet interface.
            video_features: ``(B, D, T)`` output of :meth:`encode_video` for this batch, used instead of
                running the video front-end again (``xs_pad["video"]`` may then be None); for inference.
            video_decision: ``(B,)`` 0/1 per utterance: use the lips whole or not at all, in place of the
                video trust gate's soft value (:class:`VideoGate`; the search's ``video_sync_margin``); None:
                the gate.

        Returns:
            ``(hidden (B, T, D) float, olens (B,) int, None)``; ``olens == ilens`` (no subsampling). Values of
            ``hidden`` at padded frames are not meaningful.

        Raises:
            ValueError: both modalities None; a tensor of the wrong rank, feature dim (``audio_feat_dim``) or
                dtype; audio and video differing in B or T; ``ilens`` of the wrong shape or out of range;
                unknown keys in ``xs_pad``; ``video_features`` of the wrong shape.
        """
        emb = self.embed(xs_pad, ilens, video_features, video_decision)
        return self.encoder(emb.x, emb.padding_mask), emb.olens, None

    def extract_layer_outputs(self, xs_pad: Mapping[str, torch.Tensor | None], ilens: torch.Tensor | None,
                              num_layers: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every transformer layer's output, e.g. for k-means targets or layer-wise probing.

        Element ``i - 1`` of the list is the output of layer ``i`` (``(B, T, D)`` float), without the final
        LayerNorm -- what AV-HuBERT returns for ``output_layer=i`` (as used by its feature dumping for
        clustering). Only the first ``num_layers`` layers are run (all ``encoder_layers`` by default).

        Args: as :meth:`forward`, plus ``num_layers`` in ``1..encoder_layers``.

        Returns:
            ``(outputs, olens)``: a list of ``num_layers`` tensors ``(B, T, D)``, and ``(B,)`` lengths.

        Raises:
            ValueError: as :meth:`forward`, or ``num_layers`` out of range.
        """
        emb = self.embed(xs_pad, ilens)
        return self.encoder.layer_outputs(emb.x, emb.padding_mask, num_layers), emb.olens

    def extra_repr(self) -> str:
        """The non-default options, for ``print(model)``."""
        default = AVHubertEncoderConfig()
        changed = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)
                   if getattr(self.config, f.name) != getattr(default, f.name)}
        return f"config overrides vs BASE: {changed}" if changed else "config: AV-HuBERT BASE"
