"""Video that does not say the transcript: the encoder's video trust gate (``video_gate``), its training
(``untrusted_video_prob``, ``video_gate_weight``), the search's use of it, and the test sets that measure it
(``avsr-untrusted-video``)."""

import numpy as np
import pytest
import torch

from avsr.config import ConfigError
from avsr.data.datadir import Utterance, read_datadir, write_datadir
from avsr.data.dataset import UNTRUSTED_VIDEO_KINDS, AudioAugment, AVDataset, collate, untrusted_video
from avsr.data.lip_sets import make_lip_set
from avsr.data.media import read_video, write_video, write_wav
from avsr.data.photo_mouth import mouth_openness, photo_mouth
from avsr.decode import DecodeConfig
from avsr.decode.searcher import Searcher
from avsr.encoder import AVHubertEncoder, VideoGate
from avsr.models import AVSRModel
from tests.decoding import searcher
from tests.test_beam_search import TINY_DECODER, TINY_ENCODER
from tests.test_rescore import LENS, _inputs

pytestmark = pytest.mark.usefixtures("one_thread")



def _model(trust_bias: float | None = None, video_gate_weight: float = 0.0, views=("audiovisual",),
           decode_defaults: dict | None = None) -> AVSRModel:
    torch.manual_seed(0)
    enc = dict(TINY_ENCODER, audio_gate=True, video_gate=True, video_gate_hidden=8, video_gate_kernel=3,
               video_gate_max_offset=4)
    model = AVSRModel.from_config(dict(vocab_size=12, encoder_conf=enc, decoder_conf=TINY_DECODER,
                                       model_conf={"ctc_weight": 0.3, "av_batch_views": list(views),
                                                   "video_gate_weight": video_gate_weight},
                                       decode_defaults=decode_defaults)).eval()
    with torch.no_grad():
        model.encoder.audio_gate.proj.weight.normal_(0, 0.5)
        model.encoder.video_gate.proj.weight.normal_(0, 0.5)
        if trust_bias is not None:
            model.encoder.video_gate.proj.weight.zero_()
            model.encoder.video_gate.proj.bias.fill_(trust_bias)
    return model


def test_a_closed_video_gate_gives_exactly_the_audio_only_input():
    model = _model(trust_bias=-80.0)
    audio, video = _inputs()
    with torch.no_grad():
        fused, _ = model.encode(audio, video, LENS)
        alone, _ = model.encode(audio, None, LENS)
    for i, n in enumerate(LENS.tolist()):
        torch.testing.assert_close(fused[i, :n], alone[i, :n], atol=1e-5, rtol=1e-5)


def test_an_open_video_gate_keeps_the_lips_and_the_audio_gate():
    open_model = _model(trust_bias=80.0)
    audio, video = _inputs()
    with torch.no_grad():
        fused, _ = open_model.encode(audio, video, LENS)
        alone, _ = open_model.encode(audio, None, LENS)
        feats = open_model.encoder.encode_video(video, LENS)
        audio_gate, trust = open_model.encoder.gate_means(audio, feats, LENS)
    assert (fused - alone).abs().max() > 1e-2  # the lips change the encoding
    torch.testing.assert_close(trust, torch.ones(3))
    assert float(audio_gate.std()) > 0 and bool((audio_gate < 1).all())


def test_the_gate_means_are_the_gates_fusion_applies_per_utterance():
    model = _model()
    audio, video = _inputs()
    seen = []
    hook = model.encoder.video_gate.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model.encode(audio, video, LENS)
        feats = model.encoder.encode_video(video, LENS)
        _, trust = model.encoder.gate_means(audio, feats, LENS)
    hook.remove()
    gate, logit = seen[0].gate, seen[0].logit
    torch.testing.assert_close(trust, gate[:, 0, 0])
    torch.testing.assert_close(trust, torch.sigmoid(logit))
    assert float(trust.std()) > 0
    # each utterance's gate ignores its padding: alone it is the same
    with torch.no_grad():
        one = model.encoder.gate_means(audio[1:2, :, :10], feats[1:2, :, :10], LENS[1:2])[1]
    torch.testing.assert_close(one, trust[1:2], atol=1e-5, rtol=1e-5)


def test_video_gate_config_is_checked():
    with pytest.raises(ConfigError, match="video_gate_kernel"):
        AVHubertEncoder(**dict(TINY_ENCODER, video_gate=True, video_gate_kernel=4))
    with pytest.raises(ConfigError, match="video_gate_max_offset"):
        AVHubertEncoder(**dict(TINY_ENCODER, video_gate=True, video_gate_max_offset=2))
    with pytest.raises(ConfigError, match="video_gate_weight > 0 needs an encoder with a video gate"):
        AVSRModel.from_config(dict(vocab_size=12, encoder_conf=dict(TINY_ENCODER), decoder_conf=TINY_DECODER,
                                   model_conf={"video_gate_weight": 1.0}))


def test_training_loss_has_the_gate_cross_entropy_and_leaves_untrusted_rows_out_of_the_video_view():
    model = _model(video_gate_weight=0.5, views=("audiovisual", "video")).train()
    audio, video = _inputs()
    ys = torch.tensor([[3, 4, 5], [6, 7, 0], [8, 9, 10]])
    ys_lens = torch.tensor([3, 2, 3])
    trusted = torch.tensor([1.0, 0.0, 1.0])
    assert model.batch_keys[-1] == "video_trusted"
    torch.manual_seed(3)
    loss, stats = model(audio, video, LENS, ys.masked_fill(ys == 0, -1), ys_lens, None, None, None, trusted)
    with torch.no_grad():  # the parts again by hand, in training mode too (the BatchNorm of the batch)
        feats = model.encoder.encode_video(video, LENS)
        (enc, lens), gate = model._encode_with_trust(audio, LENS, feats)
        ys_pad = ys.masked_fill(ys == 0, -1)
        ys_, ys_in, ys_out = model._targets(ys_pad, ys_lens)
        fused, _ = model._loss((enc, lens), ys_, ys_lens, ys_in, ys_out)
        rows = torch.tensor([0, 2])
        ys_r, ys_in_r, ys_out_r = model._targets(ys_pad[rows], ys_lens[rows])
        video_only = model._loss(model.encode(None, None, LENS[rows], video_features=feats[rows]), ys_r,
                                 ys_lens[rows], ys_in_r, ys_out_r)[0]
        bce = torch.nn.functional.binary_cross_entropy_with_logits(gate.logit, trusted)
        # the contrastive loss: offset 0 (index K = 4) among the valid offsets of every frame of rows 0 and 2
        nce = []
        for i in (0, 2):
            for t in range(int(LENS[i])):
                z = (gate.similarity[i, t] / 0.1).masked_fill(~gate.valid[i, t], float("-inf"))
                nce.append(-torch.log_softmax(z, 0)[4])
        nce = torch.stack(nce).mean()
    torch.testing.assert_close(stats["loss_trust"], bce, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["loss_sync"], nce, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(loss.detach(), fused + video_only + 0.5 * (bce + nce), atol=1e-4, rtol=1e-4)


def _frames(t: int = 30, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (t, 24, 24), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("kind", UNTRUSTED_VIDEO_KINDS)
def test_untrusted_video_keeps_the_length_and_loses_the_lips(kind):
    video, other = _frames(30), _frames(11, seed=1)
    g = torch.Generator().manual_seed(0)
    out = untrusted_video(video, kind, g, other)
    assert out.shape == video.shape and out.dtype == torch.uint8
    assert not torch.equal(out, video)
    if kind == "other":
        assert torch.equal(out[:11], other) and torch.equal(out[11:22], other)
    elif kind == "photo":  # the photograph's mouth at the video's size, not the video's own frames
        assert float((out.float() - video.float()).abs().mean()) > 20
    elif kind == "frozen":
        assert bool((out == out[0]).all()) and any(torch.equal(out[0], f) for f in video)
    elif kind == "shift":
        step = next(s for s in range(-25, 26) if torch.equal(out, torch.roll(video, s, 0)))
        assert 10 <= abs(step) <= 25
    else:  # blur: the mean brightness stays, the detail goes
        assert abs(out.float().mean() - video.float().mean()) < 3
        assert out.float().diff(dim=2).abs().mean() < 0.3 * video.float().diff(dim=2).abs().mean()
    with pytest.raises(ValueError, match="kind"):
        untrusted_video(video, "sideways", g)


def _corpus(root, n=6, frames=20):
    utts = []
    for i in range(n):
        spk = f"s{i % 3}"
        uid = f"{spk}_u{i}"
        wav, mp4 = root / f"{uid}.wav", root / f"{uid}.mp4"
        write_wav(wav, torch.randn(frames * 640) * 0.1)
        write_video(mp4, np.full((frames, 96, 96), 20 * i, dtype=np.uint8))
        utts.append(Utterance(uid, spk, str(wav), str(mp4), "A B", frames))
    return utts


def test_untrusted_video_in_training_marks_its_items_and_only_in_audio_visual_batches(tmp_path):
    utts = _corpus(tmp_path)
    aug = AudioAugment(untrusted_video_prob=0.5, untrusted_video_kinds=("other",))
    ds = AVDataset(utts, train=True, audio_augment=aug)
    items = [ds[(i, "audiovisual", e)] for e in range(6) for i in range(len(utts))]
    flags = [it["video_trusted"] for it in items]
    assert 0.25 < flags.count(False) / len(flags) < 0.75
    assert all(ds[(i, "video", 0)]["video_trusted"] is True for i in range(len(utts)))
    own = AVDataset(utts, train=True)
    for e in range(6):  # an untrusted item shows the mouth of another speaker (a constant grey per utterance)
        for i in range(len(utts)):
            it = ds[(i, "audiovisual", e)]
            mine = own[(i, "audiovisual", e)]["video"]
            changed = not torch.allclose(it["video"].mean(), mine.mean(), atol=0.05)
            assert changed == (not it["video_trusted"])
    batch = collate([ds[(i, "audiovisual", 1)] for i in range(len(utts))])
    assert batch["video_trusted"].tolist() == [float(ds[(i, "audiovisual", 1)]["video_trusted"])
                                               for i in range(len(utts))]
    assert collate([own[(i, "audiovisual", 1)] for i in range(len(utts))])["video_trusted"] is None
    with pytest.raises(ValueError, match="untrusted_video_prob"):
        AudioAugment(untrusted_video_prob=1.5).check()


def test_a_model_that_does_not_trust_the_lips_decodes_audio_visual_input_as_audio(tmp_path):
    audio, video = _inputs()
    cfg = DecodeConfig(beam_size=4, ctc_weight=0.3, maxlenratio=-4.0, video_weight=1.0, audio_weight=3.0,
                       audio_confidence=2.0)
    closed = _model(trust_bias=-80.0)
    both, _, _, _, gates = Searcher(closed, cfg).decode(audio, video, LENS)
    alone = Searcher(closed, cfg).decode(audio, None, LENS)[0]
    assert [h[0].tokens for h in both] == [h[0].tokens for h in alone]
    assert gates["video_trust"].max() < 1e-6 and gates["audio_gate"].min() > 1 - 1e-6  # what fusion did
    opened = _model(trust_bias=80.0)
    scores = [[h[0].score for h in Searcher(opened, cfg).decode(audio, v, LENS)[0]] for v in (video, None)]
    assert max(abs(a - b) for a, b in zip(*scores)) > 1e-3  # open: the lips count


def test_untrusted_test_sets_keep_the_audio_and_length_and_resume(tmp_path):
    src = tmp_path / "test"
    utts = _corpus(tmp_path, frames=12)
    write_datadir(src, utts)
    out = make_lip_set(src, tmp_path / "test_other_lips", "other_lips")
    donors = dict(line.split() for line in (tmp_path / "test_other_lips" / "donors").read_text().splitlines())
    by_id = {u.utt_id: u for u in utts}
    for u in out:
        assert u.wav == by_id[u.utt_id].wav and u.text == by_id[u.utt_id].text
        assert by_id[donors[u.utt_id]].speaker != u.speaker
        frames = read_video(u.video)
        assert frames.shape[0] == 12
        assert abs(float(frames.float().mean()) - 20 * int(donors[u.utt_id].split("_u")[1])) < 3
    frozen = make_lip_set(src, tmp_path / "test_frozen_mouth", "frozen_mouth")
    assert all(read_video(u.video).float().std(dim=0).max() < 3 for u in frozen)
    stamp = {u.utt_id: (tmp_path / "test_frozen_mouth" / "media" / f"{u.utt_id}.mp4").stat().st_mtime_ns
             for u in frozen}
    again = make_lip_set(src, tmp_path / "test_frozen_mouth", "frozen_mouth")
    assert [u.utt_id for u in again] == [u.utt_id for u in read_datadir(tmp_path / "test_frozen_mouth")]
    assert all((tmp_path / "test_frozen_mouth" / "media" / f"{u}.mp4").stat().st_mtime_ns == t
               for u, t in stamp.items())
    with pytest.raises(ValueError, match="other_lips"):
        make_lip_set(src, tmp_path / "x", "sideways")


def test_the_photo_mouth_opens_with_the_utterance_mouth():
    rendered = torch.full((5, 96, 96), 120, dtype=torch.uint8)
    for i, half in enumerate([1, 3, 6, 10, 3]):  # a dark mouth of growing height, then closing
        rendered[i, 48 - half : 48 + half, 30:66] = 30
    openness = mouth_openness(rendered)
    assert openness.tolist() == pytest.approx([0.0, 2 / 9, 5 / 9, 1.0, 2 / 9], abs=0.02)
    frames = photo_mouth(openness)
    assert frames.shape == (5, 96, 96) and frames.dtype == torch.uint8
    dark = (frames[:, 44:64, 30:66] == 40).float().mean(dim=(1, 2))
    assert dark[0] < dark[1] < dark[2] < dark[3] and dark[4] == dark[1]  # the open mouth's dark inside
    torch.testing.assert_close(frames[:, :40], frames[0:1, :40].expand(5, -1, -1))  # above the lips: still
    assert bool((mouth_openness(rendered[:1].expand(4, -1, -1)) == 0).all())
    with pytest.raises(ValueError, match="openness"):
        photo_mouth(openness[None])


def test_the_photo_lips_set_moves_the_photograph_with_each_utterance(tmp_path):
    src = tmp_path / "test"
    utts = _corpus(tmp_path, n=2, frames=10)
    write_datadir(src, utts)
    out = make_lip_set(src, tmp_path / "test_photo_lips", "photo_lips")
    frames = read_video(out[0].video)
    assert frames.shape == (10, 96, 96) and out[0].wav == utts[0].wav
    assert abs(float(frames.float().mean()) - float(photo_mouth(torch.zeros(1)).float().mean())) < 3


def _sync_gate(hidden: int = 4) -> VideoGate:
    """A gate whose embeddings pass the first ``hidden`` feature channels through, and whose logit is its
    first feature (offset 0 against the mean of the others) -- the evidence without training."""
    gate = VideoGate(8, hidden=hidden, kernel=1, max_offset=5)
    with torch.no_grad():
        for emb in (gate.embed_audio, gate.embed_video):
            emb[0].weight.zero_()
            emb[0].bias.fill_(10.0)  # GELU of x + 10 is about x + 10: linear
            emb[0].weight[:hidden, :hidden, 0] = torch.eye(hidden)
            emb[2].weight.zero_()
            emb[2].bias.fill_(-10.0)
            emb[2].weight[:, :, 0] = torch.eye(hidden)
        gate.proj.weight.copy_(torch.tensor([[1.0, 0.0]]))
        gate.proj.bias.fill_(-0.5)
    return gate


def test_the_video_gate_compares_the_streams_at_each_offset_and_trusts_lips_in_sync():
    g = torch.Generator().manual_seed(0)
    t = 40
    speech = torch.randn(3, 8, t, generator=g)  # each utterance's own content
    audio = speech.clone()
    video = torch.stack([speech[0], torch.roll(speech[1], 8, 1), speech[2, :, :1].expand(8, t)])
    gate = _sync_gate()
    with torch.no_grad():
        trust = gate(audio, video, None)
    k = 5
    # the similarity of frame t with the video frame t + j - K, exactly
    torch.testing.assert_close(trust.similarity[0, 10, k], torch.tensor(1.0), atol=1e-4, rtol=0)
    a = torch.nn.functional.normalize(speech[0, :4, 10], dim=0)
    v = torch.nn.functional.normalize(speech[0, :4, 12], dim=0)
    torch.testing.assert_close(trust.similarity[0, 10, k + 2], a @ v, atol=1e-4, rtol=1e-4)
    assert not bool(trust.valid[0, 2, 0]) and bool(trust.valid[0, 5, 0]) and not bool(trust.valid[0, 38, -1])
    # in sync: trusted; lips 8 frames late and a frozen mouth: not
    assert trust.gate[0, 0, 0] > 0.9 and trust.gate[1, 0, 0] < 0.5 and trust.gate[2, 0, 0] < 0.5
    # babble over the audio lowers every similarity, but offset 0 still stands out
    noisy = audio + 1.5 * torch.randn(audio.shape, generator=g)
    with torch.no_grad():
        assert gate(noisy, video, None).gate[0, 0, 0] > 0.6
    # padding is ignored: the first utterance alone, padded, gives the same gate
    zeros = torch.zeros(1, 8, 10)
    padded = torch.cat([audio[:1], zeros], 2), torch.cat([video[:1], zeros], 2)
    mask = torch.arange(t + 10)[None] >= t
    with torch.no_grad():
        torch.testing.assert_close(gate(*padded, mask).logit, trust.logit[:1], atol=1e-5, rtol=1e-5)


def test_the_sync_margin_is_offset_zero_against_the_far_offsets_and_a_decision_replaces_the_gate():
    g = torch.Generator().manual_seed(1)
    speech = torch.randn(2, 8, 30, generator=g)
    video = torch.stack([speech[0], torch.roll(speech[1], 8, 1)])
    gate = _sync_gate().eval()
    with torch.no_grad():
        trust = gate(speech, video, None)
    # the logit of _sync_gate is 10 * margin - 0.5
    torch.testing.assert_close(trust.margin, (trust.logit + 0.5) / 10, atol=1e-5, rtol=1e-5)
    assert trust.margin[0] > 0.5 > trust.margin[1]
    with torch.no_grad():
        decided = gate(speech, video, None, torch.tensor([0.0, 1.0]))
    assert decided.gate.flatten().tolist() == [0.0, 1.0]
    torch.testing.assert_close(decided.margin, trust.margin)


def test_the_search_uses_the_lips_whole_or_not_at_all_by_their_sync_margin():
    audio, video = _inputs()
    base = dict(beam_size=4, ctc_weight=0.3, maxlenratio=-4.0, video_weight=1.0, audio_weight=3.0,
                audio_confidence=2.0)
    model = _model(trust_bias=0.0)  # a soft gate of 0.5: neither the lips nor the audio alone

    def decode(v, **rule):
        hyps, _, _, _, gates = Searcher(model, DecodeConfig(**base, **rule)).decode(audio, v, LENS)
        return [h[0].tokens for h in hyps], [h[0].score for h in hyps], gates

    alone = decode(None)[0]
    never = decode(video, video_sync_margin=2.0)
    assert never[0] == alone and never[2]["video_trust"].tolist() == [0.0] * len(LENS)
    always = decode(video, video_sync_margin=-2.0)
    assert always[2]["video_trust"].tolist() == [1.0] * len(LENS)
    soft = decode(video)
    assert soft[2]["video_trust"].min() < 0.9 and "video_sync" not in soft[2]
    assert max(abs(a - b) for a, b in zip(always[1], soft[1])) > 1e-3
    # the bar: margin >= video_sync_margin + video_sync_slope * q, per utterance
    margin, q = always[2]["video_sync"], always[2]["audio_ctc_confidence"]
    assert bool((q <= 0).all()) and margin.shape == q.shape == (len(LENS),)
    evidence = margin - 0.5 * q
    bar = float(evidence.min() + evidence.max()) / 2
    split = decode(video, video_sync_margin=bar, video_sync_slope=0.5)
    used = (margin >= bar + 0.5 * q).float()
    assert split[2]["video_trust"].tolist() == used.tolist() and 0 < used.sum() < len(LENS)
    for i, u in enumerate(used.tolist()):
        assert split[0][i] == (always if u else never)[0][i]


def test_the_sync_rule_comes_from_the_config_or_the_model_and_needs_a_ctc_head():
    assert DecodeConfig().sync_rule({"video_sync_margin": 0.2}) == (0.2, 0.0)
    own = DecodeConfig(video_sync_slope=2.0)
    assert own.sync_rule({"video_sync_margin": 0.2, "video_sync_slope": 1}) == (0.2, 2.0)
    assert DecodeConfig().sync_rule(None) is None
    with pytest.raises(ConfigError, match="video_sync_margin"):
        DecodeConfig(video_sync_margin=5.0)
    model = _model(decode_defaults={"video_sync_margin": 0.1, "video_sync_slope": 1.0})
    assert searcher(model, DecodeConfig()).sync_rule == (0.1, 1.0)  # the checkpoint's decode section
    assert Searcher(model, DecodeConfig()).sync_rule is None  # the model itself holds no defaults
    model.ctc_lo = None
    with pytest.raises(ValueError, match="video_sync_margin"):
        searcher(model, DecodeConfig())


def test_the_video_views_entropy_is_a_second_condition_of_the_decision():
    audio, video = _inputs()
    base = dict(beam_size=4, ctc_weight=0.3, maxlenratio=-4.0, video_weight=1.0, audio_weight=3.0,
                audio_confidence=2.0, video_sync_margin=-2.0)  # the margin alone: lips always used
    model = _model(trust_bias=0.0)

    def decode(v, **rule):
        result = Searcher(model, DecodeConfig(**base, **rule)).decode(audio, v, LENS)
        return [h[0].tokens for h in result.hypotheses], result.gates, result.views

    alone = decode(None)[0]
    always, gates, views = decode(video, video_max_entropy=1e6)
    assert gates["video_trust"].tolist() == [1.0] * len(LENS)
    # the entropy: of the video-only view's CTC posteriors, mean over each utterance's frames, in nats
    with torch.no_grad():
        enc_v, _ = model.encode(None, None, LENS, model.encode_video(video, LENS))
        logp = model.ctc_log_probs(enc_v).double()
    expected = [float(-(logp[i, :n].exp() * logp[i, :n]).sum(-1).mean()) for i, n in enumerate(LENS.tolist())]
    entropy = gates["video_ctc_entropy"]
    assert entropy.tolist() == pytest.approx(expected, rel=1e-4)
    assert bool((entropy > 0).all()) and bool((entropy <= np.log(logp.shape[-1]) + 1e-6).all())
    bar = float(entropy.min() + entropy.max()) / 2
    split, split_gates, split_views = decode(video, video_max_entropy=bar)
    used = (entropy <= bar).float()
    assert 0 < used.sum() < len(LENS) and split_gates["video_trust"].tolist() == used.tolist()
    for i, u in enumerate(used.tolist()):
        assert split[i] == (always if u else alone)[i]
    # the video-only view computed for the check is the one the ranking searches
    assert [h[0].tokens for h in split_views["video"]] == [h[0].tokens for h in views["video"]]
    none = decode(video, video_max_entropy=0.0)
    assert none[0] == alone and "video_sync" in none[1]


def test_the_entropy_bar_comes_from_the_config_or_the_model_and_needs_the_margin():
    assert DecodeConfig().entropy_bar({"video_max_entropy": 0.25}) == 0.25
    assert DecodeConfig(video_max_entropy=0.5).entropy_bar({"video_max_entropy": 0.25}) == 0.5
    assert DecodeConfig().entropy_bar(None) is None
    with pytest.raises(ConfigError, match="video_max_entropy"):
        DecodeConfig(video_max_entropy=-1.0)
    model = _model(decode_defaults={"video_sync_margin": 0.1, "video_max_entropy": 0.3})
    assert searcher(model, DecodeConfig()).video_max_entropy == 0.3
    with pytest.raises(ValueError, match="video_max_entropy 0.3 is a condition"):
        searcher(model, DecodeConfig(), defaults={"video_max_entropy": 0.3})
