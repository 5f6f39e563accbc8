"""AV-HuBERT pretraining: masked multimodal cluster prediction.

Source: Shi et al., "Learning Audio-Visual Speech Representation by Masked Multimodal Cluster Prediction"
(ICLR 2022), Sec. 3; the model ``AVHubertModel`` (``forward``, ``apply_input_mask``, ``apply_feature_mask``,
``forward_targets``, ``compute_logits``) in ``avhubert/hubert.py`` and the loss ``AVHubertCriterion`` in
``avhubert/hubert_criterion.py`` of facebookresearch/av_hubert. The flow of one batch::

    labels (B, T_label) at label_rate Hz --forward_targets--> (B, T) at 25 Hz (every ratio-th label)
    audio (B, 104, T) -- span mask, frames -> mask_emb --+
    video (B, 1, T, H, W) -- span mask, frames -> other frames of the utterance (same_seq) --+
      -> encoder.embed (front-ends, modality dropout, fusion) -> encoder.encoder -> (B, T, D)
      -> final_proj -> (B, T, final_dim [x label sets]) -> cosine with label embeddings / logit_temp
      -> cross-entropy on masked frames (x pred_masked_weight) [+ unmasked (x pred_nomask_weight)]
      + loss_weights[0] * features_pen

The label embeddings are learned (``label_embs_concat``, as the original) or a momentum memory
(``label_embedding: momentum``, :class:`avsr.autograd.MomentumLabelMemory`, NPID's non-parametric memory
with the cluster mean of the projected frames as update -- an avsr option, not in AV-HuBERT).

Loss normalisation follows the criterion plus fairseq's division of the gradient by the sample size: for
each label set ``i``, ``(w_m * CE_sum(masked) + w_u * CE_sum(unmasked)) / N_i`` with ``N_i`` the number of
frames with a label (not -1) in the parts whose weight is non-zero, summed over label sets, plus
``loss_weights[0] * features_pen`` (the criterion multiplies it by the sample size, fairseq divides by it).
Stats are in nats (fairseq logs base 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from avsr.autograd import MomentumLabelMemory
from avsr.config import ConfigError, load_yaml
from avsr.encoder import AVHubertEncoder, EncoderRuntime
from avsr.models.config import AVHubertPretrainConfig, ModelConfig
from avsr.nn.masking import apply_input_mask, compute_span_mask

__all__ = ["AVHubertPretrainConfig", "AVHubertPretrainModel"]

#: minimum number of mask spans per utterance (``min_masks=2`` in ``AVHubertModel.apply_input_mask``)
MIN_MASKS = 2


class AVHubertPretrainModel(nn.Module):
    """AV-HuBERT encoder + masked cluster prediction head and loss.

    Args:
        config: the model's configuration, :class:`avsr.models.config.ModelConfig` (or a mapping of it):
            ``num_classes`` (clusters ``K`` of each label set, e.g. ``[500]``, or ``[100, 500]`` for two label
            sets predicted at once), ``encoder_conf`` (:class:`avsr.encoder.AVHubertEncoderConfig`; None: its
            defaults) and ``pretrain_conf`` (:class:`AVHubertPretrainConfig`).
        runtime: the encoder's run-time switches (:class:`avsr.encoder.EncoderRuntime`: activation
            checkpointing, the video front-end's precision and layout, who draws the modality dropout; None:
            its defaults), not part of the configuration.

    Submodules/parameters (names as the original's, so state-dict keys of ``encoder.`` match AVSRModel's):
    ``encoder``; ``final_proj`` (Linear ``D -> final_dim * sets`` when ``untie_final_proj``, else
    ``D -> final_dim``); ``mask_emb`` (``(audio_feat_dim,)`` for input masking, ``(D,)`` for feature
    masking; init U[0, 1)); ``label_embs_concat`` (``(sum K, final_dim)``, init U[0, 1)) for learned label
    embeddings, or ``label_memories`` (one :class:`~avsr.autograd.MomentumLabelMemory` per set) for momentum
    ones. The original's cluster ids include the 4 special symbols of a fairseq dictionary; here
    ``K`` counts clusters only.

    Raises:
        avsr.config.ConfigError: bad ``encoder_conf``/``pretrain_conf`` (key named) or ``num_classes``.
    """

    #: the trainer calls ``model(*[batch[k] for k in batch_keys])``
    batch_keys = ("audio", "video", "lengths", "labels")

    def __init__(self, config: ModelConfig | Mapping[str, Any], *, runtime: EncoderRuntime | None = None
                 ) -> None:
        super().__init__()
        self.config = config = ModelConfig.from_mapping(config).for_pretraining()
        self.encoder = AVHubertEncoder(config=config.encoder_conf, runtime=runtime)
        self.conf = pretrain_conf = config.pretrain_conf
        num_classes = config.num_classes
        self.num_classes = [int(k) for k in num_classes]
        d = self.encoder.output_size()
        self.final_dim = pretrain_conf.final_dim if pretrain_conf.final_dim > 0 else d
        sets = len(self.num_classes)
        proj_dim = self.final_dim * sets if pretrain_conf.untie_final_proj else self.final_dim
        self.final_proj = nn.Linear(d, proj_dim)
        emb_dim = self.encoder.config.audio_feat_dim if pretrain_conf.masking_type == "input" else d
        self.mask_emb = nn.Parameter(torch.empty(emb_dim).uniform_())
        self.label_embs_concat: nn.Parameter | None = None
        self.label_memories: nn.ModuleList | None = None
        if pretrain_conf.label_embedding == "learned":
            embs = torch.empty(sum(self.num_classes), self.final_dim).uniform_()
            self.label_embs_concat = nn.Parameter(embs)
        else:
            self.label_memories = nn.ModuleList(
                MomentumLabelMemory(k, self.final_dim, pretrain_conf.logit_temp,
                                    pretrain_conf.label_memory_momentum) for k in self.num_classes
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | ModelConfig, where: str = "model config", *,
                    runtime: EncoderRuntime | None = None) -> AVHubertPretrainModel:
        """Build from ``{"encoder_conf": {...}, "pretrain_conf": {...}, "num_classes": [K, ...]}`` or a
        :class:`~avsr.models.config.ModelConfig`.

        Args:
            config: the mapping (``num_classes`` required; it may also be a single integer).
            where: origin named in error messages (a file name).
            runtime: the encoder's run-time switches (:class:`avsr.encoder.EncoderRuntime`; None: its
                defaults).

        Raises:
            avsr.config.ConfigError: unknown key at any level (named with ``where``), missing or invalid
                ``num_classes``, a section that is not a mapping, or a bad value (key named).
        """
        try:
            return cls(ModelConfig.from_mapping(config, where), runtime=runtime)
        except ConfigError as e:
            if str(e).startswith(where):
                raise
            raise ConfigError(f"{where}: {e}") from e

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> AVHubertPretrainModel:
        """:meth:`from_config` on a YAML file; errors name the file."""
        return cls.from_config(load_yaml(path), str(path))

    def align_targets(self, labels: Sequence[Tensor], num_frames: int) -> tuple[list[Tensor], int]:
        """Labels at ``label_rate`` -> one label per input frame (AV-HuBERT ``forward_targets``).

        With ``ratio = label_rate / sample_rate`` and ``T_l`` the shortest padded label length over the
        label sets: if ``ratio * num_frames > T_l`` only the first ``int(T_l / ratio)`` frames are used;
        frame ``t`` gets label ``int(t * ratio)`` (float32 arithmetic, as the original).

        Args:
            labels: one ``(B, T_l)`` integer tensor per label set, ids in ``[0, K)``, -1 for no label.
            num_frames: ``T``, input frames.

        Returns:
            ``(targets, T_used)``: a list of ``(B, T_used)`` int64 tensors and the number of frames used.

        Raises:
            ValueError: wrong number of label sets, a tensor that is not 2-D integer, batch sizes that
                differ, an id outside ``[-1, K)`` (set and batch item named), or labels too short for one
                frame.
        """
        sets = len(self.num_classes)
        if isinstance(labels, Tensor) or not isinstance(labels, Sequence) or len(labels) != sets:
            got = type(labels).__name__ + (f" of length {len(labels)}" if hasattr(labels, "__len__") else "")
            raise ValueError(f"labels must be a list of {sets} tensor(s) (B, T_label), one per label set, "
                             f"got {got}")
        b = labels[0].shape[0] if labels[0].dim() > 0 else -1
        for i, (lab, k) in enumerate(zip(labels, self.num_classes)):
            if lab.dim() != 2 or lab.is_floating_point() or lab.is_complex() or lab.shape[0] != b:
                raise ValueError(f"labels[{i}] must be an integer tensor (B={b}, T_label), got {lab.dtype} "
                                 f"{tuple(lab.shape)}")
            bad = (lab < -1) | (lab >= k)
            if bool(bad.any()):
                u = int(bad.any(1).nonzero()[0])
                raise ValueError(f"labels[{i}] of batch item {u}: ids must lie in [0, {k}) or be -1 (no "
                                 f"label); got {lab[u][bad[u]].unique().tolist()}")
        ratio = float(self.conf.label_rate) / float(self.conf.sample_rate)
        t_lab = min(lab.shape[1] for lab in labels)
        t_used = num_frames
        if ratio * num_frames > t_lab:
            t_used = int(t_lab / ratio)
        if t_used < 1:
            raise ValueError(f"labels ({t_lab} per utterance at {self.conf.label_rate} Hz) are too short for "
                             f"one input frame at {self.conf.sample_rate} Hz")
        idx = (torch.arange(t_used, dtype=torch.float32) * ratio).long().to(labels[0].device)
        return [lab[:, idx].long() for lab in labels], t_used

    def _logits(self, i: int, feats: Tensor, targets: Tensor) -> Tensor:
        """Logits ``(N, K_i)`` float32 of projected frames ``feats (N, final_dim)`` against label set ``i``:
        cosine similarity / ``logit_temp`` (``compute_logits`` with ``sim_type: cosine``: the norms' product
        clamped at 1e-6). The momentum memory is updated from ``targets`` in the backward pass."""
        feats = feats.float()
        if self.label_memories is not None:
            return self.label_memories[i](F.normalize(feats, dim=-1), targets)
        start = sum(self.num_classes[:i])
        emb = self.label_embs_concat[start:start + self.num_classes[i]].float()
        norms = feats.norm(dim=-1)[:, None] * emb.norm(dim=-1)[None, :]
        return (feats @ emb.t()) / norms.clamp(min=1e-6) / self.conf.logit_temp

    def _mask_inputs(self, audio: Tensor | None, video: Tensor | None, padding: Tensor, lengths: Tensor
                     ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        """Input masking (``apply_input_mask``): separate span masks for audio and video; audio frames get
        ``mask_emb``, video frames per ``selection_type``; a batch of one gets zeros (as the original).
        Returns the masked inputs and the union of the masks ``(B, T)``."""
        c = self.conf
        b, t = padding.shape
        union = torch.zeros(b, t, dtype=torch.bool, device=padding.device)
        if audio is not None and c.mask_prob_audio > 0:
            m = compute_span_mask((b, t), padding, c.mask_prob_audio, c.mask_length_audio, MIN_MASKS,
                                  require_same_masks=c.require_same_masks)
            audio = apply_input_mask(audio, m, "mask_emb" if b > 1 else "zero", time_dim=2,
                                     mask_emb=self.mask_emb)
            union |= m
        if video is not None and c.mask_prob_image > 0:
            m = compute_span_mask((b, t), padding, c.mask_prob_image, c.mask_length_image, MIN_MASKS,
                                  require_same_masks=c.require_same_masks)
            video = apply_input_mask(video, m, c.selection_type if b > 1 else "zero", time_dim=2,
                                     lengths=lengths)
            union |= m
        return audio, video, union

    def forward(self, audio: Tensor | None, video: Tensor | None, lengths: Tensor, labels: Sequence[Tensor]
                ) -> tuple[Tensor, dict[str, Tensor]]:
        """Masked cluster prediction loss of a batch (in train and eval mode alike masks are drawn, from the
        global RNG, as the original's validation; modality dropout and dropouts only in training).

        Args:
            audio: ``(B, 104, T)`` float audio features at 25 Hz, or None.
            video: ``(B, 1, T, H, W)`` float normalised mouth crops at 25 fps, or None.
            lengths: ``(B,)`` int64 valid frames per utterance.
            labels: one ``(B, T_label)`` int64 tensor per label set at ``label_rate`` Hz
                (``T_label ~= T * label_rate / 25``), padded with -1; -1 frames are ignored.

        Returns:
            ``loss`` (scalar float32, differentiable) and ``stats`` (detached scalar float32 tensors on the
            loss's device, read by the trainer once per log interval): ``loss``, ``loss_masked`` and
            ``loss_unmasked`` (mean cross-entropy per labelled frame, summed over label sets),
            ``loss_features_pen`` (``loss_weights[0] * features_pen``), ``acc_masked``, ``acc_unmasked``
            (argmax accuracy over labelled frames of all sets; nan without such frames), ``n_masked``,
            ``n_unmasked`` (non-padding frames). Padding frames are in neither part.

        Raises:
            ValueError: the label errors of :meth:`align_targets`, both modalities None, and the encoder's
                input errors.
        """
        audio, video, lengths, targets, padding = self._prepare_batch(audio, video, lengths, labels)
        x, mask, features_pen = self._encode(audio, video, lengths, padding)
        return self._loss(x, mask, padding, targets, features_pen)

    def _prepare_batch(
        self, audio: Tensor | None, video: Tensor | None, lengths: Tensor, labels: Sequence[Tensor]
    ) -> tuple[Tensor | None, Tensor | None, Tensor, list[Tensor], Tensor]:
        """Targets at the input frame rate (:meth:`align_targets`) and the inputs cropped to them.

        Returns:
            ``(audio, video, lengths, targets, padding)``: the inputs cut to the ``T`` frames that have labels
            (``(B, 104, T)`` / ``(B, 1, T, H, W)`` or None), ``lengths`` ``(B,)`` int64 clamped to ``T``, one
            ``(B, T)`` int64 target tensor per label set and ``padding`` ``(B, T)`` bool (True at padding),
            all on the inputs' device.

        Raises:
            ValueError: both modalities None, or the label errors of :meth:`align_targets`.
        """
        ref = audio if audio is not None else video
        if ref is None:
            raise ValueError("audio and video are both None; at least one modality is needed")
        t = ref.shape[2]
        targets, t_used = self.align_targets(labels, t)
        device = ref.device
        targets = [tgt.to(device) for tgt in targets]
        lengths = lengths.to(device, torch.long)
        if t_used < t:  # labels shorter than the features: crop (forward_targets)
            audio = audio[:, :, :t_used] if audio is not None else None
            video = video[:, :, :t_used] if video is not None else None
            lengths = lengths.clamp(max=t_used)
            t = t_used
        padding = torch.arange(t, device=device)[None, :] >= lengths[:, None]
        return audio, video, lengths, targets, padding

    def _encode(self, audio: Tensor | None, video: Tensor | None, lengths: Tensor, padding: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Masked encoding: input masking (:meth:`_mask_inputs`) or feature masking (one span mask on the
        fused features, filled with ``mask_emb``) around the encoder.

        Returns:
            ``(x, mask, features_pen)``: encoder output ``(B, T, D)``, the masked frames ``(B, T)`` bool and
            the fused features' penalty (scalar) of ``encoder.embed``.
        """
        c = self.conf
        if c.masking_type == "input":
            audio, video, mask = self._mask_inputs(audio, video, padding, lengths)
        emb = self.encoder.embed({"audio": audio, "video": video}, lengths)
        x = emb.x
        if c.masking_type == "feature":
            ref = audio if audio is not None else video
            mask = compute_span_mask((ref.shape[0], ref.shape[2]), padding, c.mask_prob_audio,
                                     c.mask_length_audio, MIN_MASKS, require_same_masks=c.require_same_masks)
            x = apply_input_mask(x, mask, "mask_emb", mask_emb=self.mask_emb)
        return self.encoder.encoder(x, emb.padding_mask), mask, emb.features_pen

    def _set_logits(self, i: int, p: Tensor, tgt: Tensor, masked: Tensor, unmasked: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Logits and targets of label set ``i`` on the masked and the unmasked frames.

        Args:
            p: ``(B, T, final_dim)`` projected frames.  tgt: ``(B, T)`` int64 targets.
            masked, unmasked: ``(B, T)`` bool, the non-padding frames of each part.

        Returns:
            ``(lg_m, t_m, lg_u, t_u)``: ``(N_m, K_i)`` float32 logits and ``(N_m,)`` targets of the masked
            frames, the same of the unmasked ones. With ``pred_nomask_weight > 0`` one :meth:`_logits` call
            covers all frames (one memory update per step); otherwise the unmasked logits carry no gradient.
        """
        if self.conf.pred_nomask_weight > 0:
            valid = masked | unmasked  # ~padding
            logits = self._logits(i, p[valid], tgt[valid])
            is_m = masked[valid]
            return logits[is_m], tgt[masked], logits[~is_m], tgt[unmasked]
        lg_m, t_m = self._logits(i, p[masked], tgt[masked]), tgt[masked]
        with torch.no_grad():
            lg_u, t_u = self._logits(i, p[unmasked], tgt[unmasked]), tgt[unmasked]
        return lg_m, t_m, lg_u, t_u

    def _loss(self, x: Tensor, mask: Tensor, padding: Tensor, targets: Sequence[Tensor], features_pen: Tensor
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """Cluster prediction loss and statistics (see :meth:`forward`) of encoder output ``x`` ``(B, T, D)``
        with masked frames ``mask`` and padding ``padding`` (both ``(B, T)`` bool), one ``(B, T)`` int64
        target tensor per label set and the fused features' penalty (scalar)."""
        c = self.conf
        proj = self.final_proj(x)
        sets = len(self.num_classes)
        projs = proj.chunk(sets, dim=-1) if c.untie_final_proj else [proj] * sets
        masked, unmasked = mask & ~padding, ~mask & ~padding
        w_m, w_u = c.pred_masked_weight, c.pred_nomask_weight
        loss = proj.new_zeros((), dtype=torch.float32)
        # statistics as tensors (no host synchronisation): summed cross-entropies, correct and labelled frames
        loss_m = loss_u = cor_m = cor_u = cnt_m = cnt_u = loss.new_zeros(())
        with torch.autocast(padding.device.type, enabled=False):
            for i, (p, tgt) in enumerate(zip(projs, targets)):
                lg_m, t_m, lg_u, t_u = self._set_logits(i, p, tgt, masked, unmasked)
                ce_m = F.cross_entropy(lg_m, t_m, ignore_index=-1, reduction="sum")
                ce_u = F.cross_entropy(lg_u, t_u, ignore_index=-1, reduction="sum")
                n_m, n_u = (t_m >= 0).sum(), (t_u >= 0).sum()
                size = n_m * (w_m > 0) + n_u * (w_u > 0)
                loss = loss + (w_m * ce_m + (w_u * ce_u if w_u > 0 else 0.0)) / size.clamp(min=1)
                with torch.no_grad():
                    loss_m = loss_m + ce_m / n_m.clamp(min=1)
                    loss_u = loss_u + ce_u / n_u.clamp(min=1)
                    cor_m = cor_m + ((lg_m.argmax(-1) == t_m) & (t_m >= 0)).sum()
                    cor_u = cor_u + ((lg_u.argmax(-1) == t_u) & (t_u >= 0)).sum()
                cnt_m, cnt_u = cnt_m + n_m, cnt_u + n_u
            pen = c.loss_weights[0] * features_pen.float() if c.loss_weights else loss.new_zeros(())
            loss = loss + pen
        nan = torch.full((), float("nan"), device=loss.device)
        stats = {
            "loss": loss.detach(),
            "loss_masked": loss_m,
            "loss_unmasked": loss_u,
            "loss_features_pen": pen.detach(),
            "acc_masked": torch.where(cnt_m > 0, cor_m / cnt_m.clamp(min=1), nan),
            "acc_unmasked": torch.where(cnt_u > 0, cor_u / cnt_u.clamp(min=1), nan),
            "n_masked": masked.sum().float(),
            "n_unmasked": unmasked.sum().float(),
        }
        return loss, stats
