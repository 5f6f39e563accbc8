"""Models shipped inside the package, by name: ``Transcriber.from_pretrained("synthgrid")``.

A shipped model is the folder ``avsr/pretrained/<name>/`` (package data, in the wheel). It holds what
:func:`avsr.inference.pretrained.load_pretrained` reads, in one of two layouts:

* ``model.pt`` -- one avsr checkpoint (``model``, ``model_config`` and the trainer's ``data_stats``; e.g. the
  average of an experiment's best epochs) -- and ``bpe.model``, its sentencepiece tokenizer, beside it; or
* an experiment directory's ``epoch<N>.pt`` files and ``bpe.model`` (the best are averaged);

and, in both, ``decode.yaml`` (optional: the decoding configuration the model card's figures were measured
with, used when no other is given) and ``MODEL_CARD.md`` (what the model was trained on, its word error
rates, its limits).

:func:`resolve_model` turns what a user gives -- a path, or the name of a shipped model -- into what to load.
The command-line tools (``avsr transcribe``, ``avsr demo``) load :data:`DEFAULT_MODEL` when no
``--checkpoint`` is given. This module imports nothing heavy: the tools' ``--help`` reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "CHECKPOINT", "TOKENIZER", "DECODE_CONFIG", "MODEL_CARD", "ROOT",
           "available_models", "is_model_name", "resolve_model", "shipped_decode_config"]

#: the model the command-line tools load when no ``--checkpoint`` is given.
DEFAULT_MODEL = "synthgrid"
#: file names inside a shipped model's folder.
CHECKPOINT, TOKENIZER, DECODE_CONFIG, MODEL_CARD = "model.pt", "bpe.model", "decode.yaml", "MODEL_CARD.md"

#: the folder of the shipped models: ``avsr/pretrained`` of the installed package (read at each call).
ROOT = Path(__file__).resolve().parent


def _installed(folder: Path) -> bool:
    """Whether ``folder`` holds a model's weights (``model.pt`` or an ``epoch<N>.pt``)."""
    return (folder / CHECKPOINT).is_file() or any(folder.glob("epoch*.pt"))


def available_models() -> list[str]:
    """The names of the models installed in :data:`ROOT`, sorted (``[]`` when none is)."""
    if not ROOT.is_dir():
        return []
    return sorted(d.name for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))
                  and _installed(d))


def is_model_name(source: str | os.PathLike) -> bool:
    """Whether ``source`` reads as a model's name rather than a path: no directory part, no ``.pt``/``.pth``
    suffix, not ``.``/``..``, and no such file or directory exists (an existing path always wins)."""
    text = os.fspath(source)
    path = Path(text)
    return (bool(text) and path.name == text and text not in (".", "..")
            and path.suffix.lower() not in (".pt", ".pth") and not path.exists())


def resolve_model(source: str | os.PathLike) -> Path:
    """What :func:`avsr.inference.pretrained.load_pretrained` should load for ``source``.

    Args:
        source: an experiment directory or checkpoint file (returned as a :class:`~pathlib.Path`, whether it
            exists or not: the loader reports a missing one), or the name of a shipped model
            (:func:`is_model_name`).

    Returns:
        the path; for a shipped model, its ``model.pt`` when it has one, else its folder (an experiment
        directory).

    Raises:
        FileNotFoundError: a name that is no shipped model -- the message says, in one line, that the model
            is not installed in this package (when its folder exists without weights, or it is
            :data:`DEFAULT_MODEL`), or that it is neither a path nor a shipped model, and names the models
            that are installed.
    """
    if not is_model_name(source):
        return Path(source)
    name = os.fspath(source)
    folder = ROOT / name
    if folder.is_dir() and _installed(folder):
        checkpoint = folder / CHECKPOINT
        return checkpoint if checkpoint.is_file() else folder
    names = available_models()
    shipped = f"installed: {', '.join(names)}" if names else "none is installed"
    if folder.is_dir() or name == DEFAULT_MODEL:
        raise FileNotFoundError(
            f"the pretrained model {name!r} is not installed in this package (no {CHECKPOINT} in {folder}; "
            f"{shipped}): give the path of a trained model's experiment directory or checkpoint instead")
    raise FileNotFoundError(f"{name!r} is neither a file or directory nor a pretrained model ({shipped})")


def shipped_decode_config(path: str | os.PathLike) -> Path | None:
    """The ``decode.yaml`` of the shipped model that :func:`resolve_model` returned ``path`` for, or None
    (another path, or a shipped model without one)."""
    path = Path(path)
    folder = (path.parent if path.name == CHECKPOINT else path).resolve()
    if folder.parent != ROOT.resolve():
        return None
    config = folder / DECODE_CONFIG
    return config if config.is_file() else None
