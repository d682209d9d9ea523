"""Loading and checking config dataclasses: YAML -> keys, types, ranges -> a frozen dataclass.

A YAML file holds exactly the field names of its dataclass: unknown keys, wrong types, NaN or
infinite floats and out-of-range values are rejected with the key, the value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from fid.errors import ConfigError  # noqa: F401  (fid.config's error, defined with the others)
from fid.text_files import read_text


def check_finite(name: str, value: Any):
    """Raises ConfigError for NaN and +-inf: NaN passes every comparison (`nan < 0` is False)
    and inf passes a lower bound, so range checks alone let YAML's .nan/.inf reach torch."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} = {value!r} is not a finite number: expected a real value")


def check_range(name: str, value: Any, *, low=None, high=None, allow_none=False, what=None):
    """Raises ConfigError unless low <= value <= high (either bound optional)."""
    if value is None and allow_none:
        return
    check_finite(name, value)
    if (low is not None and value < low) or (high is not None and value > high):
        if what is None:
            bounds = []
            if low is not None:
                bounds.append(f">= {low}")
            if high is not None:
                bounds.append(f"<= {high}")
            what = " and ".join(bounds)
        raise ConfigError(f"{name} = {value!r} is out of range: expected {what}")


T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits a field's type (ints are accepted where floats are)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    raise TypeError(f"unsupported config field type {tp!r}")


def config_from_dict(data: dict[str, Any], cls: type[T], source: str = "config") -> T:
    """Builds a config dataclass from a mapping, checking keys, types and ranges.

    Raises:
        ConfigError: naming `source`, the key, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping of keys to values, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    renamed = getattr(cls, "renamed_keys", {})
    for key, value in data.items():
        if key not in fields and key in renamed:
            raise ConfigError(
                f"{source}: {key!r} was renamed: use {renamed[key]!r} (same meaning) in "
                f"{cls.__name__}"
            )
        if key not in fields:
            raise ConfigError(
                f"{source}: unknown key {key!r} for {cls.__name__}. "
                f"Allowed keys: {', '.join(sorted(fields))}"
            )
        if not _matches(value, hints[key]):
            raise ConfigError(
                f"{source}: {key} = {value!r} has the wrong type: expected {_type_name(hints[key])}"
            )
        if hints[key] is float and isinstance(value, int):
            data = {**data, key: float(value)}
    try:
        for key, value in data.items():  # every float knob, range-checked or not
            check_finite(key, value)
        return cls(**data)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def load_config(path: str | Path | None, cls: type[T]) -> T:
    """Loads a YAML file into `cls`; None (no file) gives the defaults.

    Raises:
        ConfigError: for a missing file, one that is not UTF-8 (naming line and byte offset),
            invalid YAML, or a bad key or value.
    """
    if path is None:
        return cls()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = read_text(path, "a YAML file of knobs", kind=ConfigError)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    return config_from_dict(data, cls, source=str(path))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The plain-types dict of a config (for checkpoints and provenance records)."""
    return dataclasses.asdict(config)
