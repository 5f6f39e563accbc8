"""An experiment directory set up from a training configuration: what ``avsr-train`` does before the loop.

:func:`setup_experiment` reads the training YAML into its typed tree
(:func:`avsr.train.config.load_experiment_config`), applies the command line's overrides, builds the model
-- an ``AVSRModel`` (ASR training, with a sentencepiece tokenizer) or an ``AVHubertPretrainModel``
(pretraining, when the YAML has ``pretrain_conf``, with cluster label sets) -- optionally starting its
encoder from a checkpoint (:func:`init_encoder`), writes the experiment directory (``config.yaml``,
``bpe.model``; :func:`write_experiment`), reads the data dirs into datasets (:func:`build_datasets`)
and returns the :class:`~avsr.train.trainer.Trainer`.

Resume policy (:func:`keep_promise`): re-running into an experiment whose ``config.yaml`` differs from the
new settings and that holds checkpoints is refused with the differing keys named, unless the change is
allowed; then it is logged, appended to ``config_changes.log`` and the old configuration kept as
``config.<N>.yaml``. The settings of :data:`FREE_ON_RESUME` (a longer schedule, the speed settings) may
change without that (logged). Distributed training (torchrun, DDP) is the trainer's; this module picks the
device only (:func:`training_device`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from avsr.config import ConfigError, UsageError, from_dict, parse_yaml
from avsr.data.datadir import read_datadir
from avsr.data.dataset import AVDataset, LabelSet
from avsr.data.lexicon import PhoneLexicon
from avsr.data.tokenizer import Tokenizer
from avsr.encoder import AVHubertEncoderConfig, EncoderRuntime
from avsr.fileio import remove_stale_tmp, write_text_atomic
from avsr.models.config import ModelConfig
from avsr.nn.precision import flush_denormal
from avsr.train.config import TrainConfig, load_experiment_config, resolved_settings
from avsr.train.trainer import Trainer, build_audio_augment, build_noise

__all__ = ["ExperimentOptions", "ModelSetup", "FREE_ON_RESUME", "OVERRIDES", "setup_experiment",
           "load_label_sets", "init_encoder", "build_model", "encoder_runtime", "keep_promise",
           "write_experiment", "build_datasets", "training_device"]

logger = logging.getLogger("avsr.train")

#: Settings a resumed run may change without ``allow_config_change``: a longer schedule, and the speed
#: settings, which change no result beyond float rounding.
FREE_ON_RESUME = frozenset({"max_epoch", "precision", "video_precision", "compile", "checkpoint_activations",
                            "cache_limit_mb", "flush_denormal"})
#: :class:`~avsr.train.config.TrainConfig` fields that :class:`ExperimentOptions` may override.
OVERRIDES = ("max_epoch", "precision", "video_precision", "compile", "checkpoint_activations")


@dataclass
class ExperimentOptions:
    """What to train, from where, into where (the options of ``avsr-train``).

    Attributes:
        config: training YAML (a path or a shipped configuration's name).
        train_data, valid_data: Kaldi-style data dirs.
        exp_dir: the experiment directory (created).
        bpemodel: sentencepiece model (ASR training; None for pretraining).
        phone_lexicon: a Kaldi ``lexicon.txt`` (:class:`avsr.data.lexicon.PhoneLexicon`): the phone targets of
            a model with ``model_conf.phone_ctc_weight > 0`` (ASR training; required there; for a model
            without a phone loss it is logged as not used).
        labels: pretraining: cluster label file names found in both data dirs, one per label set.
        init_encoder: checkpoint whose encoder starts the model's encoder (fine-tuning).
        train_noise: noise wav for training-time augmentation.
        ngpu: 0: CPU; >= 1: CUDA.
        allow_config_change: resume with settings other than ``config.yaml`` (see :func:`keep_promise`).
        max_epoch, precision, video_precision, compile, checkpoint_activations: overrides of the YAML's
            settings (None: the YAML's).
    """

    config: Path
    train_data: Path
    valid_data: Path
    exp_dir: Path
    bpemodel: Path | None = None
    phone_lexicon: Path | None = None
    labels: list[str] | None = None
    init_encoder: Path | None = None
    train_noise: str | None = None
    ngpu: int = 0
    allow_config_change: bool = False
    max_epoch: int | None = None
    precision: str | None = None
    video_precision: str | None = None
    compile: bool | None = None
    checkpoint_activations: bool | None = None


@dataclass
class ModelSetup:
    """A built model with what its training needs.

    Attributes:
        model: ``AVSRModel`` or ``AVHubertPretrainModel``; its ``config`` (a
            :class:`~avsr.models.config.ModelConfig`) goes into ``config.yaml`` and every checkpoint.
        tokenizer: the sentencepiece tokenizer (ASR training), None for pretraining.
        phone_lexicon: the phone targets of the phone CTC loss, or None.
        train_labels, valid_labels: the cluster label sets of pretraining (None for ASR training).
    """

    model: torch.nn.Module
    tokenizer: Tokenizer | None = None
    train_labels: list[LabelSet] | None = None
    valid_labels: list[LabelSet] | None = None
    phone_lexicon: PhoneLexicon | None = None


def setup_experiment(opts: ExperimentOptions) -> Trainer:
    """Build the model, write the experiment directory and return its trainer (see the module docstring).

    The trainer has not resumed yet: call ``trainer.resume()`` then ``trainer.run()``. ``flush_denormal``
    (default true) is applied before the model is built, so that every intra-op thread treats subnormal
    floats as zero (:func:`avsr.nn.precision.flush_denormal`); the torch seed is the config's ``seed``. The
    model's encoder is built with the run-time switches of the training configuration
    (:func:`encoder_runtime`: ``checkpoint_activations``, ``video_precision`` resolved for the training
    device, the modality dropout drawn by the data loader), which the trainer checks.

    Raises:
        ConfigError: a bad training YAML, a missing ``--bpemodel`` / ``--labels``, label sets of different
            rates, an ``--init-encoder`` checkpoint that does not fit, an utterance longer than
            ``batch_frames``.
        UsageError: the experiment holds checkpoints trained with other settings (:func:`keep_promise`).
        DataDirError, TokenizerError, LexiconError, FileNotFoundError: bad data dirs, a transcript with
            ``<unk>`` or a word the phone lexicon lacks, missing files (named).
        RuntimeError: ``ngpu > 0`` without CUDA.
    """
    experiment = load_experiment_config(opts.config)
    cfg = experiment.train
    for key in OVERRIDES:
        if getattr(opts, key) is not None:
            cfg = dataclasses.replace(cfg, **{key: getattr(opts, key)})  # checked as the YAML's values
    device = training_device(opts.ngpu)
    if cfg.flush_denormal:  # before any parallel op: the intra-op threads inherit the flag when created
        flush_denormal(True)
    torch.manual_seed(cfg.seed)
    runtime = encoder_runtime(cfg, experiment.model, device)  # draws nothing from torch's generators
    setup = build_model(opts, experiment.model, runtime=runtime)
    write_experiment(opts.exp_dir, cfg, setup, opts.bpemodel, opts.allow_config_change)
    train_set, valid_set = build_datasets(opts, cfg, setup)
    return Trainer(setup.model, setup.model.config.to_dict(), train_set, valid_set, cfg, opts.exp_dir,
                   device=device)


def load_label_sets(data_dir: Path, names: list[str]) -> list[LabelSet]:
    """The cluster label files ``data_dir/<name>`` (``.km``, with ``<name>.json`` metadata) as label sets.

    Raises:
        FileNotFoundError: a label file or its metadata is missing (named).
        ValueError: a malformed line (file and line named, by :func:`avsr.clustering.read_labels`).
    """
    from avsr.clustering import read_label_meta, read_labels

    sets = []
    for name in names:
        path = data_dir / name
        meta = read_label_meta(path)
        rate, k = float(meta["label_rate"]), int(meta["num_classes"])
        sets.append(LabelSet(str(path), read_labels(path), rate, k))
    return sets


def init_encoder(model: torch.nn.Module, path: Path) -> None:
    """Copy the encoder weights of a checkpoint into ``model.encoder`` (fine-tuning a pretrained encoder).

    Accepts avsr checkpoints (pretraining or ASR models, an encoder written by ``avsr-convert``) and official
    fairseq AV-HuBERT checkpoints (``av_hubert`` pretraining, fine-tuned ones), read safely and mapped by
    :func:`avsr.compat.read_checkpoint`.

    Raises:
        ConfigError: not a checkpoint with an AV-HuBERT encoder, or weights that do not fit this model's
            encoder (missing/unexpected keys or shapes named; e.g. another ``encoder_embed_dim``).
    """
    from avsr.compat import CheckpointError, load_state_strict, read_checkpoint

    try:
        enc = read_checkpoint(path).encoder_state
        load_state_strict(model.encoder, enc, str(path), "encoder of this model")
    except (CheckpointError, FileNotFoundError) as e:  # the messages name the file
        raise ConfigError(f"--init-encoder: {e}") from e
    logger.info("encoder initialised from %s (%d tensors)", path, len(enc))


def encoder_runtime(cfg: TrainConfig, config: ModelConfig, device: str | torch.device) -> EncoderRuntime:
    """The run-time switches (:class:`avsr.encoder.EncoderRuntime`) of the encoder a training of ``cfg``
    builds.

    ``checkpoint_activations`` is the training setting's; ``video_precision`` the training setting resolved
    for ``device`` (:meth:`TrainConfig.resolved_video_precision`: ``auto`` made ``bf16`` or ``fp32``, logged
    once; None: as the rest of the model), applied in training and validation alike; the modality dropout is
    drawn by the data loader (``modality_dropout_by_loader``) when the model's ``encoder_conf`` has
    ``modality_dropout > 0``: the training set :func:`build_datasets` builds loads both audio and video, so
    the loader can drop either (:class:`avsr.data.dataset.ModalityBatchSampler`). Draws nothing from torch's
    random generators.

    Args:
        cfg: the training settings.
        config: the model configuration (its ``encoder_conf``; None: the encoder's defaults).
        device: the training device (``"cpu"``, ``"cuda"``, ``"cuda:N"``).

    Raises:
        ValueError: an unknown ``video_precision`` (:func:`avsr.nn.precision.resolve_precision`).
    """
    encoder_conf = config.encoder_conf if config.encoder_conf is not None else AVHubertEncoderConfig()
    return EncoderRuntime(checkpoint_activations=cfg.checkpoint_activations,
                          video_precision=cfg.resolved_video_precision(torch.device(device)),
                          modality_dropout_by_loader=encoder_conf.modality_dropout > 0)


def build_model(opts: ExperimentOptions, config: ModelConfig, runtime: EncoderRuntime | None = None
                ) -> ModelSetup:
    """The model of a training YAML's model sections (``pretrain_conf`` present: pretraining).

    Pretraining reads the label sets ``opts.labels`` of both data dirs, which give ``num_classes`` and the
    label rate (100 Hz MFCC clusters, 25 Hz layer clusters). ASR training reads the tokenizer
    ``opts.bpemodel``, which gives ``vocab_size``. With ``opts.init_encoder`` the encoder starts from that
    checkpoint's. ``runtime``: the encoder's run-time switches (:func:`encoder_runtime`; None: the encoder's
    defaults, which :class:`~avsr.train.trainer.Trainer` refuses unless they are the training settings').

    Raises:
        ConfigError: no ``--labels`` for pretraining, label sets of different rates, no ``--bpemodel`` for
            ASR training, an ``--init-encoder`` checkpoint that does not fit.
        FileNotFoundError, TokenizerError, ValueError: missing or malformed tokenizer or label files.
    """
    if config.pretraining:
        setup = _pretrain_model(opts, config, runtime)
    else:
        from avsr.models.asr import AVSRModel

        if opts.bpemodel is None:
            raise ConfigError(f"{opts.config} is an ASR training config: --bpemodel is required")
        tokenizer = Tokenizer(opts.bpemodel)
        lexicon = None
        if config.model_conf.phone_ctc_weight > 0:
            if opts.phone_lexicon is None:
                raise ConfigError(f"{opts.config}: model_conf.phone_ctc_weight > 0 needs --phone-lexicon")
            lexicon = PhoneLexicon.from_file(opts.phone_lexicon)
            config = dataclasses.replace(config, model_conf=dataclasses.replace(
                config.model_conf, phone_vocab_size=lexicon.num_classes))
        elif opts.phone_lexicon is not None:  # a recipe passes its lexicon whatever the config
            logger.info("--phone-lexicon %s not used: %s has no phone loss (model_conf.phone_ctc_weight 0)",
                        opts.phone_lexicon, opts.config)
        model = AVSRModel.from_config(dataclasses.replace(config, vocab_size=tokenizer.vocab_size),
                                      str(opts.config), runtime=runtime)
        setup = ModelSetup(model, tokenizer, phone_lexicon=lexicon)
    if opts.init_encoder is not None:
        init_encoder(setup.model, opts.init_encoder)
    n_params = sum(p.numel() for p in setup.model.parameters())
    logger.info("model: %.2fM parameters", n_params / 1e6)
    return setup


def _pretrain_model(opts: ExperimentOptions, config: ModelConfig, runtime: EncoderRuntime | None = None
                    ) -> ModelSetup:
    """The ``AVHubertPretrainModel`` of :func:`build_model`, with its label sets."""
    from avsr.models.config import AVHubertPretrainConfig
    from avsr.models.pretrain import AVHubertPretrainModel

    if not opts.labels:
        raise ConfigError(f"{opts.config} has pretrain_conf (pretraining) but no --labels were given")
    train_labels = load_label_sets(opts.train_data, opts.labels)
    valid_labels = load_label_sets(opts.valid_data, opts.labels)
    num_classes = [s.num_classes for s in train_labels]
    rates = {s.label_rate for s in train_labels}
    if len(rates) != 1:
        raise ConfigError(f"--labels {opts.labels}: label sets differ in label rate {sorted(rates)}")
    # the label rate is the labels' own (100 Hz MFCC clusters, 25 Hz layer clusters)
    head = dataclasses.replace(config.pretrain_conf or AVHubertPretrainConfig(), label_rate=rates.pop())
    model = AVHubertPretrainModel.from_config(
        dataclasses.replace(config, pretrain_conf=head, num_classes=num_classes), str(opts.config),
        runtime=runtime)
    logger.info("pretraining: label sets %s, classes %s", opts.labels, num_classes)
    return ModelSetup(model, None, train_labels, valid_labels)


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _complete(settings: dict) -> dict:
    """``config.yaml``'s settings with every default filled in (through :class:`TrainConfig` and
    :class:`~avsr.models.config.ModelConfig`), so that a file written before a setting existed, or without
    the defaults, compares equal to the same settings written in full; as they are where they do not build
    (a setting since removed)."""
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    try:
        train = from_dict(TrainConfig, {k: v for k, v in settings.items() if k in train_keys})
        model = ModelConfig.from_mapping({k: v for k, v in settings.items() if k not in train_keys})
        model = model.for_pretraining() if model.pretraining else model.for_asr()
    except ConfigError:
        return settings
    return resolved_settings(train, model)


def keep_promise(exp_dir: Path, resolved: dict, allow_change: bool) -> None:
    """Refuse to resume an experiment trained with other settings (see the module docstring).

    Args:
        exp_dir: the experiment directory (``config.yaml``, ``checkpoint.pt``, ``epoch<N>.pt``).
        resolved: the new resolved configuration (as it would be written to ``config.yaml``).
        allow_change: resume anyway: the old ``config.yaml`` is kept as ``config.<N>.yaml`` and the change
            appended to ``config_changes.log``.

    Raises:
        UsageError: ``exp_dir`` holds checkpoints and a ``config.yaml`` that differs from ``resolved`` (the
            differing keys named), and ``allow_change`` is False.
    """
    path = exp_dir / "config.yaml"
    trained = (exp_dir / "checkpoint.pt").is_file() or any(exp_dir.glob("epoch*.pt"))
    if not (path.is_file() and trained):
        return
    old = _flatten(_complete(parse_yaml(path.read_text(encoding="utf-8"), str(path)) or {}))
    new = _flatten(_complete(yaml.safe_load(yaml.safe_dump(resolved))))  # as it would be written
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    free = [k for k in differ if k in FREE_ON_RESUME]
    if free:  # written to config.yaml by the caller, the change logged here
        logger.info("resuming %s with %s", exp_dir,
                    ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in free))
        differ = [k for k in differ if k not in FREE_ON_RESUME]
    if not differ:
        return
    changes = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ)
    if not allow_change:
        raise UsageError(f"{exp_dir} holds checkpoints trained with other settings ({changes}); train into "
                         "another --exp-dir, or pass --allow-config-change to resume with the new settings")
    n = 1
    while (exp_dir / f"config.{n}.yaml").exists():
        n += 1
    shutil.copyfile(path, exp_dir / f"config.{n}.yaml")
    with open(exp_dir / "config_changes.log", "a", encoding="utf-8") as log:
        log.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} resumed with {changes} "
                  f"(previous config: config.{n}.yaml)\n")
    logger.warning("resuming %s with changed settings: %s (previous config kept as config.%d.yaml)", exp_dir,
                   changes, n)


def write_experiment(exp_dir: Path, cfg: TrainConfig, setup: ModelSetup, bpemodel: Path | None,
                     allow_change: bool) -> dict:
    """Create ``exp_dir``, remove temporary files of interrupted writes, check the resume policy
    (:func:`keep_promise`) and write ``bpe.model`` (a copy of ``bpemodel``, ASR training) and ``config.yaml``.

    Returns:
        The resolved configuration written to ``config.yaml`` (loop settings and model configuration).

    Raises:
        UsageError: as :func:`keep_promise`.
        OSError: the directory or a file cannot be written.
    """
    exp_dir.mkdir(parents=True, exist_ok=True)
    for path in remove_stale_tmp(exp_dir):
        logger.info("removed %s, left by an interrupted write", path)
    resolved = resolved_settings(cfg, setup.model.config)
    keep_promise(exp_dir, resolved, allow_change)
    if setup.tokenizer is not None:
        shutil.copyfile(bpemodel, exp_dir / "bpe.model")
    if setup.phone_lexicon is not None:
        setup.phone_lexicon.write(exp_dir / "lexicon.txt")
    write_text_atomic(exp_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
    return resolved


def build_datasets(opts: ExperimentOptions, cfg: TrainConfig,
                   setup: ModelSetup) -> tuple[AVDataset, AVDataset]:
    """The training and validation datasets of the data dirs (transcripts needed unless pretraining).

    ASR training checks that every training transcript encodes without ``<unk>`` (a validation transcript
    that does not is logged: its loss counts ``<unk>``); the training set gets the noise
    (``opts.train_noise``) and audio augmentation of ``cfg``.

    Raises:
        DataDirError: a bad data dir (file and utterance named).
        TokenizerError: an empty transcript, or a training transcript the tokenizer cannot encode.
        ConfigError: an utterance longer than ``cfg.batch_frames`` (named), a bad augmentation setting.
    """
    pretrain = setup.tokenizer is None
    train_utts = read_datadir(opts.train_data, require_text=not pretrain)
    valid_utts = read_datadir(opts.valid_data, require_text=not pretrain)
    if setup.tokenizer is not None:  # every training target must be tokens the model can learn: no <unk>
        setup.tokenizer.check_texts({u.utt_id: u.text for u in train_utts}, str(opts.train_data / "text"))
        unknown = setup.tokenizer.check_texts({u.utt_id: u.text for u in valid_utts},
                                              str(opts.valid_data / "text"), strict=False)
        if unknown:  # validation text may hold characters the training text lacks: <unk> in its loss
            logger.warning("%s", unknown)
    if setup.phone_lexicon is not None:
        for data, utts in ((opts.train_data, train_utts), (opts.valid_data, valid_utts)):
            setup.phone_lexicon.check_texts({u.utt_id: u.text for u in utts}, str(data / "text"))
    train_set = AVDataset(
        train_utts,
        setup.tokenizer,
        train=True,
        noise=build_noise(opts.train_noise, cfg),
        seed=cfg.seed,
        label_sets=setup.train_labels or (),
        audio_augment=build_audio_augment(cfg),
        cache_limit_mb=cfg.cache_limit_mb,
        phone_lexicon=setup.phone_lexicon,
        # the model's clean audio-visual view needs the clean audio of audio-visual batches
        keep_clean_audio="audiovisual_clean" in getattr(getattr(setup.model, "conf", None), "av_batch_views",
                                                        ()),
    )
    valid_set = AVDataset(valid_utts, setup.tokenizer, train=False, label_sets=setup.valid_labels or (),
                          cache_limit_mb=cfg.cache_limit_mb, phone_lexicon=setup.phone_lexicon)
    for name, dataset in (("--train-data", train_set), ("--valid-data", valid_set)):
        longest = max(range(len(dataset)), key=dataset.num_frames, default=None)
        if longest is not None and dataset.num_frames(longest) > cfg.batch_frames:
            raise ConfigError(
                f"{opts.config}: batch_frames is {cfg.batch_frames}, but utterance "
                f"'{dataset.utts[longest].utt_id}' of {name} has {dataset.num_frames(longest)} frames; raise "
                "batch_frames or leave the utterance out of the data dir")
    return train_set, valid_set


def training_device(ngpu: int) -> str:
    """``"cuda"`` for ``ngpu > 0`` (several GPUs: one process each, through torchrun), else ``"cpu"``.

    Raises:
        RuntimeError: ``ngpu > 0`` but CUDA is not available.
    """
    device = "cuda" if ngpu > 0 else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    return device
