"""An ESPnet2 ``AbsEncoder`` around :class:`avsr.encoder.AVHubertEncoder`.

ESPnet builds encoders as ``encoder_class(input_size=input_size, **encoder_conf)`` and calls
``encoder(xs_pad (B, T, D), ilens (B,)) -> (hidden, olens, states)`` (``espnet2/asr/encoder/abs_encoder.py``,
``espnet2/tasks/asr.py``). :class:`AVHubertESPnetEncoder` takes ESPnet's packed frames (audio features and
mouth ROI side by side, :mod:`avsr.espnet.layout`), crops and normalises the video as avsr's loader does,
and runs the wrapped ``AVHubertEncoder`` (attribute ``avhubert``) -- with its modality dropout and
``feature_grad_mult`` in training. ``reload_pretrained_parameters`` (called by ESPnet's ``initialize`` after
its weight initialisation) restores the weights of an avsr checkpoint or an official AV-HuBERT checkpoint
(:mod:`avsr.compat` reads both).

The class derives from ESPnet's ``AbsEncoder`` when ``espnet2`` is importable, else from ``torch.nn.Module``
(same behaviour), so that this module imports without ESPnet.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from avsr.config import ConfigError, load_yaml
from avsr.encoder import AVHubertEncoder, AVHubertEncoderConfig, EncoderRuntime
from avsr.espnet.layout import crop_and_normalize, roi_side, unpack_frames
from avsr.features import CROP_SIZE
from avsr.modalities import check_modality
from avsr.nn.precision import check_precision

try:  # ESPnet's interface when it is installed; the class works the same without it
    from espnet2.asr.encoder.abs_encoder import AbsEncoder as _EncoderBase
except ImportError:  # pragma: no cover - depends on the environment
    _EncoderBase = torch.nn.Module

__all__ = ["AVHubertESPnetEncoder", "shipped_model_config"]

logger = logging.getLogger(__name__)

def shipped_model_config(name: str | os.PathLike) -> Path:
    """The YAML of a shipped model configuration (``avsr/conf/model/<name>.yaml``, e.g. ``avhubert_base``,
    ``avhubert_large``, ``avsr_synthgrid_cpu``), or ``name`` itself when it is an existing file.

    Raises:
        avsr.config.ConfigError: neither a file nor a shipped name (the shipped names are listed).
    """
    path = Path(name)
    if path.is_file():
        return path
    conf_dir = Path(__file__).resolve().parents[1] / "conf" / "model"
    shipped = conf_dir / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in conf_dir.glob("*.yaml"))
    raise ConfigError(f"model {str(name)!r} is neither a YAML file nor a shipped model configuration {names}")


class AVHubertESPnetEncoder(_EncoderBase):
    """AV-HuBERT encoder for ESPnet2 ASR (registered as ``encoder: avsr_avhubert`` by :mod:`avsr.espnet`).

    Args:
        input_size: ``D`` of ESPnet's input, ``audio_feat_dim + S * S`` (packed layout of
            :mod:`avsr.espnet.layout`; ``S``, the ROI side, follows from it). ESPnet passes it.
        model: a shipped model configuration name (``avhubert_base``, ``avsr_synthgrid_cpu``, ...) or a
            YAML path whose ``encoder_conf`` (or top level) gives the encoder options; None: AV-HuBERT BASE's
            defaults.
        pretrained: an avsr checkpoint (``AVSRModel``, pretraining model, or ``avsr-convert`` encoder) or an
            official AV-HuBERT checkpoint (pretrained ``*_iter5.pt`` or fine-tuned); its architecture is the
            base configuration (under ``model`` and the keyword options) and its weights are loaded now and
            again by :meth:`reload_pretrained_parameters` (ESPnet rebuilds the model from its ``config.yaml``
            when decoding, so the file must exist there too; the trained weights then replace these).
        modality: the input used outside training: ``audiovisual``, ``audio`` (video fed as zeros after
            its front-end, as AV-HuBERT) or ``video``; in training both are given and the encoder's modality
            dropout decides. Can be changed later (``encoder.modality = "audio"``, or ``--modality`` of
            ``python -m avsr.espnet.asr_inference``).
        crop_size: side of the square video crop (88 as AV-HuBERT).
        video_precision: precision of the video front-end's ResNet in training, as avsr's training setting
            of that name (:class:`avsr.train.trainer.TrainConfig`): ``auto`` (default: bfloat16 where the
            device computes it natively, e.g. CPUs with AVX-512 BF16 / AMX, float32 elsewhere;
            :func:`avsr.nn.precision.resolve_precision` on the input's device), ``fp32``, ``bf16``, or None
            (the caller's, float32 in ESPnet's trainer). Outside training the front-end runs in the
            caller's precision (float32 in ``Speech2Text``), as ``avsr.bin.decode``'s default. Given to the
            wrapped encoder when it is built (``EncoderRuntime(video_precision=...,
            video_precision_in_eval=False)``, :class:`avsr.encoder.EncoderRuntime`); read back as the
            read-only :attr:`video_precision`.
        **encoder_conf: :class:`avsr.encoder.AVHubertEncoderConfig` options (``encoder_layers``,
            ``feature_grad_mult``, ``modality_dropout``, ...), overriding ``model`` and ``pretrained``.

    Input ``xs_pad (B, T, D)`` packed frames (25 Hz), ``ilens (B,)`` valid frames; output ``(hidden (B, T, E)
    float, olens (B,), None)`` with ``E = encoder_embed_dim`` and ``olens == ilens`` (no subsampling).

    In training, the wrapper makes the encoder's per-batch modality dropout draw itself (the same rule and
    probabilities, :func:`avsr.nn.modality.draw_modalities`; the wrapped encoder is built with
    ``EncoderRuntime(modality_dropout_by_loader=True)``, so it does not draw again) before it crops the
    video, so that a
    batch whose video is dropped (audio-only: 80% of the SynthGRID recipe's batches) skips the crop and
    normalisation of its frames as well as the video front-end, as in avsr's trainer.

    Raises:
        avsr.config.ConfigError: an unknown option (named), a bad value, an unknown ``model`` name,
            ``input_size`` not ``audio_feat_dim + S * S``, an ROI smaller than ``crop_size``, a bad
            ``modality`` or ``video_precision``.
        avsr.compat.CheckpointError: ``pretrained`` is not a readable AV-HuBERT/avsr checkpoint, or its
            weights do not fit the configured architecture (keys named).
    """

    def __init__(
        self,
        input_size: int,
        model: str | None = None,
        pretrained: str | None = None,
        modality: str = "audiovisual",
        crop_size: int = CROP_SIZE,
        video_precision: str | None = "auto",
        **encoder_conf: Any,
    ) -> None:
        super().__init__()
        conf: dict[str, Any] = {}
        loaded = None
        if pretrained is not None:
            from avsr.compat import read_checkpoint

            loaded = read_checkpoint(pretrained)
            conf.update(loaded.encoder_conf)
        if model is not None:
            path = shipped_model_config(model)
            data = load_yaml(path)
            if "encoder_conf" in data:
                data = data["encoder_conf"] or {}
            conf.update(data)
        conf.update(encoder_conf)
        if video_precision is not None:
            try:
                check_precision(video_precision, "encoder_conf: video_precision")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        # the video front-end's precision in training only (auto: resolved on the input's device at each
        # forward pass); the modality dropout drawn in forward, before the video is cropped
        runtime = EncoderRuntime(video_precision=video_precision, video_precision_in_eval=False,
                                 modality_dropout_by_loader=True)
        self.avhubert = AVHubertEncoder(runtime=runtime, **conf)
        cfg: AVHubertEncoderConfig = self.avhubert.config
        try:
            self.roi_size = roi_side(input_size, cfg.audio_feat_dim)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if self.roi_size < crop_size:
            raise ConfigError(
                f"the {self.roi_size}x{self.roi_size} ROI of input_size {input_size} is smaller "
                f"than crop_size {crop_size}"
            )
        self.input_size = int(input_size)
        self.crop_size = int(crop_size)
        self.modality = modality
        self.pretrained = pretrained
        if loaded is not None:
            self._load(loaded)

    @property
    def video_precision(self) -> str | None:
        """The video front-end's precision in training (None, ``auto``, ``fp32`` or ``bf16``), as given to
        the constructor; read-only (the wrapped encoder was built with it)."""
        return self.avhubert.video_precision

    @property
    def modality(self) -> str:
        """The input used outside training (``audiovisual``, ``audio`` or ``video``)."""
        return self._modality

    @modality.setter
    def modality(self, value: str) -> None:
        try:
            check_modality(value)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self._modality = value

    def output_size(self) -> int:
        """``E``, the size of the output vectors (``encoder_embed_dim``)."""
        return self.avhubert.output_size()

    def _load(self, loaded) -> None:
        from avsr.compat import load_state_strict

        load_state_strict(self.avhubert, loaded.encoder_state, str(loaded.path), "encoder")

    def reload_pretrained_parameters(self) -> None:
        """Load the ``pretrained`` checkpoint's encoder weights again (ESPnet calls this after its ``init``
        re-initialised every parameter); without ``pretrained`` nothing changes.

        Raises:
            avsr.compat.CheckpointError: the checkpoint no longer reads or fits (keys named).
        """
        if self.pretrained is None:
            return
        from avsr.compat import read_checkpoint

        self._load(read_checkpoint(self.pretrained))
        logger.info("AV-HuBERT encoder weights reloaded from %s", self.pretrained)

    def forward(
        self, xs_pad: torch.Tensor, ilens: torch.Tensor, prev_states: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Encode a padded batch of packed frames (ESPnet ``AbsEncoder.forward``).

        Args:
            xs_pad: ``(B, T, D)`` float packed frames (:mod:`avsr.espnet.layout`), zero-padded after each
                utterance's ``ilens`` frames.
            ilens: ``(B,)`` integer valid frames per utterance, in ``[1, T]``.
            prev_states: ignored (ESPnet's interface).

        Returns:
            ``(hidden (B, T, E), olens (B,) int64, None)``.

        Raises:
            ValueError: ``D`` differs from ``input_size``; the wrapped encoder's input errors.
        """
        if xs_pad.dim() != 3 or xs_pad.shape[-1] != self.input_size:
            raise ValueError(
                f"xs_pad must be (B, T, {self.input_size}) packed frames, got {tuple(xs_pad.shape)}"
            )
        audio, video = unpack_frames(xs_pad, self.avhubert.config.audio_feat_dim)
        keep = self.batch_modality() if self.training else self.modality
        if keep == "video":
            audio = None
        if keep == "audio":
            video = None
        else:
            video = crop_and_normalize(video, self.training, self.crop_size).to(xs_pad.dtype)
        return self.avhubert({"audio": audio, "video": video}, ilens)

    def batch_modality(self) -> str:
        """The modality dropout draw of one training batch (the wrapped encoder's,
        :meth:`avsr.encoder.AVHubertEncoder.draw_batch_modality`)."""
        return self.avhubert.draw_batch_modality()
