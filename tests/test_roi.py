"""Mouth ROIs as AV-HuBERT's ``align_mouth.py`` cuts them: the geometry against an independent
re-implementation of the original, landmark files, MediaPipe's 68 points on a real face (scikit-image's
astronaut), the command-line tool.

The tests that run MediaPipe are skipped when it is not installed (``pip install 'avsr[video]'``); CI has it.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from collections import deque

import numpy as np
import pytest

from avsr.data.media import read_audio_track, read_video, read_wav, write_av_video, write_video, write_wav
from avsr.data.roi import (
    MOUTH_POINTS,
    STABLE_POINTS,
    RoiError,
    alignment_transforms,
    crop_origins,
    extract_mouth_roi,
    interpolate_landmarks,
    load_landmarks,
    mean_face,
    rgb_to_gray,
)

needs_mediapipe = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None or importlib.util.find_spec("skimage") is None,
    reason="needs mediapipe and scikit-image: pip install 'avsr[video]'",
)
needs_skimage_cv2 = pytest.mark.skipif(
    importlib.util.find_spec("skimage") is None or importlib.util.find_spec("cv2") is None,
    reason="needs scikit-image and OpenCV (a mediapipe dependency)",
)
CENTRE = 48.0  # where the crop puts the mean of the lip points: rows round(cy) - 48 .. round(cy) + 48


# --- the original, written again from align_mouth.py, to compare with -----------------------------------


def _original_interpolate(landmarks: list) -> list:
    """landmarks_interpolate: linear between frames with landmarks, the first / last copied outwards."""
    landmarks = list(landmarks)
    valid = [i for i, f in enumerate(landmarks) if f is not None]
    for a, b in zip(valid[:-1], valid[1:]):
        delta = landmarks[b] - landmarks[a]
        for i in range(1, b - a):
            landmarks[a + i] = landmarks[a] + i / float(b - a) * delta
    landmarks[: valid[0]] = [landmarks[valid[0]]] * valid[0]
    landmarks[valid[-1] :] = [landmarks[valid[-1]]] * (len(landmarks) - valid[-1])
    return landmarks


def _original_crops(frames_bgr: list, landmarks: list, margin: int = 12) -> np.ndarray:
    """crop_patch + cut_patch (96x96) + cv2.cvtColor(BGR2GRAY), frame by frame (scikit-image, OpenCV)."""
    import cv2
    from skimage import transform

    face, stable = mean_face(), list(STABLE_POINTS)
    margin = min(len(frames_bgr), margin)

    def cut(image, points):
        cx, cy = np.mean(points, axis=0)
        cy = 48 if cy - 48 < 0 else cy
        cx = 48 if cx - 48 < 0 else cx
        cy = image.shape[0] - 48 if cy + 48 > image.shape[0] else cy
        cx = image.shape[1] - 48 if cx + 48 > image.shape[1] else cx
        return image[int(round(cy) - 48) : int(round(cy) + 48), int(round(cx) - 48) : int(round(cx) + 48)]

    def crop(frame, points, tform):
        warped = transform.warp(frame, inverse_map=tform.inverse, output_shape=(256, 256))
        return cv2.cvtColor(
            np.ascontiguousarray(cut((warped * 255).astype("uint8"), points)), cv2.COLOR_BGR2GRAY
        )

    queue, out = deque(), []
    for index, frame in enumerate(frames_bgr):
        queue.append((frame, landmarks[index]))
        if len(queue) == margin:
            smooth = np.mean([points for _, points in queue], axis=0)
            tform = transform.estimate_transform("similarity", smooth[stable], face[stable])
            frame_, points = queue.popleft()
            out.append(crop(frame_, tform(points)[48:68], tform))
    while queue:  # the last margin - 1 frames: the last transform
        frame_, points = queue.popleft()
        out.append(crop(frame_, tform(points)[48:68], tform))
    return np.stack(out)


def _random_video(rng, num_frames, dtype, mouth_shift=(0.0, 0.0), floor=0, centre=(75, 75), size=150):
    """Crops of the astronaut photo and landmarks: the mean face moved to ``centre``, with noise."""
    from skimage.data import astronaut

    photo = astronaut()
    corners = rng.integers(0, 512 - size, (num_frames, 2))
    frames = np.stack([np.maximum(photo[y : y + size, x : x + size], floor) for y, x in corners])
    face = mean_face()
    face[48:68] += mouth_shift
    angle, scale = rng.uniform(-0.3, 0.3), rng.uniform(0.35, 0.6)
    rot = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    points = (face - 128) @ rot.T + centre + rng.normal(0, 5, 2)
    landmarks = points + rng.normal(0, 1.5, (num_frames, 68, 2)) + rng.normal(0, 4, (num_frames, 1, 2))
    return frames, (np.round(landmarks) if dtype == np.int32 else landmarks).astype(dtype)


# --- geometry without MediaPipe ----------------------------------------------------------------------


@needs_skimage_cv2
@pytest.mark.parametrize(
    "dtype, num_frames, missing, mouth_shift, floor, centre",
    [
        (np.int32, 17, (0, 3, 4, 5, 16), (0.0, 0.0), 0, (75, 75)),  # dlib's int32 pickles, gaps at both ends
        (np.float32, 15, (7,), (0.0, 0.0), 9, (20, 140)),  # float32; no 0 in the frames, mouth at the edge
        (np.float64, 20, (), (70.0, 95.0), 0, (75, 75)),  # mouth far off: crops clamped to the 256 frame
        (np.float64, 5, (1, 2), (-90.0, -120.0), 12, (75, 75)),  # fewer frames than the window, clamped
    ],
)
def test_crops_are_the_originals_bit_for_bit(dtype, num_frames, missing, mouth_shift, floor, centre):
    rng = np.random.default_rng(num_frames)
    frames, landmarks = _random_video(rng, num_frames, dtype, mouth_shift, floor, centre)
    given = [None if t in missing else landmarks[t] for t in range(num_frames)]
    expected = _original_crops([f[..., ::-1] for f in frames], _original_interpolate(given))
    track = extract_mouth_roi(frames, given)
    assert track.frames.shape == expected.shape == (num_frames, 96, 96)
    assert np.array_equal(track.frames, expected)  # exact: same float64 steps, truncation and fixed point
    assert track.detected.tolist() == [t not in missing for t in range(num_frames)]
    assert track.clamped.all() == (mouth_shift != (0.0, 0.0)) and track.clamped.any() == track.clamped.all()
    if centre != (75, 75):  # the crops sample outside the source frames (cval 0 and warp's clipping)
        inverse = np.linalg.inv(
            np.concatenate([track.transforms, np.tile([0.0, 0.0, 1.0], (num_frames, 1, 1))], 1)
        )
        grid = np.stack(np.meshgrid(np.arange(96), np.arange(96)), -1).reshape(-1, 2)
        src = np.einsum("tij,nj->tni", inverse[:, :2, :2], grid) + inverse[:, None, :2, 2]
        assert ((src < -1) | (src > 150)).any(axis=(1, 2)).all()


@needs_skimage_cv2
@pytest.mark.parametrize("shift", [0.5, 1.5])
def test_sampling_clips_as_warp_does_at_the_frame_edge(shift):
    # frames without a 0 pixel, the 256x256 output shifted half a pixel (no output pixel wholly outside the
    # frame: warp clips partly outside pixels up to the frame's minimum) or 1.5 pixels (some wholly outside:
    # the clip's minimum becomes the outside value 0)
    from skimage.transform import SimilarityTransform, warp

    from avsr.data.roi import sample_crops

    rng = np.random.default_rng(0)
    frames = rng.integers(40, 256, (2, 256, 256, 3), dtype=np.uint8)
    tform = SimilarityTransform(translation=(-shift, -shift))  # source = output + shift
    origins = np.array([[160, 160], [100, 160]])
    crops = sample_crops(frames, np.tile(tform.inverse.params, (2, 1, 1)), origins, 96)
    for frame, (row, col), crop in zip(frames, origins, crops):
        expected = (warp(frame, inverse_map=tform.inverse, output_shape=(256, 256)) * 255).astype("uint8")
        assert np.array_equal(crop, expected[row : row + 96, col : col + 96])
    assert (crops[:, -1] < 40).any() == (shift > 1)  # the last row mixes in the outside value only then


@needs_skimage_cv2
def test_gray_is_opencvs_bgr2gray_on_every_colour():
    import cv2

    values = np.arange(256, dtype=np.uint8)
    r, g, b = np.meshgrid(values, values, values, indexing="ij")
    rgb = np.stack([r, g, b], axis=-1).reshape(4096, 4096, 3)
    assert np.array_equal(rgb_to_gray(rgb), cv2.cvtColor(rgb[..., ::-1].copy(), cv2.COLOR_BGR2GRAY))


def test_missing_frames_are_interpolated_as_the_original():
    rng = np.random.default_rng(0)
    landmarks = rng.normal(100, 30, (9, 68, 2))
    detected = np.array([False, False, True, False, False, True, True, False, False])
    filled = interpolate_landmarks(np.where(detected[:, None, None], landmarks, np.nan), detected)
    assert np.array_equal(filled[:2], landmarks[[2, 2]]) and np.array_equal(filled[7:], landmarks[[6, 6]])
    assert np.array_equal(filled[[2, 5, 6]], landmarks[[2, 5, 6]])
    for t in (3, 4):  # start + (i / n) * (stop - start), bit for bit
        assert np.array_equal(filled[t], landmarks[2] + (t - 2) / 3.0 * (landmarks[5] - landmarks[2]))
    assert np.array_equal(interpolate_landmarks(np.where(detected[:, None, None], landmarks, np.nan)), filled)
    with pytest.raises(ValueError, match="no frame"):
        interpolate_landmarks(landmarks, np.zeros(9, dtype=bool))


def test_transform_of_a_frame_fits_the_next_window_and_the_last_frames_reuse_one():
    from skimage.transform import estimate_transform

    rng = np.random.default_rng(1)
    landmarks = mean_face() * rng.uniform(0.8, 1.2) + rng.normal(0, 3, (30, 68, 2))
    forward, inverse = alignment_transforms(landmarks, window_margin=12)
    assert forward.shape == inverse.shape == (30, 3, 3)
    stable, face = list(STABLE_POINTS), mean_face()
    for t in (0, 7, 18):  # frame t: the mean of frames t .. t + 11
        fit = estimate_transform("similarity", landmarks[t : t + 12].mean(axis=0)[stable], face[stable])
        assert np.allclose(forward[t], fit.params, rtol=0, atol=1e-12)
        assert np.allclose(inverse[t] @ forward[t], np.eye(3), atol=1e-12)
    assert all(np.array_equal(forward[t], forward[18]) for t in range(19, 30))  # the original's queue
    assert not np.array_equal(forward[17], forward[18])
    short, _ = alignment_transforms(landmarks[:5], window_margin=12)  # margin = min(T, 12) = 5
    assert all(np.array_equal(short[t], short[0]) for t in range(5))
    fit = estimate_transform("similarity", landmarks[:5].mean(axis=0)[stable], face[stable])
    assert np.allclose(short[0], fit.params, atol=1e-12)


def test_crop_is_centred_on_the_lips_and_clamped_to_the_reference_frame():
    face = mean_face()
    identity = np.tile(np.eye(3), (4, 1, 1))
    landmarks = np.tile(face, (4, 1, 1))
    landmarks[1, 48:68] += (-100.0, 0.0)  # lips off the left edge: centre moved to x = 48
    landmarks[2, 48:68] += (0.0, 90.0)  # below: y = 256 - 48
    landmarks[3, 48:68] += (0.5 - face[48:68].mean(axis=0)[0] + 130, 0.0)  # centre x = 130.5: round to 130
    origins, mouth, clamped = crop_origins(landmarks, identity, 96)
    centre = face[48:68].mean(axis=0)
    assert origins[0].tolist() == [round(centre[1]) - 48, round(centre[0]) - 48]
    assert origins[1, 1] == 0 and origins[2, 0] == 160 and origins[3, 1] == 130 - 48  # half to even
    assert clamped.tolist() == [False, True, True, False]
    assert mouth.shape == (4, 20, 2) and np.array_equal(mouth[0], face[48:68])


def test_mean_face_is_shipped_package_data():
    face = mean_face()
    assert face.shape == (68, 2) and face.dtype == np.float64
    assert np.linalg.norm(face[45] - face[36]) == pytest.approx(74.16, abs=0.01)  # outer eye corners
    assert np.linalg.norm(face[54] - face[48]) == pytest.approx(45.03, abs=0.01)  # mouth corners
    face[0] = 0  # a copy: the module's stays intact
    assert mean_face()[0, 0] != 0


def test_landmark_files_pickles_npy_and_a_malicious_pickle(tmp_path):
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 224, (68, 2)).astype(np.int32) for _ in range(4)]
    frames[1] = None  # no face in frame 1 (detect_landmark.py stores None)
    for protocol in (2, 4, 5):
        path = tmp_path / f"clip{protocol}.pkl"
        path.write_bytes(pickle.dumps(frames, protocol=protocol))
        landmarks, detected = load_landmarks(path)
        assert landmarks.shape == (4, 68, 2) and landmarks.dtype == np.float64
        assert detected.tolist() == [True, False, True, True] and np.isnan(landmarks[1]).all()
        assert np.array_equal(landmarks[3], frames[3])
    array = np.where(detected[:, None, None], landmarks, np.nan).astype(np.float32)
    np.save(tmp_path / "clip.npy", array)
    loaded, found = load_landmarks(tmp_path / "clip.npy")
    assert loaded.dtype == np.float32 and found.tolist() == detected.tolist()

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'pwned'}",)

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps([frames[0], Exploit()]))
    with pytest.raises(RoiError, match=r"evil\.pkl: refusing .*system.* not allowed"):
        load_landmarks(tmp_path / "evil.pkl")
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "dict.pkl").write_bytes(pickle.dumps({"landmarks": frames[0]}))
    with pytest.raises(RoiError, match=r"dict\.pkl: expected a list"):
        load_landmarks(tmp_path / "dict.pkl")
    (tmp_path / "shape.pkl").write_bytes(pickle.dumps([np.zeros((5, 2))]))
    with pytest.raises(RoiError, match=r"shape\.pkl: every frame"):
        load_landmarks(tmp_path / "shape.pkl")
    (tmp_path / "cut.pkl").write_bytes(pickle.dumps(frames)[:100])
    with pytest.raises(RoiError, match=r"cut\.pkl: cannot read"):
        load_landmarks(tmp_path / "cut.pkl")
    with pytest.raises(RoiError, match="not found"):
        load_landmarks(tmp_path / "none.pkl")


def test_given_landmarks_need_no_mediapipe_and_errors_name_the_video(monkeypatch):
    monkeypatch.setitem(sys.modules, "mediapipe", None)  # import mediapipe -> ImportError
    frames = np.zeros((3, 64, 64, 3), dtype=np.uint8)
    with pytest.raises(ImportError, match=r"pip install 'avsr\[video\]'"):
        extract_mouth_roi(frames)
    landmarks = (mean_face() - 128) / 4 + 32
    track = extract_mouth_roi(frames, [landmarks, None, landmarks], name="v.mp4")
    assert track.frames.shape == (3, 96, 96) and track.num_missing == 1
    with pytest.raises(RoiError, match="v.mp4: no frame has landmarks"):
        extract_mouth_roi(frames, [None, None, None], name="v.mp4")
    with pytest.raises(RoiError, match="v.mp4: 4 frames of landmarks, but 3 video frames"):
        extract_mouth_roi(frames, [landmarks] * 4, name="v.mp4")
    assert extract_mouth_roi(frames, [landmarks] * 2).num_frames == 2  # as the original: stops with them


# --- the astronaut's face ------------------------------------------------------------------------------


@needs_mediapipe
def test_astronaut_constants_and_68_points_in_plausible_places():
    from skimage.data import astronaut
    from skimage.transform import estimate_transform

    from avsr.data.face_video import ASTRONAUT_EYE_CORNERS, ASTRONAUT_MOUTH, ASTRONAUT_STABLE_POINTS
    from avsr.data.roi import detect_landmarks68

    landmarks, detected = detect_landmarks68(astronaut()[None])
    points = landmarks[0].astype(np.float64)
    assert detected.tolist() == [True] and landmarks.shape == (1, 68, 2) and landmarks.dtype == np.float32
    assert np.abs(points[list(MOUTH_POINTS)].mean(axis=0) - ASTRONAUT_MOUTH).max() < 0.5
    assert np.abs(points[list(STABLE_POINTS)] - ASTRONAUT_STABLE_POINTS).max() < 0.5
    assert np.abs(points[[36, 45]] - ASTRONAUT_EYE_CORNERS).max() < 0.5
    # image left to right: outer / inner corner of the left eye, inner / outer of the right; mouth corners
    assert points[36, 0] < points[39, 0] < points[33, 0] < points[42, 0] < points[45, 0]
    assert points[48, 0] < points[60, 0] < points[62, 0] < points[64, 0] < points[54, 0]
    # top to bottom: brows, eyes, nose tip, nose bottom, upper lip, inner lips, lower lip, chin
    assert points[19, 1] < points[37, 1] < points[30, 1] < points[33, 1] < points[51, 1]
    assert points[51, 1] < points[62, 1] < points[66, 1] < points[57, 1] < points[8, 1]
    # fitted to the mean face on all 68 points, the residuals per group (256x256 frame pixels); measured
    # 4-7 (jaw 7.5): she smiles, the mean face does not; the eye corners fit to 1.5 px on the 5 stable points
    face = mean_face()
    fit = estimate_transform("similarity", points, face)
    residual = np.linalg.norm(fit(points) - face, axis=1)
    for group, limit in ((range(0, 17), 10), (range(17, 27), 9), (range(27, 36), 8), (range(36, 48), 7),
                         (range(48, 68), 7)):  # fmt: skip
        assert residual[list(group)].mean() < limit, (group, residual[list(group)].mean())
    stable = list(STABLE_POINTS)
    fit = estimate_transform("similarity", points[stable], face[stable])
    assert np.linalg.norm(fit(points[stable]) - face[stable], axis=1)[1:].mean() < 2.5
    assert fit.scale == pytest.approx(1.264, abs=0.02)  # 74.2 px between the outer eye corners


@needs_mediapipe
def test_moving_face_rois_follow_the_originals_forward_window():
    from avsr.data.face_video import astronaut_video, head_motion

    motion = head_motion(40, seed=1, shift=8.0, scale=0.08, rotation=8.0)
    video = astronaut_video(40, **motion)
    track = extract_mouth_roi(video.frames)
    assert track.frames.shape == (40, 96, 96) and track.frames.dtype == np.uint8
    assert track.detected.all() and track.num_missing == 0 and not track.clamped.any()
    # the true mouth centre (known from the photo and the motion) lands at the crop centre: measured 1.2 px
    truth = np.einsum("tij,tj->ti", track.transforms[:, :, :2], video.mouth) + track.transforms[:, :, 2]
    assert np.abs(truth - CENTRE).max() <= 2.0
    assert track.mouth.shape == (40, 20, 2) and np.abs(track.mouth.mean(axis=1) - CENTRE).max() <= 0.5
    # roll and zoom of the crops follow the mean head pose of the window t .. t + 11 (the original's queue),
    # not the frame's own: measured spreads 0.3 degrees and 0.6 % (14.9 degrees and 4 % against the frame's)
    window = np.minimum(np.arange(40), 40 - 12)[:, None] + np.arange(12)
    angle = np.degrees(np.arctan2(track.transforms[:, 1, 0], track.transforms[:, 0, 0]))
    assert np.ptp(angle + motion["rotations"][window].mean(axis=1)) < 1.0
    assert np.ptp(angle + motion["rotations"]) > 8.0
    scale = np.hypot(track.transforms[:, 0, 0], track.transforms[:, 1, 0])
    assert np.ptp(scale * motion["scales"][window].mean(axis=1)) < 0.02


@needs_mediapipe
def test_frames_without_a_face_are_interpolated():
    from avsr.data.face_video import astronaut_video, head_motion

    motion = head_motion(30, seed=2, shift=8.0, scale=0.05, rotation=5.0)
    video = astronaut_video(30, **motion, occluded_frames=[12, 13, 14], occluder="eyes")
    track = extract_mouth_roi(video.frames)
    assert track.detected.tolist() == (~video.occluded).tolist()
    for t in (12, 13, 14):  # the landmarks there lie between the neighbours', linear in time
        expected = track.landmarks[11] + (t - 11) / 4 * (track.landmarks[15] - track.landmarks[11])
        assert np.allclose(track.landmarks[t], expected, atol=1e-3)
    # which is still where the (visible) mouth is, so the ROI shows the mouth, not a blank: measured 0.8 px
    truth = np.einsum("tij,tj->ti", track.transforms[:, :, :2], video.mouth) + track.transforms[:, :, 2]
    assert np.abs(truth[12:15] - CENTRE).max() <= 2.0
    for t in (12, 13, 14):  # measured correlations 0.97-0.99
        below = slice(36, 96)  # the occluder ends above the mouth
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
    np.save(tmp_path / "long.npy", np.zeros((6, 68, 2)))
    with pytest.raises(RoiError, match="silent.mp4: 6 frames of landmarks for a video of 5 frames"):
        preprocess_video(tmp_path / "silent.mp4", tmp_path / "c.mp4", None, landmarks=tmp_path / "long.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.mp4",
        "long.npy",
        "noface.mp4",
        "silent.mp4",
    ]
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
    assert main(["--src-dir", str(src), "--dst-dir", str(src), "--no-progress"]) == 2  # overwriting: misuse


@needs_mediapipe
def test_preprocess_roi_cli_reads_landmarks_in_the_originals_layout(tmp_path):
    from avsr.bin.preprocess_roi import main
    from avsr.data.face_video import astronaut_video, head_motion
    from avsr.data.media import read_video_rgb
    from avsr.data.roi import detect_landmarks68

    src, marks = tmp_path / "lrs3", tmp_path / "landmarks"
    (src / "trainval" / "spk").mkdir(parents=True)
    video = astronaut_video(25, **head_motion(25, seed=5))
    write_av_video(src / "trainval" / "spk" / "50001.mp4", video.frames, np.zeros(16000, dtype=np.float32))
    write_av_video(src / "trainval" / "spk" / "50002.mp4", video.frames, np.zeros(16000, dtype=np.float32))
    frames = read_video_rgb(src / "trainval" / "spk" / "50001.mp4")[0].numpy()  # as the tool decodes it
    landmarks, detected = detect_landmarks68(frames)
    pickled = [np.round(p).astype(np.int32) if d else None for p, d in zip(landmarks, detected)]  # as dlib's
    pickled[3] = None
    (marks / "trainval" / "spk").mkdir(parents=True)
    (marks / "trainval" / "spk" / "50001.pkl").write_bytes(pickle.dumps(pickled))

    dst = tmp_path / "roi"
    args = ["--src-dir", str(src), "--dst-dir", str(dst), "--landmarks-dir", str(marks), "--no-progress"]
    assert main(args) == 0
    expected = extract_mouth_roi(frames, pickled).frames
    written = read_video(dst / "trainval" / "spk" / "50001.mp4").numpy()
    assert written.shape == expected.shape == (25, 96, 96)
    assert np.abs(written.astype(float) - expected).mean() < 2.0  # the H.264 round trip only
    reason = (dst / "failed.tsv").read_text()
    assert reason.startswith("trainval/spk/50002.mp4\t") and "50002.pkl" in reason and "not found" in reason


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
    assert main(["--list", str(work), "--dst-dir", str(corpus), "--no-progress"]) == 2  # outside: misuse


# --- the LRS3-like fixture: a SynthGRID mouth in a real face -------------------------------------------


def _opening(frames: np.ndarray) -> np.ndarray:
    """Per frame: the fraction of dark pixels (open mouth) in the middle of a 96x96 ROI."""
    box = frames[:, 36:84, 20:76].astype(np.float32)
    return (box < 0.45 * np.median(frames, axis=(1, 2))[:, None, None]).mean(axis=(1, 2))


@needs_mediapipe
def test_composite_synthgrid_mouth_comes_back_out_of_the_face_video(tmp_path):
    from avsr.corpora.synthgrid.generate import SynthGridConfig
    from avsr.corpora.synthgrid.utterance import render_video
    from avsr.data.face_video import write_face_utterance
    from avsr.data.roi import preprocess_video

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
    # the mouth opening over time is the same signal
    assert np.corrcoef(_opening(original), _opening(back))[0, 1] > 0.8
    # and the mouth is at the same place and scale: the changes from frame to frame match pixel by pixel once
    # shifted by the offset of the rendered mouth (4 px below the ROI centre; the ROI step centres the lips)
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
