"""The names of the input modalities, defined once for the whole package.

A model reads one of three *modalities*: ``audio`` (the 104-dim stacked filterbanks at 25 Hz alone),
``video`` (the 88x88 mouth crops at 25 fps alone) or ``audiovisual`` (both, fused). Each is made of one or
both input *streams*. Training batches (modality dropout), decoding, the Transcriber, clustering features,
the ESPnet encoder and scoring all take these names; results tables list the modalities in the order of
:data:`MODALITIES`.

Source: AV-HuBERT (Shi et al., 2022), Sec. 3.2 (modality dropout) and its decoding setups (``modalities``
of ``avhubert/hubert_dataset.py``).
"""

from __future__ import annotations

__all__ = ["STREAMS", "MODALITIES", "MODALITY_INPUTS", "check_modality"]

#: the input streams of an utterance.
STREAMS: tuple[str, ...] = ("audio", "video")

#: the modalities a model reads, in the order of results tables.
MODALITIES: tuple[str, ...] = ("audio", "video", "audiovisual")

#: the streams each modality reads.
MODALITY_INPUTS: dict[str, tuple[str, ...]] = {
    "audio": ("audio",),
    "video": ("video",),
    "audiovisual": ("audio", "video"),
}


def check_modality(value: str, where: str = "modality") -> str:
    """Return ``value`` if it is one of :data:`MODALITIES`.

    Args:
        value: the name to check.
        where: what is being checked, for the message (a config key, an option, a directory).

    Raises:
        ValueError: any other value; the message names ``where`` and the accepted names.
    """
    if value not in MODALITIES:
        raise ValueError(f"{where} must be one of {list(MODALITIES)}, got {value!r}")
    return value
