"""avsr.inference.video_cache: a version of a video with other edges made from a cached version and the
front-end's output of short clips at its ends, equal to running the whole version through the front-end."""

from __future__ import annotations

import itertools

import pytest
import torch

from avsr.features import shift_edges
from avsr.inference.video_cache import reuse_plan, stem_radius, version_key, video_features
from avsr.models.asr import AVSRModel
from tests.test_inference import CONFIG

CHANGES = [(0, 0), (3, -2), (-5, 4), (8, 8), (-11, -12), (-14, 3)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AVSRModel.from_config({"vocab_size": 20, **CONFIG}).eval()


def _version(orig: torch.Tensor, change: tuple[int, int]) -> torch.Tensor:
    return shift_edges(None, orig, *change)[1]


def test_version_keys_and_the_stems_radius(model):
    assert version_key("u1", None) == version_key("u1", (0, 0)) == ("u1", (0, 0))
    assert version_key("u1", (-4, 3)) == ("u1", (-4, 3))
    # no item key, however it is spelled, names another item's version or a segment
    assert version_key("u1@-4,3", None) != version_key("u1", (-4, 3))
    assert version_key("u1#0-40", None) != version_key(("u1", 0, 40), None)
    assert stem_radius(model) == 2  # AV-HuBERT's 5-frame stem
    assert stem_radius(torch.nn.Linear(2, 2)) is None


def test_the_reusable_frames_are_those_whose_stem_window_both_versions_hold():
    # 40 frames as read; cached with 3 added at the start and 2 cut at the end, wanted with 5 cut and 4 added
    first, stop, offset = reuse_plan(40, (3, -2), (-5, 4), radius=2)
    # both hold original frames 5..37; windows inside: 7..35 -> wanted frames 2..30, cached frames 10..38
    assert (first, stop, offset) == (2, 31, 8)
    assert reuse_plan(40, (0, 0), (0, 0), radius=2) == (2, 38, 0)  # the zero-padded ends are recomputed
    assert reuse_plan(10, (-4, 0), (0, -4), radius=2) is None  # no common window


def test_a_version_made_from_another_equals_the_front_end_on_the_whole_version(model):
    torch.manual_seed(1)
    n = 40
    orig = torch.randn(n, 16, 16)
    calls = []

    def encode(video, lens):
        calls.append(lens.tolist())
        return model.encoder.encode_video(video, lens)

    with torch.no_grad():
        for cached, wanted in itertools.product(CHANGES, repeat=2):
            v1, v2 = _version(orig, cached), _version(orig, wanted)
            cache: dict = {}
            video_features(encode, v1[None, None], [len(v1)], ["u"], [cached], cache, 2)
            calls.clear()
            got = video_features(encode, v2[None, None], [len(v2)], ["u"], [wanted], cache, 2)[0]
            full = model.encoder.encode_video(v2[None, None], torch.tensor([len(v2)]))[0]
            torch.testing.assert_close(got, full, rtol=0, atol=1e-6)
            assert cache[version_key("u", wanted)] is got
            first, stop, _ = reuse_plan(n, cached, wanted, 2)
            # only the two ends, each with its window, went through the front-end
            assert calls == [[first + 2, len(v2) - stop + 2]]


def test_a_batch_mixes_made_and_whole_videos_and_other_frames_are_never_borrowed(model):
    torch.manual_seed(2)
    videos = [torch.randn(n, 16, 16) for n in (30, 44, 37)]
    with torch.no_grad():
        cache: dict = {}
        video_features(model.encoder.encode_video, videos[0][None, None], [30], ["a"], [None], cache, 2)
        # a segment of a long input as cut in one condition (frames 0-39 of "c")
        other = torch.randn(40, 16, 16)
        video_features(model.encoder.encode_video, other[None, None], [40], [("c", 0, 40)], [None], cache, 2)
        wanted = [(2, -3), (0, 0), (-4, 1)]
        shifted = [_version(v, c) for v, c in zip(videos, wanted)]
        lens = [len(v) for v in shifted]
        batch = torch.nn.utils.rnn.pad_sequence(shifted, batch_first=True).unsqueeze(1)
        sizes = []

        def encode(video, lengths):
            sizes.append(lengths.tolist())
            return model.encoder.encode_video(video, lengths)

        # ("c", 0, 37): the same segment cut at other bounds in this condition, other frames as read
        got = video_features(encode, batch, lens, ["a", "b", ("c", 0, 37)], wanted, cache, 2)
        # "a": its two ends (frames 0-5 and 25-28 of 29); "b" (nothing cached) and ("c", 0, 37): whole
        assert sizes == [[6, 4, 44, 34]]
        for feat, v in zip(got, shifted):
            full = model.encoder.encode_video(v[None, None], torch.tensor([len(v)]))[0]
            torch.testing.assert_close(feat, full, rtol=0, atol=1e-6)
        assert set(cache) == {("a", (0, 0)), ("a", (2, -3)), ("b", (0, 0)), (("c", 0, 37), (-4, 1)),
                              (("c", 0, 40), (0, 0))}
        # no radius (a front-end the module does not know): every video whole
        sizes.clear()
        video_features(encode, batch, lens, ["a", "b", ("c", 0, 37)], [(1, 1)] * 3,
                       {("a", (0, 0)): cache["a", (0, 0)]}, None)
        assert sizes == [lens]


def test_the_cached_version_that_holds_most_of_the_frames_is_taken(model):
    torch.manual_seed(3)
    orig = torch.randn(40, 16, 16)
    with torch.no_grad():
        cache: dict = {}
        for change in ((-11, -12), (0, 0)):  # the edges cut (as clean audio finds them), then as read
            v = _version(orig, change)
            video_features(model.encoder.encode_video, v[None, None], [len(v)], ["u"], [change], cache, 2)
        sizes = []

        def encode(video, lengths):
            sizes.append(lengths.tolist())
            return model.encoder.encode_video(video, lengths)

        v = _version(orig, (3, 3))
        got = video_features(encode, v[None, None], [len(v)], ["u"], [(3, 3)], cache, 2)[0]
        # from "u" as read (frames 2..37 of it), not from its version (-11, -12) (frames 13..25 only)
        assert reuse_plan(40, (0, 0), (3, 3), 2) == (5, 41, -3) and sizes == [[7, 7]]
        full = model.encoder.encode_video(v[None, None], torch.tensor([len(v)]))[0]
        torch.testing.assert_close(got, full, rtol=0, atol=1e-6)
