"""Named factory functions for the published AV-HuBERT encoder configurations, as torchaudio's
``hubert_base()`` / ``hubert_large()`` (``torchaudio/models/wav2vec2/model.py``).

Each factory builds an :class:`avsr.encoder.AVHubertEncoder` with random weights from a configuration
shipped in the package (``avsr/conf/model/<name>.yaml``, read by name with :mod:`importlib.resources`), so
that ``avsr.avhubert_base()`` and ``AVHubertEncoder.from_yaml("avhubert_base")`` are the same model.
Keyword overrides replace options of the file (:class:`avsr.encoder.AVHubertEncoderConfig` names:
``encoder_layers``, ``dropout``, ``modality_dropout``, ...). The module is returned in training mode, as any
freshly built ``nn.Module``; call ``.eval()`` for inference. Trained weights come from
:meth:`avsr.encoder.AVHubertEncoder.from_pretrained` (official AV-HuBERT checkpoints or avsr's own).

Parameter counts below are of avsr's implementation (ResNet-18 video front-end, audio projection,
transformer and its convolutional positional embedding); Shi et al. (2022), "Learning Audio-Visual Speech
Representation by Masked Multimodal Cluster Prediction" (ICLR), report 103M (BASE) and 325M (LARGE).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from avsr.config import check_keys, shipped_config
from avsr.encoder import AVHubertEncoder, AVHubertEncoderConfig

__all__ = ["avhubert_base", "avhubert_large", "avhubert_synthgrid_cpu"]


def _build(factory: str, name: str, overrides: dict[str, Any]) -> AVHubertEncoder:
    """The encoder of the shipped model configuration ``name`` with ``overrides`` (the shipped file is used
    even when a file of that name lies in the working directory); ``factory`` names the caller in errors."""
    check_keys(overrides, {f.name for f in dataclasses.fields(AVHubertEncoderConfig)}, f"{factory}()")
    return AVHubertEncoder.from_yaml(shipped_config(name, "model"), **overrides)


def avhubert_base(**overrides: Any) -> AVHubertEncoder:
    """AV-HuBERT BASE: 12 transformer layers, D=768, FFN 3072, 12 heads, pre-LN, ResNet-18 video front-end
    (widths 64-128-256-512), concatenation fusion; 102,620,288 parameters (the paper: 103M).

    Source: Shi et al. (2022), ICLR; values of the original's BASE pretraining configuration
    (facebookresearch/av_hubert ``avhubert/conf/pretrain/base_lrs3_iter5.yaml`` over ``AVHubertConfig``),
    shipped as ``avsr/conf/model/avhubert_base.yaml``. The original's fine-tuning configurations change the
    dropouts (``dropout`` 0.0, ``attention_dropout`` 0.0, ``activation_dropout`` 0.1, ``encoder_layerdrop``
    0.1) and ``feature_grad_mult`` (1.0): pass them as overrides.

    Input/output: see :class:`avsr.encoder.AVHubertEncoder` (audio ``(B, 104, T)``, video
    ``(B, 1, T, 88, 88)`` at 25 frames/s -> ``(B, T, 768)``).

    Args:
        **overrides: options of :class:`avsr.encoder.AVHubertEncoderConfig` replacing the file's.

    Raises:
        avsr.config.ConfigError: an unknown override (named) or a bad value.
    """
    return _build("avhubert_base", "avhubert_base", overrides)


def avhubert_large(**overrides: Any) -> AVHubertEncoder:
    """AV-HuBERT LARGE: 24 transformer layers, D=1024, FFN 4096, 16 heads, pre-LN, ResNet-18 video front-end
    (widths 64-128-256-512), concatenation fusion; 324,622,976 parameters (the paper: 325M).

    Source: Shi et al. (2022), ICLR; values of the original's LARGE pretraining configuration
    (facebookresearch/av_hubert ``avhubert/conf/pretrain/large_lrs3_iter5.yaml`` over ``AVHubertConfig``),
    shipped as ``avsr/conf/model/avhubert_large.yaml``; fine-tuning changes the dropouts as for
    :func:`avhubert_base`.

    Input/output: see :class:`avsr.encoder.AVHubertEncoder` (-> ``(B, T, 1024)``). The float32 weights take
    1.3 GB; build under ``torch.device("meta")`` to inspect the architecture without allocating them.

    Args:
        **overrides: options of :class:`avsr.encoder.AVHubertEncoderConfig` replacing the file's.

    Raises:
        avsr.config.ConfigError: an unknown override (named) or a bad value.
    """
    return _build("avhubert_large", "avhubert_large", overrides)


def avhubert_synthgrid_cpu(**overrides: Any) -> AVHubertEncoder:
    """The encoder of the default SynthGRID recipe: the AV-HuBERT architecture at CPU size -- 4 transformer
    layers, D=192, FFN 768, 4 heads, pre-LN, ResNet-18 video front-end with widths 8-16-32-64, modality
    dropout 0.9 / audio dropout 0.15; 2,212,832 parameters.

    Source: avsr's own configuration ``avsr/conf/model/avsr_synthgrid_cpu.yaml`` (its ``encoder_conf``; the
    whole model with its decoder is ``AVSRModel.from_yaml("avsr_synthgrid_cpu", vocab_size=V)``), trained
    by ``recipes/synthgrid/avsr1/run.sh`` on 2 CPU cores (results in the README).

    Input/output: see :class:`avsr.encoder.AVHubertEncoder` (-> ``(B, T, 192)``).

    Args:
        **overrides: options of :class:`avsr.encoder.AVHubertEncoderConfig` replacing the file's.

    Raises:
        avsr.config.ConfigError: an unknown override (named) or a bad value.
    """
    return _build("avhubert_synthgrid_cpu", "avsr_synthgrid_cpu", overrides)
