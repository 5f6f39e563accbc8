"""YAML configuration files mapped onto typed dataclasses.

Every configurable part of avsr is a dataclass whose field names are the hyper-parameter names of
AV-HuBERT/fairseq (``encoder_embed_dim``, ``feature_grad_mult``, ...), a subclass of :class:`Config`. The
field definitions hold everything that is checked: the type annotation and, through :func:`option` (or
:func:`probability`), the range or the accepted values (``lr: float = option(1e-3, gt=0)``); a class adds
rules between its fields in :meth:`Config.check`. The checks run at every construction, from Python or from
YAML. A YAML file is read with :func:`load_yaml` and a mapping is turned into a dataclass with
:func:`from_dict`, which

* refuses unknown (misspelt) keys, naming the key, the dataclass and the file it came from;
* checks every value against the field's declared type: ``int`` (an integral float such as ``1e4`` is taken
  as its integer), ``float`` (an integer is taken as a float), ``bool`` (``true``/``false`` only), ``str``,
  ``list[X]`` / ``tuple[X, ...]``, ``X | None`` and nested dataclasses; a string where a number or a
  boolean is declared, or a list where a scalar is, is a :class:`ConfigError` naming the key, the value, the
  expected type and the file;
* checks the field's rule (probabilities in [0, 1], positive sizes and learning rates, non-empty SNR
  lists, one of a set of names).

The configuration of a whole model -- encoder, decoder, loss and decoding defaults -- is one tree,
:class:`avsr.models.config.ModelConfig`, and a training YAML is that tree with the training loop's
settings, :class:`avsr.train.config.ExperimentConfig`.

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
import inspect
import logging
import math
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
logger = logging.getLogger(__name__)

#: the kinds of shipped configuration: the sub-directories of ``avsr/conf``.
CONFIG_KINDS = ("model", "decode", "train", "pretrain", "finetune")
#: the kinds a training configuration (``avsr-train --config``) can be.
TRAIN_KINDS = ("train", "pretrain", "finetune")


_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _DuplicateKey(yaml.YAMLError):
    """A mapping key given twice (:class:`_Loader`)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's booleans and floats, refusing a key given twice in
    one mapping (PyYAML keeps the last silently; YAML 1.2 requires unique keys)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise _DuplicateKey(f"key '{key}' given twice (lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


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
        ConfigError: not valid YAML, or a key given twice in one mapping (names ``where`` and the lines).
    """
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects
    except _DuplicateKey as e:
        raise ConfigError(f"{where}: {e}") from e
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

    The checks are the field definitions' own (:class:`Config`): each value is checked against the field's
    declared type and its :func:`option` rule, nested dataclass fields are built recursively from nested
    mappings, and values are converted where the module docstring says (integral floats to ``int``, integers
    to ``float``, lists to tuples for tuple fields); then the class's rules between fields
    (:meth:`Config.check`) run.

    Args:
        cls: a dataclass type (a :class:`Config` subclass for the checks; another dataclass is checked by
            :func:`check_fields` after it is built).
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
    check_keys(mapping, {f.name for f in dataclasses.fields(cls)}, where)
    try:  # the mapping against the constructor: a required key missing, a field that is not an argument
        inspect.signature(cls).bind(**mapping)
    except TypeError as e:
        raise ConfigError(f"{where}: {cls.__name__}: {e}") from e
    try:  # a TypeError raised while the object is built and checked is a bug, not a configuration error
        obj = cls(**mapping)
        if not isinstance(obj, Config):
            check_fields(obj)
        return obj
    except ValueError as e:  # ConfigError is a ValueError
        raise ConfigError(f"{where}: {e}") from e


@dataclasses.dataclass(frozen=True)
class Rule:
    """The values a configuration field accepts beyond its type (see :func:`option`).

    Attributes:
        ge, gt, le, lt: bounds of a number (of each number of a list).
        choices: the accepted values (strings of a fixed set).
        non_empty: a list must not be empty.
        finite: a number must be finite (no ``.inf``/``.nan``).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    non_empty: bool = False
    finite: bool = False

    def describe(self) -> str:
        """What the rule expects, as the error messages say it (``a probability in [0, 1]``)."""
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.non_empty:
            return "a non-empty list"
        low = high = None
        if self.ge is not None or self.gt is not None:
            low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}"
        if self.le is not None or self.lt is not None:
            high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})"
        finite = "a finite number" if self.finite else "a number"
        if low == "[0" and high == "1]":
            return "a probability in [0, 1]"
        if low and high:
            return f"{finite} in {low}, {high}"
        if low:
            return f"{finite} {'>=' if low[0] == '[' else '>'} {low[1:]}"
        if high:
            return f"{finite} {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
        return finite

    def allows(self, value: Any) -> bool:
        """Whether ``value`` (already of the field's type) keeps the rule; of a list, ``non_empty`` sees the
        whole list and the other bounds each element."""
        if self.choices is not None and not isinstance(value, (list, tuple)):
            return value in self.choices
        if isinstance(value, (list, tuple)):
            if self.non_empty and not value:
                return False
            return all(self.allows(v) for v in value)
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return True
        return not ((self.ge is not None and not value >= self.ge)
                    or (self.gt is not None and not value > self.gt)
                    or (self.le is not None and not value <= self.le)
                    or (self.lt is not None and not value < self.lt)
                    or (self.finite and not math.isfinite(value)))


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def option(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None,
           ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
           choices: Sequence | None = None, non_empty: bool = False, finite: bool = False) -> Any:
    """A configuration field with its rule: ``lr: float = option(1e-3, gt=0)``.

    Args:
        default: the default value (or ``factory``: a function that makes it, for lists).
        ge, gt, le, lt: bounds of a number (each number of a list).
        choices: the accepted values.
        non_empty: a list that must not be empty.
        finite: no ``.inf``/``.nan``.

    Returns:
        a :func:`dataclasses.field` whose metadata holds the :class:`Rule` (``metadata["rule"]``), checked by
        :class:`Config` (every construction) and so by :func:`from_dict` (every YAML file).
    """
    rule = Rule(ge, gt, le, lt, tuple(choices) if choices is not None else None, non_empty, finite)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"rule": rule})
    return dataclasses.field(default=default, metadata={"rule": rule})


def probability(default: float | None) -> Any:
    """A field holding a probability in [0, 1] (``dropout: float = probability(0.1)``), see :func:`option`."""
    return option(default, ge=0.0, le=1.0)


class Config:
    """Base of avsr's configuration dataclasses: the field definitions hold the types and ranges.

    Every construction -- from Python (``TrainConfig(lr=...)``) or from YAML (:func:`from_dict`) -- checks
    each field against its annotation and its :func:`option` rule (:func:`check_fields`: values converted
    as the module docstring says, nested dataclasses built from mappings), then the rules between fields
    (:meth:`check`). Errors are :class:`ConfigError` naming the key; :func:`from_dict` adds the file.
    """

    def __post_init__(self) -> None:
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Rules between fields (a subclass's); raise :class:`ConfigError` naming the keys."""


def check_fields(obj: Any) -> None:
    """Check (and convert in place) every field of the dataclass instance ``obj`` against its annotation and
    :class:`Rule`.

    Raises:
        ConfigError: ``<key>: expected <type or range>, got <value>``.
    """
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = check_value(getattr(obj, f.name), hints.get(f.name, Any), f.name, f.metadata.get("rule"))
        object.__setattr__(obj, f.name, value)  # as converted (frozen dataclasses too)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls``; those of a class naming a type that cannot be found (a
    ``NameError``: e.g. one imported only for type checkers) are not checked, which is logged once per class.
    Any other failure (a malformed annotation) is raised."""
    try:
        return typing.get_type_hints(cls)
    except NameError as e:
        logger.warning("%s.%s: an annotation cannot be resolved (%s); its fields' types are not checked",
                       cls.__module__, cls.__qualname__, e)
        return {}


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(tp, str(tp).replace("typing.", ""))


def check_value(value: Any, tp: Any, key: str, rule: Rule | None = None) -> Any:
    """``value`` checked against the type annotation ``tp`` and the field's ``rule``.

    Returns:
        the value, converted as the module docstring says.

    Raises:
        ConfigError: naming ``key``, the value and the expected type or range.
    """
    value = _check_type(value, tp, key)
    if rule is not None and value is not None and not rule.allows(value):
        raise ConfigError(f"{key}: expected {rule.describe()}, got {value!r}")
    return value


def _bad(value: Any, tp: Any, key: str) -> ConfigError:
    return ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _check_type(value: Any, tp: Any, key: str) -> Any:
    """``value`` as the annotation ``tp`` declares it (see the module docstring), or ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        alts = [a for a in args if a is not type(None)]
        if len(alts) == 1:  # X | None: X's own message (a nested section's key, a list's element)
            return _check_type(value, alts[0], key)
        for alt in alts:
            try:
                return _check_type(value, alt, key)
            except ConfigError:
                pass
        raise _bad(value, tp, key)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, key)
        raise _bad(value, tp, key)
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
        raise _bad(value, tp, key)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _bad(value, tp, key)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values ({_type_name(tp)}), got {value!r}")
            return tuple(_check_type(v, a, key) for v, a in zip(value, args))
        items = [_check_type(v, args[0] if args else Any, key) for v in value]
        return tuple(items) if tuple in (origin, tp) else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _bad(value, tp, key)
        return value
    return value  # other annotations (objects passed from Python, e.g. a NoiseSource) are not checked here


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass instance as a plain (YAML-serialisable) dict: nested dataclasses as dicts, tuples as lists
    (YAML's safe dumper writes no tuples)."""
    return _plain(dataclasses.asdict(obj))


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


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
