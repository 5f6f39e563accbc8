"""SynthGRID acoustic augmentation: determinism per utterance, and each step's effect within its documented
range (reverberation time, codec distortion and delay, band limits, SNRs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.signal

from avsr.corpora.synthgrid import augment as A


def _speechlike(seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """A harmonic signal (F0 120 Hz) with syllable-rate amplitude modulation and formant-like peaks."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * A.SAMPLE_RATE)) / A.SAMPLE_RATE
    x = sum(np.sin(2 * np.pi * 120 * k * t + rng.uniform(0, 6.28)) / k for k in range(1, 40))
    x = x * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t))
    b, a = scipy.signal.iirpeak(700, 5, fs=A.SAMPLE_RATE)
    x = x + 2 * scipy.signal.lfilter(b, a, x)
    return (0.1 * x / np.abs(x).max()).astype(np.float32)


def _lag(y: np.ndarray, x: np.ndarray) -> int:
    corr = scipy.signal.correlate(y, x, mode="full")
    return int(np.argmax(corr)) - (x.shape[0] - 1)


def _sdr(x: np.ndarray, y: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((x - y).astype(np.float64) ** 2)))


def test_plan_and_chain_are_deterministic_per_seed():
    cfg = dataclasses.replace(A.AugmentConfig(), reverb_prob=1, band_prob=1, codec_prob=1, noise_prob=1,
                              hum_prob=1, num_rooms=4)
    x = _speechlike()
    plans = [A.plan(np.random.default_rng([0, 2, 17, 1, 7]), cfg) for _ in range(2)]
    assert plans[0] == plans[1] and [s for s, _ in plans[0]] == ["reverb", "band", "codec", "noise", "hum"]
    other = A.plan(np.random.default_rng([0, 2, 18, 1, 7]), cfg)
    assert other != plans[0]
    channel = A.Channel(((1000.0, 6.0, 1.0),))
    y1 = A.apply_plan(x, plans[0], channel, cfg, corpus_seed=0)
    y2 = A.apply_plan(x, plans[1], channel, cfg, corpus_seed=0)
    assert y1.dtype == np.float32 and y1.shape == x.shape and np.array_equal(y1, y2)
    assert not np.array_equal(y1, x) and np.abs(y1).max() <= 0.99 + 1e-6


def test_plan_probabilities_follow_the_config():
    none = A.plan(np.random.default_rng(3), A.NO_AUGMENT)
    assert none == []
    counts = {}
    for i in range(2000):
        for step, _ in A.plan(np.random.default_rng([5, i]), A.AugmentConfig()):
            counts[step] = counts.get(step, 0) + 1
    cfg = A.AugmentConfig()
    for step, p in (("reverb", cfg.reverb_prob), ("band", cfg.band_prob), ("codec", cfg.codec_prob),
                    ("noise", cfg.noise_prob), ("hum", cfg.hum_prob)):
        assert abs(counts[step] / 2000 - p) < 0.04, (step, counts[step])


def test_room_impulse_responses_have_the_drawn_reverberation_time():
    """Documented: T20 of the image-source RIR (Schroeder) within 0.6-1.3 x the drawn RT60 (0.15-0.8 s)."""
    rng = np.random.default_rng(1)
    for _ in range(8):
        room = A.Room.sample(rng, (0.15, 0.8), (0.4, 3.0))
        assert all(0.3 - 1e-9 <= m <= s - 0.3 + 1e-9 for m, s in zip(room.microphone, room.size))
        rir = A.room_impulse_response(room)
        assert rir[0] == pytest.approx(1.0) and np.abs(rir).max() == pytest.approx(1.0)
        assert 0.6 * room.rt60 <= A.rt60_of(rir) <= 1.3 * room.rt60, room


def test_reverberation_keeps_timing_and_smears_the_signal():
    x = _speechlike()
    rir = A.room_impulse_response(A.Room((6.0, 5.0, 3.0), 0.6, (2.0, 2.5, 1.5), (4.0, 2.0, 1.3)))
    y = A.reverberate(x, rir)
    assert y.shape == x.shape
    click = np.zeros(8000, np.float32)
    click[1000] = 1.0
    assert int(np.argmax(np.abs(A.reverberate(click, rir)))) == 1000  # direct path on time: video in sync
    assert _sdr(x, y) < 5.0  # the reverberant tail is a large part of the signal
    silence = np.concatenate([x, np.zeros(8000, np.float32)])
    tail = A.reverberate(silence, rir)[x.shape[0] : x.shape[0] + 1600]
    assert np.sqrt(np.mean(tail**2)) > 0.01 * np.sqrt(np.mean(x**2))  # the room rings on after speech


def _lsd(x: np.ndarray, y: np.ndarray, lo: float = 100.0, hi: float = 3400.0) -> float:
    """Log-spectral distance (dB) of the long-term spectra in the telephone band."""
    f, px = scipy.signal.welch(x, fs=A.SAMPLE_RATE, nperseg=512)
    _, py = scipy.signal.welch(y, fs=A.SAMPLE_RATE, nperseg=512)
    keep = (f >= lo) & (f <= hi)
    return float(np.sqrt(np.mean((10 * np.log10(px[keep] + 1e-12) - 10 * np.log10(py[keep] + 1e-12)) ** 2)))


@pytest.mark.parametrize(("codec", "low", "high"), [
    ("opus", 6000, 24000), ("mp3", 16000, 32000), ("amr_nb", 4750, 12200),
])  # fmt: skip
def test_codecs_distort_within_their_range_and_keep_timing(codec, low, high):
    """Documented: the decoded signal is aligned with the input (codec delay removed, |lag| <= 2 samples),
    its long-term spectrum differs from the input's by a log-spectral distance of 0.3-8 dB in 100-3400 Hz,
    more at the lower bitrate."""
    x = _speechlike()
    distances = []
    for bitrate in (low, high):
        y = A.apply_codec(x, codec, bitrate)
        assert y.shape == x.shape and y.dtype == np.float32 and not np.array_equal(x, y)
        assert abs(_lag(y, x)) <= 2
        distances.append(_lsd(x, y))
        assert 0.3 <= distances[-1] <= 8.0, (codec, bitrate, distances[-1])
    assert distances[0] > distances[1]
    y = A.apply_codec(x, "mulaw", 64000)  # G.711: a quantiser, the waveform stays (SDR about 25 dB)
    assert abs(_lag(y, x)) <= 2 and 20.0 < _sdr(x, y) < 35.0


def test_unknown_codec_is_named():
    with pytest.raises(A.AugmentError, match="unknown codec 'gsm'"):
        A.apply_codec(_speechlike(0.2), "gsm", 13000)


def _band_energy(x: np.ndarray, lo: float, hi: float) -> float:
    f, p = scipy.signal.welch(x, fs=A.SAMPLE_RATE, nperseg=1024)
    return float(p[(f >= lo) & (f < hi)].sum())


def test_band_limits_remove_the_band_outside():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(32000).astype(np.float32) * 0.1
    tel = A.band_limit(x, "telephone")
    assert _band_energy(tel, 4500, 8000) < 1e-3 * _band_energy(x, 4500, 8000)
    assert _band_energy(tel, 0, 150) < 1e-2 * _band_energy(x, 0, 150)
    assert _band_energy(tel, 800, 3000) > 0.8 * _band_energy(x, 800, 3000)
    nb = A.band_limit(x, "narrowband")
    assert _band_energy(nb, 4200, 8000) < 1e-3 * _band_energy(x, 4200, 8000)
    lp = A.band_limit(x, "lowpass", 5000)
    assert _band_energy(lp, 6500, 8000) < 1e-3 * _band_energy(x, 6500, 8000)
    with pytest.raises(ValueError, match="unknown band limit"):
        A.band_limit(x, "bandstop")


@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0])
def test_colored_noise_has_the_spectral_slope(exponent):
    n = A.colored_noise(64000, exponent, np.random.default_rng(0))
    assert np.sqrt(np.mean(n.astype(np.float64) ** 2)) == pytest.approx(1.0, rel=1e-3)
    f, p = scipy.signal.welch(n, fs=A.SAMPLE_RATE, nperseg=4096)
    keep = (f > 100) & (f < 6000)
    slope = np.polyfit(np.log10(f[keep]), 10 * np.log10(p[keep]), 1)[0]  # dB per decade
    assert slope == pytest.approx(-10 * exponent, abs=1.5)


def test_noise_and_hum_are_added_at_the_snr():
    x = _speechlike()
    active = np.abs(x) > 0  # all
    for noise in (A.colored_noise(x.shape[0], 1.0, np.random.default_rng(1)),
                  A.mains_hum(x.shape[0], 50.0, 4, np.random.default_rng(2))):
        y = A.add_at_snr(x, noise, 12.0, active)
        snr = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean((y - x).astype(np.float64) ** 2))
        assert snr == pytest.approx(12.0, abs=0.05)
    hum = A.mains_hum(32000, 60.0, 3, np.random.default_rng(0))
    spectrum = np.abs(np.fft.rfft(hum))  # 0.5 Hz bins
    peaks = np.fft.rfftfreq(32000, 1 / A.SAMPLE_RATE)[np.argsort(spectrum)[-3:]]
    assert set(peaks.round().astype(int)) == {60, 120, 180}


def test_microphone_eq_boosts_and_cuts_around_its_centre():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(32000).astype(np.float32) * 0.05
    y = A.equalize(x, [(1000.0, 9.0, 1.0), (4000.0, -9.0, 1.0)])
    gain_1k = 10 * np.log10(_band_energy(y, 900, 1100) / _band_energy(x, 900, 1100))
    gain_4k = 10 * np.log10(_band_energy(y, 3700, 4300) / _band_energy(x, 3700, 4300))
    assert 6.0 < gain_1k < 10.0 and -10.0 < gain_4k < -6.0
    channels = [A.Channel.sample(np.random.default_rng(i), A.AugmentConfig()) for i in range(200)]
    flat = sum(not c.eq for c in channels)
    assert 70 < flat < 130  # eq_prob 0.5
    for c in channels:
        assert all(150 <= f <= 6000 and -9 <= g <= 9 and 0.5 <= q <= 2.5 for f, g, q in c.eq)


def test_config_check_names_the_field():
    with pytest.raises(ValueError, match="codec_prob"):
        dataclasses.replace(A.AugmentConfig(), codec_prob=1.5).check()
    with pytest.raises(ValueError, match="rt60"):
        dataclasses.replace(A.AugmentConfig(), rt60=(0.8, 0.2)).check()
