"""AV-HuBERT audio features and video normalisation, checked against a direct numpy transcription of
python_speech_features' published algorithm (sigproc.framesig/powspec, base.get_filterbanks/fbank)."""

import math

import numpy as np
import pytest
import torch

from avsr.features import (
    avhubert_audio_features,
    crop_video,
    edge_index,
    edge_ranges,
    edge_shift,
    freq_mask,
    hard_onset,
    logfbank,
    mel_filterbank,
    mfcc_features,
    narrowband,
    normalize_video,
    own_silence,
    scale_envelope_contrast,
    shift_edges,
    silent_edge_quartiles,
    silent_edges,
    speech_onset,
    speed_perturb,
    stack_frames,
    time_mask,
    warp_spectrum,
)


def reference_logfbank(
    signal, samplerate=16000, winlen=0.025, winstep=0.01, nfilt=26, nfft=512, preemph=0.97
):
    """Loop-by-loop transcription of python_speech_features 0.6 ``logfbank`` (rectangular window)."""
    signal = np.asarray(signal, dtype=np.float64)
    signal = np.append(signal[0], signal[1:] - preemph * signal[:-1])
    frame_len, frame_step = int(round(winlen * samplerate)), int(round(winstep * samplerate))
    slen = len(signal)
    numframes = 1 if slen <= frame_len else 1 + int(math.ceil((1.0 * slen - frame_len) / frame_step))
    padlen = int((numframes - 1) * frame_step + frame_len)
    padded = np.concatenate((signal, np.zeros(padlen - slen)))
    frames = np.stack([padded[i * frame_step : i * frame_step + frame_len] for i in range(numframes)])
    pspec = 1.0 / nfft * np.square(np.abs(np.fft.rfft(frames, nfft)))

    def hz2mel(hz):
        return 2595 * np.log10(1 + hz / 700.0)

    def mel2hz(mel):
        return 700 * (10 ** (mel / 2595.0) - 1)

    melpoints = np.linspace(hz2mel(0), hz2mel(samplerate / 2), nfilt + 2)
    bins = np.floor((nfft + 1) * mel2hz(melpoints) / samplerate)
    fbank = np.zeros([nfilt, nfft // 2 + 1])
    for j in range(nfilt):
        for i in range(int(bins[j]), int(bins[j + 1])):
            fbank[j, i] = (i - bins[j]) / (bins[j + 1] - bins[j])
        for i in range(int(bins[j + 1]), int(bins[j + 2])):
            fbank[j, i] = (bins[j + 2] - i) / (bins[j + 2] - bins[j + 1])
    feat = np.dot(pspec, fbank.T)
    feat = np.where(feat == 0, np.finfo(float).eps, feat)
    return np.log(feat)


@pytest.mark.parametrize("n", [200, 400, 401, 561, 12345, 16000])
def test_logfbank_matches_published_algorithm(n):
    rng = np.random.default_rng(n)
    sig = np.round(rng.standard_normal(n) * 2000)
    sig[:37] = 0  # exact zeros exercise the eps floor on silent frames
    ours = logfbank(torch.from_numpy(sig)).numpy()
    ref = reference_logfbank(sig)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9)


def test_silence_is_floored_not_minus_infinity():
    out = logfbank(torch.zeros(1600, dtype=torch.float64))
    assert torch.isfinite(out).all()
    assert torch.allclose(out, torch.full_like(out, math.log(np.finfo(float).eps)))


def test_filterbank_peaks_where_a_tone_is():
    t = torch.arange(16000, dtype=torch.float64) / 16000
    tone = torch.sin(2 * math.pi * 1000 * t) * 10000
    energies = logfbank(tone).mean(0)
    fb = mel_filterbank()
    bin_1khz = round(1000 * 512 / 16000)
    assert int(energies.argmax()) == int(fb[:, bin_1khz].argmax())


@pytest.mark.parametrize("warp", [0.9, 1.1])
def test_frequency_warp_moves_a_tone_by_the_factor(warp):
    t = torch.arange(16000, dtype=torch.float64) / 16000
    tone = torch.sin(2 * math.pi * 2000 * t) * 10000
    frames = tone[:400].unfold(0, 400, 400)
    power = torch.fft.rfft(frames, n=512).abs().pow(2)
    peak = int(power.argmax())  # 2 kHz = bin 64
    warped = warp_spectrum(power, warp)
    assert abs(int(warped.argmax()) - peak * warp) <= 1
    assert torch.equal(warp_spectrum(power, 1.0), power)
    assert torch.equal(logfbank(tone, warp=1.0), logfbank(tone))
    assert not torch.allclose(logfbank(tone, warp=warp), logfbank(tone))
    with pytest.raises(ValueError, match="positive"):
        warp_spectrum(power, 0.0)


def test_speed_perturb_scales_pitch_and_duration_and_keeps_video_in_sync():
    sr, hz = 16000, 1000.0
    tone = torch.sin(2 * math.pi * hz * torch.arange(sr) / sr)  # 1 s
    video = torch.arange(25).view(25, 1, 1).expand(25, 2, 2).to(torch.uint8)  # frame i holds the value i
    for factor in (0.9, 1.1):
        wav, vid = speed_perturb(tone, factor, video)
        assert wav.numel() == math.ceil(sr / factor)
        spectrum = torch.fft.rfft(wav[2000:-2000]).abs()
        peak_hz = int(spectrum.argmax()) * sr / (wav.numel() - 4000)
        assert abs(peak_hz - hz * factor) < 5  # sox ``speed``: pitch x factor
        assert vid.shape == (round(25 / factor), 2, 2) and vid.dtype == torch.uint8
        expected = (torch.arange(vid.shape[0]) * factor).floor().clamp(max=24)
        assert torch.equal(vid[:, 0, 0].double(), expected.double())
        # audio and video still agree on the duration within one frame
        assert abs(wav.numel() / 640 - vid.shape[0]) <= 1
    same_wav, same_video = speed_perturb(tone, 1.0, video)
    assert same_wav is tone and same_video is video
    assert speed_perturb(tone, 1.1)[1] is None
    with pytest.raises(ValueError, match="positive"):
        speed_perturb(tone, 0.0)


def test_narrowband_keeps_the_band_below_4_khz_and_removes_the_one_above():
    """narrowband: resampled to 8 kHz and back, a 1 kHz tone is kept (length, dtype, amplitude) while a 6 kHz
    tone is removed (more than 40 dB down); the same as torchaudio's resampling of an 8 kHz recording."""
    import torchaudio.functional as taf

    sr = 16000
    t = torch.arange(sr) / sr
    low, high = torch.sin(2 * math.pi * 1000 * t), torch.sin(2 * math.pi * 6000 * t)
    out = narrowband(low + high)
    assert out.shape == (sr,) and out.dtype == torch.float32
    spectrum = torch.fft.rfft(out[2000:-2000]).abs()
    bins = out.numel() - 4000
    at = lambda hz: float(spectrum[round(hz * bins / sr)])  # noqa: E731
    assert abs(at(1000) / float(torch.fft.rfft(low[2000:-2000]).abs().max()) - 1) < 0.02
    assert 20 * math.log10(at(6000) / at(1000)) < -40
    assert torch.allclose(out, taf.resample(taf.resample(low + high, sr, 8000), 8000, sr)[:sr])
    assert narrowband(torch.zeros(7)).shape == (7,)  # any length comes back
    with pytest.raises(ValueError, match="rate"):
        narrowband(low, rate=16000)
    with pytest.raises(ValueError, match="waveform"):
        narrowband(low.view(2, -1))


def test_silent_edges_counts_whole_quiet_frames_at_each_end():
    g = torch.Generator().manual_seed(0)
    speech = torch.randn(640 * 10, generator=g) * 0.3
    quiet = torch.randn(640 * 3, generator=g) * 0.3 * 10 ** (-60 / 20)  # 60 dB below the speech
    wav = torch.cat([quiet, speech, quiet[:640 * 2], torch.zeros(300)])  # the partial last frame is ignored
    assert silent_edges(wav) == (3, 2)
    assert silent_edges(wav, threshold_db=-70.0) == (3, 2)  # below -70 dB no, but the recording's floor
    floor40 = quiet * 10 ** (20 / 20)  # a noise floor 40 dB below the speech (an HMM voice, a microphone)
    assert silent_edges(torch.cat([floor40, speech, floor40[:640 * 2]])) == (3, 2)
    onset = torch.randn(640, generator=g) * 0.3 * 10 ** (-30 / 20)  # a weak onset, 30 dB above the floor
    assert silent_edges(torch.cat([quiet[:640 * 2], onset, speech, quiet])) == (2, 3)
    assert silent_edges(speech) == (0, 0)
    assert silent_edges(torch.zeros(640 * 4)) == (0, 0)  # nothing to tell silence from: never trimmed
    assert silent_edges(torch.zeros(100)) == (0, 0)
    with pytest.raises(ValueError, match="negative"):
        silent_edges(wav, threshold_db=3.0)
    with pytest.raises(ValueError, match="waveform"):
        silent_edges(wav.view(1, -1))


def test_shift_edges_adds_quiet_frames_and_removes_frames_in_sync():
    g = torch.Generator().manual_seed(1)
    floor = torch.randn(640, generator=g) * 1e-3
    wav = torch.cat([floor, torch.randn(640 * 8, generator=g) * 0.3, floor])  # 10 frames
    video = torch.arange(10).view(10, 1, 1).expand(10, 2, 2).to(torch.uint8)  # frame i holds i
    out, vid = shift_edges(wav, video, 2, -1, generator=torch.Generator().manual_seed(2))
    assert out.numel() == 640 * 11 and vid.shape == (11, 2, 2) and vid.dtype == torch.uint8
    assert torch.equal(out[640 * 2:], wav[:-640])  # the speech is untouched, one frame cut at the end
    added = out[: 640 * 2]  # at the utterance's noise floor (its quietest frame), not digital zeros
    assert 0.5 < float(added.pow(2).mean().sqrt() / floor.pow(2).mean().sqrt()) < 2.0
    assert vid[:, 0, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]  # the first frame repeated, last cut
    again, _ = shift_edges(wav, video, 2, -1, generator=torch.Generator().manual_seed(2))
    assert torch.equal(again, out)
    out, vid = shift_edges(wav, video, -3, 4)
    assert torch.equal(out[: 640 * 7], wav[640 * 3:])
    assert vid[:, 0, 0].tolist() == list(range(3, 10)) + [9] * 4
    assert shift_edges(wav, video, 0, 0) == (wav, video)
    assert shift_edges(None, video, 1, 0)[0] is None and shift_edges(wav, None, 1, 0)[1] is None
    with pytest.raises(ValueError, match="leaves nothing"):
        shift_edges(wav, video, -5, -5)
    with pytest.raises(ValueError, match="leaves nothing"):
        shift_edges(None, video, -10, 0)
    # frame labels at 100 Hz (4 per frame) follow the same map
    assert edge_index(8, 1, -1, per_frame=4).tolist() == [0] * 5 + list(range(1, 4))
    assert edge_index(3, -1, 2).tolist() == [1, 2, 2, 2]


def test_edge_shift_gives_the_target_edges_and_never_cuts_speech():
    g = torch.Generator().manual_seed(4)
    speech = torch.randn(640 * 10, generator=g) * 0.3
    wav = torch.cat([torch.zeros(640 * 9), speech, torch.zeros(640 * 2)])
    assert edge_shift(wav, (5, 4)) == (-4, 2)  # 9 silent frames at the start -> 5; 2 at the end -> 4
    assert edge_shift(wav, (9, 2)) == (0, 0)
    assert edge_shift(wav, ((4, 6), (3, 5))) == (-3, 1)  # into a range: to its nearest end
    assert edge_shift(wav, ((4, 10), (1, 5))) == (0, 0)  # already in it: kept
    assert edge_ranges((5, (3, 4))) == ((5, 5), (3, 4))
    tight = torch.cat([speech[:640 * 5], torch.zeros(640), speech[640 * 5:]])  # a pause inside only
    assert edge_shift(tight, (5, 4)) == (5, 4)  # speech up to both ends: every frame added
    assert edge_shift(speech, (5, 4)) is None  # no silent frame anywhere (noise throughout): not found
    assert edge_shift(torch.zeros(640 * 5), (5, 4)) is None and edge_shift(torch.zeros(10), (1, 1)) is None
    out, _ = shift_edges(wav, None, *edge_shift(wav, (5, 4)))
    assert silent_edges(out) == (5, 4) and torch.equal(out[640 * 5: 640 * 15], speech)
    for bad in ((-1, 2), (1,), ((3, 2), 1), (1.5, 2), "ab"):
        with pytest.raises(ValueError, match="target"):
            edge_shift(wav, bad)
    # the middle half over utterances that have a silent frame (the trainer's data_stats["edge_frames"])
    pairs = ((2, 1), (6, 3), (4, 7), (3, 0), (5, 2))
    waves = [torch.cat([torch.zeros(640 * a), speech, torch.zeros(640 * b)]) for a, b in pairs]
    assert silent_edge_quartiles(waves + [speech]) == ((3, 5), (1, 3))  # ranks 1 and 3 of 5, sorted
    assert silent_edge_quartiles([speech, speech]) is None and silent_edge_quartiles([]) is None


def test_own_silence_is_the_recordings_quiet_frames_and_pads_the_edges():
    g = torch.Generator().manual_seed(5)
    speech = torch.randn(640 * 6, generator=g) * 0.3
    floor = torch.randn(640 * 3, generator=g) * 1e-4
    start = torch.cat([floor[:640 * 2], speech, floor[640 * 2:]])
    assert torch.equal(own_silence(start), floor[:640 * 2])  # the silent frames at the start
    end = torch.cat([speech, floor])
    assert torch.equal(own_silence(end), floor)  # else those at the end
    inside = torch.cat([speech[:640 * 3], floor[:640], speech[640 * 3:]])
    assert torch.equal(own_silence(inside), floor[:640])  # else the quietest frame, if silent
    assert own_silence(speech) is None and own_silence(torch.zeros(640 * 2)) is None
    out, _ = shift_edges(start, None, 3, -1, silence=floor[:640 * 2])
    assert torch.equal(out[: 640 * 3], torch.cat([floor[:640 * 2], floor[:640]]))  # repeated, not noise
    assert torch.equal(out[640 * 3:], start[:-640])
    with pytest.raises(ValueError, match="silence"):
        shift_edges(start, None, 1, 0, silence=torch.zeros(0))


def test_freq_mask_zeroes_the_same_channels_in_every_stacked_frame():
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(20, 104) + 5
    out = freq_mask(feats, 2, 4, generator=g)
    per_channel = out.view(20, 4, 26)
    zero = (per_channel == 0).all(dim=0)  # (4, 26): channels masked in every frame
    assert torch.equal(zero, zero[:1].expand(4, 26))  # the same channels in each sub-frame
    assert 0 < int(zero[0].sum()) <= 8
    assert torch.equal(out.view(20, 4, 26)[:, :, ~zero[0]], feats.view(20, 4, 26)[:, :, ~zero[0]])
    assert freq_mask(feats, 0, 4) is feats
    with pytest.raises(ValueError, match="width"):
        freq_mask(feats, 1, 26)
    with pytest.raises(ValueError, match="multiple"):
        freq_mask(torch.randn(3, 100), 1, 2)


def test_time_mask_zeroes_whole_frames_in_at_most_num_spans_of_at_most_width():
    feats = torch.randn(50, 104) + 5  # no frame is 0 by chance
    out = time_mask(feats, 3, 4, generator=torch.Generator().manual_seed(5))
    zero = (out == 0).all(dim=1)
    assert torch.equal(out[~zero], feats[~zero]) and not (out[zero] != 0).any()
    assert 0 < int(zero.sum()) <= 12
    edges = torch.diff(torch.cat([torch.tensor([0]), zero.int(), torch.tensor([0])]))
    assert int((edges == 1).sum()) <= 3  # at most three spans, each at most 4 frames
    assert all(int(e) - int(b) <= 4 for b, e in zip(torch.nonzero(edges == 1), torch.nonzero(edges == -1)))
    again = time_mask(feats, 3, 4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(out, again)
    many = [int((time_mask(feats, 3, 4, generator=torch.Generator().manual_seed(s)) == 0).all(1).sum())
            for s in range(200)]
    assert max(many) <= 12 and 3.0 < sum(many) / len(many) < 6.0  # 3 masks of E[w] = 2 frames, overlaps
    short = time_mask(feats[:2], 2, 10, generator=torch.Generator().manual_seed(0))  # wider than T: cut
    assert short.shape == (2, 104)
    assert time_mask(feats, 0, 4) is feats and time_mask(feats, 2, 0) is feats
    with pytest.raises(ValueError, match=">= 0"):
        time_mask(feats, -1, 2)
    with pytest.raises(ValueError, match="shape"):
        time_mask(torch.randn(2, 3, 4), 1, 2)


def test_stacking_pads_with_zeros_and_keeps_frame_order():
    feats = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    out = stack_frames(feats, 4)
    assert out.shape == (3, 12)
    assert torch.equal(out[0], feats[0:4].reshape(-1))
    assert torch.equal(out[2, :6], feats[8:10].reshape(-1))
    assert torch.equal(out[2, 6:], torch.zeros(6))


@pytest.mark.parametrize("frames", [1, 7, 50])
def test_avhubert_features_are_25hz_104dim_and_frame_normalised(frames):
    wav = torch.randn(frames * 640) * 0.1
    feats = avhubert_audio_features(wav, num_video_frames=frames)
    assert feats.shape == (frames, 104) and feats.dtype == torch.float32
    torch.testing.assert_close(feats.mean(1), torch.zeros(frames), atol=1e-4, rtol=0)
    torch.testing.assert_close(feats.std(1, unbiased=False), torch.ones(frames), atol=1e-2, rtol=0)


def test_features_follow_the_original_pipeline_step_by_step():
    rng = np.random.default_rng(3)
    wav = (rng.standard_normal(640 * 20) * 0.05).astype(np.float32)
    ref = reference_logfbank(np.asarray(wav, dtype=np.float64) * 32768.0)  # original reads int16 scale
    ref = np.concatenate([ref, np.zeros(((-len(ref)) % 4, 26))]).reshape(-1, 104)
    ref = ref[:18]  # trimmed to a shorter video
    ref = (ref - ref.mean(1, keepdims=True)) / np.sqrt(ref.var(1, keepdims=True) + 1e-5)
    ours = avhubert_audio_features(torch.from_numpy(wav), num_video_frames=18)
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-4)


def test_audio_is_padded_to_longer_video():
    feats = avhubert_audio_features(torch.randn(640 * 5) * 0.1, num_video_frames=8, normalize=False)
    assert feats.shape == (8, 104)
    assert torch.equal(feats[5:], torch.zeros(3, 104))


def test_wrong_sample_rate_is_refused():
    with pytest.raises(ValueError, match="16000"):
        avhubert_audio_features(torch.randn(8000), sample_rate=8000)


def test_video_centre_crop_and_normalisation():
    frames = torch.zeros(3, 96, 96, dtype=torch.uint8)
    frames[:, 4:92, 4:92] = 255
    out = normalize_video(crop_video(frames))
    assert out.shape == (3, 88, 88)
    torch.testing.assert_close(out, torch.full_like(out, (1.0 - 0.421) / 0.165))


def test_training_crop_is_random_and_can_flip():
    frames = torch.arange(96, dtype=torch.uint8).repeat(2, 96, 1)  # value = column index
    g = torch.Generator().manual_seed(0)
    firsts = {int(crop_video(frames, train=True, generator=g)[0, 0, 0]) for _ in range(40)}
    assert len(firsts) > 3  # positions vary
    assert any(f >= 87 for f in firsts)  # some crops are flipped (first column holds a right-edge value)


def test_crop_refuses_small_frames():
    with pytest.raises(ValueError, match="smaller"):
        crop_video(torch.zeros(2, 64, 64))


# --- MFCC for the first k-means iteration ----------------------------------------------------------


@pytest.mark.parametrize("num_samples", [400, 16000, 640 * 37])
def test_mfcc_is_39_dims_at_100_hz_on_whole_windows(num_samples):
    wav = torch.randn(num_samples, generator=torch.Generator().manual_seed(num_samples)) * 0.1
    feats = mfcc_features(wav)
    assert feats.dtype == torch.float32 and torch.isfinite(feats).all()
    assert feats.shape == (1 + (num_samples - 400) // 160, 39)  # 1 s -> 98 frames; 37 video frames -> 146
    if num_samples == 640 * 37:
        assert feats.shape[0] == 4 * 37 - 2


def test_mfcc_deltas_are_the_regression_over_two_frames_each_side():
    t = torch.arange(8000) / 16000
    wav = (torch.sin(2 * math.pi * (300 + 2000 * t) * t) * 0.3).to(torch.float32)  # a chirp: cepstra move
    feats = mfcc_features(wav)
    static, delta, ddelta = feats[:, :13], feats[:, 13:26], feats[:, 26:]

    def regression(c):  # (c[t+1] - c[t-1] + 2 (c[t+2] - c[t-2])) / 10 on the interior frames
        return (c[3:-1] - c[1:-3] + 2 * (c[4:] - c[:-4])) / 10

    torch.testing.assert_close(delta[2:-2], regression(static), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ddelta[2:-2], regression(delta), atol=1e-4, rtol=1e-4)
    assert delta[2:-2].abs().mean() > 0.05  # the chirp makes the deltas non-trivial


def test_mfcc_static_part_follows_the_spectrum():
    t = torch.arange(16000, dtype=torch.float64) / 16000
    low = mfcc_features((torch.sin(2 * math.pi * 200 * t) * 0.3).to(torch.float32))
    high = mfcc_features((torch.sin(2 * math.pi * 4000 * t) * 0.3).to(torch.float32))
    assert (low[:, 1] - high[:, 1]).mean() > 1.0  # C1: spectral tilt, larger for low frequencies
    # 200 Hz repeats every 80 samples, so every 10 ms frame is the same: zero deltas away from the edges
    torch.testing.assert_close(low[5:-5, 13:], torch.zeros_like(low[5:-5, 13:]), atol=1e-4, rtol=0)


def test_mfcc_refuses_short_or_integer_input():
    with pytest.raises(ValueError, match="25 ms"):
        mfcc_features(torch.zeros(399))
    with pytest.raises(ValueError, match="float"):
        mfcc_features(torch.zeros(1600, dtype=torch.int16))


def test_scale_envelope_contrast_scales_the_formants_and_keeps_level_and_harmonics():
    """A vowel-like spectrum (harmonics of 125 Hz under three formants): the envelope's log deviation from
    the frame's mean is scaled by the factor (formant peak against valley), the harmonics stay where they
    are, zero bins stay zero, 1.0 returns the input itself; bad arguments are refused."""
    sr, n = 16000, 512
    t = torch.arange(4000, dtype=torch.float64) / sr
    x = torch.zeros_like(t)
    for h in range(1, 64):
        f = 125.0 * h
        amp = sum(1 / (1 + ((f - fc) / bw) ** 2) for fc, bw in ((700, 80), (1200, 90), (2600, 120)))
        x += amp * torch.sin(2 * math.pi * f * t)
    frames = x.unfold(0, 400, 160) * torch.hann_window(400, dtype=torch.float64)
    power = torch.fft.rfft(frames, n=n).abs().square() / n
    peak, valley = 24, 60  # bins of the 6th harmonic (750 Hz, at F1) and the 15th (1875 Hz, F2-F3 valley)
    depth = (power[:, peak] / power[:, valley]).log()
    for factor in (0.6, 1.5):
        out = scale_envelope_contrast(power, factor)
        assert out.shape == power.shape and out.dtype == power.dtype
        ratio = (out[:, peak] / out[:, valley]).log() / depth
        # about the factor: the liftered envelope is a smoothed one
        assert torch.allclose(ratio, torch.full_like(ratio, factor), atol=0.15)
        # the harmonics stay the local maxima they were (fine structure kept)
        harmonics = [round(125.0 * h * n / sr) for h in range(2, 20)]
        assert (out[:, harmonics].log() - out[:, [k + 2 for k in harmonics]].log() > 0.5).all()
        level = out.log().mean(-1) - power.log().mean(-1)
        assert level.abs().max() < 0.05  # the frame's mean log level kept
    assert scale_envelope_contrast(power, 1.0) is power
    gaps = power.clone()
    gaps[:, 100:110] = 0
    assert (scale_envelope_contrast(gaps, 1.3)[:, 100:110] == 0).all()
    feats = avhubert_audio_features(x.float(), contrast=1.3)
    assert feats.shape == avhubert_audio_features(x.float()).shape
    assert not torch.equal(feats, avhubert_audio_features(x.float()))
    for bad in ({"contrast": 0.0}, {"contrast": -1.0}, {"contrast": 1.2, "lifter": 0},
                {"contrast": 1.2, "lifter": 256}):
        with pytest.raises(ValueError, match="envelope"):
            scale_envelope_contrast(power, **bad)


def test_hard_onset_mutes_the_speech_rise_from_the_start_to_the_cut():
    g = torch.Generator().manual_seed(0)
    t = torch.arange(6400, dtype=torch.float32)
    rise = torch.clamp(t / 800.0, max=1.0)  # a 50 ms linear rise, then full level
    speech = 0.5 * rise * torch.sin(2 * math.pi * 200.0 * t / 16000.0)
    floor = torch.randn(3 * 640, generator=g) * 1e-4  # room tone, about -70 dB below the speech
    wav = torch.cat([floor, speech, floor[:640]])
    onset = speech_onset(wav)
    # the first 1 ms block within 30 dB of the loudest: early in the rise (8 ms of its 50), never in the floor
    assert 3 * 640 <= onset <= 3 * 640 + 128 and onset % 16 == 0
    out = hard_onset(wav, 10.0)
    at = onset + 160
    assert torch.equal(out[:at], torch.zeros(at))  # room tone and the first 10 ms of the rise muted
    assert torch.equal(out[at:], wav[at:])  # the rest untouched
    assert float(out[at : at + 16].abs().max()) > 0.05  # the speech now starts at a high level
    assert torch.equal(hard_onset(wav, 0.0)[onset:], wav[onset:])
    assert torch.equal(hard_onset(wav, 1e6), torch.zeros_like(wav))  # a cut past the end mutes it all
    # no onset: silence, a constant floor, under 1 ms of samples -> the very same tensor
    for none in (torch.zeros(1000), torch.full((1000,), 0.01), torch.ones(10)):
        assert speech_onset(none) is None
        assert hard_onset(none, 5.0) is none
    with pytest.raises(ValueError, match="hard_onset"):
        hard_onset(wav, -1.0)
    with pytest.raises(ValueError, match="speech_onset"):
        hard_onset(wav[None], 5.0)
    with pytest.raises(ValueError, match="speech_onset"):
        speech_onset(wav, 3.0)


