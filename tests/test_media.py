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


@pytest.mark.parametrize("zoom", [1, 3])  # 96x96 decodes on one thread, 288x288 with FFmpeg's threads
def test_read_video_gives_what_ffmpeg_gray_conversion_gives(tmp_path, zoom):
    import av

    path = tmp_path / "v.mp4"
    write_video(path, _moving_pattern(4).repeat(zoom, axis=1).repeat(zoom, axis=2))
    with av.open(str(path)) as container:
        reference = np.stack([f.to_ndarray(format="gray") for f in container.decode(video=0)])
    assert reference.shape == (4, 96 * zoom, 96 * zoom)
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


# --- raw audio-visual recordings: read_audio_track, read_video_rgb, write_av_video ------------------------


def _numbered_rgb(num_frames: int, size: int = 32) -> np.ndarray:
    """(T, size, size, 3) uint8 frames whose gray level encodes the frame index (8 levels apart)."""
    levels = 16 + 8 * np.arange(num_frames)
    return np.broadcast_to(levels[:, None, None, None], (num_frames, size, size, 3)).astype(np.uint8)


def _frame_indices(frames: torch.Tensor) -> np.ndarray:
    return np.rint((frames.numpy().astype(float).mean(axis=(1, 2, 3)) - 16) / 8).astype(int)


def test_write_av_video_round_trip_of_frames_and_audio(tmp_path):
    from avsr.data.media import read_audio_track, read_video_rgb, write_av_video

    frames = np.stack([np.stack([_moving_pattern(12)[t]] * 3, axis=-1) for t in range(12)])  # (12, 96, 96, 3)
    frames[..., 0] = np.clip(frames[..., 0].astype(int) + 40, 0, 255)  # some colour
    t = np.arange(8000) / 16000
    wav = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 0.5 s: 12.5 frames
    path = tmp_path / "av.mp4"
    write_av_video(path, frames, wav)
    back, source_fps = read_video_rgb(path)
    assert back.dtype == torch.uint8 and back.shape == (12, 96, 96, 3) and source_fps == 25.0
    assert np.abs(back.numpy().astype(float) - frames).mean() < 4.0
    audio = read_audio_track(path)
    assert audio.dtype == torch.float32 and 8000 <= audio.shape[0] < 8000 + 1024  # AAC pads to 1024 samples
    lags = [np.dot(audio.numpy()[2000 + lag : 6000 + lag], wav[2000:6000]) for lag in range(-40, 41)]
    assert int(np.argmax(lags)) == 40  # in time: the encoder delay is removed again
    assert np.abs(audio.numpy()[:8000] - wav)[2000:7000].max() < 0.02
    assert read_video(path).shape == (12, 96, 96)  # the gray reader reads it too
    assert [p.name for p in tmp_path.iterdir()] == ["av.mp4"]


def test_write_av_video_takes_gray_frames_and_no_audio(tmp_path):
    from avsr.data.media import read_audio_track, write_av_video

    path = tmp_path / "silent.mp4"
    write_av_video(path, _moving_pattern(5), None)
    assert read_video(path).shape == (5, 96, 96)
    with pytest.raises(MediaError, match="silent.mp4.*no audio stream"):
        read_audio_track(path)


def test_read_video_rgb_resamples_30_fps_to_25_fps_by_timestamp(tmp_path):
    from avsr.data.media import read_video_rgb, write_av_video

    path = tmp_path / "thirty.mp4"
    write_av_video(path, _numbered_rgb(30), None, fps=30)  # 1 s
    frames, source_fps = read_video_rgb(path)
    assert source_fps == 30.0 and frames.shape == (25, 32, 32, 3)  # same duration
    # output frame k shows the source frame nearest to k / 25 s (ties to the earlier one)
    expected = [int(np.floor(k * 30 / 25 + 0.5 - 1e-9)) for k in range(25)]
    assert _frame_indices(frames).tolist() == expected


def test_read_video_rgb_ntsc_rate_and_same_rate(tmp_path):
    from fractions import Fraction

    from avsr.data.media import read_video_rgb, write_av_video

    path = tmp_path / "ntsc.mp4"
    write_av_video(path, _numbered_rgb(30), None, fps=Fraction(30000, 1001))  # 1.001 s
    frames, source_fps = read_video_rgb(path)
    assert abs(source_fps - 29.97) < 0.01 and frames.shape[0] == 25
    assert np.all(np.diff(_frame_indices(frames)) >= 1)  # in order, no frame twice
    same = tmp_path / "same.mp4"
    write_av_video(same, _numbered_rgb(20), None, fps=25)
    frames, _ = read_video_rgb(same)
    assert _frame_indices(frames).tolist() == list(range(20))  # 25 fps is kept frame for frame


def test_read_audio_track_downmixes_and_resamples(tmp_path):
    from avsr.data.media import read_audio_track

    rate = 44100
    t = np.arange(rate // 2) / rate
    tone = 0.5 * np.sin(2 * np.pi * 300 * t)
    path = tmp_path / "stereo.wav"
    soundfile.write(str(path), np.stack([tone, np.zeros_like(tone)], axis=1).astype(np.float32), rate)
    audio = read_audio_track(path)
    assert audio.shape == (8000,)  # 0.5 s at 16 kHz
    assert abs(np.abs(audio.numpy()[1000:-1000]).max() - 0.25) < 0.01  # the mean of the channels


def test_read_audio_track_and_read_video_rgb_name_bad_files(tmp_path):
    from avsr.data.media import read_audio_track, read_video_rgb

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(200))
    for reader in (read_audio_track, read_video_rgb):
        with pytest.raises(MediaError, match="broken.mp4"):
            reader(broken)
        with pytest.raises(MediaError, match="absent.mp4"):
            reader(tmp_path / "absent.mp4")
    audio_only = tmp_path / "audio_only.wav"
    write_wav(audio_only, np.zeros(1600, dtype=np.float32))
    with pytest.raises(MediaError, match="audio_only.wav.*no video stream"):
        read_video_rgb(audio_only)


def test_write_av_video_refuses_bad_input(tmp_path):
    from avsr.data.media import write_av_video

    with pytest.raises(MediaError, match="odd.mp4.*even"):
        write_av_video(tmp_path / "odd.mp4", np.zeros((2, 31, 32, 3), dtype=np.uint8))
    with pytest.raises(MediaError, match="float.mp4.*uint8"):
        write_av_video(tmp_path / "float.mp4", np.zeros((2, 32, 32, 3), dtype=np.float32))
    with pytest.raises(MediaError, match="nan.mp4.*finite"):
        write_av_video(tmp_path / "nan.mp4", np.zeros((2, 32, 32, 3), dtype=np.uint8), np.array([np.nan]))
    assert not list(tmp_path.iterdir())
