"""Trainer: learning-rate schedule, checkpoints, averaging, and exact resumption after an interruption."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from avsr.checkpoint import average_state_dicts, epoch_checkpoints, load_checkpoint, save_atomic
from avsr.compat import CheckpointError
from avsr.config import ConfigError
from avsr.data.dataset import AVDataset, ModalityBatchSampler, NoiseConfig, collate
from avsr.data.media import read_wav, write_wav
from avsr.data.noise import NoiseSource
from avsr.data.tokenizer import Tokenizer, train_sentencepiece
from avsr.encoder import AVHubertEncoder, EncoderRuntime
from avsr.models.asr import AVSRModel
from avsr.models.config import ModelConfig
from avsr.nn.precision import native_bf16, resolve_precision
from avsr.train.config import load_experiment_config
from avsr.train.experiment import encoder_runtime
from avsr.train.trainer import (
    TrainConfig,
    Trainer,
    build_audio_augment,
    build_noise,
    lr_lambda,
)
from tests.test_data import WORDS, make_utt

MODEL = {
    "encoder_conf": dict(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32,
                         encoder_attention_heads=2, conv_pos=4, conv_pos_groups=2, resnet_widths=[2, 2, 4, 4],
                         modality_dropout=0.5, audio_dropout=0.5),
    "decoder_conf": dict(decoder_layers=1, decoder_embed_dim=16, decoder_ffn_embed_dim=32,
                         decoder_attention_heads=2),
    "model_conf": dict(ctc_weight=0.3),
}

#: the model section every training YAML needs (load_experiment_config refuses one without it)
ENCODER = "encoder_conf: {encoder_layers: 1}\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 6)) for _ in range(8)]
    tok = Tokenizer(train_sentencepiece(texts * 20, root / "bpe", vocab_size=24))
    utts = [make_utt(root, f"s1_{i}", frames=6 + i, text=t) for i, t in enumerate(texts)]
    return tok, utts


def training_model(config: dict, cfg: TrainConfig) -> AVSRModel:
    """The model of ``config`` with the encoder's run-time switches of ``cfg`` on the CPU, as
    ``setup_experiment`` builds it (the trainer refuses an encoder built otherwise)."""
    runtime = encoder_runtime(cfg, ModelConfig.from_mapping(config), "cpu")
    return AVSRModel.from_config(config, runtime=runtime)


def make_trainer(tok, utts, exp_dir, max_epoch, **settings):
    cfg = TrainConfig(max_epoch=max_epoch, batch_frames=40, warmup_steps=2, lr=1e-3, log_interval=1,
                      **settings)
    torch.manual_seed(0)
    config = {"vocab_size": tok.vocab_size, **MODEL}
    model = training_model(config, cfg)
    return Trainer(model, config, AVDataset(utts, tok, train=True), AVDataset(utts[:2], tok), cfg, exp_dir)


def test_resumed_training_equals_uninterrupted_training(setup, tmp_path):
    tok, utts = setup
    straight = make_trainer(tok, utts, tmp_path / "a", max_epoch=2)
    straight.run()
    first = make_trainer(tok, utts, tmp_path / "b", max_epoch=2)
    first.cfg.max_epoch = 1  # "killed" after one epoch
    first.run()
    resumed = make_trainer(tok, utts, tmp_path / "b", max_epoch=2)
    assert resumed.resume() and resumed.epoch == 1 and resumed.step == first.step
    resumed.run()
    assert resumed.step == straight.step
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
    assert [n for n, _ in epoch_checkpoints(tmp_path / "b")] == [1, 2]
    ckpt = load_checkpoint(tmp_path / "b" / "epoch2.pt")
    assert ckpt["model_config"]["vocab_size"] == tok.vocab_size and "acc" in ckpt["valid"]
    assert len((tmp_path / "b" / "train_log.jsonl").read_text().splitlines()) == 2


def test_the_checkpoint_records_the_middle_half_of_the_silent_edges_of_the_training_audio(setup, tmp_path):
    tok, utts = setup
    edged = []
    for i, u in enumerate(utts[:5]):  # (start, end) silent frames: (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)
        speech = read_wav(u.wav)[: 640 * (u.num_frames - 2 * i - 1)]
        wav = torch.cat([torch.zeros(640 * (i + 1)), speech, torch.zeros(640 * i)])
        write_wav(tmp_path / f"e{i}.wav", wav)
        edged.append(dataclasses.replace(u, wav=str(tmp_path / f"e{i}.wav")))
    trainer = make_trainer(tok, edged + utts[5:], tmp_path / "exp", max_epoch=1)  # the rest: no silence
    assert trainer.data_stats["edge_frames"] == [[2, 4], [1, 3]]  # first and third quartiles
    # a video-only training set: an encoder that draws its modality dropout itself (the loader cannot)
    runtime = dataclasses.replace(trainer.model.encoder.runtime, modality_dropout_by_loader=False)
    model = AVSRModel.from_config(trainer.model_config, runtime=runtime)
    video_only = Trainer(model, trainer.model_config, AVDataset(utts, tok, modalities=("video",)),
                         AVDataset(utts[:2], tok, modalities=("video",)), trainer.cfg, tmp_path / "v")
    assert "edge_frames" not in video_only.data_stats


def test_resume_takes_the_learning_rate_of_the_config_and_checkpoints_record_the_data(setup, tmp_path):
    tok, utts = setup
    first = make_trainer(tok, utts, tmp_path, max_epoch=1)
    first.run()
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["data_stats"] == {"max_frames": max(u.num_frames for u in utts), "num_utts": len(utts),
                                  "narrowband_prob": 0.0}
    # the precision as set and as resolved on this machine, with the reason
    reason = native_bf16("cpu")[1]
    resolved = resolve_precision(first.cfg.precision, "cpu")
    cfg = first.cfg
    assert ckpt["precision"] == {"precision": cfg.precision, "video_precision": cfg.video_precision,
                                 "resolved": resolved, "resolved_video": first.video_precision or resolved,
                                 "device": "cpu", "native_bf16": reason}
    resumed = make_trainer(tok, utts, tmp_path, max_epoch=2)
    resumed.cfg.lr, resumed.cfg.weight_decay = 4e-3, 0.05  # resumed with --allow-config-change
    assert resumed.resume()
    factor = lr_lambda(resumed.step, 2, resumed.total_steps, resumed.cfg.final_lr_scale)
    for group in resumed.optimizer.param_groups:
        assert group["initial_lr"] == 4e-3 and group["weight_decay"] == 0.05
        assert group["lr"] == pytest.approx(4e-3 * factor)
    assert resumed.scheduler.get_last_lr() == [pytest.approx(4e-3 * factor)] * len(
        resumed.optimizer.param_groups)


def test_checkpoint_average_and_truncated_file(tmp_path):
    save_atomic({"model": {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(1)}}, tmp_path / "epoch1.pt")
    save_atomic({"model": {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(2)}}, tmp_path / "epoch2.pt")
    avg = average_state_dicts([tmp_path / "epoch1.pt", tmp_path / "epoch2.pt"])
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0])) and int(avg["n"]) == 2
    data = (tmp_path / "epoch2.pt").read_bytes()
    (tmp_path / "bad.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"bad\.pt: truncated or not a torch checkpoint"):
        load_checkpoint(tmp_path / "bad.pt")
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left behind


def test_lr_schedule_warms_up_then_decays():
    values = [lr_lambda(s, warmup=10, total=100, final_scale=0.1) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[10:], values[11:]))
    assert lr_lambda(100, 10, 100, 0.1) == pytest.approx(0.1)


def test_train_config_takes_the_model_from_a_model_yaml(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train").mkdir()
    (tmp_path / "model" / "m.yaml").write_text("encoder_conf: {encoder_layers: 2, encoder_embed_dim: 48}\n"
                                               "model_conf: {ctc_weight: 0.5}\n")
    (tmp_path / "train" / "t.yaml").write_text("model_config: ../model/m.yaml\nmax_epoch: 3\n"
                                               "encoder_conf: {encoder_layers: 1}\n")
    experiment = load_experiment_config(tmp_path / "train" / "t.yaml")
    assert experiment.train.max_epoch == 3
    model = experiment.model  # the training YAML's encoder_conf keys over the model YAML's
    assert (model.encoder_conf.encoder_layers, model.encoder_conf.encoder_embed_dim) == (1, 48)
    assert model.model_conf.ctc_weight == 0.5 and model.decoder_conf is None
    (tmp_path / "model" / "m.yaml").write_text("encoder_cfg: {}\n")
    with pytest.raises(ConfigError, match=r"m\.yaml.*'encoder_cfg'"):
        load_experiment_config(tmp_path / "train" / "t.yaml")


def test_train_config_unknown_key_is_named(tmp_path):
    (tmp_path / "t.yaml").write_text("max_epochs: 3\nencoder_conf: {encoder_layers: 1}\n")
    with pytest.raises(ConfigError, match=r"t\.yaml.*'max_epochs'"):
        load_experiment_config(tmp_path / "t.yaml")
    (tmp_path / "m.yaml").write_text("max_epoch: 3\nencoder_conf: {encoder_layer: 1}\n")
    with pytest.raises(ConfigError, match=r"m\.yaml: encoder_conf: unknown config key 'encoder_layer'"):
        load_experiment_config(tmp_path / "m.yaml")  # refused when read, not when built


def test_audio_augment_settings_from_the_train_config(tmp_path):
    (tmp_path / "t.yaml").write_text(
        "freq_warp: [0.9, 1.1]\nnum_freq_mask: 2\nfreq_mask_width: 4\nspeed_perturb: [0.9, 1.0, 1.1]\n"
        "envelope_contrast: [0.7, 1.4]\nenvelope_contrast_prob: 0.5\n" + ENCODER
    )
    cfg = load_experiment_config(tmp_path / "t.yaml").train
    aug = build_audio_augment(cfg)
    assert aug.freq_warp == (0.9, 1.1) and (aug.num_freq_mask, aug.freq_mask_width) == (2, 4)
    assert aug.speed_factors == (0.9, 1.0, 1.1)
    assert aug.envelope_contrast == (0.7, 1.4) and aug.envelope_contrast_prob == 0.5
    assert build_audio_augment(TrainConfig()) is None  # off by default
    assert build_audio_augment(TrainConfig(speed_perturb=[1.0])) is None  # only 1.0: nothing changes
    for bad, match in (("freq_warp: [0.9]", "freq_warp"), ("freq_warp: [1.1, 0.9]", "freq_warp"),
                       ("num_freq_mask: -1", "num_freq_mask"),
                       ("speed_perturb: [0.9, -1.0]", "speed_perturb"),
                       ("envelope_contrast: [1.4, 0.7]", "envelope_contrast"),
                       ("envelope_contrast: [0.0, 1.2]", "envelope_contrast"),
                       ("envelope_contrast_prob: 2", "envelope_contrast_prob")):
        (tmp_path / "b.yaml").write_text(bad + "\n" + ENCODER)
        with pytest.raises(ConfigError, match=match):
            build_audio_augment(load_experiment_config(tmp_path / "b.yaml").train)


def test_validation_every_interval_and_in_the_last_kept_epochs(setup, tmp_path):
    tok, utts = setup
    trainer = make_trainer(tok, utts, tmp_path, max_epoch=5)
    trainer.cfg.valid_interval, trainer.cfg.keep_nbest = 2, 2
    assert [e for e in range(1, 6) if trainer.should_validate(e)] == [2, 4, 5]
    trainer.cfg.valid_interval = 0
    assert [e for e in range(1, 6) if trainer.should_validate(e)] == [4, 5]
    trainer.run()
    valid = [load_checkpoint(p)["valid"] for _, p in epoch_checkpoints(tmp_path)]
    assert len(valid) == 2 and all("acc" in v for v in valid)  # the kept epochs 4 and 5
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [bool(r["valid"]) for r in log] == [False, False, False, True, True]


def test_modality_dropout_is_drawn_by_the_loader_and_not_again_by_the_encoder(setup, tmp_path):
    tok, utts = setup
    trainer = make_trainer(tok, utts, tmp_path, max_epoch=1)
    encoder = trainer.model.encoder
    assert isinstance(trainer.sampler, ModalityBatchSampler) and encoder.modality_dropout_by_loader
    # one rule: the loader's draws are the encoder's (same probabilities, same function)
    assert (trainer.sampler.modality_dropout, trainer.sampler.audio_dropout) == (
        encoder.config.modality_dropout, encoder.config.audio_dropout)
    for epoch in range(3):
        trainer.sampler.set_epoch(epoch)
        drawn = trainer.sampler.modalities(len(trainer.sampler))
        got = ["audiovisual" if b["audio"] is not None and b["video"] is not None
               else "audio" if b["audio"] is not None else "video" for b in trainer.loader]
        assert got == drawn
    # an audio-visual batch from the loader reaches both front-ends even when the encoder would drop one
    always = dataclasses.replace(encoder.config, modality_dropout=1.0, audio_dropout=1.0)  # audio dropped
    batch = collate([trainer.train_set[(i, "audiovisual")] for i in range(2)])
    for by_loader, audio_grad in ((True, True), (False, False)):  # False: the encoder's own draw
        enc = AVHubertEncoder(always, runtime=EncoderRuntime(modality_dropout_by_loader=by_loader)).train()
        enc.load_state_dict(encoder.state_dict())
        hidden, _, _ = enc({"audio": batch["audio"], "video": batch["video"]}, batch["lengths"])
        hidden.sum().backward()
        assert (enc.feature_extractor_audio.proj.weight.grad is not None) == audio_grad
    # an encoder built to draw itself: no sampler for the loader (it would draw twice), the encoder unchanged
    with pytest.raises(ValueError, match=r"draws its modality dropout itself.*by_loader=True"):
        enc.modality_batch_sampler(trainer.sampler.batch_sampler)
    assert not enc.modality_dropout_by_loader and enc.runtime == EncoderRuntime()
    nothing = AVHubertEncoder(dataclasses.replace(always, modality_dropout=0.0),
                              runtime=EncoderRuntime(modality_dropout_by_loader=True))
    with pytest.raises(ValueError, match="modality_dropout is 0"):
        nothing.modality_batch_sampler(trainer.sampler.batch_sampler)
    with pytest.raises(AttributeError):
        encoder.modality_dropout_by_loader = False


def test_the_encoder_draws_its_modality_dropout_unless_built_for_the_loader(setup, tmp_path):
    """A model whose encoder draws itself trains on plain length buckets (its forward draws); one built for
    the loader's draw needs a training set that loads both modalities: refused otherwise, not ignored."""
    tok, utts = setup
    cfg = TrainConfig(max_epoch=1, batch_frames=40, warmup_steps=2, log_interval=1)
    config = {"vocab_size": tok.vocab_size, **MODEL}
    runtime = encoder_runtime(cfg, ModelConfig.from_mapping(config), "cpu")
    assert runtime.modality_dropout_by_loader  # modality_dropout 0.5
    itself = dataclasses.replace(runtime, modality_dropout_by_loader=False)
    own = AVSRModel.from_config(config, runtime=itself)
    trainer = Trainer(own, config, AVDataset(utts, tok, train=True), AVDataset(utts[:2], tok), cfg,
                      tmp_path / "own")
    assert not isinstance(trainer.sampler, ModalityBatchSampler)
    assert not own.encoder.modality_dropout_by_loader
    for modalities in (("audio",), ("video",)):
        with pytest.raises(ConfigError, match=rf"loads only \['{modalities[0]}'\].*cannot drop a modality"):
            Trainer(AVSRModel.from_config(config, runtime=runtime), config,
                    AVDataset(utts, tok, train=True, modalities=modalities),
                    AVDataset(utts[:2], tok, modalities=modalities), cfg, tmp_path / modalities[0])


def test_av_mismatch_prob_from_the_train_config_needs_loader_drawn_modality_dropout(setup, tmp_path):
    tok, utts = setup
    (tmp_path / "t.yaml").write_text("av_mismatch_prob: 0.2\n" + ENCODER)
    cfg = load_experiment_config(tmp_path / "t.yaml").train
    assert build_audio_augment(cfg).av_mismatch_prob == 0.2
    assert not build_audio_augment(cfg).av_mismatch_noisy_only
    (tmp_path / "b.yaml").write_text("av_mismatch_prob: 1.2\n")
    with pytest.raises(ConfigError, match="av_mismatch_prob"):
        load_experiment_config(tmp_path / "b.yaml")
    trainer = make_trainer(tok, utts, tmp_path / "ok", max_epoch=1, av_mismatch_prob=0.2)
    assert isinstance(trainer.sampler, ModalityBatchSampler)
    with pytest.raises(ConfigError, match="av_mismatch_noisy_only needs training noise"):
        make_trainer(tok, utts, tmp_path / "quiet", max_epoch=1, av_mismatch_prob=0.2,
                     av_mismatch_noisy_only=True)
    MODEL["encoder_conf"]["modality_dropout"] = 0.0
    try:  # no batch would be marked audio-visual: refused, not ignored
        with pytest.raises(ConfigError, match="av_mismatch_prob.*modality dropout"):
            make_trainer(tok, utts, tmp_path / "bad", max_epoch=1, av_mismatch_prob=0.2)
    finally:
        MODEL["encoder_conf"]["modality_dropout"] = 0.5


def test_time_masks_from_the_train_config_and_av_only_needs_loader_drawn_modality_dropout(setup, tmp_path):
    tok, utts = setup
    (tmp_path / "t.yaml").write_text("num_time_mask: 2\ntime_mask_width: 3\ntime_mask_av_only: true\n"
                                     + ENCODER)
    aug = build_audio_augment(load_experiment_config(tmp_path / "t.yaml").train)
    assert (aug.num_time_mask, aug.time_mask_width, aug.time_mask_av_only) == (2, 3, True)
    assert build_audio_augment(TrainConfig(num_time_mask=2)) is None  # width 0: nothing changes
    for bad, match in (("num_time_mask: -1", "num_time_mask"), ("time_mask_width: -2", "time_mask_width"),
                       ("time_mask_av_only: 3", "time_mask_av_only")):
        (tmp_path / "b.yaml").write_text(bad + "\n" + ENCODER)
        with pytest.raises(ConfigError, match=match):
            load_experiment_config(tmp_path / "b.yaml")
    masks = {"num_time_mask": 2, "time_mask_width": 3, "time_mask_av_only": True}
    assert isinstance(make_trainer(tok, utts, tmp_path / "ok", 1, **masks).sampler, ModalityBatchSampler)
    MODEL["encoder_conf"]["modality_dropout"] = 0.0
    try:  # no batch would be marked audio-visual: refused, not ignored
        with pytest.raises(ConfigError, match="time_mask_av_only.*modality dropout"):
            make_trainer(tok, utts, tmp_path / "bad", 1, **masks)
        make_trainer(tok, utts, tmp_path / "all", 1, num_time_mask=2, time_mask_width=3)  # every utterance
    finally:
        MODEL["encoder_conf"]["modality_dropout"] = 0.5


def test_edge_silence_frames_from_the_train_config_are_checked(tmp_path):
    (tmp_path / "e.yaml").write_text("edge_silence_frames: [-8, 8]\nedge_silence_keep_length: true\n"
                                     + ENCODER)
    aug = build_audio_augment(load_experiment_config(tmp_path / "e.yaml").train)
    assert (aug.edge_silence_frames, aug.edge_silence_keep_length) == ((-8, 8), True)
    assert build_audio_augment(TrainConfig(edge_silence_frames=[0, 0])) is None  # nothing changes
    for bad, match in (("edge_silence_frames: [4, -4]", "low <= high"), ("edge_silence_frames: [1, 2, 3]",
                       "low, high"), ("edge_silence_frames: [0.5, 2]", "edge_silence_frames"),
                       ("edge_silence_keep_length: 2", "edge_silence_keep_length"),
                       ("edge_silence_prob: 1.5", "edge_silence_prob")):
        (tmp_path / "b.yaml").write_text(bad + "\n" + ENCODER)
        with pytest.raises(ConfigError, match=match):
            build_audio_augment(load_experiment_config(tmp_path / "b.yaml").train)


def test_narrowband_prob_from_the_train_config_is_checked(setup, tmp_path):
    tok, utts = setup
    (tmp_path / "n.yaml").write_text("narrowband_prob: 0.2\nnarrowband_audio_only: true\n" + ENCODER)
    aug = build_audio_augment(load_experiment_config(tmp_path / "n.yaml").train)
    assert (aug.narrowband_prob, aug.narrowband_audio_only) == (0.2, True)
    narrow = {"narrowband_prob": 0.2, "narrowband_audio_only": True}
    assert isinstance(make_trainer(tok, utts, tmp_path / "ok", 1, **narrow).sampler, ModalityBatchSampler)
    MODEL["encoder_conf"]["modality_dropout"] = 0.0
    try:  # no batch would be marked audio-only: refused, not ignored
        with pytest.raises(ConfigError, match="narrowband_audio_only.*modality dropout"):
            make_trainer(tok, utts, tmp_path / "bad", 1, **narrow)
    finally:
        MODEL["encoder_conf"]["modality_dropout"] = 0.5
    assert build_audio_augment(TrainConfig(narrowband_prob=0.0)) is None  # nothing changes
    for bad in ("narrowband_prob: 1.5", "narrowband_prob: -0.1", "narrowband_prob: often"):
        (tmp_path / "b.yaml").write_text(bad + "\n" + ENCODER)
        with pytest.raises(ConfigError, match="narrowband_prob"):
            build_audio_augment(load_experiment_config(tmp_path / "b.yaml").train)


def test_noise_probabilities_per_batch_modality_from_the_train_config(tmp_path):
    write_wav(tmp_path / "n.wav", np.random.default_rng(0).standard_normal(16000).astype(np.float32))
    (tmp_path / "a.yaml").write_text("noise_prob: 0.5\nnoise_prob_audio_only: 0.1\n" + ENCODER)
    noise = build_noise(str(tmp_path / "n.wav"), load_experiment_config(tmp_path / "a.yaml").train)
    assert [noise.prob_for(m) for m in ("audiovisual", "audio", "video", None)] == [0.5, 0.1, 0.5, 0.5]
    (tmp_path / "b.yaml").write_text("noise_prob: 0.5\nnoise_prob_audio_only: 1.5\n")
    with pytest.raises(ConfigError, match="noise_prob_audio_only"):
        build_noise(str(tmp_path / "n.wav"), load_experiment_config(tmp_path / "b.yaml").train)
    assert build_noise(str(tmp_path / "n.wav"), TrainConfig(noise_prob=0.0)) is None


def test_trainer_flushes_subnormals_only_when_configured(setup, tmp_path):
    """flush_denormal (default true) switches the calling thread to flush-to-zero; false leaves IEEE
    subnormals (the conftest fixture restores them after the test)."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero (FTZ/DAZ)")
    tok, utts = setup
    make_trainer(tok, utts, tmp_path / "ieee", 1, flush_denormal=False)
    assert float(torch.tensor([1e-39]) * 1.0) != 0.0
    make_trainer(tok, utts, tmp_path / "ftz", 1)
    assert float(torch.tensor([1e-39]) * 1.0) == 0.0


def test_the_encoder_is_built_with_the_video_precision_of_the_training_config(setup, tmp_path):
    tok, utts = setup
    # default auto: resolved for this CPU; null: as the rest of the model (None on the encoder)
    auto = resolve_precision("auto", "cpu")  # bf16 where native, else fp32
    assert make_trainer(tok, utts, tmp_path / "a", 1).model.encoder.video_precision == auto
    as_rest = make_trainer(tok, utts, tmp_path / "n", 1, video_precision=None)
    assert as_rest.model.encoder.video_precision is None
    trainer = make_trainer(tok, utts, tmp_path / "b", 1, video_precision="bf16")
    assert trainer.model.encoder.video_precision == "bf16"
    assert trainer.model.encoder.feature_extractor_video.resnet.precision == "bf16"
    trainer.train_epoch()  # float32 training with a bfloat16 ResNet: finite statistics
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_the_trainer_refuses_an_encoder_built_with_other_run_time_switches(setup, tmp_path):
    """The trainer assigns nothing to the encoder: one whose checkpoint_activations or video_precision
    disagree with the training config is refused, the setting named (an unresolved auto that resolves to the
    config's precision is the same)."""
    tok, utts = setup
    cfg = TrainConfig(max_epoch=1, batch_frames=40, warmup_steps=2, log_interval=1, video_precision="fp32")
    config = {"vocab_size": tok.vocab_size, **MODEL}
    runtime = encoder_runtime(cfg, ModelConfig.from_mapping(config), "cpu")
    assert runtime == EncoderRuntime(video_precision="fp32", modality_dropout_by_loader=True)

    def trainer(runtime, cfg=cfg):
        return Trainer(AVSRModel.from_config(config, runtime=runtime), config,
                       AVDataset(utts, tok, train=True), AVDataset(utts[:2], tok), cfg, tmp_path)

    for other, match in (
        (dict(checkpoint_activations=True), r"checkpoint_activations: the training config says False"),
        (dict(video_precision=None), r"video_precision: the training config says 'fp32'.*built with None"),
        (dict(video_precision="bf16"), r"video_precision: .*built with 'bf16'"),
        (dict(video_precision_in_eval=False), r"video_precision: .*built with 'fp32' in training only"),
    ):
        with pytest.raises(ConfigError, match=match):
            trainer(dataclasses.replace(runtime, **other))
    with pytest.raises(ConfigError, match="video_precision"):
        trainer(None)  # the encoder's defaults: the caller's precision, not the config's
    auto = dataclasses.replace(cfg, video_precision="auto")
    assert trainer(dataclasses.replace(runtime, video_precision="auto"), auto).video_precision == \
        resolve_precision("auto", "cpu")
    ckpt = dataclasses.replace(cfg, checkpoint_activations=True)
    assert trainer(dataclasses.replace(runtime, checkpoint_activations=True), ckpt).model.encoder.encoder \
        .checkpoint_activations


def test_av_batch_views_sum_the_losses_of_each_view_from_one_video_front_end_run(setup, monkeypatch):
    tok, utts = setup
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    enc = {**MODEL["encoder_conf"], **no_dropout, "dropout_features": 0.0, "dropout_input": 0.0,
           "modality_dropout": 0.0}
    config = {"vocab_size": tok.vocab_size, **MODEL, "encoder_conf": enc,
              "decoder_conf": {**MODEL["decoder_conf"], **no_dropout}}
    torch.manual_seed(0)
    one = AVSRModel.from_config(config).train()
    views = {**MODEL["model_conf"], "av_batch_views": ["audiovisual", "video"]}
    both = AVSRModel.from_config({**config, "model_conf": views}).train()
    both.load_state_dict(one.state_dict())
    assert both.conf.av_batch_views == ("audiovisual", "video")
    ds = AVDataset(utts, tok)
    batch = collate([ds[(i, "audiovisual")] for i in range(3)])
    args = (batch["lengths"], batch["ys_pad"], batch["ys_lens"])
    calls = []
    front_end = both.encoder.encode_video
    monkeypatch.setattr(both.encoder, "encode_video", lambda *a, **k: calls.append(1) or front_end(*a, **k))
    loss, stats = both(batch["audio"], batch["video"], *args)
    assert calls == [1]  # the video front-end ran once for both views
    loss_av, stats_av = one(batch["audio"], batch["video"], *args)
    loss_v, stats_v = one(None, batch["video"], *args)
    torch.testing.assert_close(loss, loss_av + loss_v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["loss_ctc"], stats_av["loss_ctc"] + stats_v["loss_ctc"], rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(stats["acc"], (stats_av["acc"] + stats_v["acc"]) / 2)
    loss.backward()
    assert all(p.grad is not None for p in both.encoder.feature_extractor_video.parameters())
    # one-stream batches and evaluation are scored as they are
    torch.testing.assert_close(both(batch["audio"], None, *args)[0], one(batch["audio"], None, *args)[0])
    both.load_state_dict(one.state_dict())  # the same BatchNorm running statistics
    both.eval(), one.eval()
    with torch.no_grad():
        torch.testing.assert_close(both(batch["audio"], batch["video"], *args)[0],
                                   one(batch["audio"], batch["video"], *args)[0])


def test_audiovisual_clean_view_scores_the_fused_input_with_the_clean_audio(setup, tmp_path):
    """av_batch_views with audiovisual_clean: that view is the audio-visual loss of the batch's
    audio_clean (the batch's audio where there is none); the trainer passes audio_clean and has the
    training set keep it (refused without), and refuses the view without loader-drawn modality dropout."""
    tok, utts = setup
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    enc = {**MODEL["encoder_conf"], **no_dropout, "dropout_features": 0.0, "dropout_input": 0.0,
           "modality_dropout": 0.0, "encoder_layerdrop": 0.0}
    config = {"vocab_size": tok.vocab_size, **MODEL, "encoder_conf": enc,
              "decoder_conf": {**MODEL["decoder_conf"], **no_dropout}}
    torch.manual_seed(0)
    one = AVSRModel.from_config(config).train()
    assert not hasattr(one, "batch_keys")  # the trainer's default arguments
    views = {**MODEL["model_conf"], "av_batch_views": ["audiovisual", "audiovisual_clean"]}
    two = AVSRModel.from_config({**config, "model_conf": views}).train()
    two.load_state_dict(one.state_dict())
    assert two.batch_keys[-1] == "audio_clean"
    ds = AVDataset(utts, tok)
    batch = collate([ds[(i, "audiovisual")] for i in range(3)])
    args = (batch["lengths"], batch["ys_pad"], batch["ys_lens"])
    noisy = batch["audio"] + torch.randn_like(batch["audio"])
    loss = two(noisy, batch["video"], *args, batch["audio"])[0]
    expected = one(noisy, batch["video"], *args)[0] + one(batch["audio"], batch["video"], *args)[0]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(two(noisy, batch["video"], *args)[0],  # no clean audio: the batch's audio
                               2 * one(noisy, batch["video"], *args)[0], rtol=1e-5, atol=1e-5)
    assert not make_trainer(tok, utts, tmp_path / "ok", 1).loader.dataset.keep_clean_audio
    MODEL["model_conf"]["av_batch_views"] = ["audiovisual", "video", "audiovisual_clean"]
    MODEL["encoder_conf"]["modality_dropout"] = 0.1  # mostly audio-visual batches
    try:
        torch.manual_seed(0)
        config = {"vocab_size": tok.vocab_size, **MODEL}
        write_wav(tmp_path / "n.wav", np.random.default_rng(0).standard_normal(16000).astype(np.float32))
        noise = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[0.0])
        cfg = TrainConfig(max_epoch=1, batch_frames=40, warmup_steps=2, log_interval=1)
        with pytest.raises(ConfigError, match="audiovisual_clean needs a training set that keeps"):
            Trainer(training_model(config, cfg), config, AVDataset(utts, tok, train=True, noise=noise),
                    AVDataset(utts[:2], tok), cfg, tmp_path / "unkept")
        train_set = AVDataset(utts, tok, train=True, noise=noise, keep_clean_audio=True)
        trainer = Trainer(training_model(config, cfg), config, train_set, AVDataset(utts[:2], tok), cfg,
                          tmp_path / "clean")
        assert trainer.loader.dataset.keep_clean_audio and trainer.model.batch_keys[-1] == "audio_clean"
        seen = []
        forward = trainer.model.forward
        trainer.model.forward = lambda *a: seen.append(a[-1] is not None and a[1] is not None) or forward(*a)
        trainer.run()  # audio-visual batches carry audio_clean (None in the others) through the trainer
        assert (tmp_path / "clean" / "epoch1.pt").exists() and any(seen)
        MODEL["encoder_conf"]["modality_dropout"] = 0.0
        with pytest.raises(ConfigError, match="audiovisual_clean.*modality dropout"):
            make_trainer(tok, utts, tmp_path / "bad", 1)
    finally:
        MODEL["encoder_conf"]["modality_dropout"] = 0.5
        del MODEL["model_conf"]["av_batch_views"]


@pytest.mark.parametrize("views", [[], ["video", "video"], ["fused"]])
def test_av_batch_views_refuses_bad_values_naming_the_key(setup, views):
    tok, _ = setup
    config = {"vocab_size": tok.vocab_size, **MODEL, "model_conf": {"av_batch_views": views}}
    with pytest.raises(ConfigError, match="av_batch_views"):
        AVSRModel.from_config(config, "m.yaml")


def test_av_batch_views_need_an_encoder_that_runs_the_video_front_end_alone(setup):
    tok, _ = setup

    class Foreign(torch.nn.Module):  # ESPnet AbsEncoder interface only
        def output_size(self) -> int:
            return 16

    with pytest.raises(ConfigError, match="av_batch_views.*encode_video.*Foreign"):
        AVSRModel({"vocab_size": tok.vocab_size, "model_conf": {"av_batch_views": ["audiovisual", "video"]}},
                  encoder=Foreign())
    model = AVSRModel({"vocab_size": tok.vocab_size}, encoder=Foreign())
    assert model.conf.av_batch_views == ("audiovisual",)


class _FrameRegression(torch.nn.Module):
    """A deterministic model (no dropout) for the trainer's loop: the loss of a batch is the mean over its
    utterances of the mean over their frames of (w . x_t + b)^2 (``audio`` (B, 104, T), ``lengths`` (B,))."""

    batch_keys = ("audio", "lengths")

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(104, 1)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, audio, lengths):
        self.seen.append((audio.detach().clone(), lengths.clone()))
        mask = (torch.arange(audio.shape[-1])[None, :] < lengths[:, None]).float()
        per_frame = self.proj(audio.transpose(1, 2)).squeeze(-1).pow(2) * mask
        loss = (per_frame.sum(1) / lengths).mean()
        return loss, {"loss": loss.detach()}


def test_accumulated_half_batches_give_the_gradient_of_the_full_batch(setup, tmp_path):
    tok, utts = setup
    same = [dataclasses.replace(u, num_frames=8) for u in utts[2:6]]  # 4 utterances of 8 frames ...
    for u in same:
        write_wav(tmp_path / f"{u.utt_id}.wav", read_wav(u.wav)[: 8 * 640])
    same = [dataclasses.replace(u, wav=str(tmp_path / f"{u.utt_id}.wav"), video=None) for u in same]
    torch.manual_seed(0)
    model = _FrameRegression()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = TrainConfig(max_epoch=1, batch_frames=16, max_batch_size=2, accum_grad=2, grad_clip=0.0, lr=1e-3,
                      warmup_steps=0, noise_prob=0.0, log_interval=1,  # ... in 2 batches of 2: one step
                      precision="fp32")  # auto would be bf16 on a CPU with native bf16: compared in fp32
    trainer = Trainer(model, {}, AVDataset(same, tok, modalities=("audio",), train=True),
                      AVDataset(same[:1], tok, modalities=("audio",)), cfg, tmp_path / "exp")
    grads = []  # the gradient each optimiser step sees
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.append({n: p.grad.clone() for n, p in model.named_parameters()}))
    trainer.train_epoch()
    assert trainer.step == 1 and len(grads) == 1 and [int(n.numel()) for _, n in model.seen] == [2, 2]
    # the full batch: the two half-batches as one, from the same starting weights
    full = _FrameRegression()
    full.load_state_dict(start)
    audio = torch.cat([a for a, _ in model.seen])
    lengths = torch.cat([n for _, n in model.seen])
    full(audio, lengths)[0].backward()
    for name, p in full.named_parameters():
        torch.testing.assert_close(grads[0][name], p.grad, msg=name)


def test_the_training_set_is_built_keeping_the_clean_audio_when_the_model_asks_for_it(setup, tmp_path):
    from avsr.data.datadir import write_datadir
    from avsr.train.config import TrainConfig
    from avsr.train.experiment import ExperimentOptions, ModelSetup, build_datasets

    tok, utts = setup
    write_datadir(tmp_path / "data", utts)
    opts = ExperimentOptions(config=tmp_path / "train.yaml", train_data=tmp_path / "data",
                             valid_data=tmp_path / "data", exp_dir=tmp_path / "exp")
    for views, kept in ((["audiovisual", "video"], False), (["audiovisual", "audiovisual_clean"], True)):
        config = {"vocab_size": tok.vocab_size, **MODEL, "model_conf": {"av_batch_views": views}}
        model = AVSRModel.from_config(config)
        train_set, valid_set = build_datasets(opts, TrainConfig(batch_frames=1000), ModelSetup(model, tok))
        assert train_set.keep_clean_audio is kept and not valid_set.keep_clean_audio


def test_setup_experiment_builds_the_encoder_with_the_training_settings(setup, tmp_path):
    """avsr-train's setup: the encoder comes built with the training config's checkpoint_activations and
    video_precision (resolved for the device, in validation too) and, with modality dropout, for the loader's
    draw; building those switches draws nothing from torch's generator (the weights are the seed's)."""
    import yaml

    from avsr.data.datadir import write_datadir
    from avsr.train.experiment import ExperimentOptions, setup_experiment

    tok, utts = setup
    write_datadir(tmp_path / "data", utts)
    base = {**MODEL, "max_epoch": 1, "batch_frames": 40, "warmup_steps": 2, "log_interval": 1, "seed": 3}
    no_dropout = {**MODEL["encoder_conf"], "modality_dropout": 0.0}
    cases = [({"checkpoint_activations": True, "video_precision": "fp32"}, (True, "fp32", True)),
             ({}, (False, resolve_precision("auto", "cpu"), True)),  # the defaults: auto, no checkpointing
             ({"video_precision": None, "encoder_conf": no_dropout}, (False, None, False))]
    for i, (settings, expected) in enumerate(cases):
        (tmp_path / f"t{i}.yaml").write_text(yaml.safe_dump({**base, **settings}))
        opts = ExperimentOptions(config=tmp_path / f"t{i}.yaml", train_data=tmp_path / "data",
                                 valid_data=tmp_path / "data", exp_dir=tmp_path / f"exp{i}",
                                 bpemodel=tok.model_path)
        trainer = setup_experiment(opts)
        enc = trainer.model.encoder
        assert (enc.checkpoint_activations, enc.video_precision, enc.modality_dropout_by_loader) == expected
        assert enc.runtime.video_precision_in_eval and trainer.video_precision == expected[1]
        assert isinstance(trainer.sampler, ModalityBatchSampler) == expected[2]
        torch.manual_seed(3)
        ref = AVSRModel.from_config(trainer.model_config)
        for (k, a), b in zip(ref.state_dict().items(), trainer.model.state_dict().values()):
            assert torch.equal(a, b), k
