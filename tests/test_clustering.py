"""Clustering targets: label files, feature shards (MFCC and encoder layers), k-means, cluster quality."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
import torch

from avsr.bin import cluster_quality as cluster_quality_cli
from avsr.bin import dump_features as dump_features_cli
from avsr.bin import kmeans as kmeans_cli
from avsr.clustering.extract import LayerExtractor, load_encoder
from avsr.clustering.kmeans import KMeansConfig, fit_kmeans, load_kmeans, sample_features, write_kmeans_labels
from avsr.clustering.labels import LabelError, read_label_meta, read_labels, write_label_meta, write_labels
from avsr.clustering.quality import (
    PhoneAlignmentError,
    cluster_quality,
    frame_phones,
    label_quality,
    read_phn,
)
from avsr.clustering.shards import FeatureDumpError, dump_shard, find_shards, read_shard
from avsr.data.datadir import Utterance, read_datadir, write_datadir
from avsr.data.media import write_video, write_wav
from avsr.encoder import AVHubertEncoder

TINY = dict(encoder_layers=2, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4,
            conv_pos=8, conv_pos_groups=4, resnet_widths=[4, 8, 8, 16])
FAST_KM = KMeansConfig(n_clusters=3, batch_size=256, n_init=3, max_iter=20)

# --- cluster quality -------------------------------------------------------------------------------


def test_identical_labels_are_pure_and_fully_informative():
    y = np.random.default_rng(0).integers(0, 7, 500)
    perm = np.array([3, 0, 6, 1, 5, 2, 4])
    q = cluster_quality(y, perm[y])  # clusters = phones renamed
    assert q["phone_purity"] == pytest.approx(1.0) and q["cluster_purity"] == pytest.approx(1.0)
    assert q["pnmi"] == pytest.approx(1.0) and q["num_frames"] == 500


def test_independent_labels_carry_no_information():
    i = np.arange(4 * 5 * 30)
    y, z = i % 4, (i // 4) % 5  # every (phone, cluster) pair equally often
    q = cluster_quality(y, z)
    assert q["pnmi"] == pytest.approx(0.0, abs=1e-12)
    assert q["phone_purity"] == pytest.approx(1 / 4) and q["cluster_purity"] == pytest.approx(1 / 5)


def test_small_example_matches_hand_computation():
    # counts: phone 0 with clusters 0, 0, 1, 1; phone 1 with cluster 1 -> p(y, z) = [[.4, .4], [0, .2]]
    y = np.array([0, 0, 0, 0, 1])
    z = np.array([0, 0, 1, 1, 1])
    q = cluster_quality(y, z, num_clusters=3)  # an unused cluster changes nothing
    assert q["phone_purity"] == pytest.approx(0.8)  # max_y p(y, z) summed over z: .4 + .4
    assert q["cluster_purity"] == pytest.approx(0.6)  # max_z p(y, z) summed over y: .4 + .2
    mi = (0.4 * math.log(0.4 / (0.8 * 0.4)) + 0.4 * math.log(0.4 / (0.8 * 0.6))
          + 0.2 * math.log(0.2 / (0.2 * 0.6)))
    hy = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    assert q["mutual_info"] == pytest.approx(mi) and q["phone_entropy"] == pytest.approx(hy)
    assert q["pnmi"] == pytest.approx(mi / hy)
    assert q["num_clusters_used"] == 2


def test_quality_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="equal"):
        cluster_quality(np.zeros(3, int), np.zeros(4, int))
    with pytest.raises(ValueError, match="out of range"):
        cluster_quality(np.zeros(3, int), np.array([0, 1, 5]), num_clusters=3)


def test_frames_take_the_phone_at_their_centre(tmp_path):
    phn = tmp_path / "a.phn"
    phn.write_text("0.00 0.03 pau\n0.03 0.05 b\n0.06 0.08 aa\n")  # a gap 50-60 ms, audio goes on to 100 ms
    starts, ends, phones = read_phn(phn)
    ph, kept = frame_phones(starts, ends, phones, 10, 100)  # centres 5, 15, ..., 95 ms
    assert ph.tolist() == ["pau", "pau", "pau", "b", "b", "pau", "aa", "aa", "pau", "pau"] and kept.all()
    ph, kept = frame_phones(starts, ends, phones, 10, 100, outside=None)
    assert kept.tolist() == [True] * 5 + [False] + [True] * 2 + [False] * 2
    ph, _ = frame_phones(starts, ends, phones, 2, 25)  # centres 20 ms, 60 ms
    assert ph.tolist() == ["pau", "aa"]


def test_bad_phone_alignment_names_file_and_line(tmp_path):
    phn = tmp_path / "b.phn"
    phn.write_text("0.0 0.1 pau\n0.1 oops aa\n")
    with pytest.raises(PhoneAlignmentError, match=r"b\.phn:2"):
        read_phn(phn)
    phn.write_text("0.0 0.1 pau\n0.05 0.2 aa\n")
    with pytest.raises(PhoneAlignmentError, match=r"b\.phn:2.*overlaps"):
        read_phn(phn)


# --- label files -----------------------------------------------------------------------------------


def test_labels_round_trip_sorted(tmp_path):
    labels = {"s2_u1": torch.tensor([3, 1, 4]), "s1_u9": np.array([0, 0, 99]), "s1_u2": [7]}
    write_labels(tmp_path / "km.km", labels)
    lines = (tmp_path / "km.km").read_text().splitlines()
    assert lines == ["s1_u2 7", "s1_u9 0 0 99", "s2_u1 3 1 4"]
    back = read_labels(tmp_path / "km.km")
    assert list(back) == ["s1_u2", "s1_u9", "s2_u1"]
    assert all(v.dtype == torch.int64 for v in back.values())
    assert back["s1_u9"].tolist() == [0, 0, 99]
    write_label_meta(tmp_path / "km.km", 25, 100, "layer6 of x.pt", "km.joblib")
    info = read_label_meta(tmp_path / "km.km")
    assert info == {"label_rate": 25, "num_classes": 100, "features": "layer6 of x.pt",
                    "kmeans_model": "km.joblib"}


@pytest.mark.parametrize("body, message", [
    ("a 1 2\nb 1 x 3\n", r"km\.km:2: utterance 'b': label 'x' is not an integer"),
    ("a 1 2\nb\n", r"km\.km:2: utterance 'b' has no labels"),
    ("a 1\n\na 2\n", r"km\.km:3: utterance 'a' is listed twice"),
    ("a 1 -2\n", r"km\.km:1: utterance 'a': negative label -2"),
])
def test_bad_label_line_is_named(tmp_path, body, message):
    (tmp_path / "km.km").write_text(body)
    with pytest.raises(LabelError, match=message):
        read_labels(tmp_path / "km.km")


def test_label_meta_missing_key_is_named(tmp_path):
    info = {"label_rate": 100, "features": "mfcc", "kmeans_model": "k"}
    (tmp_path / "km.km.json").write_text(json.dumps(info))
    with pytest.raises(LabelError, match="km.km.json: missing key 'num_classes'"):
        read_label_meta(tmp_path / "km.km")


# --- k-means on synthetic features -----------------------------------------------------------------


class Blobs:
    """A fake extractor: utterance i has 20 + i frames drawn around one of three far-apart centres."""

    description, rate = "blobs", 25
    centres = np.array([[10.0, 0, 0, 0], [0, 10.0, 0, 0], [0, 0, 0, 10.0]])

    def truth(self, utt_id: str) -> np.ndarray:
        i = int(utt_id.split("_")[1])
        return (np.arange(20 + i) + i) % 3

    def __call__(self, utts):
        for u in reversed(utts):  # any order is allowed
            z = self.truth(u.utt_id)
            noise = np.random.default_rng(zlib.crc32(u.utt_id.encode())).standard_normal((len(z), 4))
            yield u.utt_id, (self.centres[z] + noise).astype(np.float32)


def blob_datadir(path, n=12):
    utts = [Utterance(f"s_{i:02d}", "s", wav=f"/nonexistent/s_{i:02d}.wav") for i in range(n)]
    write_datadir(path, utts)
    return read_datadir(path, require_text=False)


def test_kmeans_recovers_separable_clusters_and_the_saved_model_reproduces_labels(tmp_path):
    utts = blob_datadir(tmp_path / "data")
    for rank in range(3):
        dump_shard(utts, Blobs(), tmp_path / "feats", "train", nshard=3, rank=rank)
    prefixes = find_shards(tmp_path / "feats", "train")
    shards = [read_shard(p) for p in prefixes]
    assert sum(len(s.utt_ids) for s in shards) == 12 and shards[0].feats.dtype == np.float32
    feats = sample_features(shards, percent=0.5, max_frames=150, seed=1)
    assert feats.shape == (150, 4)
    km = fit_kmeans(feats, tmp_path / "km.joblib", FAST_KM, {"features": "blobs", "rate": 25})
    out = write_kmeans_labels(prefixes, tmp_path / "km.joblib", tmp_path / "data", "km3")
    labels = read_labels(out)
    assert list(labels) == [u.utt_id for u in utts]
    truth = np.concatenate([Blobs().truth(u) for u in labels])
    got = torch.cat(list(labels.values())).numpy()
    contingency = np.zeros((3, 3), int)
    np.add.at(contingency, (truth, got), 1)
    assert ((contingency > 0).sum(1) == 1).all() and ((contingency > 0).sum(0) == 1).all()  # a permutation
    assert read_label_meta(out) == {"label_rate": 25, "num_classes": 3, "features": "blobs",
                                    "kmeans_model": str((tmp_path / "km.joblib").resolve())}
    first = out.read_text()
    write_kmeans_labels(prefixes, tmp_path / "km.joblib", tmp_path / "data", "km3")  # redo from the model
    assert out.read_text() == first
    for s in shards:  # the same labels as sklearn's predict
        predicted, offsets = km.predict(np.asarray(s.feats)), s.offsets()
        for i, utt in enumerate(s.utt_ids):
            assert np.array_equal(predicted[offsets[i] : offsets[i + 1]], labels[utt].numpy())
    centres, summary = load_kmeans(tmp_path / "km.joblib")
    assert centres.shape == (3, 4) and summary["num_fit_frames"] == 150 and summary["n_init"] == 3


def test_shards_resume_and_refuse_other_features(tmp_path):
    utts = blob_datadir(tmp_path / "data", n=4)
    prefix = dump_shard(utts, Blobs(), tmp_path / "feats", "train")
    stamp = (prefix.parent / "train_0_1.npy").stat().st_mtime_ns
    dump_shard(utts, Blobs(), tmp_path / "feats", "train")  # finished: skipped
    assert (prefix.parent / "train_0_1.npy").stat().st_mtime_ns == stamp

    class Other(Blobs):
        description = "other"

    with pytest.raises(FeatureDumpError, match="train_0_1.json: a finished shard of other features"):
        dump_shard(utts, Other(), tmp_path / "feats", "train")
    with pytest.raises(FeatureDumpError, match="train_1_2 is missing"):
        dump_shard(utts, Blobs(), tmp_path / "feats2", "train", nshard=2, rank=0)
        find_shards(tmp_path / "feats2", "train")
    with pytest.raises(FeatureDumpError, match="5 shards for 4 utterances"):
        dump_shard(utts, Blobs(), tmp_path / "feats3", "train", nshard=5, rank=0)


# --- feature dumping from a data dir ---------------------------------------------------------------

PHONES = ["pau", "b", "ih", "n", "pau"]


def make_datadir(root, durations=(1.0, 0.64, 0.8)):
    """Wav + 96x96 mp4 + .phn per utterance (a chirp per phone so that MFCCs vary), and a data dir."""
    rng = np.random.default_rng(0)
    utts = []
    for i, seconds in enumerate(durations):
        frames = round(seconds * 25)
        n = frames * 640
        bounds = np.linspace(0, seconds, len(PHONES) + 1)
        wav = np.zeros(n, np.float32)
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            s = np.arange(int(a * 16000), int(b * 16000))
            tone = np.sin(2 * np.pi * (300 + 500 * k) * s / 16000)
            wav[s] = 0.2 * tone + 0.01 * rng.standard_normal(len(s))
        stem = root / f"spk_{i}"
        write_wav(stem.with_suffix(".wav"), wav)
        write_video(stem.with_suffix(".mp4"), rng.integers(0, 255, (frames, 96, 96), dtype=np.uint8))
        stem.with_suffix(".phn").write_text("".join(f"{a:.4f} {b:.4f} {p}\n" for a, b, p in
                                                    zip(bounds[:-1], bounds[1:], PHONES)))
        utts.append(Utterance(f"spk_{i}", "spk", wav=str(stem.with_suffix(".wav")),
                              video=str(stem.with_suffix(".mp4")), num_frames=frames))
    write_datadir(root / "data", utts)
    return root / "data"


def test_mfcc_pipeline_gives_100_hz_labels_and_quality(tmp_path, capsys):
    data = make_datadir(tmp_path)
    feat_dir = tmp_path / "feats"
    dump_features_cli.main(["--data-dir", str(data), "--feat-dir", str(feat_dir), "--feature", "mfcc",
                            "--nshard", "2"])
    shard = read_shard(feat_dir / "data_0_2")
    assert shard.info["rate"] == 100 and shard.feats.shape[1] == 39
    km = tmp_path / "km" / "km.joblib"
    kmeans_cli.main(["fit", "--feat-dir", str(feat_dir), "--split", "data", "--km", str(km),
                     "--n-clusters", "5", "--n-init", "2"])
    kmeans_cli.main(["apply", "--feat-dir", str(feat_dir), "--split", "data", "--km", str(km),
                     "--data-dir", str(data), "--name", "mfcc5"])
    labels = read_labels(data / "mfcc5.km")
    for utt_id, seconds in zip(["spk_0", "spk_1", "spk_2"], (1.0, 0.64, 0.8)):
        assert len(labels[utt_id]) == 1 + (round(seconds * 16000) - 400) // 160  # ~100 per second
    assert read_label_meta(data / "mfcc5.km")["label_rate"] == 100
    out = tmp_path / "quality.json"
    capsys.readouterr()
    cluster_quality_cli.main(["--labels", str(data / "mfcc5.km"), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["num_classes"] == 5 and result["num_frames"] == sum(map(len, labels.values()))
    assert 0.5 < result["phone_purity"] <= 1 and 0 < result["pnmi"] <= 1  # tones per phone: informative
    assert "| mfcc | 5 | 100 |" in capsys.readouterr().out
    assert cluster_quality_cli.main(["--report", str(out)]) == 0
    assert "| mfcc | 5 | 100 |" in capsys.readouterr().out
    # a file that is not a quality result: one line naming it and what it lacks, exit status 1
    for text, lacks in (("[1, 2]", "no labels, features"), ("{not json", "not JSON"),
                        (json.dumps({**result, "pnmi": "high"}), "pnmi")):
        (tmp_path / "other.json").write_text(text)
        assert cluster_quality_cli.main(["--report", str(out), str(tmp_path / "other.json")]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("avsr-cluster-quality: error: "), err
        assert "other.json: not a cluster quality" in err, err
        assert lacks in err and "\n" not in err, err
    (tmp_path / "spk_1.phn").unlink()
    with pytest.raises(PhoneAlignmentError, match=r"utterance 'spk_1': phone alignment .*spk_1\.phn not"):
        label_quality(data / "mfcc5.km", data)


def tiny_checkpoint(path):
    torch.manual_seed(0)
    encoder = AVHubertEncoder(**TINY)
    model = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    model["final_proj.weight"] = torch.zeros(3, 16)  # pretraining-only weights are ignored
    torch.save({"model": model, "model_config": {"encoder_conf": TINY, "num_classes": [3]}}, path)
    return encoder.eval()


def test_layer_features_are_25_hz_and_independent_of_batching(tmp_path):
    data = make_datadir(tmp_path, durations=(0.4, 0.28))
    ckpt = tmp_path / "ckpt.pt"
    reference = tiny_checkpoint(ckpt)
    encoder = load_encoder(ckpt)
    pairs = zip(encoder.state_dict().values(), reference.state_dict().values())
    assert all(torch.equal(a, b) for a, b in pairs)
    alone = tmp_path / "encoder.pt"  # an encoder alone (avsr-convert's layout) loads too
    torch.save({"model": reference.state_dict(), "model_config": {"encoder_conf": TINY}}, alone)
    loaded = load_encoder(alone).feature_extractor_audio.proj.weight
    assert torch.equal(loaded, reference.feature_extractor_audio.proj.weight)
    bad = tmp_path / "bad.pt"
    torch.save({"model": {"encoder.feature_extractor_audio.proj.weight": torch.zeros(16, 104)},
                "model_config": {"encoder_conf": TINY}}, bad)
    with pytest.raises(FeatureDumpError, match="bad.pt: the encoder weights do not fit"):
        load_encoder(bad)
    feat_dir = tmp_path / "feats"
    dump_features_cli.main(["--data-dir", str(data), "--feat-dir", str(feat_dir), "--feature", "layer",
                            "--checkpoint", str(ckpt), "--layer", "2", "--device", "cpu"])
    shard = read_shard(feat_dir / "data_0_1")
    assert shard.info["rate"] == 25 and shard.info["features"] == f"layer2 of {ckpt}"
    assert dict(zip(shard.utt_ids, shard.lengths.tolist())) == {"spk_0": 10, "spk_1": 7}
    assert shard.feats.shape == (17, 16)
    # one utterance per batch gives the same features as the padded batch of two
    single = LayerExtractor(encoder, 2, batch_frames=1)
    alone = dict(single(read_datadir(data, require_text=False)))
    offsets = shard.offsets()
    for i, utt in enumerate(shard.utt_ids):
        np.testing.assert_allclose(shard.feats[offsets[i] : offsets[i + 1]], alone[utt], atol=1e-5)
    audio_only = dict(LayerExtractor(encoder, 1, modality="audio")(read_datadir(data, require_text=False)))
    assert audio_only["spk_0"].shape == (10, 16)
    with pytest.raises(ValueError, match="layer must be in 1..2"):
        LayerExtractor(encoder, 3)
