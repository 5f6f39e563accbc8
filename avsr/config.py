"""YAML configuration files mapped onto typed dataclasses.

Every configurable part of avsr is a dataclass whose field names are the hyper-parameter names of
AV-HuBERT/fairseq (``encoder_embed_dim``, ``feature_grad_mult``, ...). A YAML file is read with
:func:`load_yaml` and a mapping is turned into a dataclass with :func:`from_dict`, which

* refuses unknown (misspelt) keys, naming the key, the dataclass and the file it came from;
* checks every value against the field's declared type: ``int`` (an integral float such as ``1e4`` is taken
  as its integer), ``float`` (an integer is taken as a float), ``bool`` (``true``/``false`` only), ``str``,
  ``list[X]`` / ``tuple[X, ...]``, ``X | None`` and nested dataclasses; a string where a number or a
  boolean is declared, or a list where a scalar is, is a :class:`ConfigError` naming the key, the value, the
  expected type and the file;
* checks the ranges of the fields named in :data:`FIELD_RANGES` (probabilities in [0, 1], positive sizes
  and learning rates, non-empty SNR lists).

YAML is read with the YAML 1.2 core schema's scalars: ``3e-3`` and ``1e4`` are floats (PyYAML's YAML 1.1
rules read them as strings), and only ``true``/``false`` are booleans (``yes``/``no``/``on``/``off`` stay
strings, so they are refused where a boolean is declared).

The configurations shipped with the package lie in ``avsr/conf/<kind>/<name>.yaml`` (package data, inside
the wheel; the repository's top-level ``conf/`` is a link to that directory, the recipes' view of it).
:func:`config_path` turns either a path or the name of a shipped configuration (``"avhubert_base"``,
``"default"``) into a file, and every ``from_yaml`` of the package accepts both.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import functools
import importlib.resources
import numbers
import os
import re
import shutil
import tempfile
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

#: the kinds of shipped configuration: the sub-directories of ``avsr/conf``.
CONFIG_KINDS = ("model", "decode", "train", "pretrain", "finetune")
#: the kinds a training configuration (``avsr-train --config``) can be.
TRAIN_KINDS = ("train", "pretrain", "finetune")


_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's booleans and floats."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str = "<string>") -> Any:
    """YAML text -> Python objects with the scalars described in the module docstring.

    Raises:
        ConfigError: not valid YAML (names ``where``).
    """
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {e}") from e


class ConfigError(ValueError):
    """A configuration file or mapping is invalid: an unknown key, a wrong type or a missing file."""


class UsageError(ValueError):
    """Options that do not go together or cannot be right (exit status 2 of the command-line tools, see
    :mod:`avsr.bin.runner`, which re-exports it): e.g. resuming an experiment with other settings."""


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping.

    Args:
        path: the YAML file.

    Returns:
        The mapping (an empty dict for an empty file).

    Raises:
        ConfigError: the file is missing, is not valid YAML, or its top level is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def check_keys(mapping: Mapping[str, Any], allowed: set[str] | list[str], where: str) -> None:
    """Raise :class:`ConfigError` naming the first key of ``mapping`` that is not in ``allowed``.

    Args:
        mapping: the keys to check.
        allowed: the accepted key names.
        where: what the mapping is, for the message (e.g. ``"conf/model/small.yaml: encoder_conf"``).
    """
    allowed = set(allowed)
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown config key '{key}'{hint}")


def from_dict(cls: type[T], mapping: Mapping[str, Any] | None, where: str = "<dict>") -> T:
    """Build the dataclass ``cls`` from ``mapping``, refusing unknown keys and values of the wrong type.

    Nested dataclass fields are built recursively from nested mappings. Values are converted where the
    module docstring says (integral floats to ``int``, integers to ``float``, lists to tuples for tuple
    fields).

    Args:
        cls: a dataclass type.
        mapping: field values; missing fields take their defaults.
        where: the origin of ``mapping`` (a file name, a key path) used in error messages.

    Raises:
        ConfigError: a key is not a field of ``cls``; a value of the wrong type or out of its range (the
            message names the key, the value, what was expected and ``where``).
    """
    if mapping is not None and not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} options, got "
                          f"{type(mapping).__name__} {mapping!r}")
    mapping = dict(mapping or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(mapping, set(fields), where)
    hints = _type_hints(cls)
    kwargs = {key: check_value(value, hints.get(key, Any), key, where) for key, value in mapping.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if str(e).startswith(where):
            raise
        raise ConfigError(f"{where}: {e}") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that cannot be resolved: no type checks for this class
        return {}


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(tp, str(tp).replace("typing.", ""))


def check_value(value: Any, tp: Any, key: str, where: str) -> Any:
    """``value`` checked against the type annotation ``tp`` and, by ``key``, :data:`FIELD_RANGES`.

    Returns:
        the value, converted as the module docstring says.

    Raises:
        ConfigError: naming ``key``, the value, the expected type or range and ``where``.
    """
    value = _check_type(value, tp, key, where)
    rule = FIELD_RANGES.get(key)
    if rule is None or value is None:
        return value
    ok, expected = rule
    if expected == NON_EMPTY:
        good = ok(value)
    else:
        values = value if isinstance(value, (list, tuple)) else [value]
        good = all(not isinstance(v, numbers.Real) or ok(v) for v in values)
    if not good:
        raise ConfigError(f"{where}: {key}: expected {expected}, got {value!r}")
    return value


def _bad(value: Any, tp: Any, key: str, where: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _check_type(value: Any, tp: Any, key: str, where: str) -> Any:
    """``value`` as the annotation ``tp`` declares it (see the module docstring), or ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return _check_type(value, alt, key, where)
            except ConfigError:
                pass
        raise _bad(value, tp, key, where)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, f"{where}: {key}")
        raise _bad(value, tp, key, where)
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and is_number and float(value).is_integer():
        return int(value)
    if tp is float and is_number:
        return float(value)
    if tp is str and isinstance(value, str):
        return value
    if tp in (bool, int, float, str):
        raise _bad(value, tp, key, where)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _bad(value, tp, key, where)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: {key}: expected {len(args)} values ({_type_name(tp)}), got "
                                  f"{value!r}")
            return tuple(_check_type(v, a, key, where) for v, a in zip(value, args))
        items = [_check_type(v, args[0] if args else Any, key, where) for v in value]
        return tuple(items) if tuple in (origin, tp) else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _bad(value, tp, key, where)
        return value
    return value  # other annotations (objects passed from Python, e.g. a NoiseSource) are not checked here


def _unit(v: float) -> bool:
    return 0.0 <= v <= 1.0


#: the expectation of list fields that must not be empty (:data:`FIELD_RANGES`).
NON_EMPTY = "a non-empty list"

#: value ranges by field name, for every config class: ``key -> (predicate, what is expected)``; a list
#: value is checked element by element (except for :data:`NON_EMPTY` rules, which see the whole list).
FIELD_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{name: (_unit, "a probability in [0, 1]") for name in (
        "dropout", "dropout_input", "dropout_features", "attention_dropout", "activation_dropout",
        "encoder_layerdrop", "decoder_layerdrop", "modality_dropout", "audio_dropout", "noise_prob",
        "noise_prob_audio_only", "av_mismatch_prob", "mask_prob_audio", "mask_prob_image", "ctc_weight",
        "final_lr_scale", "label_memory_momentum", "edge_silence_prob",
        "narrowband_prob")},
    **{name: (lambda v: v > 0, "a number > 0") for name in (
        "lr", "max_epoch", "batch_frames", "max_batch_size", "accum_grad", "beam_size", "logit_temp",
        "label_rate", "sample_rate", "pre_beam_ratio", "log_interval", "speed_perturb", "mask_length_audio",
        "mask_length_image")},
    **{name: (lambda v: v >= 0, "a number >= 0") for name in (
        "weight_decay", "warmup_steps", "grad_clip", "num_workers", "keep_nbest", "freeze_finetune_updates",
        "valid_interval", "num_freq_mask", "freq_mask_width", "num_time_mask", "time_mask_width",
        "minlenratio", "feature_grad_mult")},
    "noise_snr_db": (lambda v: len(v) > 0, NON_EMPTY),
}


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass instance as a plain (YAML-serialisable) dict."""
    return dataclasses.asdict(obj)


def _copy_tree(src: Any, dst: Path) -> None:
    """Copy the resource directory ``src`` (an ``importlib.resources`` Traversable) to ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.is_dir():
            _copy_tree(child, dst / child.name)
        else:
            (dst / child.name).write_bytes(child.read_bytes())


@functools.lru_cache(maxsize=1)
def conf_dir() -> Path:
    """The directory of the shipped configurations, ``avsr/conf``, as a file-system path.

    Read with :mod:`importlib.resources`. When the package is installed as files (a wheel, an editable
    install, the checkout) this is the package's own directory; when it is imported from a zip archive, the
    tree is copied once into a temporary directory (removed at exit), so that relative references between
    configurations (a training YAML's ``model_config: ../model/x.yaml``) keep working.
    """
    root = importlib.resources.files("avsr") / "conf"
    if isinstance(root, Path):
        return root
    tmp = Path(tempfile.mkdtemp(prefix="avsr-conf-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    _copy_tree(root, tmp / "conf")
    return tmp / "conf"


def _kinds(kind: str | Sequence[str]) -> tuple[str, ...]:
    """``kind`` as a tuple of known kinds; ConfigError for an unknown one."""
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    for k in kinds:
        if k not in CONFIG_KINDS:
            raise ConfigError(f"unknown config kind {k!r}; the kinds are {', '.join(CONFIG_KINDS)}")
    return kinds


def shipped_configs(kind: str | Sequence[str]) -> list[str]:
    """The names of the shipped configurations of ``kind`` (one kind or several), sorted.

    A name is the file name without ``.yaml`` of ``avsr/conf/<kind>/<name>.yaml``, e.g.
    ``shipped_configs("decode") == ["avhubert_s2s", "default"]``.

    Raises:
        ConfigError: ``kind`` is not one of :data:`CONFIG_KINDS`.
    """
    names = set()
    for k in _kinds(kind):
        folder = conf_dir() / k
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.yaml"))
    return sorted(names)


def shipped_config(name: str, kind: str | Sequence[str]) -> Path:
    """The file of the shipped configuration ``name`` of ``kind`` (one kind or several, searched in order),
    whatever lies in the working directory.

    Raises:
        ConfigError: no shipped configuration of that kind has this name (the message lists the shipped
            names of the kind), the name is found under two of the kinds, or ``kind`` is unknown.
    """
    kinds = _kinds(kind)
    found = [conf_dir() / k / f"{name}.yaml" for k in kinds]
    found = [p for p in found if p.is_file()]
    label = "/".join(kinds)
    if not found:
        raise ConfigError(
            f"no shipped {label} config named {name!r}; the shipped {label} configs are: "
            f"{', '.join(shipped_configs(kinds)) or 'none'}"
        )
    if len(found) > 1:
        listed = ", ".join(map(str, found))
        raise ConfigError(f"{name!r} names several shipped configs ({listed}): give a path")
    return found[0]


def config_path(name_or_path: str | os.PathLike, kind: str | Sequence[str]) -> Path:
    """Resolve a configuration given as a path or as the name of a shipped configuration.

    ``name_or_path`` is taken as a path when that file exists; otherwise, when it is a bare name (no
    directory part and no ``.yaml``/``.yml`` suffix, e.g. ``"avhubert_base"``, ``Path("default")`` as
    argparse's ``type=Path`` gives it), as the name of a shipped configuration of ``kind``
    (``avsr/conf/<kind>/<name>.yaml``, read with :mod:`importlib.resources`; see :func:`shipped_config`).
    A name and an existing file that collide (a file called ``default`` in the working directory): the
    path wins; :func:`shipped_config` always takes the shipped one.

    Args:
        name_or_path: a YAML file, or the name of a shipped configuration.
        kind: ``"model"``, ``"decode"``, ``"train"``, ``"pretrain"`` or ``"finetune"``, or a sequence of them
            (searched in order; :data:`TRAIN_KINDS` for a training configuration).

    Returns:
        The file (for a name: inside the installed package).

    Raises:
        ConfigError: a path that does not exist; a name that no shipped configuration of ``kind`` has (the
            message lists the shipped names of the kind); an unknown kind.
    """
    _kinds(kind)
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = os.fspath(name_or_path)
    is_name = bool(text) and path.name == text and path.suffix.lower() not in (".yaml", ".yml")
    if not is_name:
        raise ConfigError(f"config file not found: {path}")
    try:
        return shipped_config(text, kind)
    except ConfigError as e:
        raise ConfigError(f"{text!r} is not a config file, and {e}") from None
