"""ESPnet2 interoperability: the AV-HuBERT encoder as an ESPnet ``AbsEncoder``, and ESPnet's tools with it.

* :class:`AVHubertESPnetEncoder` (:mod:`avsr.espnet.encoder`): ESPnet's ``(xs_pad (B, T, D), ilens)`` in
  the packed frame layout of :mod:`avsr.espnet.layout` (104 audio features + the flattened mouth ROI per
  25 Hz frame), ``(hidden, olens, None)`` out; pretrained weights from avsr or official AV-HuBERT
  checkpoints through ``reload_pretrained_parameters``.
* :func:`register`: adds it to ESPnet's ASR encoder choices as ``avsr_avhubert``.
* ``python -m avsr.espnet.dump``: a data dir -> per-utterance packed ``.npy`` files + ``feats.scp``.
* ``python -m avsr.espnet.asr_train ...`` / ``python -m avsr.espnet.asr_inference ...``: ESPnet's
  ``espnet2.bin.asr_train`` / ``asr_inference`` with the encoder registered (``--modality`` chooses the
  input at inference).
* :mod:`avsr.espnet.scorers`: avsr's decoder and CTC as ESPnet beam-search scorers (for comparing searches).

Importing ``avsr`` or this package never imports ESPnet; only :func:`register`, the entry points and
:mod:`avsr.espnet.scorers` need it (``bash scripts/install_espnet.sh`` makes an environment with it).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ["ENCODER_NAME", "AVHubertESPnetEncoder", "espnet_available", "register"]

#: the name under which :func:`register` adds the encoder to ESPnet's ``encoder_choices``.
ENCODER_NAME = "avsr_avhubert"


def espnet_available() -> bool:
    """Whether ``espnet2`` can be imported (without importing it)."""
    return importlib.util.find_spec("espnet2") is not None


def register() -> None:
    """Add :class:`AVHubertESPnetEncoder` to ``espnet2.tasks.asr.encoder_choices`` as ``avsr_avhubert``.

    Call it before ESPnet parses a configuration or builds a model (``ASRTask.get_parser``,
    ``Speech2Text(...)``); calling it again changes nothing. Also registers it for ESPnet's AV-HuBERT-style
    tasks that share ``encoder_choices``.

    Raises:
        ImportError: ESPnet is not installed (``bash scripts/install_espnet.sh``).
    """
    from espnet2.tasks import asr

    from avsr.espnet.encoder import AVHubertESPnetEncoder

    asr.encoder_choices.classes[ENCODER_NAME] = AVHubertESPnetEncoder


def __getattr__(name: str) -> Any:
    """Load :class:`AVHubertESPnetEncoder` on first use (PEP 562)."""
    if name == "AVHubertESPnetEncoder":
        return importlib.import_module("avsr.espnet.encoder").AVHubertESPnetEncoder
    raise AttributeError(f"module 'avsr.espnet' has no attribute {name!r}")
