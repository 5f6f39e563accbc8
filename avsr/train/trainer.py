"""Training of avsr models (``AVSRModel``, ``AVHubertPretrainModel``): one CPU process, one GPU, or many
through torchrun.

The same loop runs everywhere: with ``WORLD_SIZE > 1`` in the environment (set by ``torchrun``) it joins the
process group and wraps the model in DistributedDataParallel; each rank reads its own share of the
length-bucketed batches. After every epoch the trainer writes, atomically, ``epoch<N>.pt`` (the model) and
``checkpoint.pt`` (model, optimiser, scheduler, epoch, step, RNG states); a new run in the same directory
resumes from ``checkpoint.pt`` with the same data order and learning-rate position.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from avsr import __version__
from avsr.checkpoint import epoch_checkpoints, load_checkpoint, save_atomic, written_by
from avsr.config import ConfigError
from avsr.data.dataset import (
    AudioAugment,
    AVDataset,
    BucketBatchSampler,
    EpochKeyedBatches,
    ModalityBatchSampler,
    NoiseConfig,
    collate,
)
from avsr.data.media import MediaError, read_wav
from avsr.encoder import AVHubertEncoder
from avsr.features import silent_edge_quartiles
from avsr.memory import keep_freed_memory
from avsr.nn.precision import (
    autocast_context,
    flush_denormal,
    native_bf16,
    resolve_precision,
)
from avsr.train.config import TrainConfig
from avsr.train.curves import TrainingCurves

logger = logging.getLogger("avsr.train")

#: batch entries passed to a model that does not name its own (``batch_keys``): AVSRModel's arguments.
ASR_BATCH_KEYS = ("audio", "video", "lengths", "ys_pad", "ys_lens")


def compile_model(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """``torch.compile`` the parts of an avsr model that carry the computation, in place; returns ``model``.

    Compiled (``nn.Module.compile``, so parameter names and state-dict keys stay the same): the encoder's
    video and audio front-ends and its transformer (:class:`avsr.encoder.AVHubertEncoder`), and the
    attention decoder when there is one. The glue between them (input checks, modality handling, fusion,
    masking, losses) stays eager: it differs between audio-only, video-only and audio-visual batches and
    between models (ASR, pretraining), while each compiled part sees one kind of input. Shapes: PyTorch's
    automatic dynamic shapes -- the first batch compiles for its shapes, the first batch of another size
    recompiles once with the sizes that changed (batch size, length) symbolic, and later batches reuse that
    code; sizes that never change (feature dims, 88x88 frames) stay static. So each part compiles about
    twice per mode (training, evaluation). ``backend`` is passed to ``torch.compile`` (``aot_eager`` traces
    the same graphs without generating code, as the tests do).
    """
    encoder = getattr(model, "encoder", None)
    parts = []
    if isinstance(encoder, AVHubertEncoder):
        parts += [encoder.feature_extractor_video, encoder.feature_extractor_audio, encoder.encoder]
    elif encoder is not None:
        parts.append(encoder)
    if getattr(model, "decoder", None) is not None:
        parts.append(model.decoder)
    if not parts:
        parts.append(model)
    for part in parts:
        part.compile(backend=backend)
    return model


def make_adamw(params, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with ``cfg.lr``, ``cfg.betas`` and ``cfg.weight_decay``, in its fused single-kernel form.

    The fused kernel (CPU and CUDA) does the same update as the per-tensor one in a few ms instead of
    ~13 ms per step for the SynthGRID CPU model (212 tensors), ~50 s of a default recipe run; its state dict
    is the same, so checkpoints resume either way. Falls back to the default implementation where fused is
    unavailable (RuntimeError from torch, e.g. for a device type without the kernel).
    """
    params = list(params)
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except RuntimeError:
        return torch.optim.AdamW(params, **kwargs)


def build_audio_augment(cfg: TrainConfig) -> AudioAugment | None:
    """The training-time audio feature augmentation of ``cfg`` (None when it has none). The values are
    checked by :class:`TrainConfig`'s fields; what is left is the augmentation's own combined check.

    Raises:
        ConfigError: settings that do not go together (:meth:`avsr.data.dataset.AudioAugment.check`).
    """
    pair = lambda v: tuple(v) if v is not None else None  # noqa: E731  ([low, high] lists, checked)
    aug = AudioAugment(pair(cfg.freq_warp), cfg.num_freq_mask, cfg.freq_mask_width,
                       tuple(cfg.speed_perturb or ()), av_mismatch_prob=cfg.av_mismatch_prob,
                       av_mismatch_noisy_only=cfg.av_mismatch_noisy_only,
                       num_time_mask=cfg.num_time_mask, time_mask_width=cfg.time_mask_width,
                       time_mask_av_only=cfg.time_mask_av_only,
                       edge_silence_frames=pair(cfg.edge_silence_frames),
                       edge_silence_keep_length=cfg.edge_silence_keep_length,
                       edge_silence_prob=cfg.edge_silence_prob, narrowband_prob=cfg.narrowband_prob,
                       narrowband_audio_only=cfg.narrowband_audio_only,
                       hard_onset_prob=cfg.hard_onset_prob, hard_onset_ms=pair(cfg.hard_onset_ms),
                       envelope_contrast=pair(cfg.envelope_contrast),
                       envelope_contrast_prob=cfg.envelope_contrast_prob,
                       untrusted_video_prob=cfg.untrusted_video_prob,
                       untrusted_video_kinds=tuple(cfg.untrusted_video_kinds))
    try:
        aug.check()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return aug if aug.active else None


def lr_lambda(step: int, warmup: int, total: int, final_scale: float) -> float:
    """Learning-rate multiplier: linear warm-up to 1 over ``warmup`` steps, then cosine decay to
    ``final_scale`` at step ``total``."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final_scale + (1 - final_scale) * 0.5 * (1 + math.cos(math.pi * progress))


def _accumulate(sums: dict[str, torch.Tensor], stats: dict) -> None:
    """``sums[k] += stats[k]`` for every statistic, kept as tensors (floats are turned into tensors)."""
    for k, v in stats.items():
        v = v.detach() if torch.is_tensor(v) else torch.tensor(float(v))
        sums[k] = sums[k] + v if k in sums else v.clone()


def _join_process_group(device: str) -> tuple[int, int, torch.device]:
    """``(world_size, rank, device)`` from torchrun's environment (:func:`_dist_info`); with several processes
    joins the process group (NCCL on CUDA, else gloo) if not yet done and takes the local rank's GPU."""
    world, rank, local = _dist_info()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda") and world > 1:
        device = f"cuda:{local}"
    return world, rank, torch.device(device)


def _dist_info() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return world, rank, local


def _data_stats(train_set: AVDataset, lengths: list[int], narrowband_prob: float) -> dict:
    """What inference needs to know of the training data (the Transcriber's warning and segmentation), saved
    in checkpoints: ``max_frames`` and ``num_utts`` of ``lengths`` (frames per utterance), ``narrowband_prob``
    and, with audio, ``edge_frames`` (:func:`_training_edges`)."""
    stats = {"max_frames": max(lengths, default=0), "num_utts": len(lengths),
             "narrowband_prob": narrowband_prob}
    edges = _training_edges(train_set)
    if edges is not None:  # the edges the Transcriber brings every input into (avsr.features.edge_shift)
        stats["edge_frames"] = [list(edges[0]), list(edges[1])]
    return stats


#: at most this many training utterances are read for the silent edges of ``data_stats``.
EDGE_SAMPLE = 1000


def _training_edges(train_set: AVDataset) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The middle half (first to third quartile) of the silent 40 ms frames at the start and at the end of the
    training audio (:func:`avsr.features.silent_edge_quartiles` over at most ``EDGE_SAMPLE`` utterances
    spread over the set), or None without audio. A file that cannot be read is left out here (the loader
    names it)."""
    if "audio" not in train_set.modalities or not train_set.utts:
        return None
    sample = train_set.utts[:: math.ceil(len(train_set.utts) / EDGE_SAMPLE)]

    def waves():
        for u in sample:
            try:
                yield read_wav(u.wav)
            except (MediaError, OSError, TypeError):
                continue

    t0 = time.time()
    edges = silent_edge_quartiles(waves())
    logger.info("training audio: silent edges %s frames (start, end; first to third quartile) over %d "
                "utterances, %.1f s", edges, len(sample), time.time() - t0)
    return edges


class Trainer:
    """Trains a model on a training and a validation dataset into ``exp_dir``.

    Args:
        model: a module whose ``forward(*[batch[k] for k in model.batch_keys]) -> (loss, stats dict of
            scalar tensors or floats)``; without ``batch_keys`` the arguments are AVSRModel's ``(audio,
            video, lengths, ys_pad, ys_lens)``. A pretraining model names ``("audio", "video", "lengths",
            "labels")``.
        model_config: the dict the model was built from (saved in checkpoints so they rebuild the model).
        train_set, valid_set: :class:`AVDataset` s with a tokenizer (ASR) or label sets (pretraining).
        cfg: loop settings.
        exp_dir: output directory (checkpoints, ``train.log``, ``train_log.jsonl``, ``tensorboard/`` and
            ``images/*.png``: :class:`avsr.train.curves.TrainingCurves`).
        device: ``cpu``, ``cuda`` or ``cuda:N``; with torchrun the local rank's GPU.

    The trainer assigns nothing to the model: an :class:`avsr.encoder.AVHubertEncoder` (``model.encoder``)
    comes built with the run-time switches of ``cfg`` (:class:`avsr.encoder.EncoderRuntime`, as
    :func:`avsr.train.experiment.encoder_runtime` makes them and
    :func:`avsr.train.experiment.setup_experiment` builds the model), and one whose
    ``checkpoint_activations`` or ``video_precision`` (resolved for ``device``, applied in validation too)
    differ from ``cfg``'s is refused -- a setting is not ignored.

    When the encoder was built for the loader to draw its modality dropout
    (``EncoderRuntime(modality_dropout_by_loader=True)``, ``modality_dropout > 0``), the length-bucketed
    batches are wrapped in the encoder's :class:`avsr.data.dataset.ModalityBatchSampler`
    (:meth:`avsr.encoder.AVHubertEncoder.modality_batch_sampler`: the encoder owns the rule and the
    probabilities), which makes AV-HuBERT's per-batch modality draw in the loader (same draw on every rank,
    reproducible on resumption); the training set must then load both modalities. An encoder with
    ``modality_dropout > 0`` built to draw itself does so in its forward pass, on plain length buckets. With
    ``audiovisual_clean`` among the model's ``av_batch_views`` the training set must keep the clean audio of
    audio-visual batches (``AVDataset(keep_clean_audio=True)``, as
    :func:`avsr.train.experiment.build_datasets` builds it).

    Raises:
        ConfigError: an encoder whose run-time switches disagree with ``cfg`` (the setting named), an encoder
            built for the loader's modality draw with a training set that does not load both modalities, and
            the option errors of :meth:`_check_batch_modality_options`.
    """

    def __init__(
        self,
        model,
        model_config: dict,
        train_set: AVDataset,
        valid_set: AVDataset,
        cfg: TrainConfig,
        exp_dir: str | os.PathLike,
        device: str = "cpu",
    ):
        self.cfg = cfg
        if cfg.flush_denormal:  # this thread; avsr-train sets it earlier, for every thread
            flush_denormal(True)
        self.exp_dir = Path(exp_dir)
        self.world, self.rank, self.device = _join_process_group(device)
        if keep_freed_memory():
            logger.debug("malloc keeps freed memory for reuse (mallopt)")
        self.model = model.to(self.device)
        self.model_config = model_config
        self.train_set, self.valid_set = train_set, valid_set
        lengths = [train_set.num_frames(i) for i in range(len(train_set))]
        self.data_stats = _data_stats(train_set, lengths, cfg.narrowband_prob)
        self.precision = cfg.resolved_precision(self.device)
        self.video_precision = cfg.resolved_video_precision(self.device)
        self._check_encoder_runtime(model)
        self.sampler = self._training_sampler(model, train_set, lengths)
        self._check_batch_modality_options(model, train_set)
        self.valid_sampler, self.loader, self.valid_loader = self._loaders(train_set, valid_set)
        self.ddp = (
            torch.nn.parallel.DistributedDataParallel(self.model, find_unused_parameters=True)
            if self.world > 1
            else self.model
        )
        self._build_optimizer()
        self.epoch = 0
        self.step = 0
        if cfg.compile:
            compile_model(self.model)

    def _training_sampler(self, model, train_set: AVDataset, lengths: list[int]
                          ) -> BucketBatchSampler | ModalityBatchSampler:
        """The training batches of this rank: length buckets of ``lengths`` (frames per utterance), wrapped in
        the encoder's :class:`ModalityBatchSampler` when the loader draws the modality dropout (see the class
        docstring).

        Raises:
            ConfigError: an encoder built for the loader's modality draw and a training set that does not load
                both audio and video.
        """
        cfg = self.cfg
        buckets = BucketBatchSampler(
            lengths,
            cfg.batch_frames,
            cfg.max_batch_size,
            shuffle=True,
            seed=cfg.seed,
            num_replicas=self.world,
            rank=self.rank,
        )
        encoder = getattr(model, "encoder", None)
        if (isinstance(encoder, AVHubertEncoder) and encoder.modality_dropout_by_loader
                and encoder.config.modality_dropout > 0):
            if set(train_set.modalities) != {"audio", "video"}:
                raise ConfigError(
                    f"the model's encoder was built for the data loader to draw its modality dropout "
                    f"(EncoderRuntime(modality_dropout_by_loader=True), modality_dropout "
                    f"{encoder.config.modality_dropout}), but the training set loads only "
                    f"{list(train_set.modalities)}: the loader cannot drop a modality it does not load, and "
                    f"the dropout would be lost (build the encoder to draw itself, or load both modalities)")
            # modality dropout drawn per batch by the loader: audio-only batches skip the video's crop and
            # get their own noise probability; the encoder does not draw again
            return encoder.modality_batch_sampler(buckets, seed=cfg.seed)
        return buckets

    def _check_encoder_runtime(self, model) -> None:
        """Refuse a model whose :class:`~avsr.encoder.AVHubertEncoder` was built with run-time switches other
        than the training settings' (:class:`avsr.encoder.EncoderRuntime`; the trainer assigns none).

        Raises:
            ConfigError: ``checkpoint_activations`` differs from ``cfg.checkpoint_activations``, or the
                encoder's ``video_precision`` (``auto`` resolved for the device) differs from
                ``cfg.resolved_video_precision(device)`` or applies in training only; the message names the
                setting and says how to build the model.
        """
        encoder = getattr(model, "encoder", None)
        if not isinstance(encoder, AVHubertEncoder):
            return
        cfg, how = self.cfg, ("build the model with the training settings' runtime "
                              "(avsr.train.experiment.encoder_runtime, as setup_experiment does)")
        if encoder.checkpoint_activations != cfg.checkpoint_activations:
            raise ConfigError(f"checkpoint_activations: the training config says "
                              f"{cfg.checkpoint_activations} but the model's encoder was built with "
                              f"{encoder.checkpoint_activations}; {how}")
        built, in_eval = encoder.video_precision, encoder.runtime.video_precision_in_eval
        if built == "auto":
            built = resolve_precision(built, self.device, "video_precision")
        if built != self.video_precision or (built is not None and not in_eval):
            where = "" if in_eval else " in training only"
            raise ConfigError(f"video_precision: the training config says {cfg.video_precision!r} "
                              f"({self.video_precision!r} on {self.device}) but the model's encoder was "
                              f"built with {encoder.video_precision!r}{where}; {how}")

    def _check_batch_modality_options(self, model, train_set: AVDataset) -> None:
        """Refuse the options that act on the batch modality when the loader draws none, and a model that asks
        for the clean audio-visual view of a training set that does not keep the clean audio.

        Raises:
            ConfigError: such an option without a :class:`ModalityBatchSampler`, ``audiovisual_clean``
                without ``keep_clean_audio``, or ``av_mismatch_noisy_only`` without training noise.
        """
        cfg = self.cfg
        views = getattr(getattr(model, "conf", None), "av_batch_views", ())
        # options that act on the batch modality the loader draws: refused, not ignored, without it
        needs_batch_modality = {
            "av_mismatch_prob > 0": (cfg.av_mismatch_prob > 0, "audio-visual"),
            "untrusted_video_prob > 0": (cfg.untrusted_video_prob > 0, "audio-visual"),
            "time_mask_av_only": (cfg.time_mask_av_only and cfg.num_time_mask > 0 and cfg.time_mask_width > 0,
                                  "audio-visual"),
            "narrowband_audio_only": (cfg.narrowband_audio_only and cfg.narrowband_prob > 0, "audio-only"),
            "model_conf.av_batch_views audiovisual_clean": ("audiovisual_clean" in views, "audio-visual"),
        }
        if not isinstance(self.sampler, ModalityBatchSampler):
            for name, (used, marked) in needs_batch_modality.items():
                if used:
                    raise ConfigError(f"{name} needs modality dropout drawn by the loader (an encoder with "
                                      f"modality_dropout > 0 built with EncoderRuntime("
                                      f"modality_dropout_by_loader=True), and a training set with audio and "
                                      f"video): no batch is marked {marked} otherwise")
        if "audiovisual_clean" in views and not train_set.keep_clean_audio:
            raise ConfigError("model_conf.av_batch_views audiovisual_clean needs a training set that keeps "
                              "the clean audio of audio-visual batches (AVDataset(keep_clean_audio=True))")
        if cfg.av_mismatch_prob > 0 and cfg.av_mismatch_noisy_only and train_set.noise is None:
            raise ConfigError("av_mismatch_noisy_only needs training noise (--train-noise, noise_prob > 0)")

    def _loaders(self, train_set: AVDataset, valid_set: AVDataset
                 ) -> tuple[BucketBatchSampler, torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
        """``(valid_sampler, loader, valid_loader)``: the validation batches (length buckets, fixed order) and
        the DataLoaders of both sets (training keys carry the epoch, :class:`EpochKeyedBatches`)."""
        cfg = self.cfg
        vlen = [valid_set.num_frames(i) for i in range(len(valid_set))]
        valid_sampler = BucketBatchSampler(vlen, cfg.batch_frames, cfg.max_batch_size, shuffle=False)
        loader = torch.utils.data.DataLoader(
            train_set,
            batch_sampler=EpochKeyedBatches(self.sampler),  # the epoch reaches the workers' dataset copies
            collate_fn=collate,
            num_workers=cfg.num_workers,
            persistent_workers=cfg.num_workers > 0,
            pin_memory=self.device.type == "cuda",  # asynchronous host-to-GPU copies (_to)
        )
        valid_loader = torch.utils.data.DataLoader(
            valid_set, batch_sampler=valid_sampler, collate_fn=collate
        )
        return valid_sampler, loader, valid_loader

    def _build_optimizer(self) -> None:
        """Set ``optimizer`` (AdamW over the model's parameters, :func:`make_adamw`), ``total_steps`` (the
        optimiser steps of the run) and ``scheduler`` (warm-up + cosine, :func:`lr_lambda`, reading
        ``total_steps``)."""
        cfg = self.cfg
        self.optimizer = make_adamw(self.model.parameters(), cfg)
        self.total_steps = max(1, cfg.max_epoch * len(self.sampler) // cfg.accum_grad)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, cfg.warmup_steps, self.total_steps, cfg.final_lr_scale)
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def resume(self) -> bool:
        """Load ``exp_dir/checkpoint.pt`` if present; returns whether a run was resumed."""
        path = self.exp_dir / "checkpoint.pt"
        if not path.is_file():
            return False
        state = load_checkpoint(path, map_location=self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._apply_optimizer_settings()
        self.epoch, self.step = state["epoch"], state["step"]
        torch.set_rng_state(state["rng_cpu"])
        logger.info("resumed from %s at epoch %d, step %d", path, self.epoch, self.step)
        if written_by(state) != __version__:  # None: written before avsr recorded its version
            logger.info("%s was written by avsr %s; this is avsr %s", path,
                        written_by(state) or "(version not recorded)", __version__)
        return True

    def _apply_optimizer_settings(self) -> None:
        """After loading optimizer/scheduler state: the configuration's ``lr``, ``betas`` and ``weight_decay``
        win over the saved ones (the saved state holds the values of the run that wrote it, so a learning rate
        changed with ``--allow-config-change`` would otherwise be ignored silently); the schedule's position
        (step) is kept: the scheduler is made again at that position from the new ``initial_lr`` (its public
        constructor sets every group's ``lr`` and :meth:`get_last_lr`)."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.cfg.lr
            group["betas"] = tuple(self.cfg.betas)
            group["weight_decay"] = self.cfg.weight_decay
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, self.scheduler.lr_lambdas, last_epoch=self.scheduler.last_epoch - 1)

    def _to(self, batch: dict) -> dict:
        return {
            k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
        }

    def _forward(self, batch: dict, model) -> tuple[torch.Tensor, dict]:
        keys = getattr(self.model, "batch_keys", ASR_BATCH_KEYS)
        with autocast_context(self.device, self.precision):
            return model(*[batch[k] for k in keys])

    def _set_encoder_frozen(self) -> None:
        """Freeze the encoder during the first ``freeze_finetune_updates`` optimiser steps."""
        encoder = getattr(self.model, "encoder", None)
        if self.cfg.freeze_finetune_updates > 0 and encoder is not None:
            encoder.requires_grad_(self.step >= self.cfg.freeze_finetune_updates)

    def train_epoch(self) -> dict:
        """One pass over the training data; returns the mean of the batch statistics (floats).

        The statistics stay tensors on the device during the epoch (no host synchronisation per batch):
        they are read once per ``log_interval`` optimiser steps (log line, progress bar) and at the end.
        The loss of every batch is checked for being finite at the same points: a non-finite loss raises
        :class:`FloatingPointError` naming the first such batch (its step and utterances); the run stops
        there, before any checkpoint of that epoch is written.
        """
        self.model.train()
        self.sampler.set_epoch(self.epoch)
        self.train_set.set_epoch(self.epoch)
        sums: dict[str, torch.Tensor] = {}
        n = 0
        pending: list[tuple[torch.Tensor, int, list[str]]] = []  # (loss is finite, step, utt ids), unchecked
        bar = tqdm(
            self.loader,
            desc=f"epoch {self.epoch + 1}/{self.cfg.max_epoch}",
            disable=not self.is_main,
            dynamic_ncols=True,
            mininterval=2.0,
        )
        self.optimizer.zero_grad(set_to_none=True)
        for i, batch in enumerate(bar):
            self._set_encoder_frozen()
            batch = self._to(batch)
            loss, stats = self._forward(batch, self.ddp)
            pending.append((torch.isfinite(loss.detach()), self.step, batch["utt_ids"][:4]))
            (loss / self.cfg.accum_grad).backward()
            logged = False
            if (i + 1) % self.cfg.accum_grad == 0:
                if self.cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                logged = self.step % self.cfg.log_interval == 0
            _accumulate(sums, stats)
            n += 1
            if logged:
                self._check_finite(pending)
                values = {k: float(v) for k, v in stats.items()}
                if self.is_main:
                    logger.info("epoch %d step %d lr %.2e %s", self.epoch + 1, self.step,
                                self.scheduler.get_last_lr()[0],
                                " ".join(f"{k} {v:.3f}" for k, v in values.items()))
                acc = values.get("acc", values.get("acc_masked", float("nan")))
                bar.set_postfix(loss=f"{values['loss']:.3f}", acc=f"{acc:.3f}", refresh=False)
        self._check_finite(pending)
        return {k: float(v) / max(1, n) for k, v in sums.items()}

    def _check_finite(self, pending: list[tuple[torch.Tensor, int, list[str]]]) -> None:
        """Raise FloatingPointError naming the first pending batch whose loss is not finite; else clear
        ``pending``."""
        if pending and not bool(torch.stack([f for f, _, _ in pending]).all()):
            _, step, utts = next(p for p in pending if not bool(p[0]))
            raise FloatingPointError(
                f"non-finite loss at epoch {self.epoch + 1}, step {step}: utterances {utts}..."
            )
        pending.clear()

    @torch.no_grad()
    def validate(self) -> dict:
        """Teacher-forced loss and token accuracy on the validation set (audio-visual input)."""
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        n = 0
        for batch in self.valid_loader:
            _, stats = self._forward(self._to(batch), self.model)
            _accumulate(sums, stats)
            n += 1
        return {k: float(v) / max(1, n) for k, v in sums.items()}

    def should_validate(self, epoch: int) -> bool:
        """Whether to validate after (1-based) ``epoch``: see ``TrainConfig.valid_interval``."""
        n = self.cfg.valid_interval
        return epoch > self.cfg.max_epoch - self.cfg.keep_nbest or (n > 0 and epoch % n == 0)

    def precision_record(self) -> dict:
        """What the checkpoint records of the numeric precision: the settings as given, what they became on
        this device, and why (:func:`avsr.nn.precision.native_bf16`)."""
        return {"precision": self.cfg.precision, "video_precision": self.cfg.video_precision,
                "resolved": self.precision, "resolved_video": self.video_precision or self.precision,
                "device": str(self.device), "native_bf16": native_bf16(self.device)[1]}

    def save(self, valid: dict) -> None:
        """Write ``epoch<N>.pt`` and ``checkpoint.pt`` atomically (each records ``avsr_version``) and prune
        old epoch checkpoints."""
        if not self.is_main:
            return
        model_state = self.model.state_dict()
        meta = {"model_config": self.model_config, "epoch": self.epoch, "step": self.step, "valid": valid,
                "data_stats": self.data_stats, "precision": self.precision_record(),
                "avsr_version": __version__}
        save_atomic({"model": model_state, **meta}, self.exp_dir / f"epoch{self.epoch}.pt")
        save_atomic(
            {
                "model": model_state,
                **meta,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng_cpu": torch.get_rng_state(),
            },
            self.exp_dir / "checkpoint.pt",
        )
        for _, p in epoch_checkpoints(self.exp_dir)[: -self.cfg.keep_nbest]:
            p.unlink()

    def run(self) -> None:
        """Train from the current epoch to ``max_epoch``, validating and checkpointing after each epoch."""
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.exp_dir / "train_log.jsonl"
        if self.epoch >= self.cfg.max_epoch:
            logger.info("training already finished (%d epochs)", self.epoch)
            return
        curves = TrainingCurves(self.exp_dir)  # tensorboard/ and images/*.png, redrawn after every epoch
        while self.epoch < self.cfg.max_epoch:
            t0 = time.time()
            train_stats = self.train_epoch()
            valid_stats = self.validate() if self.should_validate(self.epoch + 1) else {}
            self.epoch += 1
            self.save(valid_stats)
            if self.is_main:
                rec = {
                    "epoch": self.epoch,
                    "step": self.step,
                    "time_s": round(time.time() - t0, 1),
                    "lr": self.scheduler.get_last_lr()[0],
                    "train": {k: round(v, 4) for k, v in train_stats.items()},
                    "valid": {k: round(v, 4) for k, v in valid_stats.items()},
                }
                with open(log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                curves.log_epoch(rec)
                logger.info(
                    "epoch %d done in %.1f s: train %s | valid %s",
                    self.epoch,
                    rec["time_s"],
                    rec["train"],
                    rec["valid"],
                )


def build_noise(path: str | None, cfg: TrainConfig) -> NoiseConfig | None:
    """The training-time noise augmentation, or None when no file is given or no utterance would get noise.

    Raises:
        ConfigError: noise asked for (``noise_prob`` or ``noise_prob_audio_only`` > 0) but no noise file
            given.
    """
    from avsr.data.noise import NoiseSource

    if cfg.noise_prob <= 0 and not cfg.noise_prob_audio_only:
        return None
    if not path:
        raise ConfigError("noise_prob or noise_prob_audio_only > 0 needs a noise file (--train-noise)")
    return NoiseConfig(NoiseSource(path), prob=cfg.noise_prob, snr_db=list(cfg.noise_snr_db), fixed=False,
                       prob_audio_only=cfg.noise_prob_audio_only)
