"""Acoustic augmentation of SynthGRID utterances: rooms, microphones, channels, codecs and noise.

Each training (and validation) utterance of the corpus is passed through a random chain of the conditions
a recording meets between a mouth and a recogniser, drawn from the utterance's own random generator, so
that the corpus is the same for any number of workers. The steps, in signal order, and their ranges
(:class:`AugmentConfig` holds the probabilities and ranges; the defaults are these):

============== ===== =============================================================================
step           prob  what and range
============== ===== =============================================================================
reverberation  0.20  shoebox room 3-10 x 3-8 x 2.4-4 m, RT60 0.15-0.8 s, source-microphone 0.4-3 m,
                     image-source RIR (pyroomacoustics ``ShoeBox``, ``inverse_sabine``), aligned so the
                     direct path keeps its time (the mouth video stays in sync)
microphone EQ  0.50  1-3 peaking filters at 150-6000 Hz, gain -9..+9 dB, Q 0.5-2.5
                     (the audio-EQ-cookbook biquad of SoX/torchaudio, scipy ``sosfilt``); per speaker:
                     every utterance of a speaker goes
                     through the same microphone
band limiting  0.15  one of: telephone band 300-3400 Hz (8th-order Butterworth band-pass, zero phase,
                     scipy), narrowband 8 kHz sampling (resampled to 8 kHz and back, as festival's 8 kHz
                     voices), low-pass at 3.5-7 kHz, high-pass at 100-400 Hz
codec          0.12  one of (PyAV's FFmpeg encoders): Opus 6-24 kbit/s, MP3 16-32 kbit/s, AMR-NB 4.75-
                     12.2 kbit/s at 8 kHz, G.711 mu-law at 8 kHz; the codec delay is removed
                     (cross-correlation) so the audio stays in sync with the video; the long-term
                     spectrum moves by a log-spectral distance of 0.3-8 dB (100-3400 Hz), more at
                     lower bitrates
noise          0.15  white, pink or brown (1/f^0, 1/f, 1/f^2 power spectrum) noise at 5-30 dB SNR
hum            0.05  mains hum at 50 or 60 Hz with 2-6 harmonics (decaying) at 15-35 dB SNR
============== ===== =============================================================================

The probabilities are half of those first tried (0.4 / 0.3 / 0.25 / 0.3 / 0.1): with those, about 60% of the
training utterances lost the band above 3.4-4 kHz or went through reverberation, and the default recipe's
model confused the letters that differ there (S/F/X/C/Z, G/T) far more often.

Speed perturbation (Kaldi's 0.9/1.0/1.1, resampling that changes tempo, pitch and formants together) is the
tape-speed factor of the synthesis (:mod:`avsr.corpora.synthgrid.festival`), since the phone times and video
must follow it; vocal-tract length apart from pitch is the speakers' warping
(:mod:`avsr.corpora.synthgrid.speakers`).

SNRs are measured on the speech-active part of the utterance (the non-pause phone segments). All signals are
``float32`` mono at 16 kHz.
"""

from __future__ import annotations

import functools
import io
from dataclasses import asdict, dataclass

import numpy as np
import scipy.signal

SAMPLE_RATE = 16000


class AugmentError(RuntimeError):
    """An augmentation step failed (a codec missing from the FFmpeg of PyAV, ...); the message names it."""


@dataclass(frozen=True)
class AugmentConfig:
    """Probabilities and ranges of the augmentation steps (see the module docstring).

    Attributes:
        reverb_prob, eq_prob, band_prob, codec_prob, noise_prob, hum_prob: probability of each step.
        rt60: reverberation time range in seconds.  distance: source-microphone distance range in metres.
        eq_gain_db: peak gain range of the microphone EQ filters (dB).
        noise_snr_db, hum_snr_db: SNR ranges (dB) of the additive noise and of the hum.
        num_rooms: size of the bank of rooms (the RIRs are computed once per worker).
    """

    reverb_prob: float = 0.2
    eq_prob: float = 0.5
    band_prob: float = 0.15
    codec_prob: float = 0.12
    noise_prob: float = 0.15
    hum_prob: float = 0.05
    rt60: tuple[float, float] = (0.15, 0.8)
    distance: tuple[float, float] = (0.4, 3.0)
    eq_gain_db: tuple[float, float] = (-9.0, 9.0)
    noise_snr_db: tuple[float, float] = (5.0, 30.0)
    hum_snr_db: tuple[float, float] = (15.0, 35.0)
    num_rooms: int = 64

    def check(self) -> None:
        """Raise ValueError naming the first invalid field."""
        for name in ("reverb_prob", "eq_prob", "band_prob", "codec_prob", "noise_prob", "hum_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"augment: {name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("rt60", "distance", "eq_gain_db", "noise_snr_db", "hum_snr_db"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"augment: {name} must be [low, high] with low <= high, got {[lo, hi]}")
        if self.rt60[0] <= 0 or self.distance[0] <= 0 or self.num_rooms < 1:
            raise ValueError("augment: rt60 and distance must be positive and num_rooms >= 1")

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


#: no augmentation at all (the test splits)
NO_AUGMENT = AugmentConfig(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------------------------------------
# rooms


@dataclass(frozen=True)
class Room:
    """A shoebox room with one source and one microphone (metres, seconds)."""

    size: tuple[float, float, float]
    rt60: float
    source: tuple[float, float, float]
    microphone: tuple[float, float, float]

    @staticmethod
    def sample(rng: np.random.Generator, rt60: tuple[float, float], distance: tuple[float, float]) -> Room:
        """Draw a room, a reverberation time and positions at least 0.3 m from the walls."""
        size = (float(rng.uniform(3, 10)), float(rng.uniform(3, 8)), float(rng.uniform(2.4, 4)))
        margin = 0.3
        source = tuple(float(rng.uniform(margin, s - margin)) for s in size[:2]) + (
            float(rng.uniform(1.2, min(1.9, size[2] - margin))),
        )
        for _ in range(100):  # a microphone at the drawn distance, inside the room
            d = float(rng.uniform(*distance))
            az, el = float(rng.uniform(0, 2 * np.pi)), float(rng.uniform(-0.4, 0.4))
            mic = (source[0] + d * np.cos(az) * np.cos(el), source[1] + d * np.sin(az) * np.cos(el),
                   source[2] + d * np.sin(el))
            if all(margin <= m <= s - margin for m, s in zip(mic, size)):
                break
        else:
            mic = (size[0] / 2, size[1] / 2, 1.2)
        return Room(size, float(rng.uniform(*rt60)), source, tuple(float(m) for m in mic))


def room_impulse_response(room: Room) -> np.ndarray:
    """The room impulse response from source to microphone at 16 kHz (image-source method).

    Uses pyroomacoustics' ``ShoeBox`` with wall absorption from Sabine's formula for ``room.rt60``
    (``inverse_sabine``), image sources up to order 20. The response is shifted so that the direct path is at
    sample 0 and scaled so that the direct path has amplitude 1.

    Returns:
        float32 ``(L,)``.

    Raises:
        AugmentError: pyroomacoustics is not installed, or the room is invalid.
    """
    try:
        import pyroomacoustics as pra
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise AugmentError("reverberation needs pyroomacoustics (pip install pyroomacoustics)") from exc
    try:
        absorption, max_order = pra.inverse_sabine(room.rt60, list(room.size))
        shoebox = pra.ShoeBox(list(room.size), fs=SAMPLE_RATE, materials=pra.Material(absorption),
                              max_order=min(int(max_order), 20))
        shoebox.add_source(list(room.source))
        shoebox.add_microphone(list(room.microphone))
        shoebox.compute_rir()
    except ValueError as exc:
        raise AugmentError(f"invalid room {room}: {exc}") from exc
    rir = np.asarray(shoebox.rir[0][0], dtype=np.float64)
    direct = int(np.argmax(np.abs(rir)))
    rir = rir[direct:] / rir[direct]
    return rir.astype(np.float32)


@functools.lru_cache(maxsize=8)
def room_bank(seed: int, num_rooms: int, rt60: tuple[float, float], distance: tuple[float, float]
              ) -> tuple[np.ndarray, ...]:
    """``num_rooms`` RIRs drawn from ``seed`` (computed once per process and kept)."""
    rng = np.random.default_rng([seed, 31])
    return tuple(room_impulse_response(Room.sample(rng, rt60, distance)) for _ in range(num_rooms))


def rt60_of(rir: np.ndarray, fs: int = SAMPLE_RATE) -> float:
    """Reverberation time of an impulse response (s): Schroeder backward integration, -5..-25 dB slope x 3.

    Returns nan when the decay does not reach -25 dB.
    """
    energy = np.cumsum((rir.astype(np.float64) ** 2)[::-1])[::-1]
    edc = 10 * np.log10(energy / energy[0] + 1e-300)
    i5, i25 = np.argmax(edc <= -5.0), np.argmax(edc <= -25.0)
    if edc[-1] > -25.0 or i25 <= i5:
        return float("nan")
    return 3.0 * (i25 - i5) / fs


def reverberate(wav: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """Convolve with an RIR whose direct path is at sample 0; the output keeps the input's length."""
    return scipy.signal.fftconvolve(wav.astype(np.float64), rir.astype(np.float64))[: wav.shape[0]].astype(
        np.float32
    )


# ----------------------------------------------------------------------------------------------------------
# microphone and channel


def peaking_sos(centre: float, gain_db: float, q: float, fs: int = SAMPLE_RATE) -> np.ndarray:
    """Second-order section of a peaking equaliser (R. Bristow-Johnson, "Cookbook formulae for audio EQ
    biquad filter coefficients": the filter of SoX's ``equalizer`` and torchaudio's ``equalizer_biquad``).

    Returns:
        float64 ``(1, 6)`` ``[b0, b1, b2, 1, a1, a2]`` for ``scipy.signal.sosfilt``.
    """
    a = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * np.pi * centre / fs
    alpha = np.sin(w0) / (2.0 * q)
    b = np.array([1.0 + alpha * a, -2.0 * np.cos(w0), 1.0 - alpha * a])
    den = np.array([1.0 + alpha / a, -2.0 * np.cos(w0), 1.0 - alpha / a])
    return np.concatenate([b / den[0], den / den[0]])[None]


def equalize(wav: np.ndarray, bands: list[tuple[float, float, float]]) -> np.ndarray:
    """A cascade of peaking filters ``(centre_hz, gain_db, q)`` (:func:`peaking_sos`, scipy ``sosfilt``)."""
    if not bands:
        return wav.astype(np.float32)
    sos = np.concatenate([peaking_sos(*band) for band in bands])
    return scipy.signal.sosfilt(sos, wav.astype(np.float64)).astype(np.float32)


def band_limit(wav: np.ndarray, kind: str, cutoff: float = 0.0) -> np.ndarray:
    """Limit the band of a 16 kHz signal.

    Args:
        kind: ``telephone`` (300-3400 Hz band-pass), ``narrowband`` (8 kHz sampling: resampled to 8 kHz and
            back, polyphase), ``lowpass`` or ``highpass`` (at ``cutoff`` Hz); Butterworth filters of order 8
            (band-pass) or 6, run forwards and backwards (zero phase, scipy ``sosfiltfilt``).

    Raises:
        ValueError: unknown kind.
    """
    x = wav.astype(np.float64)
    if kind == "narrowband":
        y = scipy.signal.resample_poly(scipy.signal.resample_poly(x, 1, 2), 2, 1)[: x.shape[0]]
    elif kind == "telephone":
        y = scipy.signal.sosfiltfilt(scipy.signal.butter(4, [300, 3400], "bandpass", fs=SAMPLE_RATE,
                                                         output="sos"), x)
    elif kind in ("lowpass", "highpass"):
        y = scipy.signal.sosfiltfilt(scipy.signal.butter(6, cutoff, kind, fs=SAMPLE_RATE, output="sos"), x)
    else:
        raise ValueError(f"unknown band limit {kind!r} (telephone, narrowband, lowpass, highpass)")
    return y.astype(np.float32)


#: codec name -> (PyAV encoder, container format, sample rate of the codec)
CODECS = {
    "opus": ("libopus", "ogg", 16000),
    "mp3": ("libmp3lame", "mp3", 16000),
    "amr_nb": ("libopencore_amrnb", "amr", 8000),
    "mulaw": ("pcm_mulaw", "wav", 8000),
}


def _align(reference: np.ndarray, decoded: np.ndarray, max_shift: int = 4000) -> np.ndarray:
    """``decoded`` shifted by the lag that maximises its cross-correlation with ``reference`` (same
    length)."""
    n = reference.shape[0]
    corr = scipy.signal.correlate(decoded[: n + max_shift], reference, mode="full", method="fft")
    lags = np.arange(-n + 1, corr.shape[0] - n + 1)
    keep = (lags >= 0) & (lags <= max_shift)
    lag = int(lags[keep][np.argmax(corr[keep])])
    out = decoded[lag : lag + n]
    return np.pad(out, (0, n - out.shape[0])).astype(np.float32)


def apply_codec(wav: np.ndarray, codec: str, bitrate: int) -> np.ndarray:
    """Encode and decode a 16 kHz signal with a lossy speech/audio codec (PyAV / FFmpeg, in memory).

    Args:
        codec: a key of :data:`CODECS`.  bitrate: bits per second (ignored by mu-law: 64 kbit/s).

    Returns:
        float32 of the input's length at 16 kHz, the codec delay removed (cross-correlation).

    Raises:
        AugmentError: unknown codec, or one that the FFmpeg of PyAV cannot encode.
    """
    import av

    if codec not in CODECS:
        raise AugmentError(f"unknown codec {codec!r}; known: {sorted(CODECS)}")
    encoder, fmt, rate = CODECS[codec]
    x = wav.astype(np.float64)
    if rate != SAMPLE_RATE:
        x = scipy.signal.resample_poly(x, rate, SAMPLE_RATE)
    pcm = (np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)
    buf = io.BytesIO()
    try:
        with av.open(buf, "w", format=fmt) as out:
            stream = out.add_stream(encoder, rate=rate)
            stream.layout = "mono"
            if codec != "mulaw":
                stream.bit_rate = int(bitrate)
            for start in range(0, pcm.shape[0], 1600):  # PyAV re-frames to the codec's frame size
                chunk = pcm[None, start : start + 1600]
                frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="mono")
                frame.sample_rate = rate
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        buf.seek(0)
        chunks = []
        decoded_rate = rate
        with av.open(buf, "r") as inp:
            for frame in inp.decode(audio=0):  # FFmpeg's Opus decoder gives 48 kHz
                decoded_rate = frame.sample_rate
                if len(frame.layout.channels) != 1:
                    raise AugmentError(f"codec {codec}: decoded {frame.layout.name} audio")
                arr = frame.to_ndarray().reshape(-1)
                scale = 1.0 / 32768.0 if arr.dtype.kind == "i" else 1.0
                chunks.append(arr.astype(np.float64) * scale)
    except (av.error.FFmpegError, ValueError) as exc:
        raise AugmentError(f"codec {codec} at {bitrate} bit/s failed: {exc}") from exc
    y = np.concatenate(chunks) if chunks else np.zeros(0)
    if decoded_rate != SAMPLE_RATE:
        g = np.gcd(int(decoded_rate), SAMPLE_RATE)
        y = scipy.signal.resample_poly(y, SAMPLE_RATE // g, int(decoded_rate) // g)
    y = np.pad(y, (0, max(0, wav.shape[0] + 4000 - y.shape[0])))
    return _align(wav.astype(np.float64), y)


# ----------------------------------------------------------------------------------------------------------
# additive noise


def colored_noise(num_samples: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise with power spectrum ``1 / f^exponent`` (0 white, 1 pink, 2 brown), unit RMS.

    Returns:
        float32 ``(num_samples,)``.
    """
    spectrum = np.fft.rfft(rng.standard_normal(num_samples))
    freqs = np.fft.rfftfreq(num_samples, 1.0 / SAMPLE_RATE)
    freqs[0] = freqs[1] if num_samples > 1 else 1.0
    spectrum *= freqs ** (-exponent / 2.0)
    noise = np.fft.irfft(spectrum, num_samples)
    return (noise / (np.sqrt(np.mean(noise**2)) + 1e-12)).astype(np.float32)


def mains_hum(num_samples: int, frequency: float, harmonics: int, rng: np.random.Generator) -> np.ndarray:
    """Mains hum: ``frequency`` and its multiples up to ``harmonics``, amplitudes 1/k, random phases; unit
    RMS."""
    t = np.arange(num_samples) / SAMPLE_RATE
    hum = sum((1.0 / k) * np.sin(2 * np.pi * k * frequency * t + rng.uniform(0, 2 * np.pi))
              for k in range(1, harmonics + 1))
    return (hum / (np.sqrt(np.mean(hum**2)) + 1e-12)).astype(np.float32)


def add_at_snr(
    wav: np.ndarray, noise: np.ndarray, snr_db: float, active: np.ndarray | None = None
) -> np.ndarray:
    """``wav + g * noise``, ``g`` such that the speech (``active`` samples) to noise power is ``snr_db``."""
    speech = wav[active] if active is not None and active.any() else wav
    p_speech = float(np.mean(speech.astype(np.float64) ** 2)) + 1e-12
    p_noise = float(np.mean(noise.astype(np.float64) ** 2)) + 1e-12
    gain = np.sqrt(p_speech / (p_noise * 10.0 ** (snr_db / 10.0)))
    return (wav + gain * noise).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------
# the chain


@dataclass(frozen=True)
class Channel:
    """A speaker's microphone: the peaking filters of its EQ (empty: flat). Drawn once per speaker."""

    eq: tuple[tuple[float, float, float], ...] = ()

    @staticmethod
    def sample(rng: np.random.Generator, config: AugmentConfig) -> Channel:
        """Draw a microphone: with probability ``eq_prob`` 1-3 peaking filters (log-uniform centres)."""
        if rng.uniform() >= config.eq_prob:
            return Channel()
        bands = tuple(
            (float(np.exp(rng.uniform(np.log(150.0), np.log(6000.0)))),
             float(rng.uniform(*config.eq_gain_db)), float(rng.uniform(0.5, 2.5)))
            for _ in range(int(rng.integers(1, 4)))
        )
        return Channel(bands)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {"eq": [list(b) for b in self.eq]}


def plan(rng: np.random.Generator, config: AugmentConfig) -> list[tuple[str, dict]]:
    """Draw the per-utterance steps: ``[(step, parameters), ...]`` in signal order (microphone EQ apart).

    Every draw is made whether or not its step is used, so each step's parameters depend only on the
    generator's seed (adding a step to one utterance does not change another step of it).
    """
    u = rng.uniform(size=6)
    room = int(rng.integers(1 << 30))
    band_kind = ("telephone", "narrowband", "lowpass", "highpass")[int(rng.integers(4))]
    band_cut = float(rng.uniform(3500, 7000)) if band_kind == "lowpass" else float(rng.uniform(100, 400))
    codec = ("opus", "mp3", "amr_nb", "mulaw")[int(rng.integers(4))]
    bitrate = {
        "opus": int(rng.uniform(6000, 24000)),
        "mp3": int(rng.choice([16000, 24000, 32000])),
        "amr_nb": int(rng.choice([4750, 5900, 7400, 10200, 12200])),
        "mulaw": 64000,
    }[codec]
    noise_exp = float(rng.choice([0.0, 1.0, 2.0]))
    noise_snr = float(rng.uniform(*config.noise_snr_db))
    noise_seed = int(rng.integers(1 << 30))
    hum = {"frequency": float(rng.choice([50.0, 60.0])), "harmonics": int(rng.integers(2, 7)),
           "snr_db": float(rng.uniform(*config.hum_snr_db)), "seed": int(rng.integers(1 << 30))}
    steps: list[tuple[str, dict]] = []
    if u[0] < config.reverb_prob:
        steps.append(("reverb", {"room": room % config.num_rooms}))
    if u[1] < config.band_prob:
        steps.append(("band", {"kind": band_kind, "cutoff": band_cut}))
    if u[2] < config.codec_prob:
        steps.append(("codec", {"codec": codec, "bitrate": bitrate}))
    if u[3] < config.noise_prob:
        steps.append(("noise", {"exponent": noise_exp, "snr_db": noise_snr, "seed": noise_seed}))
    if u[4] < config.hum_prob:
        steps.append(("hum", hum))
    return steps


def apply_plan(
    wav: np.ndarray,
    steps: list[tuple[str, dict]],
    channel: Channel,
    config: AugmentConfig,
    corpus_seed: int,
    active: np.ndarray | None = None,
) -> np.ndarray:
    """Run a plan of :func:`plan` on a 16 kHz waveform.

    Order: reverberation, the speaker's microphone EQ, band limiting, codec, noise and hum (noise after the
    codec: the background of the listener's side, as in a recording played back).

    Args:
        wav: float32 ``(N,)``.  steps: from :func:`plan`.  channel: the speaker's microphone.
        config: the ranges (the room bank).  corpus_seed: seeds the room bank.
        active: bool ``(N,)`` speech samples for the SNRs (None: all).

    Returns:
        float32 ``(N,)``, peak-limited to 0.99.

    Raises:
        AugmentError: a step failed.
    """
    x = wav.astype(np.float32)
    kinds = dict(steps)
    if "reverb" in kinds:
        bank = room_bank(corpus_seed, config.num_rooms, tuple(config.rt60), tuple(config.distance))
        x = reverberate(x, bank[kinds["reverb"]["room"]])
    if channel.eq:
        x = equalize(x, list(channel.eq))
    if "band" in kinds:
        x = band_limit(x, kinds["band"]["kind"], kinds["band"]["cutoff"])
    if "codec" in kinds:
        x = apply_codec(x, kinds["codec"]["codec"], kinds["codec"]["bitrate"])
    if "noise" in kinds:
        p = kinds["noise"]
        noise = colored_noise(x.shape[0], p["exponent"], np.random.default_rng(p["seed"]))
        x = add_at_snr(x, noise, p["snr_db"], active)
    if "hum" in kinds:
        p = kinds["hum"]
        hum = mains_hum(x.shape[0], p["frequency"], p["harmonics"], np.random.default_rng(p["seed"]))
        x = add_at_snr(x, hum, p["snr_db"], active)
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak > 0.99:
        x = x * (0.99 / peak)
    return x.astype(np.float32)
