"""The config pieces eval and training TOML files share: reading, error positions, sections.

``configs/eval/*.toml`` and ``configs/training/*.toml`` have the same ``[experiment]`` rollout
and dataset keys, ``[env]`` and ``[secrets]``, validated here with line-numbered errors.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval._toml_lines import key_lines
from osmosis_ai.eval.datasets import DATASET_FORMATS
from osmosis_ai.rollout.ids import is_single_path_segment

__all__ = [
    "Bound",
    "ConfigSource",
    "SharedExperiment",
    "TOMLTable",
    "apply_overrides",
    "dataset_path",
    "did_you_mean",
    "env_table",
    "kind_of",
    "provenance",
    "read_config",
    "read_toml",
    "rollout_location",
    "secret_names",
    "shared_experiment",
    "workspace_of",
]

#: A TOML table as ``tomllib`` returns it (values may also be dates and times).
TOMLTable = dict[str, Any]

#: Which numbers a numeric key accepts: above 0, 0 and above (0 usually meaning "off"), any.
Bound = Literal["positive", "non-negative", "any"]

_SECRETS_KEYS = ("required",)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_COMMIT_SHA = re.compile(r"[0-9a-fA-F]{7,40}")
_RESERVED_ENV_PREFIX = "_OSMOSIS_"

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
        flag = self.flags.get(key)
        if flag is not None:
            return ConfigError(f"{self.path}, {flag}: {message}")
        # tomllib keeps no positions: fall back to the nearest enclosing table that has one.
        for end in range(len(key), 0, -1):
            line = self.lines.get(key[:end])
            if line is not None:
                return ConfigError(f"{self.path}, line {line}: {message}")
            flag = next((f for k, f in self.flags.items() if k[:end] == key[:end]), None)
            if flag is not None:  # a table only overrides made
                return ConfigError(f"{self.path}, {flag}: {message}")
        return ConfigError(f"{self.path}: {message}")

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


class SharedExperiment(NamedTuple):
    """The ``[experiment]`` keys of both configs (all but the model), checked."""

    rollout: str
    entrypoint: str
    dataset: Path
    branch: str | None
    commit_sha: str | None


def shared_experiment(src: ConfigSource, table: TOMLTable, workspace: Path) -> SharedExperiment:
    """``[experiment]``'s rollout location, dataset and provenance, checked (the keys of the
    table are not: the config's declaration says which it accepts)."""
    rollout, entrypoint = rollout_location(src, table, workspace)
    dataset = dataset_path(src, table, workspace)
    return SharedExperiment(rollout, entrypoint, dataset, *provenance(src, table))


def rollout_location(src: ConfigSource, table: TOMLTable, workspace: Path) -> tuple[str, str]:
    """``experiment.rollout`` and ``.entrypoint``, checked to exist in the workspace."""
    rollout = src.string(table, "experiment", "rollout")
    entrypoint = src.string(table, "experiment", "entrypoint")
    for key, value, hint in (
        ("rollout", rollout, "the name of a directory under rollouts/"),
        ("entrypoint", entrypoint, "a file name inside the rollout directory, e.g. main.py"),
    ):
        if not is_single_path_segment(value):
            raise src.error(
                ("experiment", key),
                f"experiment.{key} {value!r} must be a single path segment ({hint}); "
                "'..', absolute paths and '/' or '\\' are not allowed",
            )
    rollout_dir = workspace / "rollouts" / rollout
    if not rollout_dir.is_dir():
        raise src.error(
            ("experiment", "rollout"),
            f"experiment.rollout {rollout!r}: there is no folder {rollout_dir}; fix the name "
            f"or create the rollout (osmosis rollout init {rollout})",
        )
    if not (rollout_dir / entrypoint).is_file():
        raise src.error(
            ("experiment", "entrypoint"),
            f"experiment.entrypoint {entrypoint!r}: there is no file {rollout_dir / entrypoint}; "
            "name the file that starts the rollout server",
        )
    return rollout, entrypoint


def dataset_path(
    src: ConfigSource,
    table: TOMLTable,
    workspace: Path,
    section: str = "experiment",
    key: str = "dataset",
) -> Path:
    """``experiment.dataset`` (or ``section.key``): a local file of a known format, made
    absolute against the workspace."""
    dataset_text = src.string(table, section, key)
    dataset = Path(dataset_text).expanduser()
    if dataset.suffix.lower().lstrip(".") not in DATASET_FORMATS:
        raise src.error(
            (section, key),
            f"{section}.{key} {dataset_text!r} must be a local file ending in "
            + ", ".join(f".{ext}" for ext in DATASET_FORMATS),
        )
    return Path(os.path.normpath(workspace / dataset))


def provenance(src: ConfigSource, table: TOMLTable) -> tuple[str | None, str | None]:
    """``experiment.branch`` or ``.commit_sha`` (at most one)."""
    branch = src.string(table, "experiment", "branch") if "branch" in table else None
    if "commit_sha" not in table:
        return branch, None
    commit_sha = src.string(table, "experiment", "commit_sha")
    if branch is not None:
        raise src.error(
            ("experiment", "commit_sha"),
            "experiment.branch and experiment.commit_sha are mutually exclusive; keep one",
        )
    if not _COMMIT_SHA.fullmatch(commit_sha):
        raise src.error(
            ("experiment", "commit_sha"),
            f"experiment.commit_sha {commit_sha!r} must be 7 to 40 hexadecimal digits",
        )
    return None, commit_sha


def env_table(src: ConfigSource, table: TOMLTable) -> dict[str, str]:
    """The ``[env]`` section: literal variables for the rollout server."""
    env: dict[str, str] = {}
    for name, value in table.items():
        if not _ENV_NAME.fullmatch(name):
            raise src.error(
                ("env", name),
                f"env name {name!r} must match ^[A-Z_][A-Z0-9_]*$ (upper case, digits, '_')",
            )
        if name.startswith(_RESERVED_ENV_PREFIX):
            raise src.error(
                ("env", name),
                f"env name {name!r} is reserved: names starting with {_RESERVED_ENV_PREFIX} "
                "are set by osmosis itself",
            )
        if not isinstance(value, str):
            raise src.type_error("env", name, value, 'a string (quote it: "...")')
        env[name] = value
    return env


def secret_names(src: ConfigSource, table: TOMLTable, env: dict[str, str]) -> tuple[str, ...]:
    """``[secrets] required``: the names of the secrets a run needs (never their values)."""
    src.reject_unknown(table, "secrets", _SECRETS_KEYS)
    names = table.get("required", [])
    if not isinstance(names, list):
        raise src.type_error("secrets", "required", names, "an array of strings")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise src.error(
                ("secrets", "required"),
                f"secrets.required must hold only strings, got {kind_of(name)}",
            )
        if not _SECRET_NAME.fullmatch(name):
            raise src.error(
                ("secrets", "required"),
                f"secret name {name!r} must match ^[A-Z][A-Z0-9_]*$ (upper case, digits, '_')",
            )
        if name in seen:
            raise src.error(
                ("secrets", "required"), f"secret {name!r} is listed twice in secrets.required"
            )
        if name in env:
            raise src.error(
                ("secrets", "required"),
                f"{name!r} is both a secret and an [env] variable; keep it in one place",
            )
        seen.add(name)
    return tuple(names)
