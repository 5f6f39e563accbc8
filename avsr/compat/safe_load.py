"""Safe loading of fairseq checkpoints: ``torch.load(weights_only=True)`` with a short list of stand-ins.

A fairseq checkpoint is a ``torch.save`` dict (``fairseq/trainer.py``, ``Trainer.state_dict``): ``cfg`` (the
Hydra configuration as plain dicts and lists, ``OmegaConf.to_container``) or, in checkpoints older than
fairseq's Hydra move, ``args`` (an :class:`argparse.Namespace`); ``model`` (the state dict);
``task_state``, which for AV-HuBERT (``avhubert/misc/fix_state.py``, ``AVHubertPretrainingTask``) pickles
fairseq ``Dictionary`` objects and, for sequence-to-sequence models, a fairseq ``SentencepieceBPE`` holding a
``sentencepiece.SentencePieceProcessor``; ``extra_state`` (meters, possibly numpy scalars);
``optimizer_history`` and ``last_optimizer_state`` (plain data and tensors).

Unpickling those objects with their real classes would import fairseq and run its code. Here torch's
restricted unpickler (``weights_only=True``) is used, and each of those class names is mapped to a small
stand-in defined below that only stores the pickled data (no method of the stand-ins runs code taken from the
file). Every other global is refused by torch, and the error names it.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "InertObject",
    "PickledObject",
    "PickledNamespace",
    "PickledDictionary",
    "PickledSentencePieceModel",
    "SAFE_GLOBALS",
    "safe_torch_load",
]


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: missing, truncated, not a checkpoint we know, or unsupported.

    The message always names the file (and, for configurations, the field).
    """


class PickledObject:
    """Stand-in for a pickled object of a class we do not import (e.g. fairseq's ``SentencepieceBPE``).

    Pickle's ``NEWOBJ`` creates it without calling ``__init__`` and ``BUILD`` fills ``__dict__`` with the
    pickled attributes, which are then plain data (or other stand-ins).
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(vars(self))})"


class InertObject(PickledObject):
    """Stand-in for a class of fairseq, AV-HuBERT, omegaconf or ``typing`` found in a checkpoint.

    Subclasses are made per pickled name (attribute ``pickled_name``). Creating one (pickle ``NEWOBJ``, or
    ``REDUCE`` with arguments, kept as ``args``) and setting its state (``BUILD``) only stores data: no code
    of the original class is imported or run. omegaconf's ``DictConfig``/``ListConfig`` (``_content``) and
    value nodes (``_val``) are read back as plain data by :func:`avsr.compat.fairseq_config.plain`.
    """

    pickled_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args


class PickledNamespace(PickledObject):
    """Stand-in for :class:`argparse.Namespace` (the ``args`` of pre-Hydra fairseq checkpoints)."""


class PickledDictionary(PickledObject):
    """Stand-in for fairseq's ``Dictionary`` (``fairseq/data/dictionary.py``).

    Attributes after unpickling (fairseq's): ``symbols`` (list of str, index order), ``count``, ``indices``,
    ``bos_index``, ``pad_index``, ``eos_index``, ``unk_index``, ``bos_word``, ``pad_word``, ``eos_word``,
    ``unk_word``, ``nspecial``.
    """


class PickledSentencePieceModel:
    """Stand-in for ``sentencepiece.SentencePieceProcessor``, which pickles its serialized model proto.

    Attribute ``model_proto``: the ``.model`` file's bytes (load it with
    ``sentencepiece.SentencePieceProcessor(model_proto=...)``).
    """

    model_proto: bytes

    def __setstate__(self, state: Any) -> None:
        # sentencepiece < 0.2 pickles the serialized model alone; 0.2 pickles a dict holding it as
        # ``model_proto`` next to a few encoding options (ignored here).
        if isinstance(state, dict):
            state = state.get("model_proto")
        if not isinstance(state, (bytes, bytearray)):
            raise pickle.UnpicklingError(
                f"sentencepiece.SentencePieceProcessor: expected the serialized model (bytes), got "
                f"{type(state).__name__}"
            )
        self.model_proto = bytes(state)


def _numpy_globals() -> list[tuple[Any, str]]:
    """numpy scalar, array and dtype constructors (meters in ``extra_state`` may hold numpy values).

    Pickles name them by the numpy version that wrote them (``numpy.core`` before 2.0, ``numpy._core``
    after); both names map to the installed numpy's functions, which build a scalar from a dtype and bytes.
    """
    core = np._core if hasattr(np, "_core") else np.core  # type: ignore[attr-defined]
    out: list[tuple[Any, str]] = [(np.dtype, "numpy.dtype"), (np.ndarray, "numpy.ndarray")]
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out.append((core.multiarray.scalar, f"{mod}.scalar"))
        out.append((core.multiarray._reconstruct, f"{mod}._reconstruct"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in dir(dtypes):
            if name.endswith("DType") and isinstance(getattr(dtypes, name), type):
                out.append((getattr(dtypes, name), f"numpy.dtypes.{name}"))
    return out


#: (stand-in, pickled global name) pairs allowed on top of torch's own weights-only allowlist.
SAFE_GLOBALS: list[tuple[Any, str]] = [
    (PickledNamespace, "argparse.Namespace"),
    (PickledDictionary, "fairseq.data.dictionary.Dictionary"),
    (PickledObject, "fairseq.data.encoders.sentencepiece_bpe.SentencepieceBPE"),
    (PickledSentencePieceModel, "sentencepiece.SentencePieceProcessor"),
    # type objects stored as values (sentencepiece >= 0.2 pickles its ``_return_type``, ``int``; omegaconf
    # metadata holds value types such as ``dict`` and ``list``)
    (int, "builtins.int"),
    (str, "builtins.str"),
    (float, "builtins.float"),
    (bool, "builtins.bool"),
    (dict, "builtins.dict"),
    (list, "builtins.list"),
    (tuple, "builtins.tuple"),
    *_numpy_globals(),
]


#: Modules whose classes may be pickled in fairseq checkpoints (configuration dataclasses and omegaconf
#: containers, ``typing`` annotations held in omegaconf metadata); they are read as :class:`InertObject`.
INERT_MODULES = (
    "omegaconf.", "typing.", "fairseq.", "avhubert.", "hubert.", "hubert_asr.", "hubert_pretraining.",
    "__main__.",
)


def _none(*args: Any) -> None:
    """Stand-in for ``operator.getitem`` on ``typing`` annotations (``List[int]``) in omegaconf metadata."""
    return None


def _new_dict(*args: Any) -> dict:
    """Stand-in for ``collections.defaultdict`` (omegaconf's resolver cache): a plain dict."""
    return {}


def _inert_globals(path: Path) -> list[tuple[Any, str]]:
    """Stand-ins for the globals of :data:`INERT_MODULES` that the (zip) checkpoint names, found by a
    static scan of its pickle; plus ``operator.getitem`` and ``collections.defaultdict`` when it pickles
    omegaconf."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # legacy (non-zip) files cannot be scanned: only SAFE_GLOBALS apply
        return []
    known = {name for _, name in SAFE_GLOBALS}
    out: list[tuple[Any, str]] = []
    omegaconf = any(n.startswith("omegaconf.") for n in names)
    for name in names:
        if name in known:
            continue
        if name.startswith(INERT_MODULES):
            short = name.rsplit(".", 1)[-1]
            out.append((type(short, (InertObject,), {"pickled_name": name, "__module__": __name__}), name))
        elif omegaconf and name == "_operator.getitem":
            out.append((_none, name))
        elif omegaconf and name == "collections.defaultdict":
            out.append((_new_dict, name))
    return out


def safe_torch_load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` allowing only :data:`SAFE_GLOBALS` as extra globals.

    Args:
        path: a ``.pt`` file written by ``torch.save`` (zip or legacy format).
        map_location: where tensors go (``"cpu"`` by default).

    Classes of fairseq, AV-HuBERT, omegaconf and ``typing`` (:data:`INERT_MODULES`) come back as
    :class:`InertObject` stand-ins; any other global that torch does not allow is refused.

    Returns:
        The unpickled object; fairseq-only classes come back as the stand-ins of this module.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file is empty, truncated or not a torch file, or it pickles a global that is
            not allowed (the message names the file and the global; :func:`load_error`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    if not hasattr(torch.serialization, "safe_globals"):
        raise CheckpointError(f"{path}: reading fairseq checkpoints safely needs torch >= 2.6 "
                              f"(found {torch.__version__})")
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS + _inert_globals(path)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError, zipfile.BadZipFile, OSError, ValueError,
            KeyError) as e:
        raise load_error(path, e) from e


#: what torch's restricted unpickler names when it refuses a global
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_error(path: str | os.PathLike, exc: BaseException) -> CheckpointError:
    """A one-line :class:`CheckpointError` for a failed ``torch.load(weights_only=True)`` of ``path``.

    A file that pickles objects outside the allowed set is named as such, with the refused globals (e.g.
    ``posix.system``) -- never as truncated, and without torch's advice to load with ``weights_only=False``,
    which would run the file's code; a damaged file is "truncated or not a torch checkpoint".
    """
    text = str(exc)
    names = sorted(set(_REFUSED_GLOBAL.findall(text)))
    if isinstance(exc, pickle.UnpicklingError) and names:
        return CheckpointError(
            f"{path}: holds objects outside the allowed set ({', '.join(names)}); avsr reads only tensors, "
            "plain Python data and fairseq's Namespace/Dictionary/SentencepieceBPE from checkpoints, and "
            "refused the file without running any of its code")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "eights only load failed" in text:  # torch's advice is not for us: keep only what it found
        lines = [x for x in lines if "weights_only" not in x and "eights only load failed" not in x]
    first = lines[0] if lines else ""
    return CheckpointError(f"{path}: truncated or not a torch checkpoint ({type(exc).__name__}: {first})")
