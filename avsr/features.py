"""Model-input features: AV-HuBERT's stacked log filterbanks for audio, and video ROI normalisation.

Audio follows AV-HuBERT's ``hubert_dataset.py`` (``load_feature``/``stacker``/``normalize``) on top of
python_speech_features' ``logfbank`` (26 filters, 25 ms window, 10 ms hop, pre-emphasis 0.97, 512-point FFT,
rectangular window, zero power floored at machine epsilon), re-written with torch so that it runs batched and
needs no python_speech_features. Video follows AV-HuBERT's image transforms: scale to [0, 1], crop 88x88
(centre at evaluation, random position and horizontal flip in training), normalise with mean 0.421 and
standard deviation 0.165.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import lru_cache

import torch

#: audio samples per video frame at 16 kHz and 25 fps.
SAMPLES_PER_FRAME = 640
#: AV-HuBERT's video normalisation constants (pixel values scaled to [0, 1]).
VIDEO_MEAN = 0.421
VIDEO_STD = 0.165
#: side of the square crop fed to the video front-end, in pixels.
CROP_SIZE = 88
#: int16 full scale: the original reads wav files as int16 and computes filterbanks on that scale.
_INT16_SCALE = 32768.0
_EPS = torch.finfo(torch.float64).eps


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


@lru_cache(maxsize=8)
def mel_filterbank(num_filters: int = 26, nfft: int = 512, sample_rate: int = 16000) -> torch.Tensor:
    """Triangular mel filterbank built exactly as python_speech_features' ``get_filterbanks``.

    The filter edges are FFT bins ``floor((nfft + 1) * mel_to_hz(m) / sample_rate)`` for ``num_filters + 2``
    points equally spaced on the mel scale between 0 Hz and ``sample_rate / 2``; each filter rises linearly
    from 0 at its left edge to 1 at its centre bin and falls back to 0 at its right edge (exclusive).

    Returns:
        float64 tensor (num_filters, nfft // 2 + 1).
    """
    mel_points = torch.linspace(
        _hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), num_filters + 2, dtype=torch.float64
    )
    bins = torch.floor((nfft + 1) * _mel_to_hz(mel_points) / sample_rate)
    k = torch.arange(nfft // 2 + 1, dtype=torch.float64)
    left, centre, right = bins[:-2, None], bins[1:-1, None], bins[2:, None]
    rising = (k - left) / (centre - left)
    falling = (right - k) / (right - centre)
    fb = torch.where((k >= left) & (k < centre), rising, torch.zeros(()))
    fb = torch.where((k >= centre) & (k < right), falling, fb)
    return fb


def logfbank(
    waveform: torch.Tensor,
    sample_rate: int = 16000,
    winlen: float = 0.025,
    winstep: float = 0.01,
    num_filters: int = 26,
    nfft: int = 512,
    preemph: float = 0.97,
    warp: float = 1.0,
    contrast: float = 1.0,
) -> torch.Tensor:
    """Log mel filterbank energies, numerically as python_speech_features' ``logfbank``.

    Args:
        waveform: (num_samples,) samples on the scale the caller wants (AV-HuBERT uses int16 values).
        sample_rate: in Hz.
        winlen, winstep: window length and hop in seconds (rectangular window, no dithering).
        num_filters: number of mel filters.
        nfft: FFT size; frames longer than ``nfft`` are truncated by the FFT as numpy's ``rfft`` does.
        preemph: pre-emphasis coefficient.
        warp: frequency-axis scale of the power spectrum before the filterbank (training augmentation,
            see :func:`warp_spectrum`); 1.0 (the default) leaves it untouched.
        contrast: scale of the spectral envelope's contrast, after the warp (training augmentation, see
            :func:`scale_envelope_contrast`); 1.0 (the default) leaves it untouched.

    Returns:
        float64 tensor (num_frames, num_filters) at 1 / winstep Hz, where
        ``num_frames = 1 + ceil((num_samples - winlen * sample_rate) / (winstep * sample_rate))`` (1 when the
        signal is shorter than one window; the last frame is zero-padded).

    Raises:
        ValueError: ``waveform`` is not one-dimensional or is empty.
    """
    if waveform.dim() != 1 or waveform.numel() == 0:
        raise ValueError(f"logfbank expects a non-empty 1-D waveform, got shape {tuple(waveform.shape)}")
    x = waveform.to(torch.float64)
    x = torch.cat([x[:1], x[1:] - preemph * x[:-1]])
    frame_len = int(round(winlen * sample_rate))
    frame_step = int(round(winstep * sample_rate))
    n = x.numel()
    num_frames = 1 if n <= frame_len else 1 + int(math.ceil((n - frame_len) / frame_step))
    pad = (num_frames - 1) * frame_step + frame_len - n
    x = torch.nn.functional.pad(x, (0, pad))
    frames = x.unfold(0, frame_len, frame_step)
    spec = torch.fft.rfft(frames, n=nfft)
    power = (spec.real.square() + spec.imag.square()) / nfft  # |X|^2 (4x faster than abs().pow(2), 1 ulp)
    if warp != 1.0:
        power = warp_spectrum(power, warp)
    if contrast != 1.0:
        power = scale_envelope_contrast(power, contrast)
    feats = power @ mel_filterbank(num_filters, nfft, sample_rate).T
    feats = torch.where(feats == 0, torch.full_like(feats, _EPS), feats)
    return feats.log()


def warp_spectrum(power: torch.Tensor, warp: float) -> torch.Tensor:
    """Scale the frequency axis of a power spectrum by ``warp`` (vocal tract length perturbation).

    ``out[..., k] = power[..., k / warp]``, linearly interpolated between FFT bins and held at the Nyquist
    bin beyond it: with ``warp > 1`` formants and harmonics move up (as for a shorter vocal tract or a faster
    tape), with ``warp < 1`` down. Frame count and timing are unchanged, so audio stays aligned with video.
    Follows VTLP (Jaitly & Hinton, 2013), applied as a plain linear warp of the whole axis.

    Args:
        power: (..., K) float power spectrum over K = nfft / 2 + 1 bins from 0 Hz to Nyquist.
        warp: positive scale factor (typically 0.9-1.1).

    Returns:
        (..., K) tensor of the same dtype.

    Raises:
        ValueError: ``warp`` not positive.
    """
    if not warp > 0:
        raise ValueError(f"frequency warp factor must be positive, got {warp}")
    k = power.shape[-1]
    src = (torch.arange(k, dtype=power.dtype, device=power.device) / warp).clamp(max=k - 1)
    lo = src.floor().long()
    hi = (lo + 1).clamp(max=k - 1)
    frac = src - lo
    return power[..., lo] * (1 - frac) + power[..., hi] * frac


#: :func:`scale_envelope_contrast`: cepstral coefficients 1..N make the envelope (N / 16 kHz = 1.5 ms, below
#: the 3.3 ms pitch period of a 300 Hz voice, so the harmonics stay out of it)
ENVELOPE_LIFTER = 24


def scale_envelope_contrast(power: torch.Tensor, contrast: float, lifter: int = ENVELOPE_LIFTER
                            ) -> torch.Tensor:
    """Sharpen (``contrast > 1``) or flatten (``< 1``) the spectral envelope of a power spectrum, per frame.

    The log power spectrum of each frame is split by cepstral liftering into its envelope (real-cepstrum
    coefficients 1..``lifter``: formant peaks and valleys, spectral tilt) and the rest (the frame's mean
    log level, coefficient 0, and the fine structure: harmonics, noise). The envelope's deviation from the
    frame's mean is multiplied by ``contrast``; level and fine structure are kept. Formant synthesisers,
    diphone voices and vocoders differ from each other in exactly this (formant bandwidths, tilt), and a
    model trained on a few of them reads the envelope's shape closely (recipes/synthgrid/avsr1/RESULTS_LOG.md,
    "Vocoder resynthesis (WORLD)"); drawn per training utterance it teaches the model the envelope's shape
    rather than its depth. An avsr training augmentation (``AudioAugment.envelope_contrast``), in the spirit
    of the cepstral-smoothing envelope of vocoders (e.g. CheapTrick's liftering, Morise 2015); not in
    AV-HuBERT.

    Args:
        power: ``(..., K)`` float power spectrum over K = nfft / 2 + 1 bins from 0 Hz to Nyquist (K >= 3).
        contrast: positive factor (1.0 returns ``power`` itself).
        lifter: the envelope's highest cepstral coefficient, 1 <= lifter < K - 1.

    Returns:
        ``(..., K)`` power spectrum of the input's dtype; bins of zero power stay zero.

    Raises:
        ValueError: ``contrast`` not positive, or ``lifter`` outside 1..K - 2.
    """
    if not contrast > 0:
        raise ValueError(f"envelope contrast must be positive, got {contrast}")
    k = power.shape[-1]
    if not 1 <= lifter <= k - 2:
        raise ValueError(f"envelope lifter must be in 1..{k - 2} for {k} bins, got {lifter}")
    if contrast == 1.0:
        return power
    floor = torch.finfo(power.dtype).tiny
    logp = power.clamp(min=floor).log()
    ceps = torch.fft.irfft(logp, n=2 * (k - 1))  # real cepstrum of the (even) log spectrum
    keep = torch.zeros_like(ceps)
    keep[..., 1 : lifter + 1] = ceps[..., 1 : lifter + 1]
    keep[..., -lifter:] = ceps[..., -lifter:]  # the symmetric half
    deviation = torch.fft.rfft(keep).real  # the envelope's log deviation from the frame's mean
    out = (logp + (contrast - 1.0) * deviation).exp()
    return torch.where(power > 0, out, power)


def speed_perturb(
    waveform: torch.Tensor, factor: float, video: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Play an utterance ``factor`` times faster, audio and video together (speed perturbation).

    The audio is resampled as sox's ``speed`` effect (Kaldi/ESPnet ``speed_perturb_factors``, Ko et al.,
    2015): duration / factor, and pitch and formants x factor, which is what a different tape speed or a
    different vocal tract length and speaking rate do. The video keeps 25 fps and takes, for each output
    frame i, the input frame ``floor(i * factor)`` (frames repeated for factor < 1, skipped for factor > 1),
    so the two streams stay in sync.

    Args:
        waveform: (N,) float 16 kHz samples.
        factor: speed factor, positive (1.0 returns the inputs unchanged); resampled with the exact rational
            ratio of ``factor`` limited to a denominator of 100 (0.9 -> 9/10).
        video: (T, H, W) frames at 25 fps of any dtype, or None.

    Returns:
        ``(waveform', video')``: (N',) float with N' = ceil(N / factor), and (round(T / factor), H, W) in the
        input dtype (or None).

    Raises:
        ValueError: ``factor`` not positive.
    """
    if not factor > 0:
        raise ValueError(f"speed perturbation factor must be positive, got {factor}")
    if factor == 1.0:
        return waveform, video
    import torchaudio.functional as taf  # imported here: the rest of this module needs only torch

    ratio = Fraction(factor).limit_denominator(100)
    wav = taf.resample(waveform, orig_freq=ratio.numerator, new_freq=ratio.denominator)
    if video is not None:
        video = video.index_select(0, speed_frame_index(video.shape[0], factor))
    return wav, video


def narrowband(waveform: torch.Tensor, rate: int = 8000) -> torch.Tensor:
    """A 16 kHz waveform as heard through a narrowband channel: resampled to ``rate`` Hz and back to 16 kHz.

    Both steps are torchaudio's band-limited sinc resampling (``torchaudio.functional.resample`` with its
    defaults), the one ``avsr.Transcriber`` applies to input at another rate, so a training utterance
    passed through this looks to the model like an 8 kHz recording (telephone, AMR-NB, festival's and
    flite's 8 kHz voices) given to the recogniser: nothing left above ``rate / 2`` Hz but the resampler's
    leakage (white noise: 38 dB below the band at 4.7 kHz, 51 dB from 5.6 kHz up). Training augmentation
    (``AudioAugment.narrowband_prob``).

    Args:
        waveform: (N,) float 16 kHz samples.
        rate: the channel's sample rate in Hz, 1000 < rate < 16000.

    Returns:
        (N,) float, the input's dtype and length.

    Raises:
        ValueError: ``waveform`` not 1-D, or ``rate`` outside (1000, 16000).
    """
    if waveform.dim() != 1:
        raise ValueError(f"narrowband expects a (N,) waveform, got shape {tuple(waveform.shape)}")
    if not 1000 < rate < 16000:
        raise ValueError(f"narrowband rate must be in (1000, 16000) Hz, got {rate}")
    import torchaudio.functional as taf  # imported here: the rest of this module needs only torch

    out = taf.resample(taf.resample(waveform, 16000, rate), rate, 16000)
    n = waveform.numel()
    return out[:n] if out.numel() >= n else torch.nn.functional.pad(out, (0, n - out.numel()))


def speed_frame_index(num_frames: int, factor: float) -> torch.Tensor:
    """Which input frame each frame of a sequence played ``factor`` times faster shows.

    Returns ``(round(num_frames / factor),)`` int64 (at least one entry): ``floor(i * factor)`` clipped to
    ``num_frames - 1``. Used by :func:`speed_perturb` for the video and for frame-level labels.
    """
    t_out = max(1, round(num_frames / factor))
    return (torch.arange(t_out, dtype=torch.float64) * factor).floor().long().clamp(max=num_frames - 1)


#: a 40 ms frame is silent for :func:`silent_edges` when its RMS is this many dB below the loudest frame's.
EDGE_SILENCE_DB = -45.0
#: ... or when it is at most this many dB above the quietest frame's (a recording's noise floor).
EDGE_FLOOR_MARGIN_DB = 10.0
#: :func:`edge_shift` finds edges only in audio whose quietest frame is this many dB below its loudest.
EDGE_RANGE_DB = 40.0


def _frame_power(waveform: torch.Tensor, samples: int = SAMPLES_PER_FRAME) -> torch.Tensor:
    """Mean square of each whole block of ``samples`` samples (default: a 40 ms frame, 640) of ``waveform``
    (N,): ``(floor(N / samples),)`` float64; a partial last block is left out."""
    n = waveform.numel() // samples
    return waveform[: n * samples].double().view(n, samples).pow(2).mean(1)


def _speech_level(power: torch.Tensor, threshold_db: float, floor_margin_db: float) -> float:
    """The power above which a block of ``power`` (n,) >= 1 counts as speech: ``threshold_db`` (< 0) below
    the loudest block's, and at least ``floor_margin_db`` above the quietest block's (the noise floor)."""
    return max(float(power.max()) * 10.0 ** (threshold_db / 10.0),
               float(power.min()) * 10.0 ** (floor_margin_db / 10.0))


def silent_edges(waveform: torch.Tensor, threshold_db: float = EDGE_SILENCE_DB) -> tuple[int, int]:
    """How many whole 40 ms frames at the start and at the end of an utterance are silent.

    A frame (640 samples at 16 kHz, one 25 fps video frame) is silent when its RMS is ``threshold_db`` dB or
    more below that of the utterance's loudest frame, or at most ``EDGE_FLOOR_MARGIN_DB`` (10 dB) above that
    of its quietest frame (a recording's noise floor: a synthesiser's pauses are digital silence, an HMM
    voice's or a microphone's are not); the counts stop at the first frame that is not. Used by
    :func:`shift_edges`'s callers to trim no speech. A waveform of all-silent (or all-zero) frames counts as
    having no silent edge, so that nothing is ever trimmed from it.

    Args:
        waveform: (N,) float 16 kHz samples.
        threshold_db: negative, in dB relative to the loudest frame.

    Returns:
        ``(start, end)``: silent frames at each end, each in ``[0, floor(N / 640)]``.

    Raises:
        ValueError: ``waveform`` is not 1-D or ``threshold_db`` is not negative.
    """
    return _silent_edges_of(_edge_power(waveform, threshold_db), threshold_db)


def _edge_power(waveform: torch.Tensor, threshold_db: float) -> torch.Tensor:
    """:func:`_frame_power` of a waveform checked for :func:`silent_edges` (ValueError otherwise)."""
    if waveform.dim() != 1:
        raise ValueError(f"silent_edges expects a (N,) waveform, got shape {tuple(waveform.shape)}")
    if not threshold_db < 0:
        raise ValueError(f"silent_edges threshold must be negative (dB below the loudest frame), got "
                         f"{threshold_db}")
    return _frame_power(waveform)


def _silent_edges_of(power: torch.Tensor, threshold_db: float) -> tuple[int, int]:
    """:func:`silent_edges` from the frame powers ``(n,)`` of :func:`_frame_power`."""
    n = power.numel()
    if n == 0:
        return 0, 0
    if float(power.max()) <= 0.0:
        return 0, 0
    loud = (power > _speech_level(power, threshold_db, EDGE_FLOOR_MARGIN_DB)).nonzero().flatten()
    if loud.numel() == 0:  # less than 10 dB between the loudest and the quietest frame
        return 0, 0
    return int(loud[0]), n - 1 - int(loud[-1])


def _spans_edge_range(power: torch.Tensor) -> bool:
    """Whether the quietest of the frame powers ``(n,)`` is ``EDGE_RANGE_DB`` (40 dB) or more below the
    loudest (the level then tells silence from speech); False for no frame or all-zero frames."""
    if power.numel() == 0 or not float(power.max()) > 0.0:
        return False
    return float(power.min()) <= float(power.max()) * 10.0 ** (-EDGE_RANGE_DB / 10.0)


def edge_ranges(target: Sequence[int | Sequence[int]]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((start_lo, start_hi), (end_lo, end_hi))`` from a target of :func:`edge_shift`: per end a frame count
    ``n`` (the range ``(n, n)``) or a range ``(lo, hi)``.

    Raises:
        ValueError: not two ends, a negative count, ``lo > hi`` or a count that is not a whole number.
    """
    if isinstance(target, (str, bytes)) or len(target) != 2:
        raise ValueError(f"edge target must give the start and the end, got {target!r}")
    out = []
    for end in target:
        lo_hi = (end, end) if isinstance(end, (int, float, str, bytes)) else tuple(end)
        if (len(lo_hi) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in lo_hi)
                or not 0 <= lo_hi[0] <= lo_hi[1]):
            raise ValueError(f"edge target must be frame counts >= 0 or ranges (lo, hi) with 0 <= lo <= hi, "
                             f"got {target!r}")
        out.append((int(lo_hi[0]), int(lo_hi[1])))
    return out[0], out[1]


def edge_shift(waveform: torch.Tensor, target: Sequence[int | Sequence[int]],
               threshold_db: float = EDGE_SILENCE_DB) -> tuple[int, int] | None:
    """The change at each end that brings an utterance's silence before and after its speech into ``target``.

    Silent frames are counted as by :func:`silent_edges`; each end's count is moved to the nearest value of
    its target range (a count already in the range stays). The result is the ``(start, end)`` argument of
    :func:`shift_edges` (> 0: frames to add, < 0: silent frames to remove), so no speech is ever removed. An
    avsr addition (neither AV-HuBERT nor ESPnet has it): :class:`avsr.Transcriber` brings every input into the
    middle half of the model's training utterances' edges (``data_stats["edge_frames"]``), see
    recipes/synthgrid/avsr1/RESULTS.md, "Silence at the edges".

    Args:
        waveform: (N,) float 16 kHz samples.
        target: per end (start, end) a count of silent 40 ms frames or a range ``(lo, hi)`` of them
            (:func:`edge_ranges`).
        threshold_db: as :func:`silent_edges`.

    Returns:
        ``(start, end)`` in frames, or None when its quietest frame is less than ``EDGE_RANGE_DB`` (40 dB)
        below its loudest (noise under the whole recording: where the speech starts cannot be told from the
        level), or it is all silent or empty.

    Raises:
        ValueError: a bad target (:func:`edge_ranges`), a waveform that is not 1-D, a non-negative
            ``threshold_db``.
    """
    (start_lo, start_hi), (end_lo, end_hi) = edge_ranges(target)
    power = _edge_power(waveform, threshold_db)
    if not _spans_edge_range(power):
        return None
    start, end = _silent_edges_of(power, threshold_db)
    return min(max(start, start_lo), start_hi) - start, min(max(end, end_lo), end_hi) - end


def silent_edge_quartiles(waveforms: Iterable[torch.Tensor], threshold_db: float = EDGE_SILENCE_DB
                          ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The middle half of the silent frames (:func:`silent_edges`) at the start and at the end of utterances.

    Only utterances with at least one silent frame count (those :func:`edge_shift` can place). The trainer
    records it as ``data_stats["edge_frames"]``, the range :class:`avsr.Transcriber` brings every input into.

    Args:
        waveforms: (N,) float 16 kHz waveforms.
        threshold_db: as :func:`silent_edges`.

    Returns:
        ``((start_q1, start_q3), (end_q1, end_q3))``: the first and third quartiles in whole frames (the
        values at ranks ``floor(0.25 (n - 1))`` and ``ceil(0.75 (n - 1))`` of the sorted counts), or None when
        no utterance has a silent frame.
    """
    starts, ends = [], []
    for wav in waveforms:
        shift = edge_shift(wav, (0, 0), threshold_db)
        if shift is not None:
            starts.append(-shift[0])
            ends.append(-shift[1])
    if not starts:
        return None
    n = len(starts)
    lo, hi = math.floor(0.25 * (n - 1)), math.ceil(0.75 * (n - 1))
    starts.sort()
    ends.sort()
    return (starts[lo], starts[hi]), (ends[lo], ends[hi])


def own_silence(waveform: torch.Tensor, threshold_db: float = EDGE_SILENCE_DB) -> torch.Tensor | None:
    """A recording's own silence: the samples of its silent frames (:func:`silent_edges`) at the start, else
    at the end, else its quietest 40 ms frame if that is ``EDGE_RANGE_DB`` (40 dB) below the loudest; None
    otherwise. What
    :class:`avsr.Transcriber` pads an input's edges with (:func:`shift_edges`' ``silence``), so that the added
    frames have the recording's noise floor -- digital zeros included, as a synthesiser's pauses.

    Args:
        waveform: (N,) float 16 kHz samples.
        threshold_db: as :func:`silent_edges`.

    Returns:
        (640 * k,) samples, k >= 1, or None.
    """
    power = _edge_power(waveform, threshold_db)
    start, end = _silent_edges_of(power, threshold_db)
    if start:
        return waveform[: SAMPLES_PER_FRAME * start]
    n = power.numel()
    if end:
        return waveform[SAMPLES_PER_FRAME * (n - end): SAMPLES_PER_FRAME * n]
    if not _spans_edge_range(power):
        return None
    quiet = int(power.argmin())
    return waveform[SAMPLES_PER_FRAME * quiet: SAMPLES_PER_FRAME * (quiet + 1)]


def shift_edges(
    waveform: torch.Tensor | None,
    video: torch.Tensor | None,
    start: int,
    end: int,
    generator: torch.Generator | None = None,
    silence: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Add or remove whole 40 ms frames of silence at the two ends of an utterance, audio and video together.

    ``start``/``end`` > 0 adds that many frames before/after it: 640 samples per frame of Gaussian noise at
    the RMS of the utterance's quietest frame (its own noise floor, at least 1e-5 of full scale; digital zeros
    would give the floored log filterbank no recording has), and copies of the first/last video frame (the
    mouth at rest). < 0 removes that many frames (the caller keeps them to silent ones with
    :func:`silent_edges`). A model trained on a corpus whose every utterance starts and ends with 150-300 ms
    of silence otherwise learns where the words are from the utterance's edges, and fails on a recording cut
    closer or with longer pauses (recipes/synthgrid/avsr1/RESULTS.md, "Silence at the edges"). An avsr
    augmentation; neither AV-HuBERT nor ESPnet has it (Kaldi's data cleanup trims and pads silence offline).

    Args:
        waveform: (N,) float 16 kHz samples, N a whole number of frames or not, or None.
        video: (T, H, W) frames at 25 fps of any dtype, or None.
        start, end: frames to add (> 0) or remove (< 0) at each end.
        generator: random source of the added noise.
        silence: (M,) float samples, M > 0: the added audio is these, repeated, instead of noise (the
            recording's own silence, :func:`own_silence`, as :class:`avsr.Transcriber` pads).

    Returns:
        ``(waveform', video')`` with ``N + 640 * (start + end)`` samples and ``T + start + end`` frames
        (None stays None).

    Raises:
        ValueError: the change would leave no frame of either stream.
    """
    if start == 0 and end == 0:
        return waveform, video
    if waveform is not None:
        cut_start, cut_end = SAMPLES_PER_FRAME * max(0, -start), SAMPLES_PER_FRAME * max(0, -end)
        if waveform.numel() - cut_start - cut_end < 1:
            raise ValueError(f"shifting the edges by {start} and {end} frames leaves nothing of a "
                             f"{waveform.numel()}-sample waveform")
        wav = waveform[cut_start: waveform.numel() - cut_end]
        added = [SAMPLES_PER_FRAME * max(0, start), SAMPLES_PER_FRAME * max(0, end)]  # samples at each end
        if any(added):
            if silence is not None:
                if silence.dim() != 1 or silence.numel() == 0:
                    raise ValueError(f"silence must be (M,) samples with M > 0, got shape "
                                     f"{tuple(silence.shape)}")
                pad = [silence.to(waveform.dtype).repeat(math.ceil(k / silence.numel()))[:k] for k in added]
            else:
                power = _frame_power(waveform)
                floor = max(float(power.min()) ** 0.5, 1e-5) if power.numel() else 1e-5
                pad = [torch.randn(k, generator=generator).to(waveform.dtype) * floor for k in added]
            wav = torch.cat([pad[0], wav, pad[1]])
        waveform = wav
    if video is not None:
        t = video.shape[0]
        if t + min(start, 0) + min(end, 0) < 1:
            raise ValueError(f"shifting the edges by {start} and {end} frames leaves nothing of {t} video "
                             "frames")
        index = torch.arange(-start, t + end).clamp(0, t - 1)
        video = video.index_select(0, index)
    return waveform, video


def edge_index(num_frames: int, start: int, end: int, per_frame: float = 1.0) -> torch.Tensor:
    """The frame index map of :func:`shift_edges` for frame-level labels at ``per_frame`` labels per 40 ms.

    Returns ``(num_frames + round(per_frame * start) + round(per_frame * end),)`` int64 indices into the
    original ``num_frames`` labels: the first/last label repeated over added frames, removed ones skipped
    (at least one entry).
    """
    a, b = round(per_frame * start), round(per_frame * end)
    return torch.arange(-a, max(num_frames + b, -a + 1)).clamp(0, num_frames - 1)


def freq_mask(
    feats: torch.Tensor,
    num_masks: int,
    max_width: int,
    generator: torch.Generator | None = None,
    num_filters: int = 26,
) -> torch.Tensor:
    """SpecAugment frequency masking on stacked filterbank frames (Park et al., 2019, Sec. 2).

    Each of ``num_masks`` masks sets ``w ~ U{0..max_width}`` consecutive filterbank channels ``[f, f + w)``
    to 0 in every frame and in each of the stacked sub-frames (the same channels in all
    ``feats.shape[1] // num_filters`` of them). Applied after AV-HuBERT's per-frame normalisation, 0 is the
    frame's mean (ESPnet masks normalised features with 0 as well).

    Args:
        feats: (T, stack * num_filters) float, e.g. (T, 104) from :func:`avhubert_audio_features`.
        num_masks: number of masks (0 returns ``feats`` unchanged).
        max_width: widest mask in channels (< ``num_filters``).
        generator: random source.
        num_filters: filterbank channels per stacked sub-frame.

    Returns:
        a masked copy, same shape and dtype.

    Raises:
        ValueError: the feature dimension is not a multiple of ``num_filters``, or ``max_width`` is out of
            ``[0, num_filters)``.
    """
    t, d = feats.shape
    if d % num_filters:
        raise ValueError(f"feature dim {d} is not a multiple of num_filters={num_filters}")
    if not 0 <= max_width < num_filters:
        raise ValueError(f"freq mask width must be in [0, {num_filters}), got {max_width}")
    if num_masks <= 0 or max_width == 0:
        return feats
    keep = torch.ones(num_filters, dtype=feats.dtype)
    for _ in range(num_masks):
        w = int(torch.randint(0, max_width + 1, (1,), generator=generator))
        f = int(torch.randint(0, num_filters - w + 1, (1,), generator=generator))
        keep[f : f + w] = 0
    return (feats.view(t, d // num_filters, num_filters) * keep.to(feats.device)).view(t, d)


def time_mask(
    feats: torch.Tensor,
    num_masks: int,
    max_width: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """SpecAugment time masking on stacked filterbank frames (Park et al., 2019, Sec. 2).

    Each of ``num_masks`` masks sets ``w ~ U{0..max_width}`` consecutive frames ``[t0, t0 + w)`` to 0 (all
    channels; ``t0 ~ U{0..T-w}``, ``w`` cut to ``T``), masks may overlap. At 25 fps one frame is 40 ms, so
    ``max_width=3`` hides up to 120 ms: a consonant's burst and transition, which the lips show. Applied after
    AV-HuBERT's per-frame normalisation, 0 is the frame's mean, as :func:`freq_mask`.

    Args:
        feats: (T, D) float, e.g. (T, 104) from :func:`avhubert_audio_features` (25 frames per second).
        num_masks: number of masks (0 returns ``feats`` unchanged).
        max_width: widest mask in frames (0 returns ``feats`` unchanged).
        generator: random source.

    Returns:
        a masked copy, same shape and dtype (``feats`` itself when nothing is masked).

    Raises:
        ValueError: ``feats`` is not 2-D, or ``num_masks`` or ``max_width`` is negative.
    """
    if feats.dim() != 2:
        raise ValueError(f"time_mask expects (T, D) features, got shape {tuple(feats.shape)}")
    if num_masks < 0 or max_width < 0:
        raise ValueError(f"time mask count and width must be >= 0, got {num_masks}, {max_width}")
    t = feats.shape[0]
    if num_masks == 0 or max_width == 0 or t == 0:
        return feats
    widths = torch.randint(0, max_width + 1, (num_masks,), generator=generator).clamp(max=t)
    starts = (torch.rand(num_masks, generator=generator) * (t - widths + 1)).long()
    frames = torch.arange(t)
    masked = ((frames[None, :] >= starts[:, None]) & (frames[None, :] < (starts + widths)[:, None])).any(0)
    return feats.masked_fill(masked[:, None].to(feats.device), 0.0)


#: :func:`hard_onset`: the speech starts at the first 1 ms block whose RMS is at most this many dB below the
#: loudest block's ...
ONSET_THRESHOLD_DB = -30.0
#: ... and at least this many dB above the quietest block's (a recording's noise floor).
ONSET_FLOOR_MARGIN_DB = 15.0


def speech_onset(waveform: torch.Tensor, threshold_db: float = ONSET_THRESHOLD_DB) -> int | None:
    """The sample where the speech of an utterance starts, to the millisecond.

    The waveform is cut into 1 ms blocks (16 samples at 16 kHz; a partial last block is left out); the onset
    is the first sample of the first block whose RMS is at most ``-threshold_db`` dB below the loudest
    block's and at least ``ONSET_FLOOR_MARGIN_DB`` (15 dB) above the quietest block's (so that room tone
    or a channel's noise floor never counts as speech).

    Args:
        waveform: (N,) float 16 kHz samples.
        threshold_db: negative, in dB relative to the loudest block.

    Returns:
        the onset's sample index in ``[0, N)``, or None when no block qualifies (silence, a constant floor,
        fewer than 16 samples).

    Raises:
        ValueError: ``waveform`` is not 1-D or ``threshold_db`` is not negative.
    """
    if waveform.dim() != 1:
        raise ValueError(f"speech_onset expects a (N,) waveform, got shape {tuple(waveform.shape)}")
    if not threshold_db < 0:
        raise ValueError(f"speech_onset threshold must be negative (dB below the loudest block), got "
                         f"{threshold_db}")
    power = _frame_power(waveform, 16)
    if power.numel() == 0:
        return None
    above = (power >= _speech_level(power, threshold_db, ONSET_FLOOR_MARGIN_DB)) & (power > 0)
    if not bool(above.any()):
        return None
    return int(above.to(torch.uint8).argmax()) * 16


def hard_onset(waveform: torch.Tensor, cut_ms: float, threshold_db: float = ONSET_THRESHOLD_DB
               ) -> torch.Tensor:
    """The utterance with its speech starting abruptly: everything before ``cut_ms`` after the onset muted.

    Some synthesisers (flite's ``rms``) and hard-cut recordings start an utterance at full amplitude out of
    digital silence; a model that heard only gradual rises can take that step for a stop's burst (an ``L``
    read as ``B`` or ``P``). Muting the samples from the start of the waveform to ``cut_ms`` after
    :func:`speech_onset` (room tone included) makes the speech start within one sample at the level it has
    there, so the model hears abrupt onsets of every kind of first sound with their own labels. An avsr
    augmentation (not in AV-HuBERT).

    Args:
        waveform: (N,) float 16 kHz samples.
        cut_ms: milliseconds of the speech's rise to mute after its onset (>= 0).
        threshold_db: the onset threshold of :func:`speech_onset`.

    Returns:
        (N,) a new tensor of the same dtype, zero before the cut (``waveform`` itself when it has no onset).

    Raises:
        ValueError: ``waveform`` is not 1-D, ``cut_ms`` is negative or ``threshold_db`` is not negative (the
            first and the last raised by :func:`speech_onset`, naming it).
    """
    if not cut_ms >= 0:
        raise ValueError(f"hard_onset needs cut_ms >= 0, got {cut_ms}")
    onset = speech_onset(waveform, threshold_db)
    if onset is None:
        return waveform
    at = min(waveform.numel(), onset + round(cut_ms * 16.0))
    out = waveform.clone()
    out[:at] = 0
    return out


def stack_frames(feats: torch.Tensor, stack_order: int = 4) -> torch.Tensor:
    """Stack ``stack_order`` consecutive frames into one, zero-padding the end (AV-HuBERT's ``stacker``).

    Args:
        feats: (T, F).
        stack_order: frames per stacked frame (4 turns 100 Hz into 25 Hz).

    Returns:
        (ceil(T / stack_order), stack_order * F), frame-major:
        ``out[t] = concat(feats[4t], ..., feats[4t+3])``.
    """
    t, f = feats.shape
    res = (-t) % stack_order
    if res:
        feats = torch.cat([feats, feats.new_zeros(res, f)])
    return feats.reshape(-1, stack_order * f)


def avhubert_audio_features(
    waveform: torch.Tensor,
    sample_rate: int = 16000,
    num_video_frames: int | None = None,
    normalize: bool = True,
    warp: float = 1.0,
    contrast: float = 1.0,
) -> torch.Tensor:
    """AV-HuBERT's audio input: 26 log filterbanks at 100 Hz stacked 4 at a time to 104 dims at 25 Hz.

    Follows AV-HuBERT ``hubert_dataset.py``: the waveform is read on the int16 scale (float input in
    [-1, 1] is scaled by 32768), ``logfbank`` (see :func:`logfbank`), :func:`stack_frames` with order 4, the
    result zero-padded or trimmed to ``num_video_frames`` when given, then each frame layer-normalised over
    its 104 features (``normalize: true``; no affine parameters, eps 1e-5).

    Args:
        waveform: (num_samples,) float in [-1, 1] (or int16 values as an integer tensor), mono.
        sample_rate: must be 16000 (the 25 Hz stacking assumes 100 Hz filterbank frames).
        num_video_frames: pad (with zeros) or trim the feature sequence to this many 25 Hz frames.
        normalize: apply the per-frame layer normalisation.
        warp: frequency warp of the power spectrum (training augmentation, :func:`warp_spectrum`).
        contrast: envelope contrast of the power spectrum (training augmentation,
            :func:`scale_envelope_contrast`).

    Returns:
        float32 tensor (T, 104) at 25 Hz.

    Raises:
        ValueError: wrong sample rate, or a waveform that is not 1-D or is empty.
    """
    if sample_rate != 16000:
        raise ValueError(f"avhubert_audio_features expects 16000 Hz audio, got {sample_rate} Hz")
    x = waveform.to(torch.float64)
    if waveform.is_floating_point():
        x = x * _INT16_SCALE
    feats = stack_frames(logfbank(x, sample_rate, warp=warp, contrast=contrast), 4)
    if num_video_frames is not None:
        diff = feats.shape[0] - num_video_frames
        if diff < 0:
            feats = torch.cat([feats, feats.new_zeros(-diff, feats.shape[1])])
        elif diff > 0:
            feats = feats[:num_video_frames]
    feats = feats.to(torch.float32)
    if normalize:
        feats = torch.nn.functional.layer_norm(feats, feats.shape[1:])
    return feats


def crop_video(
    frames: torch.Tensor, size: int = CROP_SIZE, train: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Crop square ROI frames to ``size`` (AV-HuBERT's CenterCrop at eval, RandomCrop + HorizontalFlip in
    training).

    Args:
        frames: (T, H, W) any dtype, H and W >= size.
        size: output side in pixels.
        train: random crop position (the same for every frame of the clip) and a horizontal flip with
            probability 0.5; otherwise the centre crop.
        generator: random source for the training augmentation.

    Returns:
        (T, size, size), same dtype.

    Raises:
        ValueError: frames smaller than ``size``.
    """
    t, h, w = frames.shape
    if h < size or w < size:
        raise ValueError(f"video frames of {h}x{w} are smaller than the {size}x{size} crop")
    if train:
        top = int(torch.randint(0, h - size + 1, (1,), generator=generator))
        left = int(torch.randint(0, w - size + 1, (1,), generator=generator))
    else:
        top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    out = frames[:, top : top + size, left : left + size]
    if train and bool(torch.rand((), generator=generator) < 0.5):
        out = out.flip(-1)
    return out


def normalize_video(frames: torch.Tensor) -> torch.Tensor:
    """uint8 gray frames -> float32, scaled to [0, 1] then ``(x - 0.421) / 0.165`` (AV-HuBERT's Normalize).

    Args:
        frames: (..., H, W) uint8 (0-255).

    Returns:
        float32 tensor of the same shape.
    """
    return (frames.to(torch.float32) / 255.0 - VIDEO_MEAN) / VIDEO_STD


def mfcc_features(waveform: torch.Tensor, sample_rate: int = 16000) -> torch.Tensor:
    """39-dim MFCC + delta + delta-delta features at 100 Hz, the k-means input of HuBERT / AV-HuBERT's first
    pretraining iteration.

    Follows ``dump_mfcc_feature.py`` of fairseq's ``examples/hubert/simple_kmeans`` and of AV-HuBERT's
    ``avhubert/clustering``: ``torchaudio.compliance.kaldi.mfcc`` on the float waveform in [-1, 1] with
    ``use_energy=False`` and Kaldi's other defaults (13 cepstra from 23 mel bins, 25 ms povey window, 10 ms
    hop, pre-emphasis 0.97, DC removal, cepstral lifter 22, no dither, ``snip_edges``), then
    ``torchaudio.functional.compute_deltas`` (window 5, edge frames replicated) along time, applied twice,
    concatenated as ``[mfcc, delta, delta-delta]``.

    Args:
        waveform: (num_samples,) float, values in [-1, 1] (as soundfile reads a wav), mono.
        sample_rate: in Hz.

    Returns:
        float32 tensor (T, 39) at 100 Hz with ``T = 1 + (num_samples - 400) // 160`` at 16 kHz (Kaldi's
        ``snip_edges``: only whole 25 ms windows, frame ``i`` covers samples ``[160 i, 160 i + 400)``), i.e.
        ``4 T25 - 2`` frames for a waveform of ``640 T25`` samples.

    Raises:
        ValueError: ``waveform`` is not 1-D, not floating point, or shorter than one 25 ms window.
    """
    if waveform.dim() != 1 or not waveform.is_floating_point():
        raise ValueError(
            f"mfcc_features expects a 1-D float waveform, got {waveform.dtype} "
            f"of shape {tuple(waveform.shape)}"
        )
    window = int(round(0.025 * sample_rate))
    if waveform.numel() < window:
        raise ValueError(
            f"mfcc_features needs at least one 25 ms window ({window} samples at {sample_rate} Hz), "
            f"got {waveform.numel()} samples"
        )
    import torchaudio  # imported here: the rest of this module needs only torch

    with torch.no_grad():
        mfcc = torchaudio.compliance.kaldi.mfcc(
            waveform.to(torch.float32)[None], sample_frequency=float(sample_rate), use_energy=False
        )  # (T, 13)
        cepstra = mfcc.T  # compute_deltas works along the last dim: time
        deltas = torchaudio.functional.compute_deltas(cepstra)
        ddeltas = torchaudio.functional.compute_deltas(deltas)
        return torch.cat([cepstra, deltas, ddeltas]).T.contiguous()
