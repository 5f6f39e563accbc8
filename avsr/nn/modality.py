"""AV-HuBERT's per-batch modality dropout: the one rule that decides what a training batch keeps.

Source: ``AVHubertModel.forward`` in av_hubert's ``avhubert/hubert.py`` draws, once per batch, whether a
modality is dropped (probability ``modality_dropout``) and, if so, whether it is the audio (probability
``audio_dropout``) or the video. avsr makes that draw in one place: :func:`draw_modalities`. Who calls it
is decided once, when the encoder is built (``EncoderRuntime.modality_dropout_by_loader``,
:class:`avsr.encoder.EncoderRuntime`): the encoder itself, per forward pass (its default, as the original
and as a library component inside another toolkit), or the training data loader
(:class:`avsr.data.dataset.ModalityBatchSampler`, made by
:meth:`avsr.encoder.AVHubertEncoder.modality_batch_sampler`), which then loads only the modality a batch
keeps.
"""

from __future__ import annotations

import torch

__all__ = ["draw_modalities"]


def draw_modalities(u: torch.Tensor, modality_dropout: float, audio_dropout: float) -> list[str]:
    """The modality each of ``N`` batches keeps, from uniform draws.

    Args:
        u: ``(N, 2)`` uniform [0, 1) draws (any float dtype, CPU): column 0 decides whether a modality is
            dropped (``u < modality_dropout``), column 1 which (``u < audio_dropout``: the audio).
        modality_dropout: probability in [0, 1] that a batch drops one modality.
        audio_dropout: probability in [0, 1] that the dropped modality is the audio.

    Returns:
        ``N`` names (keys of :data:`avsr.modalities.MODALITY_INPUTS`): ``"audiovisual"``, ``"audio"``
        (video dropped) or ``"video"`` (audio dropped).

    Raises:
        ValueError: ``u`` not of shape ``(N, 2)``, or a probability outside [0, 1] (named).
    """
    for name, p in (("modality_dropout", modality_dropout), ("audio_dropout", audio_dropout)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    if u.dim() != 2 or u.shape[1] != 2:
        raise ValueError(f"draws must have shape (N, 2), got {tuple(u.shape)}")
    dropped = (u[:, 0] < modality_dropout).tolist()
    audio_dropped = (u[:, 1] < audio_dropout).tolist()
    return ["audiovisual" if not d else ("video" if a else "audio") for d, a in zip(dropped, audio_dropped)]
