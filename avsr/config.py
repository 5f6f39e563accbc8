"""YAML configuration files mapped onto dataclasses.

Every configurable part of avsr is a dataclass whose field names are the hyper-parameter names of
AV-HuBERT/fairseq (``encoder_embed_dim``, ``feature_grad_mult``, ...). A YAML file is read with
:func:`load_yaml`, and a mapping is turned into a dataclass with :func:`from_dict`, which refuses
unknown (misspelt) keys and names the key, the dataclass and the file it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


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
