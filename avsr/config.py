"""YAML configuration files mapped onto dataclasses.

Every configurable part of avsr is a dataclass whose field names are the hyper-parameter names of
AV-HuBERT/fairseq (``encoder_embed_dim``, ``feature_grad_mult``, ...). A YAML file is read with
:func:`load_yaml`, and a mapping is turned into a dataclass with :func:`from_dict`, which refuses
unknown (misspelt) keys and names the key, the dataclass and the file it came from.

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
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

#: the kinds of shipped configuration: the sub-directories of ``avsr/conf``.
CONFIG_KINDS = ("model", "decode", "train", "pretrain", "finetune")
#: the kinds a training configuration (``avsr-train --config``) can be.
TRAIN_KINDS = ("train", "pretrain", "finetune")


class ConfigError(ValueError):
    """A configuration file or mapping is invalid: an unknown key, a wrong type or a missing file."""


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
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
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
    """Build the dataclass ``cls`` from ``mapping``, refusing unknown keys.

    Nested dataclass fields are built recursively from nested mappings.

    Args:
        cls: a dataclass type.
        mapping: field values; missing fields take their defaults.
        where: the origin of ``mapping`` (a file name, a key path) used in error messages.

    Raises:
        ConfigError: a key is not a field of ``cls``.
    """
    mapping = dict(mapping or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(mapping, set(fields), where)
    kwargs = {}
    for key, value in mapping.items():
        ftype = fields[key].type
        sub = _dataclass_type(cls, key, ftype)
        if sub is not None and isinstance(value, Mapping):
            value = from_dict(sub, value, f"{where}: {key}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e


def _dataclass_type(cls: type, name: str, ftype: Any) -> type | None:
    """The dataclass type of field ``name`` of ``cls`` if it is one (resolving string annotations)."""
    if isinstance(ftype, str):
        import typing

        try:
            ftype = typing.get_type_hints(cls).get(name, ftype)
        except Exception:
            return None
    return ftype if dataclasses.is_dataclass(ftype) else None


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
