"""Inference: the one path from media to text -- checkpoint(s) + tokenizer + preprocessing + beam search.

:class:`Transcriber` (ESPnet's ``Speech2Text`` made smaller) is built from a model, its tokenizer and its
settings, or from a trained model with :meth:`Transcriber.from_pretrained` (an experiment directory, whose
best checkpoints are averaged; an avsr checkpoint; an official fairseq AV-HuBERT fine-tuned checkpoint);
:meth:`Transcriber.__call__` transcribes one utterance and :meth:`Transcriber.transcribe_batch` many,
batched over utterances. The recipe's decoding stage (``python -m avsr.bin.decode``,
:mod:`avsr.inference.decode_dir`), ``avsr transcribe`` and Python users all go through this class, so a file
gives the same words whichever way it is decoded.

The parts, one concept per module:

* :mod:`avsr.inference.types`: the items, the transcripts, :class:`InferenceError`;
* :mod:`avsr.inference.inputs`: what an input may be (paths, arrays, raw face video -> mouth ROI + audio) and
  how it is read, as the recipe reads it; noise mixed at an SNR with the segment chosen by the item's key;
* :mod:`avsr.inference.segments`: long input cut at pauses and joined; the silence before and after the
  speech brought into the range of the model's training audio (``edge_frames``);
* :mod:`avsr.inference.pretrained`: a trained model's weights, tokenizer, recorded facts and decode section
  (:class:`Pretrained`, :func:`model_defaults`, :func:`checkpoint_decode_defaults`);
* :mod:`avsr.inference.batching`: one call's items read, cut, bucketed into batches and joined again;
* :mod:`avsr.inference.transcripts`: a search's result written as transcripts (text, word timings);
* :mod:`avsr.inference.transcriber`: :class:`Transcriber`: features and the search for each batch;
* :mod:`avsr.inference.decode_dir`: the recipe's decoding stage: a test set under every modality and noise
  condition into a resumable decode directory.

Errors speak to the caller of this API (``modality='audio'``, ``edge_frames``); the command-line tools
translate them to their options.
"""

from avsr.inference.inputs import collect_media, load_audio, load_item, load_video
from avsr.inference.pretrained import (
    Pretrained,
    checkpoint_decode_defaults,
    inference_device,
    load_pretrained,
    model_defaults,
    model_edge_frames,
    model_view_weights,
)
from avsr.inference.segments import (
    DEFAULT_SEGMENT_S,
    EdgeRanges,
    frame_energy_db,
    frame_motion,
    parse_edge_frames,
    pause_cuts,
)
from avsr.inference.transcriber import Transcriber
from avsr.inference.types import (
    FPS,
    MAX_EDGE_FRAMES,
    MAX_FRAME_DIFF,
    MIN_FRAMES,
    ROI_SIZE,
    SAMPLE_RATE,
    InferenceError,
    TranscribeItem,
    Transcript,
)
from avsr.modalities import MODALITY_INPUTS

__all__ = [
    "InferenceError", "Transcript", "TranscribeItem", "Transcriber", "frame_energy_db",
    "frame_motion", "model_defaults", "model_edge_frames", "model_view_weights", "parse_edge_frames",
    "pause_cuts", "load_pretrained", "load_item", "load_audio", "load_video", "EdgeRanges",
    "DEFAULT_SEGMENT_S", "FPS", "SAMPLE_RATE", "ROI_SIZE", "MIN_FRAMES", "MAX_FRAME_DIFF", "MAX_EDGE_FRAMES",
    "MODALITY_INPUTS", "collect_media", "inference_device", "Pretrained", "checkpoint_decode_defaults",
]
