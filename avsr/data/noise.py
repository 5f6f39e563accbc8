"""Additive noise at a chosen signal-to-noise ratio (babble, music, ...), for augmentation and test
conditions.

As in AV-HuBERT's noise fine-tuning and evaluation (``hubert_dataset.py``, ``add_noise``): a noise segment of
the utterance's length is cut from a long noise recording and scaled so that
``10 * log10(P_speech / P_noise) = snr_db`` with ``P`` the mean power over the utterance.
"""

from __future__ import annotations

import hashlib
import os

import torch

from avsr.data.media import read_wav


def mix_at_snr(speech: torch.Tensor, noise: torch.Tensor, snr_db: float) -> torch.Tensor:
    """Add ``noise`` to ``speech`` scaled to the given SNR.

    Args:
        speech: (N,) float waveform.
        noise: (N,) float waveform of the same length.
        snr_db: target speech-to-noise power ratio in dB.

    Returns:
        (N,) float waveform ``speech + g * noise``. Silent noise returns ``speech`` unchanged; silent speech
        returns the noise at its own level.

    Raises:
        ValueError: the lengths differ.
    """
    if speech.shape != noise.shape:
        raise ValueError(f"mix_at_snr: speech {tuple(speech.shape)} and noise {tuple(noise.shape)} differ")
    p_speech = speech.pow(2).mean()
    p_noise = noise.pow(2).mean()
    if p_noise <= 0:
        return speech.clone()
    if p_speech <= 0:
        return speech + noise
    gain = torch.sqrt(p_speech / (p_noise * 10.0 ** (snr_db / 10.0)))
    return speech + gain * noise


def stable_seed(*parts: object) -> int:
    """A process-independent 63-bit seed from ``parts`` (e.g. utterance id and condition)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class NoiseSource:
    """A long noise recording from which segments are cut.

    Args:
        path: 16 kHz mono wav file (read with :func:`avsr.data.media.read_wav`).
        sample_rate: expected sample rate in Hz.

    Raises:
        avsr.data.media.MediaError: the file is missing, corrupt, not mono or of another rate.
        ValueError: the recording is silent or empty.
    """

    def __init__(self, path: str | os.PathLike, sample_rate: int = 16000):
        self.path = str(path)
        self.wav = read_wav(path, sample_rate=sample_rate)
        self._check()

    @classmethod
    def from_waveform(cls, wav: torch.Tensor, name: str = "<waveform>") -> NoiseSource:
        """A source over a waveform in memory: ``(N,)`` float at 16 kHz; ``name`` stands for the file name
        (it seeds the segment choice of :meth:`mix` with a ``key``, as the file name does).

        Raises:
            ValueError: not a finite 1-d float waveform, empty or silent.
        """
        if not isinstance(wav, torch.Tensor) or wav.dim() != 1 or not wav.is_floating_point():
            got = f"{getattr(wav, 'dtype', type(wav).__name__)} {tuple(getattr(wav, 'shape', ()))}"
            raise ValueError(f"noise {name}: expected a (N,) float waveform, got {got}")
        if not bool(torch.isfinite(wav).all()):
            raise ValueError(f"noise {name}: the waveform has NaN or infinite values")
        source = cls.__new__(cls)
        source.path, source.wav = name, wav.to(torch.float32)
        source._check()
        return source

    def _check(self) -> None:
        if self.wav.numel() == 0 or float(self.wav.abs().max()) == 0.0:
            raise ValueError(f"noise file {self.path} is empty or silent")

    def segment(self, num_samples: int, generator: torch.Generator | None = None, offset: int | None = None):
        """A (num_samples,) segment starting at ``offset`` (random if None), wrapping around the recording."""
        n = self.wav.numel()
        if offset is None:
            offset = int(torch.randint(0, n, (1,), generator=generator))
        idx = (torch.arange(num_samples) + offset) % n
        return self.wav[idx]

    def mix(
        self, speech: torch.Tensor, snr_db: float, key: str | None = None, generator=None
    ) -> torch.Tensor:
        """``speech`` (N,) plus a noise segment at ``snr_db``; ``key`` fixes the segment (test conditions)."""
        offset = None
        if key is not None:
            offset = stable_seed(os.path.basename(self.path), key) % self.wav.numel()
        noise = self.segment(speech.numel(), generator=generator, offset=offset)
        return mix_at_snr(speech, noise, snr_db)
