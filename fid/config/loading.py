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


def _short(value: Any, limit: int = 80) -> str:
    """A value's repr for a message, cut at `limit` characters (a 20 MB list stays a line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _yaml_number_hint(value: Any, tp: Any) -> str:
    """Why a number may have arrived as a string: YAML 1.1 (PyYAML) reads `1e-4` as text (its
    floats need a dot: `1.0e-4`)."""
    floats = tp is float or (typing.get_origin(tp) in (typing.Union, types.UnionType)
                             and float in typing.get_args(tp))  # fmt: skip
    if not isinstance(value, str) or not floats:
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    return (f" (YAML reads {value} as text: its floats need a dot and a signed exponent, "
            f"write {number!r} or {number:.1e})")  # fmt: skip


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
                f"{source}: {key} = {_short(value)} has the wrong type: expected "
                f"{_type_name(hints[key])}{_yaml_number_hint(value, hints[key])}"
            )
        if hints[key] is float and isinstance(value, int):
            data = {**data, key: float(value)}
    try:
        for key, value in data.items():  # every float knob, range-checked or not
            check_finite(key, value)
        return cls(**data)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


class _DuplicateKey(Exception):
    """A mapping that names a key twice (lines 1-based)."""

    def __init__(self, key: Any, first: int, again: int):
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error: PyYAML keeps
    the last silently (YAML 1.2 says keys are unique), so a knob set twice ran the second."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are YAML's own
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first != line:
                    raise _DuplicateKey(key, first, line)
        return super().construct_mapping(node, deep)


def load_yaml(text: str, source: str) -> Any:
    """Parses YAML safely, refusing a key given twice in one mapping.

    Raises:
        ConfigError: naming `source`, the key and both lines, or YAML's own syntax error.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as duplicate:
        raise ConfigError(
            f"{source}: key {duplicate.key!r} is given twice (line {duplicate.first} and line "
            f"{duplicate.again}): expected each key once in a mapping (YAML would silently "
            "keep the last)"
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: invalid YAML: {error}") from None


def check_unique_keys(path: str | Path) -> None:
    """Refuses a YAML (or JSON) file that gives a key twice in one mapping (the workflow's
    config files, which Snakemake loads with PyYAML's last-wins rule).

    Raises:
        ConfigError: naming the file, the key and both lines.
    """
    check_config_file(Path(path))
    load_yaml(read_text(Path(path), "a YAML config file", kind=ConfigError), str(path))


# A file of knobs is a few KB; PyYAML takes ~7 GB and minutes for a 20 MB one.
MAX_CONFIG_BYTES = 1 << 20


def check_config_file(path: Path) -> None:
    """Refuses a config path that is missing, not a regular file, or far too large to be a
    file of knobs, before it is read.

    Raises:
        ConfigError: naming the path and what it is.
    """
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder: expected a YAML file of knobs")
    if not path.is_file():
        raise ConfigError(f"{path}: is not a regular file (a pipe or device?): expected a "
                          "YAML file of knobs")  # fmt: skip
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes: a file of knobs is a few KB (at most "
                          f"{MAX_CONFIG_BYTES:,} bytes read). Hint: is it the right file?")  # fmt: skip


def load_config(path: str | Path | None, cls: type[T]) -> T:
    """Loads a YAML file into `cls`; None (no file) gives the defaults.

    Raises:
        ConfigError: for a missing file, one that is not UTF-8 (naming line and byte offset),
            invalid YAML, or a bad key or value.
    """
    if path is None:
        return cls()
    path = Path(path)
    check_config_file(path)
    text = read_text(path, "a YAML file of knobs", kind=ConfigError)
    data = load_yaml(text, str(path)) or {}
    return config_from_dict(data, cls, source=str(path))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The plain-types dict of a config (for checkpoints and provenance records)."""
    return dataclasses.asdict(config)
