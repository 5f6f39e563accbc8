"""Media I/O: wav and mp4 round trips, and every error names the file."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from avsr.data.media import MediaError, read_video, read_wav, video_fps, write_video, write_wav


def test_wav_round_trip_keeps_samples_to_16_bit_precision(tmp_path):
    rng = np.random.default_rng(0)
    wav = (0.5 * rng.standard_normal(16000)).clip(-1, 1).astype(np.float32)
    path = tmp_path / "a.wav"
    write_wav(path, wav)
    back = read_wav(path)
    assert back.dtype == torch.float32 and back.shape == (16000,)
    assert np.abs(back.numpy() - wav).max() <= 1.0 / 32768 + 1e-6
    assert soundfile.info(str(path)).subtype == "PCM_16"
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]  # no temporary file left behind


def test_write_wav_accepts_tensors_and_clips(tmp_path):
    path = tmp_path / "t.wav"
    write_wav(path, torch.tensor([0.0, 2.0, -2.0, 0.25]))
    assert np.allclose(read_wav(path).numpy(), [0.0, 32767 / 32768, -1.0, 0.25], atol=1e-4)


def test_read_wav_missing_file_names_it(tmp_path):
    with pytest.raises(MediaError, match="missing.wav"):
        read_wav(tmp_path / "missing.wav")


def test_read_wav_corrupt_file_names_it(tmp_path):
    path = tmp_path / "corrupt.wav"
    path.write_bytes(b"RIFF\x00\x01garbage" * 10)
    with pytest.raises(MediaError, match="corrupt.wav"):
        read_wav(path)


def test_read_wav_wrong_sample_rate_names_both_rates(tmp_path):
    path = tmp_path / "eight.wav"
    write_wav(path, np.zeros(800, dtype=np.float32), sample_rate=8000)
    with pytest.raises(MediaError, match=r"eight.wav.*8000 Hz.*16000 Hz"):
        read_wav(path)
    assert read_wav(path, sample_rate=8000).shape == (800,)


def test_read_wav_refuses_stereo(tmp_path):
    path = tmp_path / "stereo.wav"
    soundfile.write(str(path), np.zeros((100, 2), dtype=np.float32), 16000)
    with pytest.raises(MediaError, match="stereo.wav.*2 channels"):
        read_wav(path)


def test_write_wav_refuses_bad_arrays(tmp_path):
    with pytest.raises(MediaError, match="x.wav"):
        write_wav(tmp_path / "x.wav", np.zeros((2, 10), dtype=np.float32))
    with pytest.raises(MediaError, match="NaN"):
        write_wav(tmp_path / "x.wav", np.array([0.0, np.nan], dtype=np.float32))
    assert not list(tmp_path.iterdir())


def _moving_pattern(num_frames: int = 12) -> np.ndarray:
    """A smooth moving gradient with a dark disc: (T, 96, 96) uint8."""
    yy, xx = np.mgrid[0:96, 0:96]
    frames = []
    for t in range(num_frames):
        img = 40 + 1.5 * xx + 0.5 * yy
        img[(xx - 30 - 3 * t) ** 2 + (yy - 48) ** 2 < 150] = 10
        frames.append(img)
    return np.clip(frames, 0, 255).astype(np.uint8)


def test_video_round_trip_96x96_25fps(tmp_path):
    frames = _moving_pattern()
    path = tmp_path / "v.mp4"
    write_video(path, frames, fps=25)
    back = read_video(path)
    assert back.dtype == torch.uint8 and back.shape == (12, 96, 96)
    assert np.abs(back.numpy().astype(float) - frames).mean() < 3.0  # H.264 is lossy, but barely at crf 23
    assert video_fps(path) == 25.0
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]


def test_read_video_gives_what_ffmpeg_gray_conversion_gives(tmp_path):
    import av

    path = tmp_path / "v.mp4"
    write_video(path, _moving_pattern(4))
    with av.open(str(path)) as container:
        reference = np.stack([f.to_ndarray(format="gray") for f in container.decode(video=0)])
    assert np.array_equal(read_video(path).numpy(), reference)


def test_read_video_missing_file_names_it(tmp_path):
    with pytest.raises(MediaError, match="nothing.mp4"):
        read_video(tmp_path / "nothing.mp4")


def test_read_video_corrupt_file_names_it(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(200))
    with pytest.raises(MediaError, match="broken.mp4"):
        read_video(path)


def test_read_video_without_video_stream_says_so(tmp_path):
    path = tmp_path / "audio_only.wav"
    write_wav(path, np.zeros(1600, dtype=np.float32))
    with pytest.raises(MediaError, match="audio_only.wav.*no video stream"):
        read_video(path)


def test_write_video_refuses_bad_frames(tmp_path):
    with pytest.raises(MediaError, match="odd.mp4.*even"):
        write_video(tmp_path / "odd.mp4", np.zeros((2, 95, 96), dtype=np.uint8))
    with pytest.raises(MediaError, match="float.mp4.*uint8"):
        write_video(tmp_path / "float.mp4", np.zeros((2, 96, 96), dtype=np.float32))
    with pytest.raises(MediaError, match="empty.mp4"):
        write_video(tmp_path / "empty.mp4", np.zeros((0, 96, 96), dtype=np.uint8))
    assert not list(tmp_path.iterdir())


def test_write_video_is_reproducible(tmp_path):
    rng = np.random.default_rng(0)
    frames = np.clip(_moving_pattern(25).astype(int) + rng.integers(-4, 5, size=(25, 96, 96)), 0, 255)
    frames = frames.astype(np.uint8)
    for name in ("a.mp4", "b.mp4", "c.mp4"):
        write_video(tmp_path / name, frames)
    contents = {(tmp_path / name).read_bytes() for name in ("a.mp4", "b.mp4", "c.mp4")}
    assert len(contents) == 1
