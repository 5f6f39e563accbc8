"""Data dirs, tokenizer, noise mixing, datasets, batching: behaviour and error messages."""

import math
import zlib

import numpy as np
import pytest
import torch

from avsr.config import ConfigError, from_dict, load_yaml
from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_datadir
from avsr.data.dataset import (
    AudioAugment,
    AVDataset,
    BucketBatchSampler,
    DataError,
    EpochKeyedBatches,
    LabelSet,
    ModalityBatchSampler,
    NoiseConfig,
    collate,
)
from avsr.data.media import MediaError, read_wav, write_video, write_wav
from avsr.data.noise import NoiseSource, mix_at_snr
from avsr.data.tokenizer import Tokenizer, train_sentencepiece
from avsr.features import VIDEO_MEAN, VIDEO_STD, avhubert_audio_features, narrowband

WORDS = (
    "BIN LAY PLACE SET BLUE GREEN RED WHITE AT BY IN WITH A B C ONE TWO THREE AGAIN NOW PLEASE SOON".split()
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 6)) for _ in range(300)]
    model = train_sentencepiece(texts, tmp_path_factory.mktemp("tok") / "bpe", vocab_size=30)
    return Tokenizer(model)


def make_utt(root, utt_id, frames=10, wav_frames=None, text="BIN BLUE AT A ONE NOW", sr=16000):
    wav_frames = frames if wav_frames is None else wav_frames
    rng = np.random.default_rng(zlib.crc32(utt_id.encode()))  # the same data in every process
    wav = root / f"{utt_id}.wav"
    mp4 = root / f"{utt_id}.mp4"
    write_wav(
        wav, (rng.standard_normal(wav_frames * 640 * sr // 16000) * 0.1).astype(np.float32), sample_rate=sr
    )
    write_video(mp4, rng.integers(0, 255, (frames, 96, 96), dtype=np.uint8), fps=25)
    return Utterance(
        utt_id=utt_id,
        speaker=utt_id.split("_")[0],
        wav=str(wav),
        video=str(mp4),
        text=text,
        num_frames=frames,
    )


def test_tokenizer_round_trip_and_espnet_layout(tokenizer):
    assert tokenizer.token_list[0] == "<blank>" and tokenizer.token_list[1] == "<unk>"
    assert tokenizer.token_list[-1] == "<sos/eos>"
    ids = tokenizer.encode("SET WHITE BY C THREE SOON")
    assert all(0 < i < tokenizer.sos_eos_id for i in ids)
    assert tokenizer.decode(ids) == "SET WHITE BY C THREE SOON"
    assert tokenizer.decode([0, *ids, tokenizer.sos_eos_id]) == "SET WHITE BY C THREE SOON"


def test_tokenizer_refuses_empty_text_and_names_characters_it_cannot_encode(tokenizer):
    from avsr.data.tokenizer import TokenizerError

    for empty in ("", "   "):
        with pytest.raises(TokenizerError, match=r"^data/text: utterance 'u1': empty transcript"):
            tokenizer.encode(empty, "data/text: utterance 'u1'")
    # sentencepiece maps characters it never saw to <unk>: allowed by default, named when refused
    assert 1 in tokenizer.encode("BIN BL\u00c9 AT")
    assert tokenizer.unknown_chars("BIN BL\u00c9 \u00c9T \u00df") == ["\u00c9", "\u00df"]
    assert tokenizer.unknown_chars("BIN BLUE AT") == []
    with pytest.raises(TokenizerError) as err:
        tokenizer.encode("BIN BL\u00c9 AT", "utterance 'u2'", allow_unknown=False)
    message = str(err.value)
    assert message.startswith("utterance 'u2': characters the tokenizer") and "'\u00c9' (U+00C9)" in message
    assert tokenizer.encode("BIN BLUE AT", allow_unknown=False) == tokenizer.encode("BIN BLUE AT")
    with pytest.raises(TokenizerError) as err:
        tokenizer.check_texts({"u1": "BIN BLUE", "u2": "LAY \u00c9", "u3": "", "u4": "SET"}, "data/tr/text")
    message = str(err.value)
    assert message.startswith("data/tr/text: utterance 'u2': characters") and "(2 utterances" in message
    tokenizer.check_texts({"u1": "BIN BLUE"}, "data/train/text")


def test_tokenizer_tool_refuses_empty_and_non_utf8_text_in_one_line(tmp_path, capsys):
    from avsr.bin.tokenizer import main

    (tmp_path / "empty").write_text("")
    (tmp_path / "latin1").write_bytes("s-1 BIN BLUE\ns-2 LAY R\u00c9D\n".encode("latin-1"))
    for name, named in (("empty", "empty: no transcripts"),
                        ("latin1", "latin1:2: utterance 's-2' is not UTF-8")):
        capsys.readouterr()
        argv = ["--text", str(tmp_path / name), "--out", str(tmp_path / "tok"), "--vocab-size", "20"]
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("avsr-tokenizer: error: ") and named in err, err


def test_datadir_round_trip_sorted(tmp_path):
    utts = [
        Utterance("s2_b", "s2", wav="/x/b.wav", video="/x/b.mp4", text="B", num_frames=3),
        Utterance("s1_a", "s1", wav="/x/a.wav", video="/x/a.mp4", text="A  B", num_frames=5),
    ]
    write_datadir(tmp_path / "d", utts)
    back = read_datadir(tmp_path / "d")
    assert [u.utt_id for u in back] == ["s1_a", "s2_b"]
    assert back[0].text == "A  B" and back[0].num_frames == 5 and back[1].video == "/x/b.mp4"
    assert (tmp_path / "d" / "spk2utt").read_text() == "s1 s1_a\ns2 s2_b\n"


def test_datadir_errors_name_file_and_utterance(tmp_path):
    utts = [
        Utterance("s1_a", "s1", wav="/a.wav", video="/a.mp4", text="A"),
        Utterance("s1_b", "s1", wav="/b.wav", video="/b.mp4", text="B"),
    ]
    write_datadir(tmp_path, utts)
    (tmp_path / "video.scp").write_text("s1_a /a.mp4\n")
    with pytest.raises(DataDirError, match=r"video\.scp.*s1_b"):
        read_datadir(tmp_path)
    write_datadir(tmp_path, utts)
    (tmp_path / "text").write_text("s1_a A\ns1_b\n")
    with pytest.raises(DataDirError, match=r"text.*s1_b.*empty transcript"):
        read_datadir(tmp_path)
    with pytest.raises(DataDirError, match="speaker"):
        write_datadir(tmp_path / "x", [Utterance("a_1", "b", wav="/a.wav", text="A")])


def test_mix_at_snr_hits_the_requested_ratio():
    g = torch.Generator().manual_seed(0)
    speech, noise = torch.randn(16000, generator=g), torch.randn(16000, generator=g) * 3
    for snr in (-5.0, 0.0, 10.0):
        mixed = mix_at_snr(speech, noise, snr)
        achieved = 10 * math.log10(speech.pow(2).mean() / (mixed - speech).pow(2).mean())
        assert abs(achieved - snr) < 1e-3


def test_noise_source_fixed_segments_are_reproducible(tmp_path):
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32) * 0.1)
    src = NoiseSource(tmp_path / "n.wav")
    speech = torch.randn(5000) * 0.1
    assert torch.equal(src.mix(speech, 0.0, key="utt1"), src.mix(speech, 0.0, key="utt1"))
    assert not torch.equal(src.mix(speech, 0.0, key="utt1"), src.mix(speech, 0.0, key="utt2"))
    write_wav(tmp_path / "silent.wav", np.zeros(100, dtype=np.float32))
    with pytest.raises(ValueError, match="silent"):
        NoiseSource(tmp_path / "silent.wav")


def test_dataset_items_and_collate(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, "s1_a", 10), make_utt(tmp_path, "s1_b", 7, text="SET RED BY B TWO SOON")]
    ds = AVDataset(utts, tokenizer)
    item = ds[1]
    assert item["audio"].shape == (7, 104) and item["video"].shape == (7, 88, 88)
    assert tokenizer.decode(item["tokens"].tolist()) == "SET RED BY B TWO SOON"
    batch = collate([ds[0], ds[1]])
    assert batch["audio"].shape == (2, 104, 10) and batch["video"].shape == (2, 1, 10, 88, 88)
    assert batch["lengths"].tolist() == [10, 7]
    assert torch.equal(batch["video"][1, 0, 7:], torch.zeros(3, 88, 88))
    assert (batch["ys_pad"][batch["ys_pad"] >= 0].numel()) == int(batch["ys_lens"].sum())


def test_dataset_noise_changes_audio_only(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, "s1_a", 10)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    clean = AVDataset(utts, tokenizer)[0]
    noisy = AVDataset(
        utts, tokenizer, noise=NoiseConfig(NoiseSource(tmp_path / "n.wav"), snr_db=[-5.0], fixed=True)
    )[0]
    assert not torch.allclose(clean["audio"], noisy["audio"])
    assert torch.equal(clean["video"], noisy["video"])


def test_audio_augment_changes_training_audio_only_and_is_reproducible(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, "s1_a", 10)]
    aug = AudioAugment(freq_warp=(0.9, 1.1), num_freq_mask=1, freq_mask_width=3)
    plain = AVDataset(utts, tokenizer, train=True)[0]
    ds = AVDataset(utts, tokenizer, train=True, audio_augment=aug)
    first, again = ds[0], ds[0]
    assert not torch.allclose(plain["audio"], first["audio"])
    assert torch.equal(first["audio"], again["audio"]) and torch.equal(plain["video"], first["video"])
    ds.set_epoch(1)
    assert not torch.equal(ds[0]["audio"], first["audio"])  # a new draw each epoch
    evaluation = AVDataset(utts, tokenizer, audio_augment=aug)[0]  # train=False: no augmentation
    assert torch.equal(evaluation["audio"], AVDataset(utts, tokenizer)[0]["audio"])
    with pytest.raises(ValueError, match="freq_warp"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(freq_warp=(1.1, 0.9)))


def test_speed_perturbation_changes_both_streams_together_and_is_reproducible(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, f"s1_{i}", 20) for i in range(4)]
    labels = {u.utt_id: torch.arange(20) for u in utts}  # 25 Hz frame labels: frame i -> label i
    label_set = LabelSet("frames.km", labels, label_rate=25.0, num_classes=20)
    aug = AudioAugment(speed_factors=(0.9, 1.1))
    ds = AVDataset(utts, tokenizer, train=True, audio_augment=aug, label_sets=[label_set])
    factor_of = {round(20 / 0.9): 0.9, round(20 / 1.1): 1.1}  # 22 and 18 frames
    lengths = set()
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            item = ds[i]
            t = item["video"].shape[0]
            lengths.add(t)
            assert t in factor_of and item["audio"].shape == (t, 104)
            # the labels follow the video frames they belong to
            expected = (torch.arange(t) * factor_of[t]).floor().long().clamp(max=19)
            assert torch.equal(item["labels"][0], expected)
    assert lengths == {round(20 / 0.9), round(20 / 1.1)}  # both factors were drawn
    ds.set_epoch(1)
    first = ds[0]
    assert torch.equal(first["audio"], ds[0]["audio"]) and torch.equal(first["video"], ds[0]["video"])
    evaluation = AVDataset(utts, tokenizer, audio_augment=aug)[0]  # train=False: no perturbation
    assert evaluation["video"].shape[0] == 20
    with pytest.raises(ValueError, match="speed_perturb"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(speed_factors=(0.9, 0.0)))


def test_duration_mismatch_is_an_error_naming_the_utterance(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, "s1_bad", frames=10, wav_frames=20)]
    with pytest.raises(DataError, match=r"s1_bad.*20\.0 frames.*10 frames"):
        AVDataset(utts, tokenizer)[0]


def test_wrong_rate_missing_and_corrupt_media_are_errors(tmp_path, tokenizer):
    u = make_utt(tmp_path, "s1_sr", frames=5, sr=8000)
    with pytest.raises(MediaError, match=r"s1_sr\.wav.*8000"):
        AVDataset([u], tokenizer)[0]
    u = make_utt(tmp_path, "s1_gone", frames=5)
    (tmp_path / "s1_gone.mp4").unlink()
    with pytest.raises(MediaError, match=r"s1_gone\.mp4"):
        AVDataset([u], tokenizer)[0]
    u = make_utt(tmp_path, "s1_corrupt", frames=5)
    (tmp_path / "s1_corrupt.mp4").write_bytes(b"\x00\x01 not an mp4" * 10)
    with pytest.raises(MediaError, match=r"s1_corrupt\.mp4"):
        AVDataset([u], tokenizer)[0]


def test_empty_transcript_is_an_error(tmp_path, tokenizer):
    u = make_utt(tmp_path, "s1_e", frames=5, text="")
    with pytest.raises(DataError, match="s1_e.*empty transcript"):
        AVDataset([u], tokenizer)[0]


def test_a_transcript_with_characters_the_tokenizer_cannot_encode_is_an_error(tmp_path, tokenizer):
    from avsr.data.tokenizer import TokenizerError

    u = make_utt(tmp_path, "s1_u", frames=5, text="BIN BL\u00c9 AT")
    with pytest.raises(TokenizerError, match=r"utterance 's1_u': characters .* '\u00c9' \(U\+00C9\)"):
        AVDataset([u], tokenizer, train=True)[0]  # a training target cannot hold <unk>
    assert 1 in AVDataset([u], tokenizer)[0]["tokens"].tolist()  # validation text may: <unk> in its loss
    texts = {"a": "BIN BLUE AT", "b": "BIN BL\u00c9 AT", "c": "\u00c9T"}
    message = tokenizer.check_texts(texts, "data/valid/text", strict=False)
    assert message.startswith("data/valid/text: utterance 'b': characters") and "(2 utterances" in message
    with pytest.raises(TokenizerError, match="data/train/text: utterance 'b'.*2 utterances of data/train"):
        tokenizer.check_texts(texts, "data/train/text")
    assert tokenizer.check_texts({"a": "BIN BLUE AT"}, "x", strict=False) is None
    with pytest.raises(TokenizerError, match="empty"):  # empty text is refused even when not strict
        tokenizer.check_texts({"a": " "}, "x", strict=False)


def test_bucket_sampler_respects_budget_and_is_reproducible():
    lengths = list(np.random.default_rng(0).integers(20, 80, 200))
    s = BucketBatchSampler(lengths, max_frames=400, seed=3)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(lengths[i] for i in b) <= 400 for b in batches)
    s2 = BucketBatchSampler(lengths, max_frames=400, seed=3)
    assert list(s2) == batches
    s2.set_epoch(1)
    assert list(s2) != batches
    r0 = BucketBatchSampler(lengths, 400, seed=3, num_replicas=2, rank=0)
    r1 = BucketBatchSampler(lengths, 400, seed=3, num_replicas=2, rank=1)
    assert len(r0) == len(r1) and not {i for b in r0 for i in b} & {i for b in r1 for i in b}
    with pytest.raises(ValueError, match="max_frames"):
        BucketBatchSampler([500], max_frames=400)


def test_modality_sampler_draws_as_av_hubert_and_is_reproducible():
    buckets = BucketBatchSampler(list(np.random.default_rng(0).integers(20, 80, 4000)), max_frames=80, seed=1)
    s = ModalityBatchSampler(buckets, modality_dropout=0.85, audio_dropout=0.15, seed=1)
    tagged = list(s)
    assert len(tagged) == len(buckets) == len(s)
    assert [[i for i, _ in b] for b in tagged] == list(buckets)  # the wrapped batches, unchanged
    assert all(len({m for _, m in b}) == 1 for b in tagged)  # one draw per batch
    share = {m: sum(b[0][1] == m for b in tagged) / len(tagged) for m in ("audiovisual", "audio", "video")}
    n = len(tagged)  # expected 0.15, 0.85 * 0.85, 0.85 * 0.15; 4 standard deviations
    for m, p in (("audiovisual", 0.15), ("audio", 0.7225), ("video", 0.1275)):
        assert abs(share[m] - p) < 4 * math.sqrt(p * (1 - p) / n), (m, share[m])
    again = ModalityBatchSampler(buckets, 0.85, 0.15, seed=1)
    again.set_epoch(0)
    assert list(again) == tagged
    again.set_epoch(1)
    assert [b[0][1] for b in again] != [b[0][1] for b in tagged] and buckets.epoch == 1
    assert {b[0][1] for b in ModalityBatchSampler(buckets, 0.0, 0.5)} == {"audiovisual"}
    assert {b[0][1] for b in ModalityBatchSampler(buckets, 1.0, 1.0)} == {"video"}
    with pytest.raises(ValueError, match="audio_dropout"):
        ModalityBatchSampler(buckets, 0.5, 1.5)


def test_batch_modality_loads_only_its_streams_with_its_noise_probability(tmp_path, tokenizer):
    utts = [make_utt(tmp_path, "s1_a", 10), make_utt(tmp_path, "s1_b", 7)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    noise = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[0.0], prob_audio_only=0.0)
    clean = AVDataset(utts, tokenizer, train=True)
    noisy = AVDataset(utts, tokenizer, train=True, noise=noise)
    audio_only = noisy[(0, "audio")]
    assert audio_only["video"] is None and torch.equal(audio_only["audio"], clean[0]["audio"])
    av = noisy[(0, "audiovisual")]
    assert not torch.allclose(av["audio"], clean[0]["audio"]) and av["video"].shape == (10, 88, 88)
    video_only = noisy[(1, "video")]
    assert video_only["audio"] is None and video_only["video"].shape == (7, 88, 88)
    assert torch.equal(video_only["tokens"], clean[1]["tokens"])
    batch = collate([noisy[(0, "audio")], noisy[(1, "audio")]])
    assert batch["video"] is None and batch["audio"].shape == (2, 104, 10)
    with pytest.raises(ValueError, match="batch modality"):
        noisy[(0, "lips")]
    with pytest.raises(ValueError, match="loads only"):
        AVDataset(utts, tokenizer, modalities=("audio",))[(0, "video")]



def test_av_mismatch_gives_audio_visual_items_another_speakers_audio_reproducibly(tmp_path, tokenizer):
    """av_mismatch_prob: an item of an audio-visual batch gets the waveform of another speaker's utterance,
    repeated or cut to its length (its video and tokens stay its own); audio-only batches, items without a
    batch modality and evaluation never do; the draws are a function of (seed, epoch, index), and a
    mismatched item's features never enter the clean-feature cache."""
    utts = [make_utt(tmp_path, "s1_a", 10), make_utt(tmp_path, "s1_b", 9, text="SET RED BY B TWO SOON"),
            make_utt(tmp_path, "s2_c", 4), make_utt(tmp_path, "s3_d", 12)]
    plain = AVDataset(utts, tokenizer)
    own = [plain[i]["audio"] for i in range(len(utts))]
    always = AVDataset(utts, tokenizer, train=True, audio_augment=AudioAugment(av_mismatch_prob=1.0))
    for i, u in enumerate(utts):
        item = always[(i, "audiovisual")]
        assert torch.equal(item["video"], AVDataset(utts, tokenizer, train=True)[(i, "audiovisual")]["video"])
        assert torch.equal(item["tokens"], plain[i]["tokens"]) and item["audio"].shape == own[i].shape
        others = [j for j, v in enumerate(utts) if v.speaker != u.speaker]
        # the features of another speaker's waveform, repeated or cut to this utterance's length
        n = read_wav(u.wav).numel()
        candidates = [avhubert_audio_features(w.repeat(-(-n // w.numel()))[:n], num_video_frames=u.num_frames)
                      for w in (read_wav(utts[j].wav) for j in others)]
        assert any(torch.equal(item["audio"], c) for c in candidates), u.utt_id
        assert torch.equal(always[(i, "audio")]["audio"], own[i])  # audio-only batch: its own audio
        assert torch.equal(always[i]["audio"], own[i])  # no batch modality: its own audio
    assert always._feat_cache.keys() <= {0, 1, 2, 3}
    for i, feats in always._feat_cache.items():
        assert torch.equal(feats, own[i])  # only the own, clean audio is ever cached
    evaluation = AVDataset(utts, tokenizer, audio_augment=AudioAugment(av_mismatch_prob=1.0))
    assert torch.equal(evaluation[(0, "audiovisual")]["audio"], own[0])  # train=False: no mismatch
    half = AVDataset(utts * 10, tokenizer, train=True, audio_augment=AudioAugment(av_mismatch_prob=0.5))
    draws = [not torch.equal(half[(i, "audiovisual")]["audio"], own[i % 4]) for i in range(40)]
    assert 8 <= sum(draws) <= 32
    again = AVDataset(utts * 10, tokenizer, train=True, audio_augment=AudioAugment(av_mismatch_prob=0.5))
    assert draws == [not torch.equal(again[(i, "audiovisual")]["audio"], own[i % 4]) for i in range(40)]
    again.set_epoch(1)
    assert draws != [not torch.equal(again[(i, "audiovisual")]["audio"], own[i % 4]) for i in range(40)]
    with pytest.raises(ValueError, match="av_mismatch_prob"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(av_mismatch_prob=1.5))


def test_av_mismatch_noisy_only_swaps_the_audio_of_noisy_items_under_the_same_noise(tmp_path, tokenizer):
    """av_mismatch_noisy_only: an item that draws no noise keeps its own audio; one that draws noise gets
    another speaker's audio under exactly the noise draws (segment, SNR) it would have had."""
    utts = [make_utt(tmp_path, "s1_a", 10), make_utt(tmp_path, "s2_b", 10), make_utt(tmp_path, "s3_c", 10)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    aug = AudioAugment(av_mismatch_prob=1.0, av_mismatch_noisy_only=True)
    quiet = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=0.0, snr_db=[0.0])
    ds = AVDataset(utts, tokenizer, train=True, noise=quiet, audio_augment=aug)
    assert torch.equal(ds[(0, "audiovisual")]["audio"], AVDataset(utts, tokenizer)[0]["audio"])
    loud = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[5.0])
    ds = AVDataset(utts, tokenizer, train=True, noise=loud, audio_augment=aug)
    plain = AVDataset(utts, tokenizer, train=True, noise=loud)  # the same noise draws over the own audio
    item, own = ds[(0, "audiovisual")], plain[(0, "audiovisual")]
    assert not torch.equal(item["audio"], own["audio"])
    mixes = []
    for w in (read_wav(u.wav) for u in utts[1:]):
        g = plain._generator(0, 0)  # the item's stream: the noise decision, the SNR, then the segment
        torch.rand((), generator=g), torch.randint(0, 1, (1,), generator=g)
        mixes.append(plain.noise.source.mix(w, 5.0, generator=g))
    assert any(torch.equal(item["audio"], avhubert_audio_features(m, num_video_frames=10)) for m in mixes)
    assert torch.equal(item["video"], own["video"])  # the crop draws come after: unchanged


def test_time_masks_hide_audio_frames_of_audio_visual_items_only_and_reproducibly(tmp_path, tokenizer):
    """num_time_mask / time_mask_width: whole feature frames of the item's own audio are zeroed; with
    time_mask_av_only only items of audio-visual batches get masks; the draws are a function of (seed, epoch,
    index) and leave every other draw (video crop) unchanged; the cache holds unmasked features."""
    utts = [make_utt(tmp_path, "s1_a", 30), make_utt(tmp_path, "s2_b", 25)]
    plain = AVDataset(utts * 10, tokenizer, train=True)
    aug = AudioAugment(num_time_mask=3, time_mask_width=4, time_mask_av_only=True)
    ds = AVDataset(utts * 10, tokenizer, train=True, audio_augment=aug)
    masked = []
    for i in range(20):
        own, item = plain[(i, "audiovisual")], ds[(i, "audiovisual")]
        zero = (item["audio"] == 0).all(dim=1)
        assert torch.equal(item["audio"][~zero], own["audio"][~zero]) and int(zero.sum()) <= 12
        assert torch.equal(item["video"], own["video"])  # the crop draws do not move
        masked.append(int(zero.sum()))
        assert torch.equal(ds[(i, "audio")]["audio"], own["audio"])  # audio-only batch: never masked
        assert torch.equal(ds[i]["audio"], own["audio"])  # no batch modality: never masked
    assert sum(m > 0 for m in masked) >= 15
    for i, feats in ds._feat_cache.items():
        assert torch.equal(feats, plain[i]["audio"])
    again = AVDataset(utts * 10, tokenizer, train=True, audio_augment=aug)
    assert all(torch.equal(again[(i, "audiovisual")]["audio"], ds[(i, "audiovisual")]["audio"])
               for i in range(20))
    again.set_epoch(1)
    assert any(not torch.equal(again[(i, "audiovisual")]["audio"], ds[(i, "audiovisual")]["audio"])
               for i in range(20))
    everywhere = AVDataset(utts, tokenizer, train=True,
                           audio_augment=AudioAugment(num_time_mask=3, time_mask_width=4))
    assert torch.equal(everywhere[(0, "audio")]["audio"], everywhere[(0, "audiovisual")]["audio"])
    assert (everywhere[(0, "audio")]["audio"] == 0).all(dim=1).any()
    evaluation = AVDataset(utts, tokenizer, audio_augment=aug)
    assert torch.equal(evaluation[(0, "audiovisual")]["audio"], plain[0]["audio"])
    with pytest.raises(ValueError, match="num_time_mask"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(num_time_mask=-1))


def test_hard_onset_prob_cuts_a_share_of_the_items_onsets_from_its_own_stream(tmp_path, tokenizer):
    """hard_onset_prob: a drawn item's audio features change only around where its speech starts (its
    first 30 ms are muted at most), the others' not at all; the draws are a function of (seed, epoch,
    index) that leaves the other draws alone; evaluation items and the feature cache keep the own audio;
    bad values are refused."""
    rng = np.random.default_rng(0)
    wav = np.concatenate([np.zeros(5 * 640), rng.standard_normal(15 * 640) * 0.1]).astype(np.float32)
    write_wav(tmp_path / "s1_a.wav", wav)
    write_video(tmp_path / "s1_a.mp4", rng.integers(0, 255, (20, 96, 96), dtype=np.uint8), fps=25)
    utts = [Utterance("s1_a", "s1", str(tmp_path / "s1_a.wav"), str(tmp_path / "s1_a.mp4"), "BIN BLUE", 20)]
    plain = AVDataset(utts * 20, tokenizer, train=True)
    aug = AudioAugment(hard_onset_prob=0.5, hard_onset_ms=(5.0, 30.0))
    ds = AVDataset(utts * 20, tokenizer, train=True, audio_augment=aug)
    drawn = []
    for i in range(20):
        own, item = plain[(i, "audio")], ds[(i, "audio")]
        changed = (item["audio"] != own["audio"]).any(dim=1).nonzero().flatten().tolist()
        assert not changed or 4 <= min(changed) and max(changed) <= 7  # the cut lies in frame 5
        drawn.append(bool(changed))
    assert 4 <= sum(drawn) <= 16
    for i, feats in ds._feat_cache.items():
        assert torch.equal(feats, plain[i]["audio"])  # only the own features are cached
    again = AVDataset(utts * 20, tokenizer, train=True, audio_augment=aug)
    assert drawn == [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    again.set_epoch(1)
    assert drawn != [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    evaluation = AVDataset(utts, tokenizer, audio_augment=AudioAugment(hard_onset_prob=1.0))
    assert torch.equal(evaluation[0]["audio"], plain[0]["audio"])
    for bad, key in (({"hard_onset_prob": 1.5}, "hard_onset_prob"), ({"hard_onset_ms": (30.0, 5.0)},
                                                                      "hard_onset_ms"),
                     ({"hard_onset_ms": (-5.0, 5.0)}, "hard_onset_ms")):
        with pytest.raises(ValueError, match=key):
            AVDataset(utts, tokenizer, audio_augment=AudioAugment(**bad))


def test_envelope_contrast_scales_a_share_of_the_items_envelopes_from_its_own_stream(tmp_path, tokenizer):
    """envelope_contrast: a drawn item's audio features are those of its waveform with the envelope's
    contrast scaled by a factor in the range, the others' are unchanged; the draws are a function of
    (seed, epoch, index) that leaves the other draws alone; evaluation items and the feature cache keep the
    own audio; bad values are refused."""
    utts = [make_utt(tmp_path, "s1_a", 12), make_utt(tmp_path, "s2_b", 10)]
    plain = AVDataset(utts * 10, tokenizer, train=True)
    aug = AudioAugment(envelope_contrast=(0.6, 1.5), envelope_contrast_prob=0.5)
    ds = AVDataset(utts * 10, tokenizer, train=True, audio_augment=aug)
    drawn = []
    for i in range(20):
        u, own, item = utts[i % 2], plain[(i, "audio")], ds[(i, "audio")]
        factor = ds._contrast(aug, i, 0)
        assert factor == 1.0 or 0.6 <= factor <= 1.5
        want = avhubert_audio_features(read_wav(u.wav), num_video_frames=u.num_frames, contrast=factor)
        assert torch.equal(item["audio"], want)
        assert (factor != 1.0) == (not torch.equal(item["audio"], own["audio"]))
        drawn.append(factor != 1.0)
    assert 4 <= sum(drawn) <= 16
    for i, feats in ds._feat_cache.items():
        assert torch.equal(feats, plain[i]["audio"])  # only the own, unscaled features are cached
    again = AVDataset(utts * 10, tokenizer, train=True, audio_augment=aug)
    assert drawn == [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    again.set_epoch(1)
    assert drawn != [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    evaluation = AVDataset(utts, tokenizer, audio_augment=AudioAugment(envelope_contrast=(1.5, 1.5)))
    assert torch.equal(evaluation[0]["audio"], AVDataset(utts, tokenizer)[0]["audio"])
    assert not AudioAugment(envelope_contrast=(1.0, 1.0)).active
    assert not AudioAugment(envelope_contrast=(0.5, 2.0), envelope_contrast_prob=0.0).active
    for bad, key in (({"envelope_contrast": (1.5, 0.6)}, "envelope_contrast"),
                     ({"envelope_contrast": (0.0, 1.0)}, "envelope_contrast"),
                     ({"envelope_contrast": (0.8, 1.2), "envelope_contrast_prob": 1.5},
                      "envelope_contrast_prob")):
        with pytest.raises(ValueError, match=key):
            AVDataset(utts, tokenizer, audio_augment=AudioAugment(**bad))


def test_narrowband_prob_band_limits_a_share_of_the_items_per_epoch_from_its_own_stream(tmp_path, tokenizer):
    """narrowband_prob: the audio features of a drawn item are those of its waveform through narrowband(),
    the others' are unchanged; the draw is a function of (seed, epoch, index) that leaves the other draws
    (video crop) alone; evaluation items and the cache keep the own, full-band audio."""
    utts = [make_utt(tmp_path, "s1_a", 12), make_utt(tmp_path, "s2_b", 10)]
    plain = AVDataset(utts * 10, tokenizer, train=True)
    ds = AVDataset(utts * 10, tokenizer, train=True, audio_augment=AudioAugment(narrowband_prob=0.5))
    drawn = []
    for i in range(20):
        u, own, item = utts[i % 2], plain[(i, "audiovisual")], ds[(i, "audiovisual")]
        narrow = avhubert_audio_features(narrowband(read_wav(u.wav)), num_video_frames=u.num_frames)
        assert torch.equal(item["audio"], narrow) or torch.equal(item["audio"], own["audio"])
        drawn.append(torch.equal(item["audio"], narrow))
        assert torch.equal(item["video"], own["video"])  # the crop draws do not move
    assert 4 <= sum(drawn) <= 16
    for i, feats in ds._feat_cache.items():
        assert torch.equal(feats, plain[i]["audio"])  # only the own, full-band features are cached
    again = AVDataset(utts * 10, tokenizer, train=True, audio_augment=AudioAugment(narrowband_prob=0.5))
    assert drawn == [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    again.set_epoch(1)
    assert drawn != [not torch.equal(again[(i, "audio")]["audio"], plain[i]["audio"]) for i in range(20)]
    evaluation = AVDataset(utts, tokenizer, audio_augment=AudioAugment(narrowband_prob=1.0))
    assert torch.equal(evaluation[0]["audio"], plain[0]["audio"])
    # narrowband_audio_only: only items of audio-only batches go through the channel
    only = AVDataset(utts, tokenizer, train=True,
                     audio_augment=AudioAugment(narrowband_prob=1.0, narrowband_audio_only=True))
    narrow = avhubert_audio_features(narrowband(read_wav(utts[0].wav)), num_video_frames=utts[0].num_frames)
    assert torch.equal(only[(0, "audio")]["audio"], narrow)
    assert torch.equal(only[(0, "audiovisual")]["audio"], plain[0]["audio"])
    assert torch.equal(only[0]["audio"], plain[0]["audio"])  # no batch modality: full band
    with pytest.raises(ValueError, match="narrowband_prob"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(narrowband_prob=1.5))


def test_edge_silence_adds_and_trims_silent_frames_of_every_stream_reproducibly(tmp_path, tokenizer):
    """edge_silence_frames: each end gains or loses whole 40 ms frames (audio, video and frame labels
    together), never more than its silent frames; the draws are a function of (seed, epoch, index) and leave
    the other draws alone; evaluation items are unchanged."""
    rng = np.random.default_rng(7)
    speech = (rng.standard_normal(640 * 12) * 0.3).astype(np.float32)
    quiet = (rng.standard_normal(640 * 3) * 1e-4).astype(np.float32)
    write_wav(tmp_path / "e.wav", np.concatenate([quiet, speech, quiet[: 640 * 2]]))  # silent 3 + 2
    write_video(tmp_path / "e.mp4", np.repeat(np.arange(17, dtype=np.uint8)[:, None, None] * 10, 96, 1)
                .repeat(96, 2), fps=25)
    utts = [Utterance("s1_e", "s1", str(tmp_path / "e.wav"), str(tmp_path / "e.mp4"), "BIN BLUE AT A ONE NOW",
                      17)] * 40
    labels = LabelSet("frames.km", {"s1_e": torch.arange(17)}, label_rate=25.0, num_classes=17)
    aug = AudioAugment(edge_silence_frames=(-4, 3))
    ds = AVDataset(utts, tokenizer, train=True, audio_augment=aug, label_sets=[labels])
    lengths = set()
    for i in range(40):
        item = ds[(i, "audiovisual")]
        t, lab = item["video"].shape[0], item["labels"][0]
        assert item["audio"].shape == (t, 104) and lab.numel() == t
        # the frames cut (first label > 0) or added (first label repeated) at the start, and at the end
        start = -int(lab[0]) or int((lab == 0).sum()) - 1
        end = -(16 - int(lab[-1])) or int((lab == 16).sum()) - 1
        assert -3 <= start <= 3 and -2 <= end <= 3 and t == 17 + start + end  # no speech frame is cut
        shown = ((item["video"][:, 44, 44] * VIDEO_STD + VIDEO_MEAN) * 255 / 10).round().long()
        assert torch.equal(shown, lab)  # video frame k shows the frame its label says
        lengths.add(t)
    assert len(lengths) >= 5 and min(lengths) < 17 < max(lengths)
    again = AVDataset(utts, tokenizer, train=True, audio_augment=aug, label_sets=[labels])
    assert all(torch.equal(again[(i, "audiovisual")]["audio"], ds[(i, "audiovisual")]["audio"])
               for i in range(10))
    again.set_epoch(1)
    assert any(again[(i, "audiovisual")]["video"].shape != ds[(i, "audiovisual")]["video"].shape
               for i in range(10))
    evaluation = AVDataset(utts, tokenizer, audio_augment=aug)[0]
    assert evaluation["video"].shape[0] == 17
    # keep_length: the silence moves from one end to the other (at most what the other end has)
    moved = AVDataset(utts, tokenizer, train=True, label_sets=[labels],
                      audio_augment=AudioAugment(edge_silence_frames=(-4, 3), edge_silence_keep_length=True))
    starts = set()
    for i in range(40):
        item = moved[(i, "audio")]
        lab = item["labels"][0]
        assert item["audio"].shape == (17, 104) and lab.numel() == 17
        start = -int(lab[0]) or int((lab == 0).sum()) - 1
        assert -3 <= start <= 2 and torch.equal(lab, (torch.arange(17) - start).clamp(0, 16))
        starts.add(start)
    assert min(starts) < 0 < max(starts)
    # edge_silence_prob: a share of the items keeps the corpus's edges
    half = AVDataset(utts, tokenizer, train=True, label_sets=[labels],
                     audio_augment=AudioAugment(edge_silence_frames=(1, 3), edge_silence_prob=0.5))
    kept = [torch.equal(half[(i, "audio")]["labels"][0], torch.arange(17)) for i in range(40)]
    assert 8 <= sum(kept) <= 32
    assert not AudioAugment(edge_silence_frames=(1, 3), edge_silence_prob=0.0).active
    with pytest.raises(ValueError, match="edge_silence_prob"):
        AVDataset(utts, tokenizer,
                  audio_augment=AudioAugment(edge_silence_frames=(1, 3), edge_silence_prob=2.0))
    with pytest.raises(ValueError, match="edge_silence_frames"):
        AVDataset(utts, tokenizer, audio_augment=AudioAugment(edge_silence_frames=(2, -1)))


def test_keep_clean_audio_gives_noisy_audio_visual_items_their_clean_features(tmp_path, tokenizer):
    """keep_clean_audio: an item of an audio-visual training batch whose audio got noise (or another
    speaker's audio) also carries the features of its own audio without it, under the same masks; clean
    items, other batch modalities and evaluation carry None; collate pads audio_clean (the audio where
    None)."""
    utts = [make_utt(tmp_path, "s1_a", 30), make_utt(tmp_path, "s2_b", 20)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    loud = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[0.0])
    aug = AudioAugment(num_time_mask=2, time_mask_width=4, av_mismatch_prob=0.5)
    ds = AVDataset(utts, tokenizer, train=True, noise=loud, audio_augment=aug, keep_clean_audio=True)
    masks = AudioAugment(num_time_mask=2, time_mask_width=4)
    own = AVDataset(utts, tokenizer, train=True, audio_augment=masks)
    items = [ds[(i, "audiovisual")] for i in range(2)]
    for i, item in enumerate(items):
        assert torch.equal(item["audio_clean"], own[(i, "audiovisual")]["audio"])  # own audio, same masks
        assert not torch.equal(item["audio"], item["audio_clean"])
        assert torch.equal((item["audio"] == 0).all(1), (item["audio_clean"] == 0).all(1))
        assert ds[(i, "audio")]["audio_clean"] is None and ds[i]["audio_clean"] is None
    quiet = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=0.0, snr_db=[0.0])
    assert AVDataset(utts, tokenizer, train=True, noise=quiet, keep_clean_audio=True)[(0, "audiovisual")][
        "audio_clean"] is None
    evaluation = AVDataset(utts, tokenizer, noise=loud, keep_clean_audio=True)
    assert evaluation[(0, "audiovisual")]["audio_clean"] is None
    clean_item = AVDataset(utts, tokenizer, train=True)[(1, "audiovisual")]
    batch = collate([items[0], clean_item])
    assert batch["audio_clean"].shape == batch["audio"].shape == (2, 104, 30)
    assert torch.equal(batch["audio_clean"][0].T, items[0]["audio_clean"])
    assert torch.equal(batch["audio_clean"][1], batch["audio"][1])  # no clean copy: its audio
    assert collate([clean_item])["audio_clean"] is None


def test_epoch_in_the_keys_reaches_persistent_dataloader_workers(tmp_path, tokenizer):
    """With persistent workers, each holds a copy of the dataset; the epoch travels in the keys
    (EpochKeyedBatches), so the workers draw each epoch's augmentation as the main process would."""
    utts = [make_utt(tmp_path, f"s1_{i}", 8) for i in range(4)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    noise = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[-5.0, 0.0, 5.0, 10.0])
    ds = AVDataset(utts, tokenizer, train=True, noise=noise)
    buckets = BucketBatchSampler([8] * 4, max_frames=16, shuffle=False)
    keyed = EpochKeyedBatches(buckets)
    assert len(keyed) == len(buckets) == 2
    loader = torch.utils.data.DataLoader(ds, batch_sampler=keyed, collate_fn=collate, num_workers=1,
                                         persistent_workers=True)
    by_epoch = []
    for epoch in range(2):
        keyed.set_epoch(epoch)  # the main process's dataset is left at epoch 0 on purpose
        assert buckets.epoch == epoch and [b[0] for b in keyed] == [(0, None, epoch), (2, None, epoch)]
        by_epoch.append(torch.cat([b["audio"] for b in loader]))
        expected = torch.cat([collate([ds[(i, None, epoch)] for i in b])["audio"] for b in buckets])
        assert torch.equal(by_epoch[-1], expected), epoch
    assert not torch.allclose(by_epoch[0], by_epoch[1])  # other noise draws in epoch 1
    modal = EpochKeyedBatches(ModalityBatchSampler(buckets, 1.0, 0.0, seed=2))
    modal.set_epoch(3)
    assert [b[0] for b in modal] == [(0, "audio", 3), (2, "audio", 3)]
    assert ds[(1, "audio", 3)]["video"] is None


def test_clean_audio_features_are_cached_and_noisy_ones_are_not(tmp_path, tokenizer):
    """The features of an item drawn without noise are computed once and reused in later epochs (equal to
    an uncached dataset's); an item that got noise is computed afresh and never enters the cache."""
    utts = [make_utt(tmp_path, "s1_a", 10), make_utt(tmp_path, "s1_b", 7)]
    write_wav(tmp_path / "n.wav", np.random.default_rng(1).standard_normal(32000).astype(np.float32))
    noise = NoiseConfig(NoiseSource(tmp_path / "n.wav"), prob=1.0, snr_db=[0.0], prob_audio_only=0.0)
    cached = AVDataset(utts, tokenizer, train=True, noise=noise)
    uncached = AVDataset(utts, tokenizer, train=True, noise=noise, cache=False)
    for epoch in range(2):
        for ds in (cached, uncached):
            ds.set_epoch(epoch)
        for key in [(0, "audio"), (1, "audiovisual"), (0, "audiovisual"), (1, "audio")]:
            a, b = cached[key], uncached[key]
            assert torch.equal(a["audio"], b["audio"]), (epoch, key)
            assert (a["video"] is None) == (b["video"] is None)
    assert sorted(cached._feat_cache) == [0, 1]  # from the audio-only (clean) draws only
    assert uncached._feat_cache == {}
    assert torch.equal(cached._feat_cache[0], AVDataset(utts, tokenizer)[0]["audio"])
    assert not torch.equal(cached[(0, "audiovisual")]["audio"], cached._feat_cache[0])  # noisy: not cached


def test_cache_stops_at_its_limit_and_says_so_once(tmp_path, tokenizer, caplog):
    """cache_limit_mb bounds the cache: items read after it is full are decoded again (same values), and the
    fact is logged once."""
    import logging

    utts = [make_utt(tmp_path, f"s1_{i}", 10) for i in range(3)]
    one = sum(t.numel() * t.element_size() for t in AVDataset(utts, tokenizer)._load(0))
    ds = AVDataset(utts, tokenizer, cache_limit_mb=1.5 * one / 2**20)  # room for the media of one item
    unlimited = AVDataset(utts, tokenizer)
    with caplog.at_level(logging.INFO, logger="avsr.data.dataset"):
        for _ in range(2):
            for i in range(3):
                assert torch.equal(ds[i]["audio"], unlimited[i]["audio"])
                assert torch.equal(ds[i]["video"], unlimited[i]["video"])
    assert sorted(ds._cache) == [0]  # the media of one item; the small feature tensors still fit
    assert 0 < ds._cache_bytes <= 1.5 * one
    assert sorted(unlimited._cache) == [0, 1, 2]
    full = [r for r in caplog.records if "cache is full" in r.getMessage()]
    assert len(full) == 1 and "1 of 3 utterances" in full[0].getMessage()

def test_config_unknown_key_names_key_and_file(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class C:
        encoder_layers: int = 2

    (tmp_path / "c.yaml").write_text("encoder_layer: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*'encoder_layer'.*did you mean 'encoder_layers'"):
        from_dict(C, load_yaml(tmp_path / "c.yaml"), where=str(tmp_path / "c.yaml"))
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(tmp_path / "bad.yaml")
