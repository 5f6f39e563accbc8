"""avsr.espnet without ESPnet: the packed layout, the encoder wrapper, pretrained weights, the dump tool and
the
inference entry point's argument rewriting. The tests against a real ESPnet are in test_espnet_interop.py."""

import numpy as np
import pytest
import torch
import yaml

from avsr.checkpoint import save_atomic
from avsr.config import ConfigError
from avsr.data.datadir import read_kaldi_map, write_datadir
from avsr.encoder import AVHubertEncoder
from avsr.espnet.asr_inference import with_modality
from avsr.espnet.asr_train import prepare_process
from avsr.espnet.dump import dump_datadir
from avsr.espnet.encoder import AVHubertESPnetEncoder
from avsr.espnet.layout import crop_and_normalize, pack_frames, roi_side, unpack_frames
from avsr.features import avhubert_audio_features, crop_video, normalize_video
from avsr.models.asr import AVSRModel
from avsr.nn.modality import draw_modalities
from avsr.nn.precision import flush_denormal, resolve_precision
from tests.test_compat import pretrain_ckpt
from tests.test_data import make_utt

TINY = dict(
    encoder_layers=1,
    encoder_embed_dim=16,
    encoder_ffn_embed_dim=32,
    encoder_attention_heads=2,
    conv_pos=4,
    conv_pos_groups=2,
    resnet_widths=[2, 2, 4, 4],
    dropout=0.0,
    dropout_input=0.0,
    attention_dropout=0.0,
    encoder_layerdrop=0.0,
)
D = 104 + 96 * 96


pytestmark = pytest.mark.usefixtures("one_thread")


def packed_batch(seed=0, lens=(12, 9)):
    """Packed frames (B, T, 104 + 96*96) zero-padded after ``lens``, and the modalities they hold."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lens), max(lens)
    audio = torch.randn(b, t, 104, generator=g)
    video = torch.randint(0, 256, (b, t, 96, 96), generator=g).float()
    xs = torch.cat([audio, video.flatten(2)], dim=-1)
    pad = torch.arange(t)[None, :] >= torch.tensor(lens)[:, None]
    return xs.masked_fill(pad[..., None], 0.0), torch.tensor(lens), audio, video


def test_layout_round_trip_and_roi_side():
    audio, video = torch.randn(7, 104), torch.randint(0, 256, (7, 96, 96), dtype=torch.uint8)
    packed = pack_frames(audio, video, np.float32)
    assert packed.shape == (7, D) and packed.dtype == np.float32
    a, v = unpack_frames(torch.from_numpy(packed)[None])
    assert torch.equal(a[0], audio.T) and torch.equal(v[0], video.float())
    half = torch.from_numpy(pack_frames(audio, video))  # float16: pixels exact, audio to ~3 digits
    assert torch.equal(unpack_frames(half.float()[None])[1][0], video.float())
    assert torch.allclose(unpack_frames(half.float()[None])[0][0], audio.T, rtol=1e-3, atol=2e-3)
    assert roi_side(D) == 96 and roi_side(104 + 88 * 88) == 88
    with pytest.raises(ValueError, match="S\\*S"):
        roi_side(D + 1)
    with pytest.raises(ValueError, match="frames"):
        pack_frames(audio, video[:5])


def test_eval_output_equals_avhubert_encoder_on_each_modality():
    enc = AVHubertESPnetEncoder(D, **TINY).eval()
    xs, lens, audio, video = packed_batch()
    ref = enc.avhubert
    v = normalize_video(crop_video(video.flatten(0, 1)).unflatten(0, video.shape[:2]))[:, None]
    inputs = {
        "audiovisual": (audio.transpose(1, 2), v),
        "audio": (audio.transpose(1, 2), None),
        "video": (None, v),
    }
    outs = {}
    for modality, (a, vv) in inputs.items():
        enc.modality = modality
        hidden, olens, states = enc(xs, lens)
        want, _, _ = ref({"audio": a, "video": vv}, lens)
        assert states is None and torch.equal(olens, lens) and hidden.shape == (2, 12, 16)
        for i, n in enumerate(lens.tolist()):
            torch.testing.assert_close(hidden[i, :n], want[i, :n], rtol=0, atol=1e-6)
        outs[modality] = hidden
    assert not torch.allclose(outs["audio"], outs["video"])
    assert enc.output_size() == 16
    with pytest.raises(ConfigError, match="modality"):
        enc.modality = "lips"


def test_training_crops_randomly_and_honours_modality_dropout_and_feature_grad_mult():
    torch.manual_seed(0)
    xs, lens, _, video = packed_batch()
    crops = {
        tuple(crop_and_normalize(video, train=True)[0, 0, 0, :2, :2].flatten().tolist()) for _ in range(8)
    }
    assert len(crops) > 1  # random position / flip per draw
    enc = AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 1.0, "audio_dropout": 1.0}).train()
    calls = []
    enc.avhubert.feature_extractor_video.register_forward_hook(lambda *a: calls.append("video"))
    enc.avhubert.feature_extractor_audio.register_forward_hook(lambda *a: calls.append("audio"))
    enc(xs, lens)
    assert calls == ["video"]  # audio always dropped: its front-end is not run
    grads = {}
    for mult in (1.0, 0.25):
        torch.manual_seed(1)
        enc = AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 0.0, "feature_grad_mult": mult}).train()
        enc(xs, lens)[0].sum().backward()
        grads[mult] = enc.avhubert.feature_extractor_audio.proj.weight.grad.clone()
    torch.testing.assert_close(grads[0.25], 0.25 * grads[1.0], rtol=1e-4, atol=1e-6)


def test_training_draws_the_modality_before_cropping_so_audio_only_batches_skip_the_video(monkeypatch):
    import avsr.espnet.encoder as espnet_encoder

    xs, lens, _, _ = packed_batch()
    crops = []
    real_crop = espnet_encoder.crop_and_normalize
    monkeypatch.setattr(espnet_encoder, "crop_and_normalize",
                        lambda *a, **k: crops.append(1) or real_crop(*a, **k))
    enc = AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 1.0, "audio_dropout": 0.0}).train()
    assert enc.avhubert.modality_dropout_by_loader  # the wrapper draws; the encoder does not draw again
    assert enc.avhubert.runtime.modality_dropout_by_loader  # built so, not assigned
    calls = []
    enc.avhubert.feature_extractor_video.register_forward_hook(lambda *a: calls.append("video"))
    enc.avhubert.feature_extractor_audio.register_forward_hook(lambda *a: calls.append("audio"))
    enc(xs, lens)
    assert calls == ["audio"] and crops == []  # video always dropped: neither cropped nor encoded
    enc.eval()(xs, lens)
    assert calls[1:] == ["audio", "video"] and crops == [1]  # outside training: the modality setting
    # the draws follow AV-HuBERT's rule on torch's generator, as the encoder's own draw did
    enc = AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 0.6, "audio_dropout": 0.3}).train()
    torch.manual_seed(3)
    drawn = [enc.batch_modality() for _ in range(200)]
    torch.manual_seed(3)
    assert drawn == draw_modalities(torch.rand(200, 2, dtype=torch.float64), 0.6, 0.3)
    assert set(drawn) == {"audio", "video", "audiovisual"}
    assert AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 0.0}).batch_modality() == "audiovisual"


def test_video_precision_applies_in_training_only():
    xs, lens, _, _ = packed_batch()
    seen = []
    enc = AVHubertESPnetEncoder(D, video_precision="bf16", **{**TINY, "modality_dropout": 0.0}).train()
    resnet = enc.avhubert.feature_extractor_video.resnet
    resnet.trunk.register_forward_hook(lambda m, i, o: seen.append(("trunk", o.dtype)))
    resnet.register_forward_hook(lambda m, i, o: seen.append(("resnet", o.dtype)))
    hidden, _, _ = enc(xs, lens)
    # computed in bfloat16, the output in the input's dtype
    assert seen == [("trunk", torch.bfloat16), ("resnet", torch.float32)] and hidden.dtype == torch.float32
    enc.eval()(xs, lens)
    assert seen[2:] == [("trunk", torch.float32), ("resnet", torch.float32)]  # inference: the caller's
    # the wrapped encoder is built with the precision, in training only; nothing is assigned per forward
    runtime = enc.avhubert.runtime
    assert (runtime.video_precision, runtime.video_precision_in_eval) == ("bf16", False)
    with pytest.raises(AttributeError):
        enc.video_precision = "fp32"
    enc = AVHubertESPnetEncoder(D, **{**TINY, "modality_dropout": 0.0}).train()
    assert enc.video_precision == enc.avhubert.video_precision == "auto"
    dtypes = []
    enc.avhubert.feature_extractor_video.resnet.trunk.register_forward_hook(
        lambda m, i, o: dtypes.append(o.dtype))
    enc(xs, lens)
    auto = resolve_precision("auto", "cpu", "video_precision")  # auto, resolved for the CPU
    assert dtypes == [torch.bfloat16 if auto == "bf16" else torch.float32]
    assert AVHubertESPnetEncoder(D, video_precision=None, **TINY).train().video_precision is None
    with pytest.raises(ConfigError, match="video_precision"):
        AVHubertESPnetEncoder(D, video_precision="fp16", **TINY)


def test_asr_train_prepares_the_process_as_avsrs_trainer(monkeypatch):
    import avsr.memory
    import avsr.nn.precision

    tiny = torch.tensor([1e-39])  # subnormal float32
    try:
        assert prepare_process(flush_denormals=True, keep_memory=False) == {
            "flush_denormal": True, "keep_freed_memory": False}
        assert float(tiny * 1.0) == 0.0  # flushed in this thread
    finally:
        flush_denormal(False)
    assert float(tiny * 1.0) > 0.0
    called = []
    monkeypatch.setattr(avsr.nn.precision, "flush_denormal", lambda on: called.append("flush") or True)
    monkeypatch.setattr(avsr.memory, "keep_freed_memory", lambda: called.append("malloc") or True)
    assert prepare_process() == {"flush_denormal": True, "keep_freed_memory": True}
    assert called == ["flush", "malloc"]


def test_shipped_model_name_pretrained_checkpoints_and_reload(tmp_path):
    enc = AVHubertESPnetEncoder(D, model="avsr_synthgrid_cpu")
    assert enc.avhubert.config.encoder_embed_dim == 192 and enc.avhubert.config.modality_dropout == 0.9
    with pytest.raises(ConfigError, match="avhubert_base"):
        AVHubertESPnetEncoder(D, model="no_such_model")
    with pytest.raises(ConfigError, match="input_size"):
        AVHubertESPnetEncoder(D - 1, **TINY)
    # an avsr ASR checkpoint and an official AV-HuBERT pretraining checkpoint
    config = {
        "vocab_size": 10,
        "encoder_conf": TINY,
        "decoder_conf": dict(
            decoder_layers=1, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2
        ),
    }
    own = tmp_path / "own.pt"
    save_atomic({"model": AVSRModel.from_config(config).state_dict(), "model_config": config}, own)
    official, _, _ = pretrain_ckpt(tmp_path)
    xs, lens, _, _ = packed_batch(seed=3)
    for ckpt in (own, official):
        enc = AVHubertESPnetEncoder(D, pretrained=str(ckpt), dropout=0.0).eval()
        ref = AVHubertEncoder.from_pretrained(ckpt).eval()
        with torch.no_grad():
            for p in enc.parameters():  # what ESPnet's init does before reload_pretrained_parameters
                p.normal_()
            enc.reload_pretrained_parameters()
            a, v = unpack_frames(xs)
            want = ref({"audio": a, "video": crop_and_normalize(v, train=False)}, lens)[0]
            got = enc(xs, lens)[0]
        for i, n in enumerate(lens.tolist()):
            assert (got[i, :n] - want[i, :n]).abs().max() <= 1e-5


def test_dump_writes_packed_frames_and_espnet_lists(tmp_path):
    utts = [make_utt(tmp_path, f"s1_{i}", frames=8 + i, text="BIN BLUE AT A ONE NOW") for i in range(3)]
    write_datadir(tmp_path / "data", utts)
    noise = tmp_path / "noise.wav"
    from avsr.data.media import write_wav

    write_wav(noise, (np.random.default_rng(0).standard_normal(16000) * 0.3).astype(np.float32))
    clean = dump_datadir(tmp_path / "data", tmp_path / "dump" / "clean", dtype="float32")
    noisy = dump_datadir(tmp_path / "data", tmp_path / "dump" / "noisy", noise=noise, snr_db=[0.0])
    scp = read_kaldi_map(clean)
    assert sorted(scp) == ["s1_0", "s1_1", "s1_2"]
    assert read_kaldi_map(clean.parent / "utt2num_frames") == {"s1_0": "8", "s1_1": "9", "s1_2": "10"}
    assert (clean.parent / "feats_dim").read_text().strip() == str(D)
    assert read_kaldi_map(clean.parent / "text")["s1_1"] == "BIN BLUE AT A ONE NOW"
    from avsr.data.media import read_video, read_wav

    x = np.load(scp["s1_1"])
    assert x.shape == (9, D) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, 104:].reshape(9, 96, 96), read_video(utts[1].video).numpy())
    want = avhubert_audio_features(read_wav(utts[1].wav), num_video_frames=9).numpy()
    np.testing.assert_allclose(x[:, :104], want, atol=1e-6)
    y = np.load(read_kaldi_map(noisy)["s1_1"])
    assert y.dtype == np.float16 and not np.allclose(y[:, :104], x[:, :104], atol=0.1)
    np.testing.assert_array_equal(y[:, 104:], x[:, 104:])  # noise changes only the audio


def test_inference_modality_option_rewrites_the_training_config(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"encoder": "avsr_avhubert", "encoder_conf": {"model": "x"}}))
    cmd = [
        "--asr_train_config",
        str(config),
        "--modality",
        "audio",
        "--output_dir",
        str(tmp_path / "o"),
        "--beam_size",
        "4",
    ]
    out = with_modality(cmd)
    assert (
        out[:4] == ["--output_dir", str(tmp_path / "o"), "--beam_size", "4"]
        and out[4] == "--asr_train_config"
    )
    assert yaml.safe_load(open(out[5]))["encoder_conf"] == {"model": "x", "modality": "audio"}
    assert with_modality(cmd[:2]) == cmd[:2]
    with pytest.raises(SystemExit):
        with_modality(["--modality", "lips", "--asr_train_config", str(config), "--output_dir", "o"])
