"""Audio-visual datasets, length-bucketed batching and collation.

An item is one utterance of a data dir (:mod:`avsr.data.datadir`): its 16 kHz waveform (optionally mixed
with noise at an SNR) turned into AV-HuBERT's 104-dim stacked filterbanks at 25 Hz, its 96x96 mouth ROI
frames cropped to 88x88 and normalised, and its token ids. Audio and video must agree in duration within
``max_frame_diff`` frames; the audio features are then padded or trimmed to the video length as
AV-HuBERT's ``hubert_dataset.py`` does.

In training, AV-HuBERT's per-batch modality dropout can be drawn here rather than in the model
(:class:`ModalityBatchSampler`): a batch that keeps only the audio then skips the video's crop and collation,
draws its noise with its own probability (``NoiseConfig.prob_audio_only``), and the draws depend on the seed
and epoch only, so a resumed run makes the same ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from avsr.data.datadir import Utterance
from avsr.data.lexicon import PhoneLexicon
from avsr.data.media import read_video, read_wav
from avsr.data.noise import NoiseSource, stable_seed
from avsr.data.photo_mouth import mouth_openness, photo_mouth
from avsr.data.tokenizer import Tokenizer
from avsr.features import (
    SAMPLES_PER_FRAME,
    avhubert_audio_features,
    crop_video,
    edge_index,
    freq_mask,
    hard_onset,
    narrowband,
    normalize_video,
    shift_edges,
    silent_edges,
    speed_frame_index,
    speed_perturb,
    time_mask,
)
from avsr.modalities import MODALITY_INPUTS, STREAMS
from avsr.nn.modality import draw_modalities

logger = logging.getLogger(__name__)



class DataError(ValueError):
    """An utterance cannot be used; the message names the utterance and its files."""


@dataclass
class NoiseConfig:
    """Noise added to the audio of a dataset.

    Attributes:
        source: the noise recording.
        prob: probability that an utterance gets noise (1.0 for a test condition).
        prob_audio_only: the probability for an utterance of an audio-only training batch (modality dropout
            dropped its video, :class:`ModalityBatchSampler`); None: ``prob``. Such batches teach the audio
            path alone, the audio-visual ones when to trust the lips, so the two can be given different
            amounts of noise.
        snr_db: the SNRs in dB to draw from uniformly (one value for a test condition).
        fixed: the segment and SNR are a function of the utterance id (reproducible test conditions);
            otherwise they are drawn anew each time (training augmentation).
    """

    source: NoiseSource
    prob: float = 1.0
    snr_db: Sequence[float] = (0.0,)
    fixed: bool = False
    prob_audio_only: float | None = None

    def prob_for(self, batch_modality: str | None) -> float:
        """The noise probability of an utterance in a batch that keeps ``batch_modality`` (None: no draw)."""
        if batch_modality == "audio" and self.prob_audio_only is not None:
            return self.prob_audio_only
        return self.prob


#: the kinds of video that does not say the transcript (:func:`untrusted_video`)
UNTRUSTED_VIDEO_KINDS = ("other", "frozen", "shift", "blur", "photo")


def untrusted_video(video: torch.Tensor, kind: str, generator: torch.Generator,
                    other: torch.Tensor | None = None) -> torch.Tensor:
    """Video of the same length that does not say what ``video`` says, for training the video trust gate.

    Args:
        video: ``(T, H, W)`` uint8 frames at 25 fps.
        kind: ``other`` -- ``other``'s frames (another utterance's lips), repeated or cut to T; ``frozen``
            -- one frame drawn uniformly, held for all T frames; ``shift`` -- the frames moved circularly by
            10-25 frames (0.4-1.0 s) either way (lips out of sync); ``blur`` -- every frame shrunk to 8x8
            pixels and scaled back (a mouth without its shape); ``photo`` -- the mouth of a real photograph
            moved by ``other``'s mouth (:func:`avsr.data.photo_mouth.photo_mouth`: lips of another look, out
            of time), at ``video``'s size.
        generator: the random stream of the draws.
        other: ``(T', H, W)`` uint8, required for ``other`` and ``photo``.

    Returns:
        ``(T, H, W)`` uint8.

    Raises:
        ValueError: an unknown kind, or ``other`` missing for that kind.
    """
    t = video.shape[0]
    if kind in ("other", "photo"):
        if other is None:
            raise ValueError(f"untrusted_video: kind {kind!r} needs the other utterance's frames")
        other = other.repeat(-(-t // max(1, other.shape[0])), 1, 1)[:t]
        if kind == "other":
            return other
        photo = photo_mouth(mouth_openness(other))
        return photo if photo.shape[1:] == video.shape[1:] else _resized(photo.float(), video)
    if kind == "frozen":
        return video[int(torch.randint(0, t, (1,), generator=generator))].expand(t, -1, -1).clone()
    if kind == "shift":
        step = int(torch.randint(10, 26, (1,), generator=generator))
        sign = 1 if float(torch.rand((), generator=generator)) < 0.5 else -1
        return torch.roll(video, sign * step, dims=0)
    if kind == "blur":
        return _resized(F.interpolate(video[:, None].float(), size=(8, 8), mode="area")[:, 0], video)
    raise ValueError(f"untrusted_video: kind must be one of {list(UNTRUSTED_VIDEO_KINDS)}, got {kind!r}")


def _resized(frames: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(T, h, w)`` float frames scaled (bilinear) to the size and dtype of ``like`` ``(T, H, W)``."""
    big = F.interpolate(frames[:, None], size=like.shape[1:], mode="bilinear", align_corners=False)
    return big[:, 0].round().clamp(0, 255).to(like.dtype)


@dataclass
class AudioAugment:
    """Training-time augmentation of the audio (per utterance and epoch).

    Attributes:
        speed_factors: speed perturbation: each utterance is played at a factor drawn uniformly from this
            list (:func:`avsr.features.speed_perturb`, audio and video together, before the noise), e.g.
            ``(0.9, 1.0, 1.1)`` as ESPnet's ``speed_perturb_factors``; empty for none.
        freq_warp: ``(low, high)``: the power spectrum's frequency axis is scaled by a factor drawn uniformly
            from this range (VTLP, :func:`avsr.features.warp_spectrum`), or None for no warping.
        num_freq_mask: SpecAugment frequency masks per utterance (:func:`avsr.features.freq_mask`).
        freq_mask_width: widest frequency mask, in filterbank channels (of 26).
        av_mismatch_prob: probability that an utterance of an audio-visual batch (the batch modality
            ``audiovisual`` of :class:`ModalityBatchSampler`) gets, in place of its own, the waveform of
            another training utterance of another speaker (repeated or cut to its length, before the noise).
            Its lips are then the only evidence of its transcript, so the fused model learns to weigh the
            audio by whether it agrees with the lips rather than by how clean it sounds -- the case of a
            voice it has not heard. Audio-only batches and items without a batch modality never get it.
            An avsr extension (incongruent audio-visual pairs, as the negatives of audio-visual
            synchronisation training, e.g. Chung & Zisserman, "Out of time: automated lip sync in the
            wild", ACCV 2016 workshops); it is not in AV-HuBERT.
        av_mismatch_noisy_only: give another utterance's audio only to utterances that get noise (the
            noise draws are the same, mixed over that audio): clean audio is then always the utterance's
            own, so the model is never taught to doubt clean speech, only noisy speech that the lips
            contradict -- a competing talker under babble.
        num_time_mask: SpecAugment time masks per utterance (:func:`avsr.features.time_mask`), drawn from
            their own stream (seed, epoch, index), so the other augmentation draws do not move.
        time_mask_width: widest time mask, in frames of 40 ms (25 fps).
        time_mask_av_only: mask only the audio of utterances of audio-visual batches (batch modality
            ``audiovisual``): the fused model must then take what the hidden frames said from the lips,
            while the audio-only path keeps learning from whole utterances. False: every training utterance.
        edge_silence_frames: ``(low, high)``: at each end of every training utterance (after the speed
            perturbation, before noise), a number of 40 ms frames drawn uniformly from ``low..high``
            (integers) is added as silence (> 0) or removed (< 0, only frames that
            :func:`avsr.features.silent_edges` finds silent, so no speech is cut), audio, video and frame
            labels together (:func:`avsr.features.shift_edges`); drawn from their own stream (seed, epoch,
            index). A corpus whose utterances all start and end with the same silences otherwise teaches the
            model to place the words by the edges. None: no change.
        edge_silence_keep_length: with ``edge_silence_frames``, draw the change of the start only and make
            the opposite change at the end (``end = -start``, limited to the silent frames of both ends): the
            speech moves within the utterance, whose length stays the same. Batches then keep their lengths,
            which costs about 5% of training time, against 30-50% for independent ends (longer padded
            batches on 2 CPU cores; RESULTS.md, "Silence at the edges").
        edge_silence_prob: probability that a training utterance gets the change of
            ``edge_silence_frames`` (drawn from the same stream); the others keep the corpus's edges.
        narrowband_prob: probability that a training utterance is heard through a narrowband (8 kHz)
            channel in this epoch: its waveform, noise included, is resampled to 8000 Hz and back to 16 kHz
            (:func:`narrowband`, as ``avsr.Transcriber`` does with 8 kHz input), so the filterbank channels
            above 4 kHz hold only the resampler's leakage (telephone, AMR-NB, 8 kHz voices). Drawn from its
            own stream (seed, epoch, index), so every other draw stays as without it; the two views of an
            audio-visual item (``keep_clean_audio``) go through the same channel.
        narrowband_audio_only: give the narrowband channel only to utterances of audio-only batches (batch
            modality ``audio``): the audio path learns to read band-limited speech while the fused model
            keeps learning from full-band audio when to trust it.
        hard_onset_prob: probability that a training utterance's speech starts abruptly in this epoch
            (:func:`avsr.features.hard_onset`, before another utterance's audio and the noise, so the
            ``keep_clean_audio`` view has it too): the waveform muted up to a cut drawn uniformly from
            ``hard_onset_ms`` after the speech's onset, from its own stream (seed, epoch, index).
        hard_onset_ms: ``(low, high)``: the range of the cut, in milliseconds after the onset.
        envelope_contrast: ``(low, high)``: the contrast of the spectral envelope (formant peaks against
            valleys, the spectral tilt) is scaled by a factor drawn uniformly from this range
            (:func:`avsr.features.scale_envelope_contrast`, after ``freq_warp``), for a share
            ``envelope_contrast_prob`` of the training utterances per epoch, from its own stream (seed,
            epoch, index); the ``keep_clean_audio`` view gets the same factor. None: no change.
        envelope_contrast_prob: that share.
        untrusted_video_prob: probability that an utterance of an audio-visual batch (batch modality
            ``audiovisual``) gets, in this epoch, video that does not say its transcript, of a kind drawn
            uniformly from ``untrusted_video_kinds`` (:func:`untrusted_video`, from its own stream): its
            item then has ``video_trusted`` 0, the target of the video trust gate's loss
            (``video_gate_weight`` of :class:`avsr.models.config.ModelConfig`), and its transcript is still
            the audio's. The fused model so learns to rely on the lips only where they belong to the sound;
            real users' videos hold other people's lips, frozen frames and lips out of sync. An avsr
            extension (the negatives of audio-visual synchronisation training); it is not in AV-HuBERT.
        untrusted_video_kinds: the kinds of such video, from :data:`UNTRUSTED_VIDEO_KINDS`.

    Raises (``check``):
        ValueError: a non-positive speed factor, a malformed range or a negative count/width (names the
            field).
    """

    freq_warp: tuple[float, float] | None = None
    num_freq_mask: int = 0
    freq_mask_width: int = 0
    speed_factors: tuple[float, ...] = ()
    av_mismatch_prob: float = 0.0
    av_mismatch_noisy_only: bool = False
    num_time_mask: int = 0
    time_mask_width: int = 0
    time_mask_av_only: bool = False
    edge_silence_frames: tuple[int, int] | None = None
    edge_silence_keep_length: bool = False
    edge_silence_prob: float = 1.0
    narrowband_prob: float = 0.0
    narrowband_audio_only: bool = False
    hard_onset_prob: float = 0.0
    hard_onset_ms: tuple[float, float] = (5.0, 30.0)
    envelope_contrast: tuple[float, float] | None = None
    envelope_contrast_prob: float = 1.0
    untrusted_video_prob: float = 0.0
    untrusted_video_kinds: tuple[str, ...] = UNTRUSTED_VIDEO_KINDS

    def check(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if not 0.0 <= self.untrusted_video_prob <= 1.0:
            raise ValueError(f"untrusted_video_prob must be in [0, 1], got {self.untrusted_video_prob}")
        bad = [k for k in self.untrusted_video_kinds if k not in UNTRUSTED_VIDEO_KINDS]
        if bad or not self.untrusted_video_kinds:
            raise ValueError(f"untrusted_video_kinds must be a non-empty subset of "
                             f"{list(UNTRUSTED_VIDEO_KINDS)}, got {list(self.untrusted_video_kinds)}")
        if not 0.0 <= self.av_mismatch_prob <= 1.0:
            raise ValueError(f"av_mismatch_prob must be in [0, 1], got {self.av_mismatch_prob}")
        if any(not f > 0 for f in self.speed_factors):
            raise ValueError(f"speed_perturb factors must be positive, got {list(self.speed_factors)}")
        if self.freq_warp is not None:
            lo, hi = self.freq_warp
            if not 0 < lo <= hi:
                raise ValueError(
                    f"freq_warp must be [low, high] with 0 < low <= high, got {list(self.freq_warp)}"
                )
        if self.num_freq_mask < 0 or self.freq_mask_width < 0:
            raise ValueError(f"num_freq_mask and freq_mask_width must be >= 0, got {self.num_freq_mask}, "
                             f"{self.freq_mask_width}")
        if self.num_time_mask < 0 or self.time_mask_width < 0:
            raise ValueError(f"num_time_mask and time_mask_width must be >= 0, got {self.num_time_mask}, "
                             f"{self.time_mask_width}")
        if not 0.0 <= self.edge_silence_prob <= 1.0:
            raise ValueError(f"edge_silence_prob must be in [0, 1], got {self.edge_silence_prob}")
        if not 0.0 <= self.narrowband_prob <= 1.0:
            raise ValueError(f"narrowband_prob must be in [0, 1], got {self.narrowband_prob}")
        if not 0.0 <= self.hard_onset_prob <= 1.0:
            raise ValueError(f"hard_onset_prob must be in [0, 1], got {self.hard_onset_prob}")
        lo, hi = self.hard_onset_ms
        if not 0 <= lo <= hi:
            raise ValueError(f"hard_onset_ms must be [low, high] with 0 <= low <= high, got "
                             f"{list(self.hard_onset_ms)}")
        if self.envelope_contrast is not None:
            lo, hi = self.envelope_contrast
            if not 0 < lo <= hi:
                raise ValueError(f"envelope_contrast must be [low, high] with 0 < low <= high, got "
                                 f"{list(self.envelope_contrast)}")
        if not 0.0 <= self.envelope_contrast_prob <= 1.0:
            raise ValueError(f"envelope_contrast_prob must be in [0, 1], got {self.envelope_contrast_prob}")
        if self.edge_silence_frames is not None:
            lo, hi = self.edge_silence_frames
            if not (isinstance(lo, int) and isinstance(hi, int) and lo <= hi):
                raise ValueError(f"edge_silence_frames must be [low, high] integers with low <= high, got "
                                 f"{list(self.edge_silence_frames)}")

    @property
    def active(self) -> bool:
        """Whether this changes anything."""
        warp = self.freq_warp is not None and tuple(self.freq_warp) != (1.0, 1.0)
        speed = any(f != 1.0 for f in self.speed_factors)
        masks = self.num_freq_mask > 0 and self.freq_mask_width > 0
        time_masks = self.num_time_mask > 0 and self.time_mask_width > 0
        edges = (self.edge_silence_frames is not None and tuple(self.edge_silence_frames) != (0, 0)
                 and self.edge_silence_prob > 0)
        contrast = (self.envelope_contrast is not None and tuple(self.envelope_contrast) != (1.0, 1.0)
                    and self.envelope_contrast_prob > 0)
        return (warp or speed or masks or time_masks or edges or contrast or self.av_mismatch_prob > 0
                or self.narrowband_prob > 0 or self.hard_onset_prob > 0 or self.untrusted_video_prob > 0)


@dataclass
class LabelSet:
    """Frame labels of every utterance for one target set (k-means clusters for pretraining).

    Attributes:
        name: where the labels come from (a ``.km`` file path), used in error messages.
        labels: utterance id -> ``(L,)`` int64 labels, one per frame at ``label_rate``.
        label_rate: labels per second (100 for MFCC clusters, 25 for transformer-layer clusters).
        num_classes: K, the number of clusters (labels lie in ``0..K-1``).
    """

    name: str
    labels: Mapping[str, torch.Tensor]
    label_rate: float
    num_classes: int


class AVDataset(torch.utils.data.Dataset):
    """Utterances of a data dir as model inputs.

    Args:
        utts: the utterances (from :func:`avsr.data.datadir.read_datadir`).
        tokenizer: turns transcripts into token ids; None for unlabeled data.
        modalities: which streams to load, a subset of ``("audio", "video")``.
        train: random crop and horizontal flip of the video (else centre crop).
        noise: additive noise for the audio, or None.
        max_frame_diff: largest accepted difference, in 25 fps frames, between the audio duration
            (samples / 640) and the number of video frames.
        cache: keep decoded waveforms and frames in memory after the first read (uint8 video, float32
            audio: about 0.5 MB per second of speech), and the audio features of every item drawn without
            noise, warping or speed change (they are the same in every epoch; 10 KB per second).
        cache_limit_mb: at most this many MiB in the cache (None: no limit); items read once the cache is
            full are decoded again on every access (logged once). 433 hours of LRS3 would need ~800 GB.
        seed: base seed of the random augmentation.
        label_sets: frame labels (pretraining targets), one :class:`LabelSet` per target set.
        audio_augment: speed perturbation (audio, video and labels together) and frequency warping /
            masking of the audio features (used only with ``train``).
        keep_clean_audio: items of audio-visual batches (batch modality ``audiovisual``, training only)
            whose audio got noise or another utterance's audio also carry ``audio_clean``: the features of
            their own audio without it (same speed factor, warp and masks), for the ``audiovisual_clean``
            training view of :class:`avsr.models.asr.AVSRModel`.
        phone_lexicon: turns transcripts into phone ids (the targets of the phone CTC loss,
            :class:`avsr.data.lexicon.PhoneLexicon`), or None.

    Items are dicts: ``utt_id`` (str), ``audio`` (T, 104) float32 or None, ``video`` (T, 88, 88) float32
    (normalised) or None, ``tokens`` (L,) int64 or None, ``text`` (str or None), ``labels`` (a list of
    ``(L_k,)`` int64, one per label set, or None), ``audio_clean`` ((T, 104) float32, or None when it is
    the same as ``audio``, see ``keep_clean_audio``), ``phones`` ((P,) int64 phone ids, or None without
    ``phone_lexicon``); T is the number of 25 fps video frames (audio-only:
    ceil(samples / 640)).

    Raises (from ``__getitem__``):
        DataError: the utterance has no file for a requested modality, the durations disagree, the
            transcript is empty, or it has no labels in a label set or labels of the wrong length (more
            than ``max_frame_diff`` frames off); avsr.data.media.MediaError for a missing or corrupt file;
            avsr.data.tokenizer.TokenizerError: the transcript has characters the tokenizer maps to
            ``<unk>`` (named); avsr.data.lexicon.LexiconError: a transcript word without a pronunciation
            (named).
    """

    def __init__(
        self,
        utts: Sequence[Utterance],
        tokenizer: Tokenizer | None = None,
        modalities: Sequence[str] = STREAMS,
        train: bool = False,
        noise: NoiseConfig | None = None,
        max_frame_diff: int = 2,
        cache: bool = True,
        seed: int = 0,
        label_sets: Sequence[LabelSet] = (),
        audio_augment: AudioAugment | None = None,
        cache_limit_mb: float | None = None,
        keep_clean_audio: bool = False,
        phone_lexicon: PhoneLexicon | None = None,
    ):
        bad = [m for m in modalities if m not in STREAMS]
        if bad or not modalities:
            raise ValueError(f"modalities must be a non-empty subset of {STREAMS}, got {list(modalities)}")
        self.utts = list(utts)
        self.tokenizer = tokenizer
        self.modalities = tuple(modalities)
        self.train = train
        self.noise = noise
        self.max_frame_diff = max_frame_diff
        self.cache = cache
        self.seed = seed
        self.label_sets = list(label_sets)
        if audio_augment is not None:
            audio_augment.check()
        self.audio_augment = audio_augment if audio_augment is not None and audio_augment.active else None
        self.epoch = 0
        self._cache: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        self._feat_cache: dict[int, torch.Tensor] = {}  # audio features of the clean, unwarped waveform
        self.cache_limit_mb = cache_limit_mb
        self.keep_clean_audio = keep_clean_audio
        self.phone_lexicon = phone_lexicon
        self._cache_bytes = 0
        self._cache_full = False

    def __len__(self) -> int:
        return len(self.utts)

    def set_epoch(self, epoch: int) -> None:
        """Make the augmentation of the next pass depend on ``epoch`` (reproducible resumption)."""
        self.epoch = epoch

    def num_frames(self, index: int) -> int:
        """Length of item ``index`` in 25 fps frames (from utt2num_frames if known, else by reading it)."""
        u = self.utts[index]
        if u.num_frames is not None:
            return u.num_frames
        wav, video = self._load(index)
        return int(video.shape[0]) if video is not None else math.ceil(wav.numel() / SAMPLES_PER_FRAME)

    def _load(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if index in self._cache:
            return self._cache[index]
        u = self.utts[index]
        wav = video = None
        if "audio" in self.modalities:
            if not u.wav:
                raise DataError(f"utterance '{u.utt_id}' has no wav.scp entry but audio is requested")
            wav = read_wav(u.wav)
            if not bool(torch.isfinite(wav).all()):
                raise DataError(f"utterance '{u.utt_id}': {u.wav} has NaN or infinite samples")
        if "video" in self.modalities:
            if not u.video:
                raise DataError(f"utterance '{u.utt_id}' has no video.scp entry but video is requested")
            video = read_video(u.video)
        if wav is not None and video is not None:
            audio_frames = wav.numel() / SAMPLES_PER_FRAME
            if abs(audio_frames - video.shape[0]) > self.max_frame_diff:
                raise DataError(
                    f"utterance '{u.utt_id}': audio {u.wav} lasts {wav.numel() / 16000:.3f} s "
                    f"({audio_frames:.1f} frames) but video {u.video} has {video.shape[0]} frames at 25 fps "
                    f"({video.shape[0] / 25:.3f} s); tolerance {self.max_frame_diff} frames"
                )
        if self._cache_room(sum(t.numel() * t.element_size() for t in (wav, video) if t is not None)):
            self._cache[index] = (wav, video)
        return wav, video

    def _cache_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the cache (then they are counted as cached)."""
        if not self.cache:
            return False
        if self.cache_limit_mb is not None and self._cache_bytes + nbytes > self.cache_limit_mb * 2**20:
            if not self._cache_full:
                self._cache_full = True
                logger.info("the media cache is full (%d of %d utterances, cache_limit_mb %g): the rest is "
                            "decoded again on every access", len(self._cache), len(self.utts),
                            self.cache_limit_mb)
            return False
        self._cache_bytes += nbytes
        return True

    def _generator(self, index: int, epoch: int, *stream: str) -> torch.Generator:
        """The item's random stream in ``epoch`` (seed, epoch, index); a named ``stream`` is one of its own
        (an augmentation whose draws must not move the others)."""
        return torch.Generator().manual_seed(stable_seed(self.seed, epoch, index, *stream))

    def __getitem__(self, key: int | tuple) -> dict:
        """Item ``key``: an index, ``(index, batch_modality)`` from :class:`ModalityBatchSampler`, or
        ``(index, batch_modality, epoch)`` from :class:`EpochKeyedBatches`.

        With a batch modality (a key of :data:`MODALITY_INPUTS`; None: every loaded stream) only the streams
        it keeps are returned (the other is None) and the noise probability is :meth:`NoiseConfig.prob_for`
        that modality; the frame count T is still that of the video, so the audio features are the same as
        in an audio-visual batch. An epoch in the key selects the augmentation draws of that epoch instead of
        :meth:`set_epoch`'s (a DataLoader worker holds its own copy of the dataset, which ``set_epoch`` in
        the main process does not reach).

        Raises:
            DataError, MediaError: as the class says. ValueError: an unknown batch modality, or one that
            needs a stream the dataset does not load.
        """
        index, batch_modality, epoch, keep = self._parse_key(key)
        u = self.utts[index]
        wav, video = self._load(index)
        g = self._generator(index, epoch)
        aug = self.audio_augment if self.train else None
        # its own random stream: the video crop and noise draws stay as without it
        ga = self._generator(index, epoch, "audio_augment") if aug is not None else None
        wav, video, factor, edges, num_frames = self._perturb(wav, video, aug, ga, keep, index, epoch)
        audio_feats = video_feats = tokens = clean_feats = None
        if wav is not None and "audio" in keep:
            # the item's own waveform as read: its features are cacheable
            unchanged = factor == 1.0 and edges == (0, 0)
            audio_feats, clean_feats = self._item_audio(wav, num_frames, unchanged, g, ga, aug, index, epoch,
                                                        batch_modality)
        trusted = None
        if video is not None and "video" in keep:
            video, trusted = self._trusted_video(video, aug, index, epoch, batch_modality)
            video_feats = normalize_video(crop_video(video, train=self.train, generator=g))
        if self.tokenizer is not None:
            if not (u.text or "").strip():
                raise DataError(f"utterance '{u.utt_id}' has an empty transcript")
            # a training target must not hold <unk>; validation text may (avsr.bin.train warns about it)
            ids = self.tokenizer.encode(u.text, f"utterance '{u.utt_id}'", allow_unknown=not self.train)
            tokens = torch.tensor(ids, dtype=torch.long)
        phones = None
        if self.phone_lexicon is not None:
            phones = torch.tensor(self.phone_lexicon.encode(u.text or "", f"utterance '{u.utt_id}'"),
                                  dtype=torch.long)
        return {
            "utt_id": u.utt_id,
            "audio": audio_feats,
            "video": video_feats,
            "tokens": tokens,
            "text": u.text,
            "labels": [self._labels(ls, u.utt_id, num_frames, factor, edges)
                       for ls in self.label_sets] or None,
            "audio_clean": clean_feats,
            "phones": phones,
            "video_trusted": trusted,
        }

    def _trusted_video(self, video: torch.Tensor, aug: AudioAugment | None, index: int, epoch: int,
                       batch_modality: str | None) -> tuple[torch.Tensor, bool]:
        """``(video, trusted)``: the item's ``(T, H, W)`` uint8 frames, or with ``aug.untrusted_video_prob``
        in an audio-visual batch (its own stream) video that does not say the transcript
        (:func:`untrusted_video`; ``other``: the frames of another utterance of another speaker), and
        whether they are the item's own lips."""
        if aug is None or aug.untrusted_video_prob <= 0 or batch_modality != "audiovisual":
            return video, True
        g = self._generator(index, epoch, "untrusted_video")
        if float(torch.rand((), generator=g)) >= aug.untrusted_video_prob:
            return video, True
        kinds = aug.untrusted_video_kinds
        kind = kinds[int(torch.randint(0, len(kinds), (1,), generator=g))]
        other = None
        if kind in ("other", "photo"):
            if len(self.utts) < 2:
                kind = "frozen"
            else:
                other = self._load(self._other_utterance(index, g))[1]
        return untrusted_video(video, kind, g, other), False

    def _parse_key(self, key: int | tuple) -> tuple[int, str | None, int, tuple[str, ...]]:
        """``(index, batch_modality, epoch, keep)`` of a key of :meth:`__getitem__`: the epoch defaults to
        :meth:`set_epoch`'s, ``keep`` is the streams the item returns (the batch modality's, or every loaded
        one).

        Raises:
            ValueError: an unknown batch modality, or one that needs a stream the dataset does not load.
        """
        if isinstance(key, tuple):
            index, batch_modality, epoch = (*key, self.epoch)[:3]
        else:
            index, batch_modality, epoch = key, None, self.epoch
        if batch_modality is not None and batch_modality not in MODALITY_INPUTS:
            raise ValueError(
                f"batch modality must be one of {list(MODALITY_INPUTS)}, got {batch_modality!r}"
            )
        keep = MODALITY_INPUTS[batch_modality] if batch_modality is not None else self.modalities
        if not set(keep) <= set(self.modalities):
            raise ValueError(f"a {batch_modality!r} batch needs {list(keep)}, but the dataset loads only "
                             f"{list(self.modalities)}")
        return index, batch_modality, epoch, keep

    def _perturb(
        self, wav: torch.Tensor | None, video: torch.Tensor | None, aug: AudioAugment | None,
        ga: torch.Generator | None, keep: Sequence[str], index: int, epoch: int,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, float, tuple[int, int], int]:
        """The speed perturbation (factor drawn from ``ga``) and the edge silence (its own stream) of ``aug``.

        Args:
            wav: ``(N,)`` float32 waveform or None.  video: ``(T, H, W)`` uint8 frames or None.
            aug: the training augmentation, or None (nothing changes).  ga: its random stream.
            keep: the streams the item returns (a video it does not keep is not shifted, and becomes None).

        Returns:
            ``(wav, video, factor, edges, num_frames)``: the changed streams, the speed factor (1.0: none),
            the frames added (> 0) or removed at ``(start, end)`` and the item's length T in 25 fps frames
            (the video's, else ``ceil(samples / 640)``).
        """
        factor, edges = 1.0, (0, 0)
        if aug is not None and aug.speed_factors and wav is not None:
            factor = aug.speed_factors[int(torch.randint(0, len(aug.speed_factors), (1,), generator=ga))]
            wav, video = speed_perturb(wav, factor, video)
        video_frames = int(video.shape[0]) if video is not None else None
        if aug is not None and aug.edge_silence_frames is not None:
            shown = video if "video" in keep else None  # a video the batch does not keep is not copied
            wav, video, edges = self._shift_edges(wav, shown, aug.edge_silence_frames, index, epoch,
                                                  aug.edge_silence_keep_length, aug.edge_silence_prob)
            video_frames = None if video_frames is None else video_frames + sum(edges)
        num_frames = video_frames if video_frames is not None else math.ceil(wav.numel() / SAMPLES_PER_FRAME)
        return wav, video, factor, edges, num_frames

    def _item_audio(
        self, wav: torch.Tensor, num_frames: int, unchanged: bool, g: torch.Generator,
        ga: torch.Generator | None, aug: AudioAugment | None, index: int, epoch: int,
        batch_modality: str | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The audio features of an item: an abrupt speech onset (:meth:`_hard_onset`), another
        utterance's audio and noise (:meth:`_heard_waveform`),
        frequency warping (factor drawn from ``ga``), the envelope contrast (:meth:`_contrast`), the
        narrowband channel (its own stream), features and masks (:meth:`_masks`).

        Args:
            wav: ``(N,)`` float32, the item's (perturbed) waveform.  num_frames: T.
            unchanged: ``wav`` is the item's waveform as read (no speed change or edge shift).
            g, ga: the item's main stream (noise) and augmentation stream.  aug: augmentation or None.

        Returns:
            ``(audio, audio_clean)``: ``(T, 104)`` float32 features, and those of the item's own audio without
            noise or another utterance's audio (same warp, channel and masks) when ``keep_clean_audio`` asks
            for them and they differ, else None.
        """
        cut = self._hard_onset(wav, aug, index, epoch)
        unchanged = unchanged and cut is wav
        clean = wav = cut  # the item's own waveform: only the features of the unchanged one are cached
        wav = self._heard_waveform(wav, g, aug, index, epoch, batch_modality)
        warp = 1.0
        if aug is not None and aug.freq_warp is not None:
            lo, hi = aug.freq_warp
            warp = lo + (hi - lo) * float(torch.rand((), generator=ga))
        narrow = (aug is not None and aug.narrowband_prob > 0
                  and (not aug.narrowband_audio_only or batch_modality == "audio")
                  and float(torch.rand((), generator=self._generator(index, epoch, "narrowband")))
                  < aug.narrowband_prob)
        contrast = self._contrast(aug, index, epoch)
        heard = narrowband(wav) if narrow else wav
        audio_feats = self._audio_features(index, heard, num_frames, warp, heard is clean and unchanged,
                                           contrast)
        clean_feats = None
        if (self.keep_clean_audio and self.train and batch_modality == "audiovisual"
                and wav is not clean):
            clean_feats = self._audio_features(index, narrowband(clean) if narrow else clean, num_frames,
                                               warp, unchanged and not narrow, contrast)
        if aug is not None:
            state = ga.get_state()
            audio_feats = self._masks(audio_feats, aug, ga, index, epoch, batch_modality)
            if clean_feats is not None:  # the same masks: the views differ in the noise alone
                clean_feats = self._masks(clean_feats, aug, ga.set_state(state), index, epoch,
                                          batch_modality)
        return audio_feats, clean_feats

    def _drawn_value(self, index: int, epoch: int, stream: str, prob: float, bounds: tuple[float, float]
                     ) -> float | None:
        """A share ``prob`` of the items, in ``epoch``: a value drawn uniformly from ``bounds`` ``(low,
        high)``, from the item's own stream ``stream`` (two uniform draws: whether, then where); None for
        the other items."""
        if prob <= 0:
            return None
        u = torch.rand(2, generator=self._generator(index, epoch, stream)).tolist()
        if u[0] >= prob:
            return None
        lo, hi = bounds
        return lo + (hi - lo) * u[1]

    def _contrast(self, aug: AudioAugment | None, index: int, epoch: int) -> float:
        """The envelope contrast factor of an item in an epoch (``aug.envelope_contrast``, its own stream);
        1.0 for none."""
        if aug is None or aug.envelope_contrast is None:
            return 1.0
        factor = self._drawn_value(index, epoch, "envelope_contrast", aug.envelope_contrast_prob,
                                   aug.envelope_contrast)
        return 1.0 if factor is None else factor

    def _hard_onset(self, wav: torch.Tensor, aug: AudioAugment | None, index: int, epoch: int
                    ) -> torch.Tensor:
        """``wav`` with an abrupt speech onset when ``aug.hard_onset_prob`` draws one (its own stream), else
        the very same tensor."""
        if aug is None:
            return wav
        cut = self._drawn_value(index, epoch, "hard_onset", aug.hard_onset_prob, aug.hard_onset_ms)
        return wav if cut is None else hard_onset(wav, cut)

    def _heard_waveform(self, wav: torch.Tensor, g: torch.Generator, aug: AudioAugment | None, index: int,
                        epoch: int, batch_modality: str | None) -> torch.Tensor:
        """``wav`` ``(N,)`` as the item hears it: replaced by another utterance's audio
        (:meth:`_mismatched_audio`, audio-visual batches) and with noise (drawn from ``g``,
        :meth:`_add_noise`); the very same tensor when neither applies."""
        under_noise = None  # av_mismatch_noisy_only: the audio that takes the item's place under noise
        if aug is not None and aug.av_mismatch_prob > 0 and batch_modality == "audiovisual":
            other = self._mismatched_audio(index, epoch, wav.numel(), aug.av_mismatch_prob)
            if aug.av_mismatch_noisy_only:
                under_noise = other
            elif other is not None:
                wav = other
        if self.noise is not None:
            wav = self._add_noise(self.utts[index].utt_id, wav, g, self.noise.prob_for(batch_modality),
                                  under_noise)
        return wav

    def _audio_features(self, index: int, wav: torch.Tensor, num_frames: int, warp: float,
                        own_unperturbed: bool, contrast: float = 1.0) -> torch.Tensor:
        """The (T, 104) features of ``wav``; those of the item's own unperturbed, unwarped waveform
        (``own_unperturbed``, ``warp == 1`` and ``contrast == 1``) are the same in every epoch and kept in
        the cache."""
        cacheable = own_unperturbed and warp == 1.0 and contrast == 1.0
        feats = self._feat_cache.get(index) if cacheable else None
        if feats is None:
            feats = avhubert_audio_features(wav, num_video_frames=num_frames, warp=warp, contrast=contrast)
            if cacheable and self._cache_room(feats.numel() * feats.element_size()):
                self._feat_cache[index] = feats
        return feats

    def _shift_edges(
        self, wav: torch.Tensor | None, video: torch.Tensor | None, bounds: tuple[int, int], index: int,
        epoch: int, keep_length: bool = False, prob: float = 1.0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[int, int]]:
        """``AudioAugment.edge_silence_frames`` (and ``edge_silence_keep_length``): frames of silence added
        or removed at the two ends, drawn from their own stream (seed, epoch, index); removal is limited to
        the silent frames of ``wav`` (with no audio loaded, nothing is removed). Returns the new streams and
        ``(start, end)`` as applied."""
        g = self._generator(index, epoch, "edge_silence")
        if prob < 1.0 and float(torch.rand((), generator=g)) >= prob:
            return wav, video, (0, 0)
        start, end = (int(k) for k in torch.randint(bounds[0], bounds[1] + 1, (2,), generator=g))
        trims = keep_length or min(start, end) < 0  # only a removal needs the silent frames
        quiet = silent_edges(wav) if wav is not None and trims else (0, 0)
        if keep_length:  # silent frames move from one end to the other: at most the silence of the other end
            start = min(max(start, -quiet[0]), quiet[1])
            end = -start
        else:
            start, end = max(start, -quiet[0]), max(end, -quiet[1])
        wav, video = shift_edges(wav, video, start, end, generator=g)
        return wav, video, (start, end)

    def _masks(self, feats: torch.Tensor, aug: AudioAugment, ga: torch.Generator, index: int, epoch: int,
               batch_modality: str | None) -> torch.Tensor:
        """The frequency masks (drawn from ``ga``) and time masks (their own stream) of ``aug``."""
        feats = freq_mask(feats, aug.num_freq_mask, aug.freq_mask_width, generator=ga)
        if aug.num_time_mask and (not aug.time_mask_av_only or batch_modality == "audiovisual"):
            gt = self._generator(index, epoch, "time_mask")
            feats = time_mask(feats, aug.num_time_mask, aug.time_mask_width, generator=gt)
        return feats

    def _mismatched_audio(self, index: int, epoch: int, num_samples: int, prob: float) -> torch.Tensor | None:
        """``AudioAugment.av_mismatch_prob``: with probability ``prob``, the waveform of another utterance of
        another speaker (unperturbed), repeated or cut to ``num_samples``; else None (the item keeps its
        own). The draws come from their own stream (seed, epoch, index), so the other augmentation draws do
        not move."""
        g = self._generator(index, epoch, "av_mismatch")
        if float(torch.rand((), generator=g)) >= prob or len(self.utts) < 2:
            return None
        other = self._load(self._other_utterance(index, g))[0]
        reps = -(-num_samples // max(1, other.numel()))
        return other.repeat(reps)[:num_samples]

    def _other_utterance(self, index: int, g: torch.Generator) -> int:
        """The index of another utterance, of another speaker where one of 8 draws from ``g`` finds one
        (any other one when the corpus has one speaker); needs at least two utterances."""
        speaker = self.utts[index].speaker
        for _ in range(8):
            j = int(torch.randint(0, len(self.utts) - 1, (1,), generator=g))
            j += j >= index
            if self.utts[j].speaker != speaker:
                break
        return j

    def _labels(self, ls: LabelSet, utt_id: str, num_frames: int, speed: float = 1.0,
                edges: tuple[int, int] = (0, 0)) -> torch.Tensor:
        lab = ls.labels.get(utt_id)
        if lab is None:
            raise DataError(f"utterance '{utt_id}' has no labels in {ls.name}")
        if speed != 1.0:  # the frames of a speed-perturbed utterance: the same index map as its video
            lab = lab[speed_frame_index(lab.numel(), speed)]
        if edges != (0, 0):  # silence added or removed at the ends: the edge labels repeated or dropped
            lab = lab[edge_index(lab.numel(), *edges, per_frame=ls.label_rate / 25.0)]
        expected = num_frames * ls.label_rate / 25.0
        tolerance = (self.max_frame_diff + 1) * ls.label_rate / 25.0
        if abs(lab.numel() - expected) > tolerance:
            raise DataError(
                f"utterance '{utt_id}': {lab.numel()} labels in {ls.name} at {ls.label_rate:g} Hz, but its "
                f"{num_frames} frames at 25 fps need about {expected:.0f}"
            )
        return lab

    def _add_noise(self, utt_id: str, wav: torch.Tensor, g: torch.Generator, prob: float,
                   under_noise: torch.Tensor | None = None) -> torch.Tensor:
        """``wav`` with noise drawn with probability ``prob`` (or unchanged); when noise is drawn and
        ``under_noise`` is given, that waveform (same length) takes the noise in place of ``wav``, with the
        same draws (``AudioAugment.av_mismatch_noisy_only``)."""
        cfg = self.noise
        speech = wav if under_noise is None else under_noise
        if cfg.fixed:
            snr = cfg.snr_db[stable_seed(utt_id) % len(cfg.snr_db)]
            return cfg.source.mix(speech, snr, key=utt_id)
        if float(torch.rand((), generator=g)) >= prob:
            return wav
        snr = cfg.snr_db[int(torch.randint(0, len(cfg.snr_db), (1,), generator=g))]
        return cfg.source.mix(speech, snr, generator=g)


def collate(items: list[dict]) -> dict:
    """Pad a list of :class:`AVDataset` items into a batch.

    Returns:
        dict with ``utt_ids`` (list[str]), ``audio`` (B, 104, T) float32 or None, ``video``
        (B, 1, T, 88, 88) float32 or None (zero-padded in time), ``lengths`` (B,) int64 frames,
        ``ys_pad`` (B, L) int64 padded with -1 or None, ``ys_lens`` (B,) int64 or None, ``texts``,
        ``labels``: a list with one ``(B, L_k)`` int64 tensor padded with -1 per label set, or None,
        ``audio_clean``: (B, 104, T) float32 (each item's ``audio_clean``, or its ``audio`` where that is
        None) when an item has one, else None, ``phones_pad`` (B, P) int64 padded with -1 and ``phones_lens``
        (B,) int64 when the items have ``phones``, else None, ``video_trusted``: (B,) float32, 0 for items
        whose video the loader made uninformative (``AudioAugment.untrusted_video_prob``) and 1 for the
        others, when an item has such video, else None.
    """
    lengths = torch.tensor(
        [(it["video"] if it["video"] is not None else it["audio"]).shape[0] for it in items], dtype=torch.long
    )
    t_max = int(lengths.max())
    batch: dict = {
        "utt_ids": [it["utt_id"] for it in items],
        "lengths": lengths,
        "texts": [it["text"] for it in items],
    }
    if items[0]["audio"] is not None:
        audio = torch.zeros(len(items), items[0]["audio"].shape[1], t_max)
        for i, it in enumerate(items):
            audio[i, :, : it["audio"].shape[0]] = it["audio"].T
        batch["audio"] = audio
    else:
        batch["audio"] = None
    if items[0]["video"] is not None:
        _, h, w = items[0]["video"].shape
        video = torch.zeros(len(items), 1, t_max, h, w)
        for i, it in enumerate(items):
            video[i, 0, : it["video"].shape[0]] = it["video"]
        batch["video"] = video
    else:
        batch["video"] = None
    if items[0]["tokens"] is not None:
        ys_lens = torch.tensor([it["tokens"].numel() for it in items], dtype=torch.long)
        ys_pad = torch.full((len(items), int(ys_lens.max())), -1, dtype=torch.long)
        for i, it in enumerate(items):
            ys_pad[i, : it["tokens"].numel()] = it["tokens"]
        batch["ys_pad"], batch["ys_lens"] = ys_pad, ys_lens
    else:
        batch["ys_pad"] = batch["ys_lens"] = None
    batch["audio_clean"] = None
    if any(it.get("audio_clean") is not None for it in items):
        audio_clean = batch["audio"].clone()
        for i, it in enumerate(items):
            if it["audio_clean"] is not None:
                audio_clean[i, :, : it["audio_clean"].shape[0]] = it["audio_clean"].T
        batch["audio_clean"] = audio_clean
    batch["video_trusted"] = None
    if batch["video"] is not None and any(it.get("video_trusted") is False for it in items):
        batch["video_trusted"] = torch.tensor([float(it.get("video_trusted") is not False) for it in items])
    batch["phones_pad"] = batch["phones_lens"] = None
    if items[0].get("phones") is not None:
        batch["phones_lens"] = torch.tensor([it["phones"].numel() for it in items], dtype=torch.long)
        batch["phones_pad"] = torch.nn.utils.rnn.pad_sequence([it["phones"] for it in items],
                                                              batch_first=True, padding_value=-1)
    batch["labels"] = None
    if items[0].get("labels") is not None:
        batch["labels"] = [
            torch.nn.utils.rnn.pad_sequence(
                [it["labels"][k] for it in items], batch_first=True, padding_value=-1
            )
            for k in range(len(items[0]["labels"]))
        ]
    return batch


def length_buckets(
    lengths: Sequence[int], max_frames: int, max_batch_size: int = 10_000, oversize: str = "error"
) -> list[list[int]]:
    """Indices cut into batches of similar length: sorted by length (stable), then consecutive runs whose
    ``batch_size * longest`` stays within ``max_frames`` and ``batch_size <= max_batch_size``.

    Args:
        lengths: frames per item.  max_frames: padded frames per batch.  max_batch_size: items per batch.
        oversize: what an item longer than ``max_frames`` does: ``"error"``, or ``"alone"`` (a batch of its
            own, for decoding).

    Returns:
        The batches, shortest first, as lists of indices into ``lengths``.

    Raises:
        ValueError: an item longer than ``max_frames`` with ``oversize="error"`` (names its index).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if lengths[i] > max_frames and oversize == "error":
            raise ValueError(f"utterance {i} has {lengths[i]} frames, more than max_frames={max_frames}")
        if cur and ((len(cur) + 1) * lengths[i] > max_frames or len(cur) >= max_batch_size):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class BucketBatchSampler(torch.utils.data.Sampler):
    """Batches of utterances of similar length, at most ``max_frames`` padded frames per batch.

    Utterances are sorted by length and cut into consecutive batches whose ``batch_size * longest`` stays
    within ``max_frames`` (and ``batch_size <= max_batch_size``); the order of the batches is shuffled per
    epoch from ``seed + epoch``, so a resumed run sees the same order. With ``num_replicas > 1`` (DDP) each
    rank takes every ``num_replicas``-th batch, the list being cut to a multiple of ``num_replicas``.

    Args:
        lengths: frames per utterance.
        max_frames: padded frames per batch (per rank).
        max_batch_size: utterances per batch at most.
        shuffle: shuffle the batch order each epoch.
        seed: base of the shuffling seed.
        num_replicas, rank: data-parallel world size and this process's rank.

    Raises:
        ValueError: an utterance is longer than ``max_frames``.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_frames: int,
        max_batch_size: int = 10_000,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self.batches = length_buckets(lengths, max_frames, max_batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _epoch_batches(self) -> list[list[int]]:
        batches = list(self.batches)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        if self.num_replicas > 1:
            usable = len(batches) - len(batches) % self.num_replicas
            batches = batches[:usable][self.rank :: self.num_replicas]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._epoch_batches())

    def __len__(self) -> int:
        return len(self._epoch_batches())


class EpochKeyedBatches(torch.utils.data.Sampler):
    """A batch sampler's batches with the epoch in every key: ``[(index, batch_modality, epoch), ...]``.

    Wraps :class:`BucketBatchSampler` (keys: indices; batch modality None) or :class:`ModalityBatchSampler`
    (keys: ``(index, batch_modality)``) and reads the wrapped sampler's ``epoch`` when an epoch's iteration
    starts. :meth:`AVDataset.__getitem__` then draws the augmentation (noise, crop, flip, speed, warping) of
    that epoch in whichever process loads the item: with ``num_workers > 0`` and persistent workers each
    worker holds a copy of the dataset made when the workers started, which ``AVDataset.set_epoch`` in the
    main process does not reach, so without the epoch in the key every epoch would repeat the first one's
    draws. ``set_epoch`` is forwarded to the wrapped sampler.
    """

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the wrapped sampler, whose ``epoch`` the keys carry."""
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[tuple[int, str | None, int]]]:
        epoch = int(self.batch_sampler.epoch)
        for batch in self.batch_sampler:
            yield [(k[0], k[1], epoch) if isinstance(k, tuple) else (k, None, epoch) for k in batch]

    def __len__(self) -> int:
        return len(self.batch_sampler)


class ModalityBatchSampler(torch.utils.data.Sampler):
    """AV-HuBERT's per-batch modality dropout, drawn in the data pipeline: tags each batch with what it keeps.

    Wraps a batch sampler (:class:`BucketBatchSampler`) and yields its batches unchanged, each index paired
    with the batch's modality, ``[(index, modality), ...]``, for :meth:`AVDataset.__getitem__`. Per batch,
    with probability ``modality_dropout`` one modality is dropped -- the audio with probability
    ``audio_dropout`` (modality "video"), else the video (modality "audio"); otherwise the batch is
    "audiovisual". These are the draws of ``AVHubertModel.forward`` in av_hubert's ``hubert.py`` (one per
    batch, ``modality_dropout`` / ``audio_dropout``), made from a generator seeded by ``seed`` and the epoch
    instead of the global RNG: the j-th batch of an epoch gets the same draw on every rank and after a
    resumption, with the encoder's rule (:func:`avsr.nn.modality.draw_modalities`). Made by
    :meth:`avsr.encoder.AVHubertEncoder.modality_batch_sampler` of an encoder built not to draw again
    (``EncoderRuntime(modality_dropout_by_loader=True)``).

    Args:
        batch_sampler: yields lists of indices; ``set_epoch`` is forwarded to it.
        modality_dropout, audio_dropout: probabilities in [0, 1].
        seed: base of the draws' seed.

    Raises:
        ValueError: a probability outside [0, 1] (named).
    """

    def __init__(self, batch_sampler, modality_dropout: float, audio_dropout: float, seed: int = 0):
        for name, p in (("modality_dropout", modality_dropout), ("audio_dropout", audio_dropout)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.batch_sampler = batch_sampler
        self.modality_dropout, self.audio_dropout = float(modality_dropout), float(audio_dropout)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Select the draws (and the wrapped sampler's order) of ``epoch``."""
        self.epoch = epoch
        if hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)

    def modalities(self, num_batches: int) -> list[str]:
        """The modalities of this epoch's first ``num_batches`` batches (keys of :data:`MODALITY_INPUTS`)."""
        g = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch, "modality_dropout"))
        u = torch.rand(num_batches, 2, generator=g, dtype=torch.float64)
        return draw_modalities(u, self.modality_dropout, self.audio_dropout)

    def __iter__(self) -> Iterator[list[tuple[int, str]]]:
        batches = list(self.batch_sampler)
        for batch, modality in zip(batches, self.modalities(len(batches))):
            yield [(i, modality) for i in batch]

    def __len__(self) -> int:
        return len(self.batch_sampler)
