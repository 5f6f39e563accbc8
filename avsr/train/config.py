"""The configuration of a training run, as one typed tree: :class:`ExperimentConfig` holds the loop's,
optimiser's and augmentation's settings (:class:`TrainConfig`, the top-level keys of ``conf/train/*.yaml``)
and the model's (:class:`avsr.models.config.ModelConfig`: encoder, decoder, loss or pretraining head,
decoding defaults), read once from the training YAML by :func:`load_experiment_config`.

The YAML keeps the layout of ESPnet's and fairseq's configurations: the loop's settings at the top level,
the model's sections beside them (``encoder_conf``, ``decoder_conf``, ``model_conf``, ``pretrain_conf``,
``decode_defaults``), or taken from a model YAML named by ``model_config``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from avsr.config import (
    TRAIN_KINDS,
    Config,
    ConfigError,
    check_keys,
    config_path,
    from_dict,
    load_yaml,
    option,
    probability,
    to_dict,
)
from avsr.models.config import ModelConfig
from avsr.nn.precision import PRECISIONS, resolve_precision

__all__ = ["TrainConfig", "ExperimentConfig", "MODEL_SECTIONS", "load_experiment_config", "resolved_settings"]

logger = logging.getLogger("avsr.train")

#: the keys of a training YAML that configure the model rather than the loop (a model YAML named by
#: ``model_config`` may hold them too).
MODEL_SECTIONS = ("encoder_conf", "decoder_conf", "model_conf", "pretrain_conf", "decode_defaults")


@dataclass
class TrainConfig(Config):
    """Loop, optimiser and augmentation settings (the top-level keys of ``conf/train/*.yaml``).

    Attributes:
        max_epoch: passes over the training data.
        batch_frames: padded 25 fps frames per batch and rank (``batch_size * longest``).
        max_batch_size: utterances per batch at most.
        accum_grad: batches whose gradients are summed before an optimiser step.
        lr: peak learning rate of AdamW.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: linear warm-up length in optimiser steps.
        final_lr_scale: cosine decay ends at ``lr * final_lr_scale`` at the last step.
        grad_clip: clip the global gradient norm to this (0 disables).
        noise_prob: probability that a training utterance gets babble noise (needs a noise file).
        noise_prob_audio_only: the probability for utterances of audio-only batches (those in which
            modality dropout dropped the video); null: ``noise_prob``. With a lower value the audio path
            learns mostly from clean speech while the audio-visual batches, noisier, teach the model to
            turn to the lips when the audio fails.
        noise_snr_db: SNRs in dB drawn uniformly for that noise.
        freq_warp: ``[low, high]`` range of the per-utterance frequency-axis scale of the audio spectrum
            (VTLP; null: none), see :class:`avsr.data.dataset.AudioAugment`.
        av_mismatch_prob: probability that an utterance of an audio-visual training batch gets the audio
            of another utterance of another speaker in place of its own (its transcript stays that of its
            lips), see :class:`avsr.data.dataset.AudioAugment`. Needs modality dropout drawn by the loader
            (``modality_dropout > 0`` and both streams), which is what marks a batch audio-visual.
        av_mismatch_noisy_only: only utterances that get noise get another utterance's audio (under the
            same noise), see :class:`avsr.data.dataset.AudioAugment`; needs a noise file.
        num_freq_mask: SpecAugment frequency masks per training utterance (0: none).
        freq_mask_width: widest frequency mask in filterbank channels (of 26).
        num_time_mask: SpecAugment time masks per training utterance (0: none), see
            :class:`avsr.data.dataset.AudioAugment`.
        time_mask_width: widest time mask in frames of 40 ms (25 fps).
        time_mask_av_only: time-mask only the utterances of audio-visual batches (the lips must fill the
            gap); needs modality dropout drawn by the loader, as ``av_mismatch_prob``.
        edge_silence_frames: ``[low, high]``: 40 ms frames of silence added (> 0) or removed (< 0, silent
            frames only) at each end of every training utterance, drawn uniformly per utterance, end and
            epoch (null: none), see :class:`avsr.data.dataset.AudioAugment`.
        edge_silence_keep_length: draw the change at the start only and make the opposite one at the end, so
            that the utterance keeps its length (the speech moves within it; much cheaper on a CPU).
        edge_silence_prob: share of the training utterances that get ``edge_silence_frames`` (per
            utterance and epoch); the others keep the corpus's edges.
        narrowband_prob: share of the training utterances heard through an 8 kHz channel in each epoch
            (resampled to 8 kHz and back, per utterance and epoch), see
            :class:`avsr.data.dataset.AudioAugment`; 0: none.
        narrowband_audio_only: the narrowband channel for utterances of audio-only batches only; needs
            modality dropout drawn by the loader, as ``time_mask_av_only``.
        hard_onset_prob: share of the training utterances whose speech starts abruptly (per utterance
            and epoch; 0: none), see :class:`avsr.data.dataset.AudioAugment`.
        hard_onset_ms: ``[low, high]``: milliseconds of the speech's rise muted after its onset, drawn
            uniformly.
        envelope_contrast: ``[low, high]``: factor of the spectral envelope's contrast (formant peaks
            against valleys, tilt), drawn uniformly per training utterance and epoch (null: none), see
            :class:`avsr.data.dataset.AudioAugment`.
        envelope_contrast_prob: share of the training utterances that get ``envelope_contrast``.
        untrusted_video_prob: share of the utterances of audio-visual training batches that get video which
            does not say their transcript (another utterance's lips, a frozen or blurred mouth, lips out of
            sync, a photograph's mouth moved by another utterance; per utterance and epoch), see
            :class:`avsr.data.dataset.AudioAugment`; the target of the video trust gate
            (``model_conf.video_gate_weight``). Needs modality dropout drawn by the loader, as
            ``av_mismatch_prob``. 0: none.
        untrusted_video_kinds: which of those kinds (``other``, ``frozen``, ``shift``, ``blur``, ``photo``: a
            real photograph's mouth moved by another utterance).
        speed_perturb: speed factors drawn uniformly per training utterance and epoch, applied to audio and
            video together (ESPnet's ``speed_perturb_factors``, e.g. ``[0.9, 1.0, 1.1]``; null: none).
        seed: seed of initialisation, data order and augmentation.
        num_workers: DataLoader worker processes (0 loads in the main process, with a cache).
        cache_limit_mb: memory for decoded media and clean audio features kept between epochs, in MiB per
            dataset (training, validation) and per loader process; null: no limit. What does not fit is
            decoded again every epoch (logged once). The SynthGRID default corpus needs ~2,700 MiB.
        use_amp: bfloat16 autocast on CUDA (only when ``precision`` is null).
        precision: ``auto`` (default), ``fp32`` or ``bf16``: bfloat16 autocast of the forward pass on any
            device (see :mod:`avsr.nn.precision`; CTC, log-softmax statistics, pretraining logits and the
            momentum label memory stay float32, as do parameters, gradients and optimizer state). ``auto``:
            ``bf16`` where the device computes bfloat16 natively (CPUs with AVX-512 BF16 or AMX, CUDA GPUs
            from Ampere on), ``fp32`` elsewhere (:func:`avsr.nn.precision.resolve_precision`; logged once
            with the reason, and the choice is recorded in every checkpoint under ``"precision"``). An
            explicit ``bf16`` without native support runs emulated, with a warning. null: the older
            ``use_amp`` rule (``bf16`` on CUDA when ``use_amp``, else ``fp32``).
        video_precision: ``auto`` (default), ``fp32`` or ``bf16``: the precision of the video front-end's
            ResNet alone (:attr:`avsr.encoder.AVHubertEncoder.video_precision`), whatever ``precision`` says
            for the rest; ``auto`` as for ``precision``; null: as the rest. ``bf16`` with ``precision: fp32``
            on a CPU with native bfloat16: the memory-bound ResNet runs in bfloat16 (its parameters,
            gradients and optimizer state stay float32) while the transformer, decoder and losses stay
            float32 (docs, "Performance").
        compile: ``torch.compile`` the model's heavy parts (:func:`compile_model`) with dynamic shapes, so
            that batches of other sizes reuse the compiled code; the first batches (training, validation)
            pay the compilation (see the README's "Performance" section for what it costs and gains).
        checkpoint_activations: recompute each encoder transformer layer in the backward pass instead of
            storing its activations (fairseq's option of that name; less memory, more time, same result).
        flush_denormal: treat subnormal floats as zero on the CPU (:func:`avsr.nn.precision.flush_denormal`;
            ``avsr-train`` sets it before building the model so that every intra-op thread has it). On x86
            the steps of later epochs otherwise slow down as the model's distributions sharpen.
        keep_nbest: number of last epoch checkpoints kept on disk (the rest are deleted).
        log_interval: optimiser steps between log lines.
        freeze_finetune_updates: optimiser steps at the start during which the encoder is frozen (no
            gradient, no update), as AV-HuBERT's fine-tuning (``freeze_finetune_updates``); 0 disables.
        valid_interval: validate after every ``valid_interval``-th epoch, and after each of the last
            ``keep_nbest`` epochs (the checkpoints decoding chooses from); 0: only those last ones.
    """

    max_epoch: int = option(30, gt=0)
    batch_frames: int = option(2000, gt=0)
    max_batch_size: int = option(64, gt=0)
    accum_grad: int = option(1, gt=0)
    lr: float = option(1e-3, gt=0)
    weight_decay: float = option(0.01, ge=0)
    betas: tuple[float, float] = option((0.9, 0.98), ge=0, lt=1)
    warmup_steps: int = option(500, ge=0)
    final_lr_scale: float = probability(0.05)
    grad_clip: float = option(5.0, ge=0)
    noise_prob: float = probability(0.0)
    noise_prob_audio_only: float | None = probability(None)
    noise_snr_db: list[float] = option(factory=lambda: [-5.0, 0.0, 5.0, 10.0], non_empty=True, finite=True)
    freq_warp: list[float] | None = option(None, gt=0)
    av_mismatch_prob: float = probability(0.0)
    av_mismatch_noisy_only: bool = False
    untrusted_video_prob: float = probability(0.0)
    untrusted_video_kinds: list[str] = option(factory=lambda: ["other", "frozen", "shift", "blur", "photo"],
                                              choices=["other", "frozen", "shift", "blur", "photo"],
                                              non_empty=True)
    num_freq_mask: int = option(0, ge=0)
    freq_mask_width: int = option(0, ge=0)
    num_time_mask: int = option(0, ge=0)
    time_mask_width: int = option(0, ge=0)
    time_mask_av_only: bool = False
    edge_silence_frames: list[int] | None = None
    edge_silence_keep_length: bool = False
    edge_silence_prob: float = probability(1.0)
    narrowband_prob: float = probability(0.0)
    narrowband_audio_only: bool = False
    hard_onset_prob: float = probability(0.0)
    hard_onset_ms: list[float] = option(factory=lambda: [5.0, 30.0], finite=True, ge=0)
    envelope_contrast: list[float] | None = option(None, gt=0, finite=True)
    envelope_contrast_prob: float = probability(1.0)
    speed_perturb: list[float] | None = option(None, gt=0)
    seed: int = 0
    num_workers: int = option(0, ge=0)
    cache_limit_mb: float | None = option(8192.0, ge=0)
    use_amp: bool = True
    precision: str | None = option("auto", choices=PRECISIONS)
    video_precision: str | None = option("auto", choices=PRECISIONS)
    compile: bool = False
    checkpoint_activations: bool = False
    flush_denormal: bool = True
    keep_nbest: int = option(5, ge=0)
    log_interval: int = option(20, gt=0)
    freeze_finetune_updates: int = option(0, ge=0)
    valid_interval: int = option(1, ge=0)

    def check(self) -> None:
        """The ``[low, high]`` pairs. Raises :class:`avsr.config.ConfigError` naming the key."""
        for key in ("freq_warp", "edge_silence_frames", "hard_onset_ms", "envelope_contrast"):
            value = getattr(self, key)
            if value is not None and (len(value) != 2 or value[0] > value[1]):
                raise ConfigError(f"{key}: expected [low, high] with low <= high, got {value}")

    def resolved_precision(self, device: torch.device) -> str:
        """``precision`` for ``device`` (``auto`` resolved, see :func:`avsr.nn.precision.resolve_precision`),
        or when null the ``use_amp`` rule: ``bf16`` on CUDA if ``use_amp``, else fp32."""
        if self.precision is not None:
            return resolve_precision(self.precision, device, "precision")
        return "bf16" if self.use_amp and device.type == "cuda" else "fp32"

    def resolved_video_precision(self, device: torch.device) -> str | None:
        """``video_precision`` for ``device`` (``auto`` resolved); None: as the rest of the model."""
        if self.video_precision is None:
            return None
        return resolve_precision(self.video_precision, device, "video_precision")


@dataclass
class ExperimentConfig:
    """A training YAML read into its typed tree.

    Attributes:
        train: the loop's settings.
        model: the model's sections (``vocab_size`` and ``num_classes`` are not in the YAML: the tokenizer
            and the label sets give them when the model is built).
        path: the training YAML.
        model_path: the model YAML named by ``model_config``, or None.
    """

    train: TrainConfig
    model: ModelConfig
    path: Path
    model_path: Path | None = None

    @property
    def pretraining(self) -> bool:
        """Whether the YAML trains a pretraining model (its model section has ``pretrain_conf``)."""
        return self.model.pretraining

    def resolved(self) -> dict[str, Any]:
        """The settings as ``config.yaml`` holds them (:func:`resolved_settings`)."""
        return resolved_settings(self.train, self.model)


def resolved_settings(train: TrainConfig, model: ModelConfig) -> dict[str, Any]:
    """The settings of a training run as ``config.yaml`` holds them: the loop's (``train``) at the top
    level, the model's sections (``model``, e.g. with the tokenizer's ``vocab_size``) beside them; plain YAML
    data."""
    return {**to_dict(train), **model.to_dict()}


def load_experiment_config(path: str | os.PathLike) -> ExperimentConfig:
    """Read a training YAML into an :class:`ExperimentConfig`.

    The model's sections can come from a model YAML named by ``model_config`` (a path relative to the
    training YAML, e.g. ``../model/avsr_synthgrid_cpu.yaml``); a section given in the training YAML itself is
    merged over its keys. ``path`` is a file or the name of a shipped training configuration
    (``"avsr_synthgrid_cpu"``: a file of ``avsr/conf/{train,pretrain,finetune}``; an existing file wins, see
    :func:`avsr.config.config_path`). A pretraining YAML (``pretrain_conf``) that takes a model YAML with
    ``decoder_conf``/``model_conf``/``decode_defaults`` (an ASR model's) leaves those out, with a log line.

    The model must be described: ``encoder_conf`` in the training YAML or in its ``model_config`` (an empty
    YAML, or one without a model section, would otherwise train the defaults of every setting, a
    159M-parameter model nobody asked for).

    Raises:
        ConfigError: an unknown key (named, with the file), a bad value (key and file named), a missing model
            YAML, an unknown name (the shipped names are listed), no model section (neither ``model_config``
            nor ``encoder_conf``; the file and the missing keys named).
    """
    path = config_path(path, TRAIN_KINDS)
    data = load_yaml(path)
    sections: dict[str, dict] = {}
    model_path = None
    if "model_config" in data:
        model_path = path.resolve().parent / str(data.pop("model_config"))
        base = load_yaml(model_path)
        check_keys(base, MODEL_SECTIONS, str(model_path))
        sections = {k: dict(v or {}) for k, v in base.items()}
    for key in MODEL_SECTIONS:
        if key in data:
            value = data.pop(key)
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{path}: {key}: expected a mapping, got {value!r}")
            sections[key] = {**sections.get(key, {}), **(value or {})}
    train = from_dict(TrainConfig, data, where=str(path))
    where = f"{path} (and its model_config {model_path})" if model_path is not None else str(path)
    if "encoder_conf" not in sections:
        raise ConfigError(
            f"{where}: no model section: encoder_conf is missing; name a model YAML with model_config "
            "(e.g. model_config: ../model/avsr_synthgrid_cpu.yaml) or give encoder_conf (and decoder_conf, "
            "model_conf or pretrain_conf); without it the default 159M-parameter model would be trained")
    if "pretrain_conf" in sections:
        unused = [k for k in ("decoder_conf", "model_conf", "decode_defaults") if k in sections]
        if unused:
            logger.info("pretraining: %s of %s not used", ", ".join(unused), where)
        sections = {k: v for k, v in sections.items() if k not in unused}
    model = ModelConfig.from_mapping(sections, where)
    return ExperimentConfig(train, model, path, model_path)
