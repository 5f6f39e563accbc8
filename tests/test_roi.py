"""Mouth ROI preprocessing on a real face (scikit-image's astronaut photo): alignment, gaps, errors, the CLI.

The tests that run MediaPipe are skipped when it is not installed (``pip install 'avsr[video]'``); CI has it.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from avsr.data.media import read_audio_track, read_video, read_wav, write_av_video, write_video, write_wav
from avsr.data.roi import (
    RoiError,
    fill_missing,
    similarity_transforms,
    smooth_landmarks,
    warp_frames,
)

needs_mediapipe = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None or importlib.util.find_spec("skimage") is None,
    reason="needs mediapipe and scikit-image: pip install 'avsr[video]'",
)
CENTRE = 47.5  # the centre of a 96x96 ROI in pixel coordinates

# --- geometry without MediaPipe ----------------------------------------------------------------------


def test_similarity_transforms_recover_known_transforms():
    rng = np.random.default_rng(0)
    dst = rng.uniform(-50, 50, size=(7, 2))
    angles, scales, shifts = rng.uniform(-0.5, 0.5, 4), rng.uniform(0.5, 2, 4), rng.uniform(-80, 80, (4, 2))
    # src = inverse similarity of dst, so the fit must give back (scale, angle, shift) exactly
    src = []
    for angle, scale, shift in zip(angles, scales, shifts):
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        src.append((dst - shift) @ np.linalg.inv(scale * rot).T)
    fit = similarity_transforms(np.stack(src), dst)
    assert fit.shape == (4, 2, 3)
    mapped = np.einsum("tij,tkj->tki", fit[:, :, :2], np.stack(src)) + fit[:, None, :, 2]
    assert np.abs(mapped - dst).max() < 1e-9
    assert np.allclose(np.hypot(fit[:, 0, 0], fit[:, 1, 0]), scales)


def test_fill_missing_interpolates_linearly_and_holds_the_ends():
    landmarks = np.zeros((8, 2, 2), dtype=np.float32)
    landmarks[:, :, 0] = np.arange(8)[:, None] * 10.0  # x = 10 t
    detected = np.array([False, True, True, False, False, True, True, False])
    filled = fill_missing(np.where(detected[:, None, None], landmarks, -999.0), detected)
    assert filled[:, 0, 0].tolist() == [10, 10, 20, 30, 40, 50, 60, 60]
    with pytest.raises(ValueError, match="no frame"):
        fill_missing(landmarks, np.zeros(8, dtype=bool))


def test_smooth_landmarks_follow_motion_and_average_shape_noise():
    rng = np.random.default_rng(0)
    shape = rng.uniform(-20, 20, size=(1, 10, 2))
    track = 3.0 * np.arange(40)[:, None, None]  # moving 3 px per frame
    noisy = shape + track + rng.normal(0, 1.0, size=(40, 10, 2))
    smooth = smooth_landmarks(noisy, window=12)
    assert np.allclose(smooth.mean(axis=1), noisy.mean(axis=1), atol=1e-4)  # no lag: same mean position
    clean = shape + track + (noisy - shape - track).mean(axis=1, keepdims=True)
    assert np.abs(smooth - clean)[6:-6].std() < 0.5 * np.abs(noisy - clean)[6:-6].std()
    assert np.array_equal(smooth_landmarks(noisy, window=0), noisy.astype(np.float32))


def test_warp_frames_identity_gives_the_gray_image_and_shifts_move_it():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(2, 20, 20, 3), dtype=np.uint8)
    identity = np.tile(np.array([[1.0, 0, 0], [0, 1, 0]]), (2, 1, 1))
    gray = warp_frames(frames, identity, 20, gray=True)
    expected = np.rint(frames @ np.array([0.299, 0.587, 0.114]))
    assert gray.dtype == np.uint8 and np.abs(gray - expected).max() <= 1
    shifted = identity.copy()
    shifted[:, :, 2] = [-3, -5]  # output (x, y) = source (x + 3, y + 5)
    rgb = warp_frames(frames, shifted, (10, 12), gray=False)
    assert rgb.shape == (2, 10, 12, 3) and np.array_equal(rgb, frames[:, 5:15, 3:15])


def test_missing_mediapipe_says_how_to_install(monkeypatch):
    from avsr.data.roi import extract_mouth_roi

    monkeypatch.setitem(sys.modules, "mediapipe", None)  # import mediapipe -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'avsr\[video\]'"):
        extract_mouth_roi(np.zeros((1, 32, 32, 3), dtype=np.uint8))


# --- the astronaut's face ------------------------------------------------------------------------------


@needs_mediapipe
@pytest.mark.filterwarnings("ignore:.*GetPrototype.*:UserWarning")  # protobuf 4 inside mediapipe
def test_astronaut_mouth_constants_match_mediapipe_on_the_photo():
    import mediapipe
    from skimage.data import astronaut

    from avsr.data.face_video import ASTRONAUT_EYE_CORNERS, ASTRONAUT_MOUTH
    from avsr.data.roi import LIP_POINTS

    photo = astronaut()
    with mediapipe.solutions.face_mesh.FaceMesh(static_image_mode=True, max_num_faces=1) as mesh:
        found = mesh.process(photo).multi_face_landmarks[0].landmark
    points = np.array([(p.x, p.y) for p in found]) * photo.shape[1::-1]
    assert np.abs(points[list(LIP_POINTS)].mean(axis=0) - ASTRONAUT_MOUTH).max() < 1.5
    assert np.abs(points[[33, 263]] - ASTRONAUT_EYE_CORNERS).max() < 1.5


@needs_mediapipe
def test_moving_face_keeps_the_mouth_in_place_in_the_roi():
    from avsr.data.face_video import astronaut_video, head_motion
    from avsr.data.roi import extract_mouth_roi

    video = astronaut_video(40, **head_motion(40, seed=1, shift=8.0, scale=0.08, rotation=8.0))
    assert video.frames.shape == (40, 224, 224, 3)
    track = extract_mouth_roi(video.frames)
    assert track.frames.shape == (40, 96, 96) and track.frames.dtype == np.uint8
    assert track.detected.all() and track.num_missing == 0
    # the true mouth centre (known from the photo and the motion) lands at the ROI centre: measured 1.9 px
    truth = np.einsum("tij,tj->ti", track.transforms[:, :, :2], video.mouth) + track.transforms[:, :, 2]
    assert np.abs(truth - CENTRE).max() <= 3.0
    # every lip landmark stays at the same ROI position in every frame: measured 1.9 px at most
    assert track.mouth.shape == (40, 40, 2)
    assert np.linalg.norm(track.mouth - np.median(track.mouth, axis=0), axis=-1).max() <= 3.0
    # so the crops look alike although the face moves by up to 8 px, 8 % and 8 degrees (measured 2.2)
    assert np.abs(track.frames.astype(float) - np.median(track.frames, axis=0)).mean() < 5.0


@needs_mediapipe
def test_frames_without_a_face_are_interpolated():
    from avsr.data.face_video import astronaut_video, head_motion
    from avsr.data.roi import extract_mouth_roi

    motion = head_motion(30, seed=2, shift=8.0, scale=0.05, rotation=5.0)
    video = astronaut_video(30, **motion, occluded_frames=[12, 13, 14], occluder="eyes")
    track = extract_mouth_roi(video.frames)
    assert track.detected.tolist() == (~video.occluded).tolist()
    # the crop centre there lies between the neighbours' (source-frame pixels, linear in time) ...
    inverse = np.linalg.inv(track.transforms[:, :, :2].astype(np.float64))
    centre = np.einsum("tij,tj->ti", inverse, CENTRE - track.transforms[:, :, 2])
    for t in (12, 13, 14):
        weight = (t - 11) / 4
        assert np.abs(centre[t] - ((1 - weight) * centre[11] + weight * centre[15])).max() < 1.0
    # ... which is still where the (visible) mouth is, so the ROI shows the mouth, not a blank
    truth = np.einsum("tij,tj->ti", track.transforms[:, :, :2], video.mouth) + track.transforms[:, :, 2]
    assert np.abs(truth[12:15] - CENTRE).max() <= 4.0
    for t in (12, 13, 14):
        below = slice(36, 96)  # the occluder ends above the mouth, about 24 px above the ROI centre
        assert np.corrcoef(track.frames[t, below].ravel(), track.frames[11, below].ravel())[0, 1] > 0.9


@needs_mediapipe
def test_errors_name_the_file(tmp_path):
    from avsr.data.face_video import astronaut_video
    from avsr.data.roi import preprocess_video

    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, size=(10, 64, 64, 3), dtype=np.uint8)
    write_av_video(tmp_path / "noface.mp4", noise, np.zeros(6400, dtype=np.float32))
    with pytest.raises(RoiError, match="noface.mp4.*no face"):
        preprocess_video(tmp_path / "noface.mp4", tmp_path / "a.mp4", tmp_path / "a.wav")
    write_av_video(tmp_path / "silent.mp4", astronaut_video(5).frames, None)
    with pytest.raises(RoiError, match="silent.mp4.*no audio stream"):
        preprocess_video(tmp_path / "silent.mp4", tmp_path / "b.mp4", tmp_path / "b.wav")
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(100))
    with pytest.raises(RoiError, match="broken.mp4"):
        preprocess_video(tmp_path / "broken.mp4", tmp_path / "c.mp4", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.mp4", "noface.mp4", "silent.mp4"]
    stats = preprocess_video(tmp_path / "silent.mp4", tmp_path / "d.mp4", None)  # video only: fine
    assert stats["frames"] == 5 and read_video(tmp_path / "d.mp4").shape == (5, 96, 96)


# --- the command-line tool -----------------------------------------------------------------------------


@needs_mediapipe
def test_preprocess_roi_cli_writes_good_files_lists_bad_ones_and_resumes(tmp_path, caplog):
    from avsr.bin.preprocess_roi import main
    from avsr.data.face_video import astronaut_video, head_motion

    src, dst = tmp_path / "lrs3", tmp_path / "roi"
    (src / "test" / "spk1").mkdir(parents=True)
    (src / "test" / "spk2").mkdir(parents=True)
    video = astronaut_video(36, **head_motion(36, seed=3))  # 1.2 s at 30 fps
    t = np.arange(int(1.2 * 16000)) / 16000
    write_av_video(
        src / "test" / "spk1" / "good.mp4", video.frames, 0.3 * np.sin(2 * np.pi * 200 * t), fps=30
    )
    gray = np.full((20, 64, 64, 3), 128, dtype=np.uint8)
    write_av_video(src / "test" / "spk2" / "bad.mp4", gray, np.zeros(12800, dtype=np.float32))
    (src / "test" / "spk1" / "good.txt").write_text("Text: HELLO\n")  # not copied

    assert main(["--src-dir", str(src), "--dst-dir", str(dst), "--nj", "2", "--no-progress"]) == 0
    roi = read_video(dst / "test" / "spk1" / "good.mp4")
    assert roi.shape == (30, 96, 96)  # 1.2 s at 25 fps
    wav = read_wav(dst / "test" / "spk1" / "good.wav")
    assert wav.shape == (30 * 640,) and 0.2 < float(wav.abs().max()) < 0.4
    lines = (dst / "failed.tsv").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("test/spk2/bad.mp4\t") and "no face" in lines[0]
    files = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    assert files == ["failed.tsv", "test/spk1/good.mp4", "test/spk1/good.wav"]

    before = (dst / "test" / "spk1" / "good.mp4").stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main(["--src-dir", str(src), "--dst-dir", str(dst), "--no-progress"]) == 0
    assert (dst / "test" / "spk1" / "good.mp4").stat().st_mtime_ns == before
    assert "done 0, skipped 1 (already done), failed 1;" in caplog.text
    assert main(["--src-dir", str(src), "--dst-dir", str(dst), "--no-progress", "--fail-on-error"]) == 1
    assert main(["--src-dir", str(src), "--dst-dir", str(src), "--no-progress"]) == 1  # would overwrite


@needs_mediapipe
def test_preprocess_roi_cli_work_list_with_outputs_and_segments(tmp_path):
    from avsr.bin.preprocess_roi import main
    from avsr.data.face_video import astronaut_video

    clip = tmp_path / "raw" / "clip.mp4"
    clip.parent.mkdir()
    t = np.arange(2 * 16000) / 16000
    write_av_video(clip, astronaut_video(50).frames, 0.3 * np.sin(2 * np.pi * 200 * t))  # 2 s at 25 fps
    work = tmp_path / "roi.list"
    work.write_text(
        f"{clip} train/spk/whole.mp4\n"
        f"{clip} pretrain/spk/piece_0.mp4 0.000 0.800\n"
        f"{clip} pretrain/spk/piece_1.mp4 0.800 -1\n"
    )
    corpus = tmp_path / "corpus"
    assert main(["--list", str(work), "--dst-dir", str(corpus), "--no-progress"]) == 0
    assert read_video(corpus / "train" / "spk" / "whole.mp4").shape == (50, 96, 96)
    assert read_video(corpus / "pretrain" / "spk" / "piece_0.mp4").shape == (20, 96, 96)
    assert read_video(corpus / "pretrain" / "spk" / "piece_1.mp4").shape == (30, 96, 96)
    whole, piece = (
        read_wav(corpus / "train" / "spk" / "whole.wav"),
        read_wav(corpus / "pretrain" / "spk" / "piece_1.wav"),
    )
    assert piece.shape == (30 * 640,) and np.allclose(piece.numpy(), whole.numpy()[20 * 640 :], atol=1e-4)
    assert not (corpus / "failed.tsv").exists()
    work.write_text(f"{clip} ../outside.mp4\n")
    assert main(["--list", str(work), "--dst-dir", str(corpus), "--no-progress"]) == 1


# --- the LRS3-like fixture: a SynthGRID mouth in a real face -------------------------------------------


def _opening(frames: np.ndarray) -> np.ndarray:
    """Per frame: the fraction of dark pixels (open mouth) in the middle of a 96x96 ROI."""
    box = frames[:, 36:84, 20:76].astype(np.float32)
    return (box < 0.45 * np.median(frames, axis=(1, 2))[:, None, None]).mean(axis=(1, 2))


@needs_mediapipe
def test_composite_synthgrid_mouth_comes_back_out_of_the_face_video(tmp_path):
    from avsr.data.face_video import write_face_utterance
    from avsr.data.roi import preprocess_video
    from avsr.data.synthgrid.generate import SynthGridConfig
    from avsr.data.synthgrid.utterance import render_video

    segments = [
        (0.0, 0.2, "pau"), (0.2, 0.3, "b"), (0.3, 0.6, "aa"), (0.6, 0.7, "m"), (0.7, 1.0, "aa"),
        (1.0, 1.1, "f"), (1.1, 1.4, "uw"), (1.4, 1.5, "p"), (1.5, 1.8, "iy"), (1.8, 2.0, "pau"),
    ]  # fmt: skip
    speaker = [s for s in SynthGridConfig(train_speakers=2).speakers() if s.split == "train"][1]
    write_video(tmp_path / "utt.mp4", render_video(segments, 50, speaker, np.random.default_rng(0)))
    t = np.arange(50 * 640) / 16000
    write_wav(tmp_path / "utt.wav", 0.3 * np.sin(2 * np.pi * 150 * t))
    face = write_face_utterance(tmp_path / "utt.mp4", tmp_path / "utt.wav", tmp_path / "face.mp4", seed=4)
    assert face.frames.shape == (50, 224, 224, 3)
    assert abs(read_audio_track(tmp_path / "face.mp4").shape[0] - 50 * 640) < 1024

    stats = preprocess_video(tmp_path / "face.mp4", tmp_path / "roi.mp4", tmp_path / "roi.wav")
    assert stats["frames"] == 50 and stats["frames_without_face"] == 0
    original, back = read_video(tmp_path / "utt.mp4").numpy(), read_video(tmp_path / "roi.mp4").numpy()
    assert back.shape == original.shape == (50, 96, 96)
    # the mouth opening over time is the same signal (measured: correlation 0.99)
    assert np.corrcoef(_opening(original), _opening(back))[0, 1] > 0.8
    # and the mouth is at the same place and scale: the changes from frame to frame match pixel by pixel once
    # shifted by the offset of the rendered mouth (4 px below the ROI centre; the ROI step centres the lips)
    # measured: 0.84 at (0, -4) here; 0.70-0.85 at dx -1..2, dy -8..-4 for 6 speakers
    change_a = (original - original.mean(axis=0)).astype(np.float32)
    change_b = (back - back.mean(axis=0)).astype(np.float32)
    box_a = change_a[:, 20:76, 16:80].ravel()
    scores = {
        (dx, dy): np.corrcoef(box_a, change_b[:, 20 + dy : 76 + dy, 16 + dx : 80 + dx].ravel())[0, 1]
        for dx in range(-8, 9)
        for dy in range(-12, 9)
    }
    (dx, dy), best = max(scores.items(), key=lambda item: item[1])
    assert best > 0.6 and abs(dx) <= 3 and -10 <= dy <= -2, (best, dx, dy)
