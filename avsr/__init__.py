"""avsr: audio-visual speech recognition with an AV-HuBERT-style encoder.

The public classes and the encoder factories (``avsr.avhubert_base()``, ``avsr.avhubert_large()``,
``avsr.avhubert_synthgrid_cpu()``) are loaded lazily (on first attribute access) so that ``import avsr``
stays light. The shipped YAML configurations lie in ``avsr/conf`` and are read by name
(``AVHubertEncoder.from_yaml("avhubert_base")``, see :func:`avsr.config.config_path`).
"""

from __future__ import annotations

import importlib
from typing import Any


def _version() -> str:
    """The version of the installed distribution; in a source tree that is not installed, the one its
    ``setup.cfg`` names (``0+unknown`` where neither exists)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("avsr")
    except PackageNotFoundError:
        import configparser
        from pathlib import Path

        cfg = configparser.ConfigParser()
        cfg.read(Path(__file__).resolve().parent.parent / "setup.cfg", encoding="utf-8")
        return cfg.get("metadata", "version", fallback="0+unknown")


#: the version of avsr, as ``pip`` sees it (recorded in every checkpoint the trainer writes)
__version__ = _version()

# public name -> module defining it
_LAZY = {
    "AVHubertEncoder": "avsr.encoder",
    "AVHubertEncoderConfig": "avsr.encoder",
    "EncoderRuntime": "avsr.encoder",
    "GradMultiply": "avsr.autograd",
    "grad_multiply": "avsr.autograd",
    "AVSRModel": "avsr.models.asr",
    "AVHubertPretrainModel": "avsr.models.pretrain",
    "ModelConfig": "avsr.models.config",
    "MomentumLabelMemory": "avsr.autograd",
    "DecodeConfig": "avsr.decode.config",
    "avhubert_audio_features": "avsr.features",
    "Transcriber": "avsr.inference",
    "Transcript": "avsr.inference",
    "TranscribeItem": "avsr.inference",
    "InferenceError": "avsr.inference",
    # factories of the published configurations (torchaudio's hubert_base() style)
    "avhubert_base": "avsr.models.factories",
    "avhubert_large": "avsr.models.factories",
    "avhubert_synthgrid_cpu": "avsr.models.factories",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'avsr' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Module attributes plus the lazily loaded public names."""
    return sorted(set(globals()) | set(_LAZY))
