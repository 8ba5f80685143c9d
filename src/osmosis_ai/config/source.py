"""Reading a config file: its TOML, the ``--set`` flags over it, and errors at the line (or
the flag) that set a key."""

from __future__ import annotations

import copy
import difflib
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from osmosis_ai.config.lines import key_lines
from osmosis_ai.errors import ConfigError

__all__ = [
    "Bound",
    "ConfigSource",
    "TOMLTable",
    "apply_overrides",
    "did_you_mean",
    "kind_of",
    "read_config",
    "read_toml",
    "workspace_of",
]

#: A TOML table as ``tomllib`` returns it (values may also be dates and times).
TOMLTable = dict[str, Any]

#: Which numbers a numeric key accepts: above 0, 0 and above (0 usually meaning "off"), any.
Bound = Literal["positive", "non-negative", "any"]

_TOML_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    list: "an array",
    dict: "a table",
}


def read_toml(path: Path, kind: str) -> tuple[str, TOMLTable]:
    """The text and parsed tables of ``path``; ``kind`` ("eval config"...) names it in errors.

    Raises:
        ConfigError: Missing, unreadable, not UTF-8, or not valid TOML.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{kind} {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"{kind} {path} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{kind} {path} is not UTF-8 text (bad byte at offset {exc.start})"
        ) from exc
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def workspace_of(path: Path) -> Path:
    """The directory holding the nearest ``configs/`` ancestor of ``path``, else its own."""
    for parent in path.parents:
        if parent.name == "configs":
            return parent.parent
    return path.parent


def apply_overrides(
    data: TOMLTable, overrides: Sequence[str]
) -> tuple[TOMLTable, dict[tuple[str, ...], str]]:
    """``data`` with each ``section.key=value`` of ``overrides`` set (pure), and the flag
    that set each key path.

    The value is read as a TOML value (``3``, ``1e-5``, ``true``, ``"text"``, ``["a"]``); one
    that is not TOML is taken as a string (``--set experiment.model=embedded``). Validation
    happens afterwards, exactly as for the file.

    Raises:
        ConfigError: An override without ``=`` or without a dotted key, or one that would
            replace a table with a value (or a value with a table).
    """
    merged = copy.deepcopy(data)
    flags: dict[tuple[str, ...], str] = {}
    for override in overrides:
        flag = f"--set {override}"
        name, equals, text = override.partition("=")
        path = tuple(part.strip() for part in name.split("."))
        if not equals or len(path) < 2 or not all(path):
            raise ConfigError(
                f"{flag}: write --set section.key=value (for example --set training.steps=3)"
            )
        try:
            value = tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError:
            value = text
        table = merged
        for depth, part in enumerate(path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{flag}: {'.'.join(path[: depth + 1])} is not a table")
        if isinstance(table.get(path[-1]), dict):
            raise ConfigError(f"{flag}: {name.strip()} is a table; set one of its keys")
        table[path[-1]] = value
        flags[path] = flag
    return merged, flags


def read_config(
    path: Path, kind: str, overrides: Sequence[str] = ()
) -> tuple[TOMLTable, ConfigSource]:
    """The tables of the TOML file ``path`` with ``overrides`` applied, and the source that
    places an error at its line, or at the ``--set`` flag that gave the value.

    Raises:
        ConfigError: See `read_toml` and `apply_overrides`.
    """
    text, data = read_toml(path, kind)
    data, flags = apply_overrides(data, overrides)
    return data, ConfigSource(path, key_lines(text), flags)


def did_you_mean(
    name: str, allowed: Sequence[str], aliases: Mapping[str, str] | None = None
) -> str | None:
    """The one of ``allowed`` that ``name`` most likely meant, or ``None``: an alias's key, a
    near spelling (``learning_rte``), or the initials of its words (``lr``)."""
    folded = name.strip().lower().replace("-", "_")
    if aliases and folded in aliases:
        return aliases[folded]
    close = difflib.get_close_matches(folded, allowed, n=1, cutoff=0.75)
    if close:
        return close[0]
    initials = [key for key in allowed if "_" in key and folded == _initials(key)]
    return initials[0] if len(initials) == 1 else None


def _initials(key: str) -> str:
    return "".join(word[0] for word in key.split("_") if word)


class ConfigSource:
    """The file being validated, where each key appears in it, and the ``--set`` flags that
    override some."""

    def __init__(
        self,
        path: Path,
        lines: dict[tuple[str, ...], int],
        flags: dict[tuple[str, ...], str] | None = None,
    ) -> None:
        self.path = path
        self.lines = lines
        self.flags = flags or {}

    def error(self, key: tuple[str, ...], message: str) -> ConfigError:
        """``message`` placed at the flag or line of ``key`` (its parts may be dotted: a
        subsection's name, ``"algorithm.overlong"``)."""
        where = self.where(key)
        return ConfigError(
            f"{self.path}, {where}: {message}" if where else f"{self.path}: {message}"
        )

    def where(self, key: tuple[str, ...]) -> str:
        """``line 12`` or ``--set training.steps=3``: what set ``key``, or its nearest
        enclosing table that has a line ("" when none has)."""
        key = tuple(part for name in key for part in name.split("."))
        flag = self.flags.get(key)
        if flag is not None:
            return flag
        # tomllib keeps no positions: fall back to the nearest enclosing table that has one.
        for end in range(len(key), 0, -1):
            line = self.lines.get(key[:end])
            if line is not None:
                return f"line {line}"
            flag = next((f for k, f in self.flags.items() if k[:end] == key[:end]), None)
            if flag is not None:  # a table only overrides made
                return flag
        return ""

    def flag_replaces(
        self, table: TOMLTable, section: str, keys: tuple[str, str]
    ) -> tuple[TOMLTable, str | None]:
        """``table`` without the file's key of the exclusive pair ``keys`` when a ``--set``
        flag gave the other one (a flag exists to leave the file alone, so it wins), and the
        line that says so; ``table`` as it is when both or neither came from flags."""
        if not all(key in table for key in keys):
            return table, None
        flagged = [key for key in keys if (section, key) in self.flags]
        if len(flagged) != 1:
            return table, None
        (kept,) = flagged
        dropped = next(key for key in keys if key != kept)
        note = (
            f"{self.flags[(section, kept)]} replaces the file's {section}.{dropped} = "
            f"{table[dropped]!r}"
        )
        return {key: value for key, value in table.items() if key != dropped}, note

    def sections(self, data: TOMLTable, names: tuple[str, ...], kind: str) -> dict[str, TOMLTable]:
        """The tables ``names`` of ``data`` (empty when absent), after refusing anything else
        at the top of a ``kind`` file."""
        for name in data:
            if name not in names:
                what = f"section [{name}]" if isinstance(data[name], dict) else f"key {name!r}"
                guess = did_you_mean(name, names)
                hint = f"did you mean [{guess}]? " if guess else ""
                raise self.error(
                    (name,),
                    f"unknown {what}; {hint}{kind} has only the sections "
                    + ", ".join(f"[{s}]" for s in names),
                )
        return {name: self.table(data, name) for name in names}

    def table(self, data: TOMLTable, name: str) -> TOMLTable:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise self.error((name,), f"[{name}] must be a table, got {kind_of(value)}")
        return value

    def reject_unknown(
        self,
        table: TOMLTable,
        section: str,
        allowed: tuple[str, ...],
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        """Refuse a key not in ``allowed``, naming the one meant when a near miss or one of
        ``aliases`` (other trainers' names for a key) says which."""
        for key in table:
            if key not in allowed:
                guess = did_you_mean(key, allowed, aliases)
                hint = f"did you mean '{section}.{guess}'? " if guess else ""
                raise self.error(
                    (section, key),
                    f"unknown key '{section}.{key}'; {hint}[{section}] accepts "
                    + ", ".join(allowed),
                )

    def string(self, table: TOMLTable, section: str, key: str) -> str:
        value = table[key]
        if not isinstance(value, str):
            raise self.type_error(section, key, value, "a string")
        if not value.strip():
            raise self.error((section, key), f"{section}.{key} must not be empty")
        return value

    def boolean(self, table: TOMLTable, section: str, key: str) -> bool:
        value = table[key]
        if not isinstance(value, bool):
            raise self.type_error(section, key, value, "true or false")
        return value

    def integer(self, table: TOMLTable, section: str, key: str, bound: Bound) -> int:
        value = table[key]
        # bool is an int subclass in Python, but `true` is no count in TOML.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.type_error(section, key, value, "an integer")
        self._check_bound(section, key, value, bound)
        return value

    def number(self, table: TOMLTable, section: str, key: str, bound: Bound) -> float:
        value = table[key]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.type_error(section, key, value, "a number")
        if not math.isfinite(value):
            raise self.error((section, key), f"{section}.{key} must be finite, got {value}")
        self._check_bound(section, key, value, bound)
        return float(value)

    def choice(self, table: TOMLTable, section: str, key: str, choices: tuple[str, ...]) -> str:
        value = self.string(table, section, key)
        if value not in choices:
            raise self.error(
                (section, key),
                f"{section}.{key} must be one of {', '.join(choices)}, got {value!r}",
            )
        return value

    def _check_bound(self, section: str, key: str, value: float, bound: Bound) -> None:
        if bound == "positive" and value <= 0:
            raise self.error((section, key), f"{section}.{key} must be positive, got {value}")
        if bound == "non-negative" and value < 0:
            raise self.error((section, key), f"{section}.{key} must not be negative, got {value}")

    def type_error(self, section: str, key: str, value: object, expected: str) -> ConfigError:
        return self.error(
            (section, key), f"{section}.{key} must be {expected}, got {kind_of(value)}"
        )


def kind_of(value: object) -> str:
    """How a TOML value's type reads in an error ("an integer")."""
    for python_type, name in _TOML_TYPES.items():
        if type(value) is python_type:
            return name
    return f"a {type(value).__name__}"
