"""AVHubertPretrainModel: masked cluster prediction loss, label alignment, label embeddings, configs."""

import pytest
import torch

import avsr.models.pretrain as pretrain_mod
from avsr.config import ConfigError
from avsr.encoder import AVHubertEncoder
from avsr.models.pretrain import AVHubertPretrainConfig, AVHubertPretrainModel

ENC = dict(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=2,
           conv_pos=4, conv_pos_groups=2, resnet_widths=[2, 4, 4, 8], dropout=0.0, dropout_input=0.0,
           attention_dropout=0.0, encoder_layerdrop=0.0, modality_dropout=0.0)
HW = 12


def model(num_classes=(5,), **pretrain) -> AVHubertPretrainModel:
    torch.manual_seed(0)
    conf = {"final_dim": 8, "label_rate": 25, **pretrain}
    return AVHubertPretrainModel.from_config(
        {"encoder_conf": ENC, "pretrain_conf": conf, "num_classes": list(num_classes)})


def batch(b=3, t=20, lengths=(20, 16, 11), k=5, rate=25, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    ratio = rate // 25
    labels = torch.randint(0, k, (b, t * ratio), generator=g)
    labels[torch.arange(t * ratio)[None, :] >= ratio * lengths[:, None]] = -1
    return (torch.randn(b, 104, t, generator=g), torch.randn(b, 1, t, HW, HW, generator=g), lengths, [labels])


def fixed_mask(monkeypatch, mask: torch.Tensor) -> None:
    """Every span mask the model draws is ``mask`` (audio and video alike)."""
    monkeypatch.setattr(pretrain_mod, "compute_span_mask",
                        lambda shape, pad, *a, **k: mask[:, :shape[1]] & ~pad)


def test_forward_shapes_stats_and_backward():
    m = model().train()
    audio, video, lengths, labels = batch()
    loss, stats = m(audio, video, lengths, labels)
    assert loss.shape == () and torch.isfinite(loss)
    assert set(stats) == {"loss", "loss_masked", "loss_unmasked", "loss_features_pen", "acc_masked",
                          "acc_unmasked", "n_masked", "n_unmasked"}
    # detached scalar tensors (no host synchronisation in the model; the trainer reads them per interval)
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in stats.values())
    stats = {k: float(v) for k, v in stats.items()}
    assert stats["n_masked"] + stats["n_unmasked"] == float(lengths.sum())  # padding in neither part
    assert stats["n_masked"] > 0 and 0.0 <= stats["acc_masked"] <= 1.0
    # pred_nomask_weight 0: loss = masked CE + 10 * features_pen
    assert stats["loss"] == pytest.approx(stats["loss_masked"] + stats["loss_features_pen"], rel=1e-5)
    loss.backward()
    assert m.final_proj.weight.grad is not None and m.label_embs_concat.grad.abs().sum() > 0
    assert m.mask_emb.grad is not None and m.mask_emb.shape == (104,)
    assert m.encoder.feature_extractor_video.resnet is not None
    # one modality only, and a batch of one (the original fills masked frames with zeros then)
    assert torch.isfinite(m(audio, None, lengths, labels)[0])
    assert torch.isfinite(m(None, video, lengths, labels)[0])
    assert torch.isfinite(m(audio[:1], video[:1], lengths[:1], [labels[0][:1]])[0])


def test_input_masking_audio_mask_emb_video_same_seq_loss_on_union(monkeypatch):
    audio, video, lengths, labels = batch()
    mask_a = torch.zeros(3, 20, dtype=torch.bool)
    mask_a[:, 2:6] = True
    mask_v = torch.zeros(3, 20, dtype=torch.bool)
    mask_v[:, 4:9] = True
    calls = []

    def fake(shape, pad, prob, length, min_masks, **kw):
        calls.append((prob, length, min_masks, kw["require_same_masks"]))
        return (mask_a if len(calls) == 1 else mask_v) & ~pad

    monkeypatch.setattr(pretrain_mod, "compute_span_mask", fake)
    m = model().eval()
    seen = {}
    embed = m.encoder.embed
    monkeypatch.setattr(m.encoder, "embed", lambda xs, ilens: seen.update(xs) or embed(xs, ilens))
    _, stats = m(audio, video, lengths, labels)
    # audio first (0.8, 10), then video (0.3, 5); min_masks 2; equalised masks (the original's defaults)
    assert calls == [(0.8, 10, 2, True), (0.3, 5, 2, True)]
    valid = torch.arange(20)[None, :] < lengths[:, None]
    assert stats["n_masked"] == float(((mask_a | mask_v) & valid).sum())
    a_in, v_in = seen["audio"].transpose(1, 2), seen["video"][:, 0]
    assert torch.equal(a_in[mask_a], m.mask_emb.detach().expand(int(mask_a.sum()), 104))
    assert torch.equal(a_in[~mask_a], audio.transpose(1, 2)[~mask_a])
    assert torch.equal(v_in[~mask_v], video[:, 0][~mask_v])
    assert not torch.equal(v_in[mask_v], video[:, 0][mask_v])


def test_state_dict_keys_match_the_encoder_and_the_original():
    keys = set(model().state_dict())
    enc_keys = {f"encoder.{k}" for k in AVHubertEncoder(**ENC).state_dict()}
    assert enc_keys <= keys
    assert keys - enc_keys == {"final_proj.weight", "final_proj.bias", "mask_emb", "label_embs_concat"}
    mom = set(model(label_embedding="momentum").state_dict())
    assert mom - enc_keys == {"final_proj.weight", "final_proj.bias", "mask_emb", "label_memories.0.memory"}


@pytest.mark.parametrize("label_embedding", ["learned", "momentum"])
def test_loss_only_on_masked_frames(monkeypatch, label_embedding):
    audio, video, lengths, labels = batch()
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[:, 3:9] = True
    mask[1, 12:15] = True
    fixed_mask(monkeypatch, mask)
    valid = torch.arange(20)[None, :] < lengths[:, None]

    def run(lab, **conf):
        m = model(label_embedding=label_embedding, **conf).eval()
        return m(audio, video, lengths, [lab])

    loss, stats = run(labels[0])
    assert stats["n_masked"] == float((mask & valid).sum())
    other = labels[0].clone()
    other[~mask & valid] = (other[~mask & valid] + 1) % 5  # change every unmasked label
    loss2, stats2 = run(other)
    assert torch.equal(loss, loss2) and stats["acc_masked"] == stats2["acc_masked"]
    assert stats["loss_unmasked"] != stats2["loss_unmasked"]  # still measured, for the stats
    changed = labels[0].clone()
    changed[mask & valid] = (changed[mask & valid] + 1) % 5
    assert not torch.equal(run(changed)[0], loss)
    # with pred_nomask_weight > 0 the unmasked labels count
    assert not torch.equal(run(labels[0], pred_nomask_weight=1.0)[0], run(other, pred_nomask_weight=1.0)[0])
    # -1 labels are ignored: all masked frames unlabelled -> no masked loss, accuracy undefined
    none = labels[0].clone()
    none[mask] = -1
    loss3, stats3 = run(none, loss_weights=[])
    assert loss3.item() == 0.0 and stats3["loss_masked"] == 0.0
    assert stats3["acc_masked"] != stats3["acc_masked"]  # nan


def test_align_targets_label_rate_100_and_25():
    m100, m25 = model(label_rate=100), model(label_rate=25)
    lab = torch.arange(2 * 80).view(2, 80) % 5
    targets, t_used = m100.align_targets([lab], 20)
    assert t_used == 20 and torch.equal(targets[0], lab[:, ::4])  # frame t <- label 4t
    targets, t_used = m100.align_targets([lab[:, :70]], 20)  # labels too short: crop the features
    assert t_used == 17 and torch.equal(targets[0], lab[:, :68:4])
    targets, t_used = m25.align_targets([lab[:, :30]], 20)
    assert t_used == 20 and torch.equal(targets[0], lab[:, :20])
    with pytest.raises(ValueError, match="too short"):
        m100.align_targets([lab[:, :3]], 20)
    with pytest.raises(ValueError, match=r"labels\[0\] of batch item 1"):
        m25.align_targets([torch.tensor([[0, 1], [2, 5]])], 2)
    with pytest.raises(ValueError, match="list of 1"):
        m25.align_targets(lab, 20)


def test_label_rate_100_uses_every_fourth_label_and_crops(monkeypatch):
    audio, video, lengths, labels = batch(rate=100)
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[:, 2:12] = True
    fixed_mask(monkeypatch, mask)
    m = model(label_rate=100).eval()
    torch.manual_seed(2)  # the same_seq sources of masked video frames are random
    loss, _ = m(audio, video, lengths, labels)
    other = labels[0].clone()
    off_grid = torch.arange(80) % 4 != 0
    other[:, off_grid] = torch.where(other[:, off_grid] >= 0, (other[:, off_grid] + 2) % 5, -1)
    torch.manual_seed(2)
    assert torch.equal(m(audio, video, lengths, [other])[0], loss)
    # labels for only 17 frames: the model uses the first 17 input frames
    _, stats = m(audio, video, lengths, [labels[0][:, :68]])
    assert stats["n_masked"] + stats["n_unmasked"] == float(lengths.clamp(max=17).sum())


def test_untie_final_proj_with_two_label_sets():
    m = model(num_classes=(5, 7), untie_final_proj=True)
    assert m.final_proj.out_features == 16 and m.label_embs_concat.shape == (12, 8)
    assert model(num_classes=(5, 7), untie_final_proj=False).final_proj.out_features == 8
    audio, video, lengths, labels = batch()
    lab2 = torch.randint(0, 7, (3, 20), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(5)
    loss, stats = m(audio, video, lengths, [labels[0], lab2])
    loss.backward()
    grad = m.final_proj.weight.grad
    assert grad[:8].abs().sum() > 0 and grad[8:].abs().sum() > 0  # both halves learn
    torch.manual_seed(5)
    loss_b, _ = m(audio, video, lengths, [labels[0], (lab2 + 1) % 7])
    assert not torch.equal(loss.detach(), loss_b.detach())
    with pytest.raises(ValueError, match="list of 2"):
        m(audio, video, lengths, labels)


@pytest.mark.parametrize("nomask", [0.0, 1.0])
def test_momentum_memory_changes_only_rows_of_seen_targets(monkeypatch, nomask):
    audio, video, lengths, _ = batch(lengths=(20, 20, 20))
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[:, 5:15] = True
    fixed_mask(monkeypatch, mask)
    labels = torch.where(mask, torch.arange(20) % 2, 2 + torch.arange(20) % 2)  # masked: 0/1, unmasked: 2/3
    m = model(num_classes=(6,), label_embedding="momentum", pred_nomask_weight=nomask).train()
    before = m.label_memories[0].memory.clone()
    loss, _ = m(audio, video, lengths, [labels])
    assert torch.equal(m.label_memories[0].memory, before)  # forward alone changes nothing
    loss.backward()
    after = m.label_memories[0].memory
    changed = (after != before).any(1).tolist()
    assert changed == [True, True, nomask > 0, nomask > 0, False, False]
    torch.testing.assert_close(after.norm(dim=1), torch.ones(6))
    assert m.final_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("label_embedding", ["learned", "momentum"])
def test_tiny_model_learns_masked_prediction(label_embedding):
    # labels in segments of 4 frames; audio and video carry the label of their frame (+ noise); only audio
    # is masked (80%, spans of 10), so masked frames are predictable from the video. No features_pen, to
    # keep the front-end features free to grow in this short run.
    g = torch.Generator().manual_seed(0)
    b, t, k = 4, 24, 5
    labels = torch.randint(0, k, (b, t // 4), generator=g).repeat_interleave(4, dim=1)
    audio = torch.randn(k, 104, generator=g)[labels] + 0.3 * torch.randn(b, t, 104, generator=g)
    audio = audio.transpose(1, 2)
    video = torch.randn(k, HW, HW, generator=g)[labels][:, None]
    video = video + 0.3 * torch.randn(b, 1, t, HW, HW, generator=g)
    lengths = torch.full((b,), t)
    m = model(num_classes=(k,), label_embedding=label_embedding, mask_prob_image=0.0, loss_weights=[]).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    accs, losses = [], []
    for _ in range(50):
        loss, stats = m(audio, video, lengths, [labels])
        opt.zero_grad()
        loss.backward()
        opt.step()
        accs.append(stats["acc_masked"])
        losses.append(stats["loss_masked"])
    assert sum(accs[-5:]) / 5 > 0.6  # chance is about 0.2
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_feature_masking():
    m = model(masking_type="feature", mask_prob_audio=0.5, mask_prob_image=0.5, mask_length_audio=4,
              mask_length_image=4).train()
    assert m.mask_emb.shape == (16,)  # encoder_embed_dim, as the original's feature masking
    audio, video, lengths, labels = batch()
    loss, stats = m(audio, video, lengths, labels)
    loss.backward()
    assert stats["n_masked"] > 0 and m.mask_emb.grad.abs().sum() > 0


def test_config_errors_name_the_key():
    base = {"encoder_conf": ENC, "pretrain_conf": {}, "num_classes": [5]}
    with pytest.raises(ConfigError, match="mask_prob_adio"):
        AVHubertPretrainModel.from_config({**base, "pretrain_conf": {"mask_prob_adio": 0.5}}, "pt.yaml")
    with pytest.raises(ConfigError, match="pt.yaml: decoder_conf: a pretraining model"):
        AVHubertPretrainModel.from_config({**base, "decoder_conf": {}}, "pt.yaml")
    with pytest.raises(ConfigError, match="encoder_conf.*encoder_layer"):
        AVHubertPretrainModel.from_config({**base, "encoder_conf": {"encoder_layer": 2}})
    with pytest.raises(ConfigError, match="num_classes"):
        AVHubertPretrainModel.from_config({"encoder_conf": ENC})
    with pytest.raises(ConfigError, match="num_classes"):
        AVHubertPretrainModel.from_config({**base, "num_classes": [5, 0]})
    for key, value in (("selection_type", "other_seq"), ("masking_type", "both"), ("logit_temp", 0),
                       ("label_embedding", "fixed"), ("loss_weights", [1.0, 2.0]), ("final_dim", -1),
                       ("mask_prob_image", 1.2), ("label_memory_momentum", -0.1)):
        with pytest.raises(ConfigError, match=key):
            AVHubertPretrainModel.from_config({**base, "pretrain_conf": {key: value}}, "pt.yaml")
    with pytest.raises(ConfigError, match="mask_prob_audio"):
        AVHubertPretrainConfig(masking_type="feature")
    assert model(num_classes=(5,), final_dim=0).final_proj.out_features == 16  # 0: encoder_embed_dim
    assert AVHubertPretrainModel.from_config({**base, "num_classes": 5}).num_classes == [5]
