"""Video input as users have it: broken timestamps, other and variable frame rates, rotated phone video,
audio that starts before or after the picture or outlasts it -- and audio-visual items whose video cannot be
used, decoded from their audio alone.

The files are written here with PyAV, each with the defect it stands for (read back first to show that
PyAV/FFmpeg sees the defect); the transcripts come from the tiny random model of ``test_inference``: the
properties are equalities between paths that must give the same words.
"""

from __future__ import annotations

import logging
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from avsr.data.media import (
    read_audio_aligned,
    read_audio_track,
    read_video,
    read_video_frames,
    read_video_rgb,
    read_wav,
    video_timing,
    write_av_video,
    write_video,
)
from avsr.inference import TranscribeItem, Transcriber
from tests.test_inference import DECODE, _transcriber, env  # noqa: F401  (env is a fixture)


def _numbered(num_frames: int, size: int = 96) -> np.ndarray:
    """(T, size, size) uint8 frames whose index ``16 a + b`` (up to 255) is written as gray levels 16 + 12 a
    in the left half and 16 + 12 b in the right half."""
    index = np.arange(num_frames)
    frames = np.empty((num_frames, size, size), dtype=np.uint8)
    frames[:, :, : size // 2] = (16 + 12 * (index // 16))[:, None, None]
    frames[:, :, size // 2 :] = (16 + 12 * (index % 16))[:, None, None]
    return frames


def _indices(frames: torch.Tensor) -> list[int]:
    """The frame indices of :func:`_numbered` frames as read back (gray or RGB)."""
    x = frames.numpy().astype(float)
    x = x.mean(axis=-1) if x.ndim == 4 else x
    width = x.shape[2]
    high = np.rint((x[:, :, : width // 2 - 2].mean(axis=(1, 2)) - 16) / 12)
    low = np.rint((x[:, :, width // 2 + 2 :].mean(axis=(1, 2)) - 16) / 12)
    return (16 * high + low).astype(int).tolist()


def _write(path, images: np.ndarray, pts: list[int], time_base: Fraction, rate: float | Fraction = 25,
           rotation: int | None = None, wav: np.ndarray | None = None, audio_start: int = 0) -> None:
    """An H.264 mp4 of gray ``images`` (T, H, W) with the given presentation times (``pts`` in ``time_base``
    units, the stream's rate ``rate``), a display rotation (degrees counter-clockwise), and 16 kHz AAC audio
    whose first sample is at ``audio_start`` samples."""
    with av.open(str(path), "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=rate)
        video.width, video.height, video.pix_fmt = images.shape[2], images.shape[1], "yuv420p"
        video.time_base = time_base
        video.options = {"crf": "10", "preset": "veryfast", "threads": "1"}
        if rotation is not None:
            video.set_display_rotation(rotation)
        audio = container.add_stream("aac", rate=16000, layout="mono") if wav is not None else None
        for image, t in zip(images, pts):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="gray")
            frame.pts, frame.time_base = t, time_base
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if audio is not None:
            for start in range(0, len(wav), 1024):
                chunk = wav[None, start : start + 1024]
                frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
                frame.sample_rate, frame.pts = 16000, start + audio_start
                container.mux(audio.encode(frame))
            container.mux(audio.encode(None))


def _nearest(times: list[float], count: int) -> list[int]:
    """The source frame shown at each of ``count`` ticks of 25 fps (nearest time, ties to the earlier)."""
    return [min(range(len(times)), key=lambda i: (abs(times[i] - k / 25), i)) for k in range(count)]


# --- timestamps and frame rates ------------------------------------------------------------------------


def test_frames_stamped_at_about_one_instant_are_taken_at_25_fps_with_a_note(env, tmp_path, caplog):  # noqa: F811
    path = tmp_path / "stamped.mp4"
    _write(path, _numbered(75), list(range(75)), Fraction(1, 1875), rate=1875)  # 75 frames within 40 ms
    with av.open(str(path)) as container:  # the defect as FFmpeg sees it
        stream = container.streams.video[0]
        times = [f.time for f in container.decode(stream)]
        assert stream.average_rate == 1875 and len(times) == 75 and times[-1] < 0.04
    caplog.set_level(logging.WARNING, logger="avsr.media")
    video = read_video_frames(path)
    assert video.num_frames == 75 and video.source_fps == 25.0 and _indices(video.frames) == list(range(75))
    assert video.notes == {"video_timestamps_ignored": "timestamps giving 1875 fps",
                           "video_assumed_fps": 25.0}
    warnings = [r.getMessage() for r in caplog.records if r.name == "avsr.media"]
    assert len(warnings) == 1 and str(path) in warnings[0] and "25 fps" in warnings[0]
    # a transcript of it with its 3 s of audio: 75 frames, and the note
    wav = torch.from_numpy(np.random.default_rng(0).normal(0, 0.1, 75 * 640)).float()
    result = _transcriber(env)(video=path, audio=wav)
    assert result.ok and result.modality == "audiovisual" and result.num_frames == 75
    assert result.info["video_timestamps_ignored"] == "timestamps giving 1875 fps"
    assert result.info["video_assumed_fps"] == 25.0


def test_variable_frame_rate_is_resampled_to_25_fps_by_its_timestamps(tmp_path):
    times = [k / 30 for k in range(30)] + [1 + k / 15 for k in range(30)]  # 1 s at 30 fps, 2 s at 15 fps
    path = tmp_path / "vfr.mp4"
    _write(path, _numbered(60, 32), [round(t * 1000) for t in times], Fraction(1, 1000), rate=30)
    video = read_video_frames(path)
    assert video.num_frames == 75  # 3 s, the last frame shown for 1/15 s as the ones before it
    assert _indices(video.frames) == _nearest(times, 75)
    assert read_video_rgb(path)[0].shape == (75, 32, 32, 3)
    assert video_timing(path).num_frames == 75 and video_timing(path).frames is None


@pytest.mark.parametrize("rate", [24, Fraction(30000, 1001), 30, 50, 60])
def test_common_rates_become_25_fps_of_the_same_duration(tmp_path, rate):
    count = round(3 * rate)  # 3 s
    path = tmp_path / "rate.mp4"
    _write(path, _numbered(count, 32), list(range(count)), Fraction(1, 1) / rate, rate=rate)
    video = read_video_frames(path)
    times = [i / rate for i in range(count)]
    assert video.num_frames == 75 and _indices(video.frames) == _nearest(times, 75)
    assert video.notes == {"video_resampled_from_fps": round(float(rate), 3)}


def test_a_30_fps_roi_video_is_read_at_25_fps_by_the_transcriber(env, tmp_path):  # noqa: F811
    path = tmp_path / "thirty.mp4"
    _write(path, _numbered(90), list(range(90)), Fraction(1, 30), rate=30)  # 3 s of 96x96 frames
    wav = torch.from_numpy(np.random.default_rng(1).normal(0, 0.1, 75 * 640)).float()
    result = _transcriber(env)(video=path, audio=wav)
    assert result.ok and result.num_frames == 75 and result.info["video_resampled_from_fps"] == 30.0


def test_a_25_fps_roi_video_is_read_frame_for_frame_as_training_reads_it(tmp_path):
    path = tmp_path / "roi.mp4"
    write_video(path, np.random.default_rng(2).integers(0, 256, (40, 96, 96), dtype=np.uint8))
    video = read_video_frames(path)
    assert torch.equal(video.frames, read_video(path)) and video.notes == {} and video.source_fps == 25.0


# --- rotation, gray and odd sizes --------------------------------------------------------------------


@pytest.mark.parametrize("degrees", [90, 180, 270])
def test_rotated_video_comes_out_upright(tmp_path, degrees):
    upright = np.full((64, 48), 40, dtype=np.uint8)  # portrait: a bright block at the top left,
    upright[:16, :16] = 230  # a mid-gray one at the bottom
    upright[48:, 16:32] = 140
    stored = np.rot90(upright, -degrees // 90)  # as the camera wrote it; shown turned counter-clockwise
    path = tmp_path / "phone.mp4"
    _write(path, np.repeat(stored[None], 5, axis=0), list(range(5)), Fraction(1, 25), rotation=degrees)
    with av.open(str(path)) as container:  # the rotation is metadata only
        frame = next(container.decode(video=0))
        assert (frame.height, frame.width) == stored.shape and round(frame.rotation) % 360 == degrees % 360
    video = read_video_frames(path)
    assert video.frames.shape == (5, 64, 48) and video.notes["video_rotated_deg"] == degrees
    assert np.abs(video.frames[0].numpy().astype(int) - upright).mean() < 4
    assert read_video(path).shape == (5, 64, 48)
    rgb, _ = read_video_rgb(path)
    assert rgb.shape == (5, 64, 48, 3) and rgb[0, :16, :16].float().mean() > 200


def test_gray_sources_and_odd_sizes_are_read(tmp_path):
    path = tmp_path / "gray.mkv"
    with av.open(str(path), "w") as container:  # lossless gray, odd width and height, 30 fps
        stream = container.add_stream("ffv1", rate=30)
        stream.width, stream.height, stream.pix_fmt = 97, 75, "gray"
        for i, image in enumerate(_numbered(30, 97)[:, :75]):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="gray")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    gray = read_video_frames(path)
    assert gray.frames.shape == (25, 75, 97)
    assert _indices(gray.frames) == _nearest([i / 30 for i in range(30)], 25)
    assert read_video_frames(path, gray=False).frames.shape == (25, 75, 97, 3)


# --- audio against video ----------------------------------------------------------------------------


def _tone(seconds: float, seed: int = 3) -> np.ndarray:
    return (0.3 * np.random.default_rng(seed).standard_normal(int(seconds * 16000))).astype(np.float32)


@pytest.mark.parametrize("video_start, audio_start", [(0, 8000), (12, 0)],
                         ids=["audio_later", "audio_earlier"])
def test_audio_is_aligned_to_the_first_video_frame(env, tmp_path, video_start, audio_start):  # noqa: F811
    wav = _tone(2.0)
    path = tmp_path / "av.mp4"
    _write(path, _numbered(50), [video_start + i for i in range(50)], Fraction(1, 25), wav=wav,
           audio_start=audio_start)
    offset_s = audio_start / 16000 - video_start / 25  # +0.5 s (audio later) or -0.48 s (audio earlier)
    video = video_timing(path)
    assert video.start_s == pytest.approx(video_start / 25)
    aligned, offset = read_audio_aligned(path, video.start_s)
    lag = round(offset_s * 16000)  # where the recorded samples are in the aligned audio

    def found_lag(x: np.ndarray) -> int:
        window = wav[10000:18000]
        lags = list(range(lag - 2000, lag + 2001))
        return lags[int(np.argmax([np.dot(x[10000 + k : 18000 + k], window) for k in lags]))]

    assert found_lag(aligned.numpy()) == lag
    if audio_start:  # the audio's own start carries the AAC encoder's delay: its first frame is 1024 earlier
        assert offset == pytest.approx((audio_start - 1024) / 16000) and not aligned[:6000].any()
    else:
        assert offset == pytest.approx(offset_s)
    # the transcriber reads it so: the audio of the file for frame t from sample t * 640, and says so
    tr = _transcriber(env)
    result = tr(audio=path)
    assert result.num_frames == 50 and result.info["audio_offset_s"] == pytest.approx(offset, abs=1e-4)
    expected = torch.zeros(50 * 640)
    n = min(50 * 640, aligned.numel())
    expected[:n] = aligned[:n]
    assert result.tokens == tr(audio=expected).tokens
    (both,) = tr.transcribe_batch([path])  # the file's audio and video together
    assert both.ok and both.modality == "audiovisual" and both.info["audio_offset_s"] == result.info[
        "audio_offset_s"]


def test_audio_longer_than_its_video_is_cut_and_far_longer_audio_is_decoded_alone(env, tmp_path):  # noqa: F811
    tr = _transcriber(env)
    longer = tmp_path / "longer.mp4"
    write_av_video(longer, _numbered(50), _tone(2.5))  # 2 s of video, 2.5 s of audio
    (result,) = tr.transcribe_batch([longer])
    assert result.modality == "audiovisual" and result.num_frames == 50
    assert result.info["audio_cut_s"] == pytest.approx(0.5, abs=0.07)  # the AAC padding besides
    far = tmp_path / "far.mp4"
    write_av_video(far, _numbered(25), _tone(3.0))  # 1 s of video, 3 s of audio
    alone = tr(audio=far)
    assert alone.num_frames >= 75  # the whole audio: its video cannot cover it
    (result,) = tr.transcribe_batch([far])
    assert result.ok and result.modality == "audio" and result.num_frames == alone.num_frames
    assert "1 frame" not in result.info["video_fallback"] and "25 frame(s)" in result.info["video_fallback"]
    assert result.tokens == alone.tokens


# --- audio-visual items whose video cannot be used ----------------------------------------------------


def test_an_unreadable_or_one_frame_video_is_decoded_from_its_audio(env, tmp_path, caplog):  # noqa: F811
    tr = _transcriber(env)
    mp4, wav = env["utts"][1]
    audio_only = tr(audio=wav)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    one = tmp_path / "one.mp4"
    write_video(one, read_video(mp4)[:1].numpy())
    cases = {garbage: "garbage.mp4: cannot read", one: "the video has 1 frame(s)"}
    for video, reason in cases.items():
        result = tr(video=video, audio=wav)
        assert result.ok and result.modality == "audio" and reason in result.info["video_fallback"]
        assert result.tokens == audio_only.tokens and result.text == audio_only.text
        assert result.num_frames == audio_only.num_frames
    array = tr(video=read_video(mp4)[:1].numpy(), audio=read_wav(wav))
    assert array.modality == "audio" and array.tokens == audio_only.tokens
    # in a batch: the others decoded audio-visually, one warning with the count
    caplog.set_level(logging.WARNING, logger="avsr.inference")
    items = [TranscribeItem(video=v, audio=a) for v, a in env["utts"][:2]]
    items.append(TranscribeItem(video=garbage, audio=wav, key="bad"))
    out = tr.transcribe_batch(items)
    assert [r.modality for r in out] == ["audiovisual", "audiovisual", "audio"]
    assert out[0].tokens == tr(video=env["utts"][0][0], audio=env["utts"][0][1]).tokens
    assert out[2].tokens == audio_only.tokens
    assert any("1 of 3 items decoded audio-only" in r.getMessage() for r in caplog.records)
    # a long input cut into pieces: every piece from the audio alone
    cut = Transcriber(env["models"][0], env["tokenizer"], DECODE, max_segment_s=0.8)
    pieces = cut(video=garbage, audio=wav)
    assert pieces.modality == "audio" and len(pieces.info["segments_s"]) > 1
    assert pieces.tokens == cut(audio=wav).tokens and "garbage.mp4" in pieces.info["video_fallback"]
    # a video that is not there is a mistake to report, and video alone has nothing to fall back on
    assert not tr.transcribe_batch([TranscribeItem(video=tmp_path / "gone.mp4", audio=wav)])[0].ok
    assert not tr.transcribe_batch([TranscribeItem(video=one)])[0].ok


def test_a_face_video_without_a_face_is_decoded_from_its_audio(env, tmp_path):  # noqa: F811
    pytest.importorskip("mediapipe")
    pytest.importorskip("skimage")
    tr = _transcriber(env)
    _, wav = env["utts"][0]
    samples = read_wav(wav)
    frames = np.random.default_rng(0).integers(100, 140, size=(samples.numel() // 640, 160, 160, 3),
                                               dtype=np.uint8)
    blank = tmp_path / "no_face.mp4"
    write_av_video(blank, frames, samples)
    (result,) = tr.transcribe_batch([blank])  # a file with sound: the ROI stage finds no face
    assert result.ok and result.modality == "audio" and "no face" in result.info["video_fallback"]
    assert "modality='audio'" not in result.info["video_fallback"]
    assert result.tokens == tr(audio=blank).tokens
    array = tr(video=frames, audio=samples)  # RGB frames in memory
    assert array.modality == "audio" and array.tokens == tr(audio=samples).tokens
    assert not tr.transcribe_batch([TranscribeItem(video=blank)], modality="video")[0].ok


def test_the_decoding_stage_counts_utterances_decoded_audio_only(env, tmp_path, caplog):  # noqa: F811
    from avsr.bin.decode import main as decode
    from avsr.data.datadir import Utterance, write_datadir

    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video" * 50)
    utts = [Utterance(f"spk-u{i}", "spk", wav=str(w), video=str(v), text="BIN BLUE AT F TWO NOW")
            for i, (v, w) in enumerate(env["utts"][:2])]
    utts.append(Utterance("spk-x", "spk", wav=str(env["utts"][2][1]), video=str(garbage), text="LAY RED"))
    write_datadir(tmp_path / "data", utts)
    (tmp_path / "decode.yaml").write_text("beam_size: 2\nctc_weight: 0.3\nmaxlenratio: 0.3\n"
                                          "minlenratio: 0.1\n")
    caplog.set_level(logging.INFO)
    assert decode(["--exp-dir", str(env["exp"]), "--data", str(tmp_path / "data"), "--test-set", "t",
                   "--decode-config", str(tmp_path / "decode.yaml"), "--modalities", "audiovisual", "audio",
                   "--out", str(tmp_path / "dec")]) == 0
    clean = tmp_path / "dec/t/audiovisual/clean"
    listed = (clean / "audio_only").read_text().splitlines()
    assert len(listed) == 1 and listed[0].startswith("spk-x ") and "garbage.mp4" in listed[0]
    assert not (clean / "failed").exists()
    hyps = dict(line.split(" ", 1) if " " in line else (line, "") for line in (clean / "hyp").read_text()
                .splitlines())
    audio = dict(line.split(" ", 1) if " " in line else (line, "") for line in
                 (tmp_path / "dec/t/audio/clean/hyp").read_text().splitlines())
    assert sorted(hyps) == ["spk-u0", "spk-u1", "spk-x"] and hyps["spk-x"] == audio["spk-x"]
    assert not (tmp_path / "dec/t/audio/clean/audio_only").exists()
    assert any("1 of 3 utterances decoded audio-only: their video could not be used" in r.getMessage()
               for r in caplog.records)


def test_read_audio_track_is_the_whole_track_whatever_the_video(tmp_path):
    wav = _tone(1.0)
    path = tmp_path / "late.mp4"
    _write(path, _numbered(25), list(range(25)), Fraction(1, 25), wav=wav, audio_start=8000)
    assert abs(read_audio_track(path).numel() - 16000) <= 2048  # its own samples, no zeros in front
