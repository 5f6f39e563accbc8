"""AVHubertEncoder: shapes, padding invariance, layer outputs, modality dropout, configs, building blocks."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from avsr.config import ConfigError
from avsr.encoder import AVHubertEncoder, AVHubertEncoderConfig
from avsr.nn.transformer import MultiheadSelfAttention, WeightNormConv1d

REPO = Path(__file__).resolve().parents[1]
TINY = dict(encoder_layers=2, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4,
            conv_pos=8, conv_pos_groups=4, resnet_widths=[4, 8, 8, 16])
NO_DROP = dict(dropout=0.0, dropout_input=0.0, attention_dropout=0.0, activation_dropout=0.0,
               encoder_layerdrop=0.0, modality_dropout=0.0)
HW = 16


def tiny(**kw) -> AVHubertEncoder:
    torch.manual_seed(0)
    return AVHubertEncoder(**{**TINY, **kw})


def inputs(b: int = 2, t: int = 10, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"audio": torch.randn(b, 104, t, generator=g), "video": torch.randn(b, 1, t, HW, HW, generator=g)}


@pytest.mark.parametrize("modalities", [("audio", "video"), ("audio",), ("video",)])
def test_output_shapes_and_lengths(modalities):
    enc = tiny().eval()
    xs = {k: (v if k in modalities else None) for k, v in inputs(3, 9).items()}
    ilens = torch.tensor([9, 7, 4])
    hidden, olens, state = enc(xs, ilens)
    assert hidden.shape == (3, 9, 16) and hidden.dtype == torch.float32
    assert torch.equal(olens, ilens) and state is None
    assert enc.output_size() == 16
    assert torch.isfinite(hidden).all()
    hidden_full, olens_full, _ = enc(xs, None)
    assert torch.equal(olens_full, torch.tensor([9, 9, 9]))


@pytest.mark.parametrize("conv_pos", [8, 7])
@pytest.mark.parametrize("layer_norm_first", [True, False])
@pytest.mark.parametrize("modalities", [("audio", "video"), ("audio",), ("video",)])
def test_padded_batch_gives_same_valid_frames_as_alone(conv_pos, layer_norm_first, modalities):
    enc = tiny(conv_pos=conv_pos, layer_norm_first=layer_norm_first).eval()
    full = inputs(2, 12)
    xs = {k: (v if k in modalities else None) for k, v in full.items()}
    n = 7  # utterance 1 has 7 valid frames; its padding holds garbage, not zeros
    alone = {k: (None if v is None else v[1:2, :, :n].clone()) for k, v in xs.items()}
    with torch.no_grad():
        batch_out, _, _ = enc(xs, torch.tensor([12, n]))
        alone_out, _, _ = enc(alone, torch.tensor([n]))
        first_out, _, _ = enc({k: (None if v is None else v[:1]) for k, v in xs.items()}, torch.tensor([12]))
    torch.testing.assert_close(batch_out[1, :n], alone_out[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batch_out[0], first_out[0], atol=1e-5, rtol=0)


def test_layer_outputs_count_and_relation_to_forward():
    for lnf in (True, False):
        enc = tiny(layer_norm_first=lnf, encoder_layers=3).eval()
        xs, ilens = inputs(2, 8), torch.tensor([8, 5])
        with torch.no_grad():
            outs, olens = enc.extract_layer_outputs(xs, ilens)
            hidden, _, _ = enc(xs, ilens)
            first = enc.extract_layer_outputs(xs, ilens, num_layers=1)[0]
        assert len(outs) == 3 and all(o.shape == (2, 8, 16) for o in outs)
        assert torch.equal(olens, ilens)
        # pre-LN: the final LayerNorm is applied by forward only
        last = enc.encoder.layer_norm(outs[-1]) if lnf else outs[-1]
        torch.testing.assert_close(hidden, last)
        assert len(first) == 1
        torch.testing.assert_close(first[0], outs[0])
        with pytest.raises(ValueError, match="num_layers"):
            enc.extract_layer_outputs(xs, ilens, num_layers=4)


def test_modality_dropout_in_training_only():
    xs, ilens = inputs(2, 6), torch.tensor([6, 6])
    audio_only, video_only = {"audio": xs["audio"], "video": None}, {"audio": None, "video": xs["video"]}
    for audio_dropout, same_as in ((1.0, video_only), (0.0, audio_only)):
        enc = tiny(**{**NO_DROP, "modality_dropout": 1.0, "audio_dropout": audio_dropout}).train()
        with torch.no_grad():
            dropped, _, _ = enc(xs, ilens)
            reference, _, _ = enc(same_as, ilens)  # a missing modality = zeros after its front-end
            enc.eval()
            kept, _, _ = enc(xs, ilens)
            reference_eval, _, _ = enc(same_as, ilens)
        torch.testing.assert_close(dropped, reference)
        assert not torch.allclose(kept, reference_eval, atol=1e-3)


def test_modality_dropout_is_per_batch_as_the_original():
    enc = tiny(modality_dropout=0.5, audio_dropout=0.5).train()
    a, v = torch.ones(2, 3, 2), torch.ones(2, 1, 2, 4, 4)
    torch.manual_seed(0)
    draws = [enc._modality_dropout(a, v) for _ in range(4000)]
    audio_dropped = sum(fa is None for fa, _ in draws) / len(draws)
    video_dropped = sum(fv is None for _, fv in draws) / len(draws)
    assert all(fa is not None or fv is not None for fa, fv in draws)  # never both dropped
    assert all(fa is a or fa is None for fa, _ in draws)  # the whole batch at once
    assert 0.2 < audio_dropped < 0.3 and 0.2 < video_dropped < 0.3  # 0.5 * 0.5 each


def test_layerdrop_skips_layers_in_training():
    enc = tiny(**{**NO_DROP, "encoder_layerdrop": 1.0}).train()
    xs = inputs(1, 5)
    outs, _ = enc.extract_layer_outputs(xs, None)
    torch.testing.assert_close(outs[0], outs[1])
    emb = enc.embed(xs, None)
    torch.testing.assert_close(outs[0], emb.x + enc.encoder.pos_conv(emb.x))


@pytest.mark.parametrize("fuse", ["concat", "add"])
def test_fusion(fuse):
    enc = tiny(modality_fuse=fuse).eval()
    assert enc.layer_norm.normalized_shape == ((32,) if fuse == "concat" else (16,))
    assert (enc.post_extract_proj is None) == (fuse == "add")  # as the original: no projection when add
    hidden, _, _ = enc(inputs(2, 6), torch.tensor([6, 3]))
    assert hidden.shape == (2, 6, 16)


def test_pre_and_post_ln_build_and_backward():
    for lnf in (True, False):
        enc = tiny(layer_norm_first=lnf, feature_grad_mult=1.0, **NO_DROP).train()
        assert all(layer.layer_norm_first == lnf for layer in enc.encoder.layers)
        hidden, _, _ = enc(inputs(2, 6), torch.tensor([6, 4]))
        hidden.sum().backward()
        missing = [n for n, p in enc.named_parameters() if p.grad is None]
        assert not missing


def test_state_dict_keys_follow_original():
    keys = set(tiny().state_dict())
    for key in ("feature_extractor_audio.proj.weight", "feature_extractor_video.resnet.frontend3D.0.weight",
                "feature_extractor_video.resnet.frontend3D.1.running_var",
                "feature_extractor_video.resnet.frontend3D.2.weight",
                "feature_extractor_video.resnet.trunk.layer1.0.conv1.weight",
                "feature_extractor_video.resnet.trunk.layer2.0.downsample.0.weight",
                "feature_extractor_video.resnet.trunk.layer4.1.relu2.weight",
                "feature_extractor_video.proj.bias", "layer_norm.weight", "post_extract_proj.weight",
                "encoder.pos_conv.0.weight_g", "encoder.pos_conv.0.weight_v", "encoder.pos_conv.0.bias",
                "encoder.layers.1.self_attn.q_proj.weight", "encoder.layers.0.self_attn.out_proj.bias",
                "encoder.layers.0.self_attn_layer_norm.weight", "encoder.layers.0.fc1.weight",
                "encoder.layers.0.fc2.bias", "encoder.layers.0.final_layer_norm.bias",
                "encoder.layer_norm.weight"):
        assert key in keys, key
    assert "feature_extractor_video.resnet.trunk.layer1.0.downsample.0.weight" not in keys
    relu = set(tiny(resnet_relu_type="relu").state_dict())
    assert not any(k.endswith("relu1.weight") for k in relu)


def test_input_errors():
    enc = tiny().eval()
    xs = inputs(2, 6)
    with pytest.raises(ValueError, match="both 'audio' and 'video' are None"):
        enc({"audio": None, "video": None}, torch.tensor([6, 6]))
    with pytest.raises(ValueError, match="number of frames T differs"):
        enc({"audio": xs["audio"][:, :, :5], "video": xs["video"]}, torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="audio_feat_dim=104"):
        enc({"audio": torch.randn(2, 80, 6), "video": None}, torch.tensor([6, 6]))
    with pytest.raises(ValueError, match=r"\(B, 1, T, H, W\)"):
        enc({"audio": None, "video": torch.randn(2, 3, 6, HW, HW)}, torch.tensor([6, 6]))
    with pytest.raises(ValueError, match="ilens"):
        enc(xs, torch.tensor([7, 6]))
    with pytest.raises(ValueError, match="ilens"):
        enc(xs, torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="unknown modality"):
        enc({**xs, "text": None}, torch.tensor([6, 6]))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="encoder_layerz"):
        AVHubertEncoder(encoder_layerz=3)
    with pytest.raises(ConfigError, match="modality_fuse"):
        AVHubertEncoder(**TINY, modality_fuse="mean")
    with pytest.raises(ConfigError, match="encoder_attention_heads"):
        AVHubertEncoder(**{**TINY, "encoder_attention_heads": 5})
    bad = tmp_path / "bad.yaml"
    bad.write_text("encoder_conf:\n  encoder_layers: 2\n  dropuot: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*dropuot"):
        AVHubertEncoder.from_yaml(bad)


@pytest.mark.parametrize("nested", [True, False])
def test_from_yaml_top_level_or_encoder_conf(tmp_path, nested):
    body = "".join(f"{k}: {v}\n" for k, v in TINY.items())
    text = "encoder: avhubert\nencoder_conf:\n" + "".join("  " + line + "\n" for line in body.splitlines())
    path = tmp_path / "tiny.yaml"
    path.write_text(text if nested else body)
    enc = AVHubertEncoder.from_yaml(path, dropout=0.0)
    assert enc.config.encoder_layers == 2 and enc.config.resnet_widths == [4, 8, 8, 16]
    assert enc.config.dropout == 0.0 and enc.output_size() == 16


def test_published_configs_and_parameter_counts():
    base = AVHubertEncoder.from_yaml(REPO / "conf/model/avhubert_base.yaml")
    assert base.config == AVHubertEncoderConfig()  # the dataclass defaults are AV-HuBERT BASE
    n_base = sum(p.numel() for p in base.parameters())
    with torch.device("meta"):
        large = AVHubertEncoder.from_yaml(REPO / "conf/model/avhubert_large.yaml")
    n_large = sum(p.numel() for p in large.parameters())
    assert large.config.encoder_layers == 24 and large.config.layer_norm_first
    # the paper: BASE 103M, LARGE 325M parameters
    assert 102e6 < n_base < 104e6, n_base
    assert 324e6 < n_large < 326e6, n_large


def test_weight_norm_conv_matches_torch_weight_norm_dim2():
    conv = WeightNormConv1d(8, 4, groups=2)
    ref = torch.nn.Conv1d(8, 8, 4, padding=2, groups=2)
    ref = torch.nn.utils.parametrizations.weight_norm(ref, name="weight", dim=2)
    with torch.no_grad():
        ref.parametrizations.weight.original0.copy_(conv.weight_g * 1.5)
        ref.parametrizations.weight.original1.copy_(conv.weight_v)
        conv.weight_g.mul_(1.5)
        ref.bias.copy_(conv.bias)
    x = torch.randn(2, 8, 9)
    torch.testing.assert_close(conv(x), ref(x))
    assert conv(x).shape == (2, 8, 10)  # even kernel: one extra frame, removed by SamePad


@pytest.mark.parametrize("kernel", [4, 5, 8, 7])
def test_conv_pos_keeps_the_length_and_sees_k_frames_around_each_frame_within_its_group(kernel):
    from avsr.nn.transformer import ConvPositionalEmbedding

    torch.manual_seed(0)
    d, groups = 8, 4
    pos = ConvPositionalEmbedding(d, kernel, groups)
    for frames in (1, 6, 11):  # the output has the input's length, even kernels too (SamePad drops the last)
        assert pos(torch.randn(2, frames, d)).shape == (2, frames, d)
    # an impulse at frame t of channel c: the frames that see it, and the channels (c's group only)
    t, c, frames = 10, 3, 21
    x = torch.zeros(1, frames, d)
    x[0, t, c] = 1.0
    with torch.no_grad():
        out = pos(x)[0]  # GELU(0 + bias 0) = 0 wherever the impulse does not reach
    touched_frames = out.abs().sum(1).nonzero().flatten().tolist()
    # output frame u sees input frames u - kernel // 2 ... u + (kernel - 1) - kernel // 2 (not causal):
    # odd kernels symmetric, even kernels one frame more of the past than of the future
    assert touched_frames == list(range(t - (kernel - 1 - kernel // 2), t + kernel // 2 + 1))
    touched_channels = out.abs().sum(0).nonzero().flatten().tolist()
    group = d // groups
    assert touched_channels == list(range(c // group * group, (c // group + 1) * group))
    # with padding zeroed, a frame's output depends only on what lies within the kernel
    y = torch.randn(1, frames, d)
    far = y.clone()
    far[0, : t - kernel // 2] += 5.0  # frames out of the reach of frame t
    far[0, t + kernel - kernel // 2 :] -= 5.0
    with torch.no_grad():
        torch.testing.assert_close(pos(y)[0, t], pos(far)[0, t])


def test_conv_pos_weight_is_normalised_per_kernel_tap():
    conv = WeightNormConv1d(8, 5, groups=2)
    assert conv.weight_g.shape == (1, 1, 5) and conv.weight_v.shape == (8, 4, 5)
    with torch.no_grad():
        conv.weight_g.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0]).view(1, 1, 5))
        # each tap's weight (over output and input channels) has the norm weight_g: dim=2 of weight_norm
        torch.testing.assert_close(conv.weight.norm(dim=(0, 1)), conv.weight_g.flatten())
        x = torch.randn(2, 8, 9)
        before = conv(x)
        conv.weight_v.mul_(torch.tensor([3.0, 0.1, 7.0, 1.0, 2.0]).view(1, 1, 5))  # direction kept per tap
        torch.testing.assert_close(conv(x), before)
        conv.weight_g.mul_(2.0)
        torch.testing.assert_close(conv(x), 2.0 * before)  # bias 0: linear in weight_g


def test_attention_matches_reference_with_key_padding():
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out = attn(x, ~pad[:, None, None, :])

    def heads(y):
        return y.view(2, 5, 2, 4).transpose(1, 2)

    q, k, v = heads(attn.q_proj(x)) * 4**-0.5, heads(attn.k_proj(x)), heads(attn.v_proj(x))
    scores = (q @ k.transpose(-1, -2)).masked_fill(pad[:, None, None, :], float("-inf"))
    ref = attn.out_proj((F.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(out, ref)


def test_torch_compile_fullgraph_matches_eager():
    # aot_eager: graph capture (no graph break allowed) without inductor's slow C++ codegen on 2 CPU cores.
    torch._dynamo.reset()
    enc = tiny().eval()
    xs, ilens = inputs(2, 8), torch.tensor([8, 5])
    compiled = torch.compile(enc, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(xs, ilens)[0], enc(xs, ilens)[0])


def test_audio_gate_closed_is_video_only_open_is_plain_fusion_and_one_stream_input_is_untouched():
    plain = tiny(**NO_DROP).eval()
    gated = tiny(**NO_DROP, audio_gate=True).eval()
    assert set(gated.state_dict()) - set(plain.state_dict()) == {"audio_gate.proj.weight",
                                                                 "audio_gate.proj.bias"}
    assert not any("gate" in k for k in plain.state_dict())  # AV-HuBERT's layout without the option
    gated.load_state_dict(plain.state_dict(), strict=False)
    torch.manual_seed(1)
    audio, video = torch.randn(3, 104, 12), torch.randn(3, 1, 12, HW, HW)
    lens = torch.tensor([12, 9, 5])
    with torch.no_grad():
        start = gated.audio_gate(torch.randn(3, 16, 12), torch.randn(3, 16, 12), None)
        assert start.shape == (3, 1, 12) and torch.allclose(start, torch.full_like(start, 0.9526), atol=1e-4)
        gated.audio_gate.proj.bias.fill_(-50.0)  # closed: the audio-visual input becomes the video-only one
        closed = gated({"audio": audio, "video": video}, lens)[0]
        torch.testing.assert_close(closed, plain({"audio": None, "video": video}, lens)[0])
        gated.audio_gate.proj.bias.fill_(50.0)  # open: AV-HuBERT's fusion
        torch.testing.assert_close(gated({"audio": audio, "video": video}, lens)[0],
                                   plain({"audio": audio, "video": video}, lens)[0])
        gated.audio_gate.proj.weight.normal_()
        gated.audio_gate.proj.bias.zero_()
        for modality in ({"audio": audio, "video": None}, {"audio": None, "video": video}):
            torch.testing.assert_close(gated(modality, lens)[0], plain(modality, lens)[0])
        # a padded utterance gets the gate (and output) it gets alone: the utterance means skip padding
        alone = gated({"audio": audio[2:, :, :5], "video": video[2:, :, :5]}, None)[0]
        torch.testing.assert_close(gated({"audio": audio, "video": video}, lens)[0][2, :5], alone[0],
                                   rtol=1e-4, atol=1e-5)
    gated.train()
    gated({"audio": audio, "video": video}, lens)[0].sum().backward()
    assert gated.audio_gate.proj.weight.grad.abs().sum() > 0


def test_audio_gate_hidden_is_an_mlp_gate_that_starts_open_ignores_padding_and_learns():
    gated = tiny(**NO_DROP, audio_gate=True, audio_gate_hidden=8).eval()
    keys = {k for k in gated.state_dict() if "gate" in k}
    assert keys == {"audio_gate.hidden.0.weight", "audio_gate.hidden.0.bias", "audio_gate.proj.weight",
                    "audio_gate.proj.bias"}
    assert gated.audio_gate.hidden[0].weight.shape == (8, 4 * 16)
    assert gated.audio_gate.proj.weight.shape == (1, 8)
    torch.manual_seed(2)
    audio, video = torch.randn(3, 104, 12), torch.randn(3, 1, 12, HW, HW)
    lens = torch.tensor([12, 9, 5])
    with torch.no_grad():
        start = gated.audio_gate(torch.randn(3, 16, 12), torch.randn(3, 16, 12), None)
        assert torch.allclose(start, torch.full_like(start, 0.9526), atol=1e-4)  # as the linear gate
        gated.audio_gate.proj.weight.normal_()
        gate = gated.audio_gate(torch.randn(3, 16, 12), torch.randn(3, 16, 12), None)
        assert gate.std() > 1e-3  # the hidden layer makes it depend on the frame
        alone = gated({"audio": audio[2:, :, :5], "video": video[2:, :, :5]}, None)[0]
        torch.testing.assert_close(gated({"audio": audio, "video": video}, lens)[0][2, :5], alone[0],
                                   rtol=1e-4, atol=1e-5)
    gated.train()
    gated({"audio": audio, "video": video}, lens)[0].sum().backward()
    assert gated.audio_gate.hidden[0].weight.grad.abs().sum() > 0
    for bad in (-1, True, 2.5):
        with pytest.raises(ConfigError, match="audio_gate_hidden"):
            AVHubertEncoderConfig(audio_gate_hidden=bad)


def test_audio_cmn_removes_each_utterances_constant_offset_and_ignores_padding():
    plain = tiny(**NO_DROP).eval()
    cmn = tiny(**NO_DROP, audio_cmn=True).eval()
    cmn.load_state_dict(plain.state_dict())  # no new parameters
    torch.manual_seed(3)
    audio, video = torch.randn(3, 104, 12), torch.randn(3, 1, 12, HW, HW)
    lens = torch.tensor([12, 9, 5])
    valid = (torch.arange(12)[None, :] < lens[:, None])[:, None, :]
    offset = torch.randn(3, 104, 1) * 3 * valid  # a per-utterance, per-feature constant on the valid frames
    with torch.no_grad():
        for modality in ({"audio": audio, "video": None}, {"audio": audio, "video": video}):
            shifted = dict(modality, audio=audio + offset)
            torch.testing.assert_close(cmn(shifted, lens)[0], cmn(modality, lens)[0], rtol=1e-4, atol=1e-4)
            assert not torch.allclose(plain(shifted, lens)[0], plain(modality, lens)[0], atol=1e-2)
        # the mean is over the valid frames only: a padded utterance gets the output it gets alone
        alone = cmn({"audio": audio[2:, :, :5], "video": None}, None)[0]
        torch.testing.assert_close(cmn({"audio": audio, "video": None}, lens)[0][2, :5], alone[0],
                                   rtol=1e-4, atol=1e-5)
        centred = audio[2:, :, :5] - audio[2:, :, :5].mean(dim=2, keepdim=True)
        torch.testing.assert_close(cmn({"audio": centred, "video": None}, None)[0],
                                   plain({"audio": centred, "video": None}, None)[0])


def test_video_input_size_reads_the_area_mean_of_the_crop_and_keeps_smaller_frames():
    torch.manual_seed(0)
    reduced = tiny(**NO_DROP, video_input_size=8).eval()
    whole = tiny(**NO_DROP).eval()
    whole.load_state_dict(reduced.state_dict())  # the option adds no parameter
    xs = inputs(2, 6)
    lengths = torch.tensor([6, 4])
    # a 16 x 16 crop read at 8 x 8 is the plain model on the crop's 2 x 2 block means
    pooled = F.avg_pool2d(xs["video"][:, 0], 2)[:, None]
    for audio in (xs["audio"], None):
        got = reduced({"audio": audio, "video": xs["video"]}, lengths)[0]
        want = whole({"audio": audio, "video": pooled}, lengths)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # frames already at (or below) the size pass unchanged
        torch.testing.assert_close(reduced({"audio": audio, "video": pooled}, lengths)[0], want)
    assert not torch.equal(reduced(xs, lengths)[0], whole(xs, lengths)[0])
    with pytest.raises(ConfigError, match="video_input_size"):
        AVHubertEncoder(**TINY, video_input_size=4)
