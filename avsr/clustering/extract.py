"""Feature extractors for clustering: MFCC (first iteration) and an encoder layer (later iterations).

- :class:`MfccExtractor`: 39-dim MFCC + deltas at 100 Hz from the wav (HuBERT / AV-HuBERT
  ``dump_mfcc_feature.py``), see :func:`avsr.features.mfcc_features`.
- :class:`LayerExtractor`: the output of transformer layer ``L`` of an AV-HuBERT encoder at 25 Hz, as
  AV-HuBERT's ``dump_hubert_feature.py``: audio as the model input
  (:func:`avsr.features.avhubert_audio_features`, padded or trimmed to the video length), video
  centre-cropped to 88x88 and normalised, both modalities given (``audiovisual``, the original's choice) or
  one of them; the encoder in eval mode. Unlike the original
  (one utterance at a time), utterances are batched (zero-padded, with lengths), which gives the same
  features since the encoder's output on valid frames does not depend on padding in eval mode.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from avsr.clustering.shards import FeatureDumpError
from avsr.data.datadir import Utterance
from avsr.data.media import read_video, read_wav
from avsr.encoder import AVHubertEncoder
from avsr.features import (
    SAMPLES_PER_FRAME,
    avhubert_audio_features,
    crop_video,
    mfcc_features,
    normalize_video,
)
from avsr.modalities import check_modality

__all__ = ["MfccExtractor", "LayerExtractor", "load_encoder", "layer_extractor"]

logger = logging.getLogger("avsr.clustering.extract")

#: which streams the encoder sees when dumping layer features.


class MfccExtractor:
    """39-dim MFCC + delta + delta-delta at 100 Hz per utterance (``description`` ``mfcc``, ``rate`` 100)."""

    description = "mfcc"
    rate = 100

    def __call__(self, utts: Sequence[Utterance]) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(utt_id, float32 (T, 39))`` in order, ``T = 1 + (num_samples - 400) // 160``.

        Raises:
            FeatureDumpError: an utterance without wav, or shorter than 25 ms (named).
            avsr.data.media.MediaError: unreadable wav or wrong rate (file named).
        """
        for u in utts:
            if u.wav is None:
                raise FeatureDumpError(f"utterance '{u.utt_id}' has no wav (wav.scp): MFCC needs audio")
            wav = read_wav(u.wav)
            try:
                feats = mfcc_features(wav)
            except ValueError as e:
                raise FeatureDumpError(f"utterance '{u.utt_id}' ({u.wav}): {e}") from e
            yield u.utt_id, feats.numpy()


def load_encoder(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AVHubertEncoder:
    """The encoder of a checkpoint, in eval mode, on ``map_location``.

    Read by :func:`avsr.compat.read_checkpoint`: an avsr checkpoint of a whole model (``{"model": state_dict,
    "model_config": {"encoder_conf": ...}}`` as the trainer writes for the pretraining or the ASR model: the
    ``encoder.``-prefixed weights), an encoder alone (``avsr-convert``), or an official fairseq AV-HuBERT
    checkpoint.

    Raises:
        FileNotFoundError: no such file.
        FeatureDumpError: an avsr checkpoint whose encoder weights do not fit its ``encoder_conf`` (keys
            named).
        avsr.compat.CheckpointError: any other unreadable or unfitting checkpoint.
    """
    from avsr.compat import CheckpointError, read_checkpoint
    from avsr.encoder import AVHubertEncoder

    loaded = read_checkpoint(path, map_location)
    try:
        encoder = AVHubertEncoder.from_checkpoint(loaded)
    except CheckpointError as e:
        if loaded.kind != "avsr":
            raise
        raise FeatureDumpError(
            f"{path}: the encoder weights do not fit model_config.encoder_conf: {e}"
        ) from e
    return encoder.to(map_location)


class LayerExtractor:
    """Output of transformer layer ``layer`` of an encoder at 25 Hz, ``(T, encoder_embed_dim)`` per utterance.

    Args:
        encoder: the encoder (put in eval mode here).
        layer: 1..encoder_layers; the output of that layer without the final LayerNorm (AV-HuBERT's
            ``output_layer``).
        modality: ``audiovisual`` (both streams, the original's choice), ``audio`` or ``video``.
        device: where the encoder runs.
        batch_frames: most padded 25 Hz frames per batch (utterances are sorted by ``num_frames`` when the
            data dir knows them, so batches hold utterances of similar length).
        description: recorded with the features (default ``layer<L>``).

    T is the number of video frames when the video is read (the audio features are padded or trimmed to
    it, as the original and :class:`avsr.data.dataset.AVDataset`), else ``ceil(num_samples / 640)``.

    Raises:
        ValueError: bad ``layer`` or ``modality``.
    """

    rate = 25

    def __init__(self, encoder: AVHubertEncoder, layer: int, modality: str = "audiovisual",
                 device: str | torch.device = "cpu", batch_frames: int = 1000, description: str | None = None
                 ) -> None:
        check_modality(modality)
        if not 1 <= layer <= encoder.config.encoder_layers:
            raise ValueError(
                f"layer must be in 1..{encoder.config.encoder_layers} (encoder_layers), got {layer}"
            )
        self.encoder = encoder.to(device).eval()
        self.layer, self.modality, self.device = layer, modality, torch.device(device)
        self.batch_frames = batch_frames
        self.description = description or f"layer{layer}"

    def inputs(self, u: Utterance) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Model inputs of one utterance: ``(audio (T, 104) | None, video (T, 88, 88) | None)``, float32.

        Raises:
            FeatureDumpError: the utterance lacks the wav or video the modality needs (named).
            avsr.data.media.MediaError: unreadable media (file named).
        """
        video = audio = None
        if self.modality in ("audiovisual", "video"):
            if u.video is None:
                raise FeatureDumpError(f"utterance '{u.utt_id}' has no video (video.scp), needed for "
                                       f"{self.modality} features")
            video = normalize_video(crop_video(read_video(u.video), train=False))
        if self.modality in ("audiovisual", "audio"):
            if u.wav is None:
                raise FeatureDumpError(f"utterance '{u.utt_id}' has no wav (wav.scp), needed for "
                                       f"{self.modality} features")
            wav = read_wav(u.wav)
            from_audio = math.ceil(wav.numel() / SAMPLES_PER_FRAME)
            num_frames = from_audio if video is None else video.shape[0]
            if abs(from_audio - num_frames) > 2:
                logger.warning("utterance %s: audio of %d frames padded/trimmed to its %d video frames",
                               u.utt_id, from_audio, num_frames)
            audio = avhubert_audio_features(wav, num_video_frames=num_frames)
        return audio, video

    @torch.inference_mode()
    def encode(self, items: list[tuple[torch.Tensor | None, torch.Tensor | None]]) -> list[torch.Tensor]:
        """Layer outputs of a batch of :meth:`inputs` results: a list of float32 ``(T_i, D)`` on the CPU."""
        lengths = [(a if a is not None else v).shape[0] for a, v in items]
        b, t = len(items), max(lengths)
        audio = video = None
        if items[0][0] is not None:
            audio = torch.zeros(b, items[0][0].shape[1], t)
            for i, (a, _) in enumerate(items):
                audio[i, :, : a.shape[0]] = a.T
            audio = audio.to(self.device)
        if items[0][1] is not None:
            video = torch.zeros(b, 1, t, *items[0][1].shape[1:])
            for i, (_, v) in enumerate(items):
                video[i, 0, : v.shape[0]] = v
            video = video.to(self.device)
        ilens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        outputs, _ = self.encoder.extract_layer_outputs({"audio": audio, "video": video}, ilens, self.layer)
        hidden = outputs[self.layer - 1].float().cpu()
        return [hidden[i, :n] for i, n in enumerate(lengths)]

    def __call__(self, utts: Sequence[Utterance]) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(utt_id, float32 (T, D))`` for every utterance (in batch order, shortest first when the
        lengths are known).

        Raises: as :meth:`inputs`.
        """
        order = sorted(utts, key=lambda u: u.num_frames or 0)
        batch: list[tuple[Utterance, tuple]] = []
        longest = 0
        for u in order:
            item = self.inputs(u)
            n = (item[0] if item[0] is not None else item[1]).shape[0]
            if batch and max(longest, n) * (len(batch) + 1) > self.batch_frames:
                yield from self._flush(batch)
                batch, longest = [], 0
            batch.append((u, item))
            longest = max(longest, n)
        if batch:
            yield from self._flush(batch)

    def _flush(self, batch: list[tuple[Utterance, tuple]]) -> Iterator[tuple[str, np.ndarray]]:
        feats = self.encode([item for _, item in batch])
        for (u, _), f in zip(batch, feats):
            yield u.utt_id, f.numpy()


def layer_extractor(checkpoint: str | os.PathLike, layer: int, modality: str = "audiovisual",
                    device: str | torch.device = "cpu", batch_frames: int = 1000) -> LayerExtractor:
    """The :class:`LayerExtractor` of layer ``layer`` of a checkpoint's encoder (:func:`load_encoder`),
    described as ``layer<L> of <checkpoint>`` (plus `` (<modality>)`` unless audiovisual) in the shards.

    Raises:
        as :func:`load_encoder` and :class:`LayerExtractor`.
    """
    description = f"layer{layer} of {checkpoint}"
    if modality != "audiovisual":
        description += f" ({modality})"
    return LayerExtractor(load_encoder(checkpoint), layer, modality, device, batch_frames, description)
