"""The eval TOML (``configs/eval/<name>.toml``): loading, validation and error positions."""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval._toml_lines import key_lines
from osmosis_ai.eval.datasets import DATASET_FORMATS
from osmosis_ai.rollout.ids import is_single_path_segment

__all__ = ["EvalConfig", "EvaluationConfig", "ExperimentConfig", "load_eval_config"]

#: A TOML table as ``tomllib`` returns it (values may also be dates and times).
TOMLTable = dict[str, Any]

_SECTIONS = ("experiment", "evaluation", "env", "secrets", "advanced")
_EXPERIMENT_REQUIRED = ("rollout", "entrypoint", "model_path", "dataset")
_EXPERIMENT_KEYS = (*_EXPERIMENT_REQUIRED, "branch", "commit_sha")
_EVALUATION_KEYS = (
    "limit",
    "n",
    "batch_size",
    "pass_threshold",
    "agent_workflow_timeout_s",
    "grader_timeout_s",
)
_SECRETS_KEYS = ("required",)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_COMMIT_SHA = re.compile(r"[0-9a-fA-F]{7,40}")
_RESERVED_ENV_PREFIX = "_OSMOSIS_"

_DEFAULT_AGENT_TIMEOUT_SEC = 450.0
_DEFAULT_GRADER_TIMEOUT_SEC = 150.0

_TOML_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    list: "an array",
    dict: "a table",
}


@dataclass(frozen=True)
class ExperimentConfig:
    """The ``[experiment]`` section: what is evaluated, on which model and which data."""

    rollout: str
    """Name of the rollout directory, ``<workspace>/rollouts/<rollout>/``."""

    entrypoint: str
    """File inside the rollout directory that starts the rollout server (e.g. ``main.py``)."""

    model_path: str
    """Gateway policy spec: ``embedded``, ``openai:<base_url>[:<model>]`` or ``provider/model``."""

    dataset: Path
    """The dataset file (CSV, JSONL or Parquet), made absolute against the workspace."""

    branch: str | None = None
    """Optional branch the rollout code comes from; recorded as provenance only."""

    commit_sha: str | None = None
    """Optional commit (7-40 hex digits) the rollout code comes from; provenance only."""


@dataclass(frozen=True)
class EvaluationConfig:
    """The ``[evaluation]`` section: how many rows, attempts and how long each may take."""

    limit: int | None = None
    """First rows to evaluate; None (written as a non-positive number, or absent) means all."""

    n: int = 1
    """Attempts per row."""

    batch_size: int | None = None
    """Concurrency hint; None leaves the choice to the runner."""

    pass_threshold: float = 1.0
    """A rollout passes when its reward is at least this."""

    agent_timeout_sec: float = _DEFAULT_AGENT_TIMEOUT_SEC
    """Deadline of the agent workflow (``agent_workflow_timeout_s``)."""

    grader_timeout_sec: float = _DEFAULT_GRADER_TIMEOUT_SEC
    """Deadline of the grader (``grader_timeout_s``)."""


@dataclass(frozen=True)
class EvalConfig:
    """A validated eval config file."""

    path: Path
    """The absolute path of the TOML file."""

    workspace: Path
    """The directory holding ``configs/`` (else the TOML's own directory)."""

    experiment: ExperimentConfig
    evaluation: EvaluationConfig
    env: dict[str, str] = field(default_factory=dict)
    """Literal environment variables for the rollout server (``[env]``)."""

    secrets: tuple[str, ...] = ()
    """Names of the secrets the run needs (``[secrets] required``); values are never stored."""

    advanced: TOMLTable = field(default_factory=dict)
    """The ``[advanced]`` table, kept verbatim as provenance; ignored by local runs."""

    @property
    def rollout_dir(self) -> Path:
        """The rollout's directory, ``<workspace>/rollouts/<rollout>``."""
        return self.workspace / "rollouts" / self.experiment.rollout

    @property
    def entrypoint_path(self) -> Path:
        """The entrypoint file inside :attr:`rollout_dir`."""
        return self.rollout_dir / self.experiment.entrypoint


def load_eval_config(path: Path) -> EvalConfig:
    """Read and validate an eval TOML file.

    Relative paths inside the file (``experiment.dataset``) are resolved against the
    workspace: the directory that contains the nearest ``configs/`` ancestor of the file, or
    the file's own directory when it has none. The rollout directory and its entry point
    must exist (checked here, before a run creates anything); the dataset is not opened.

    Args:
        path: The TOML file, usually ``configs/eval/<name>.toml``.

    Returns:
        The validated config.

    Raises:
        ConfigError: The file cannot be read or is not valid TOML; or a section or key is
            unknown, missing, of the wrong type or out of range; or the rollout directory or
            entry point does not exist. The message names the file, the line and the key.
    """
    path = Path(os.path.abspath(path))
    text, data = _read_toml(path)
    src = _Source(path, key_lines(text))
    for name in data:
        if name not in _SECTIONS:
            what = f"section [{name}]" if isinstance(data[name], dict) else f"key {name!r}"
            raise src.error(
                (name,),
                f"unknown {what}; an eval config has only the sections "
                + ", ".join(f"[{s}]" for s in _SECTIONS),
            )
    tables = {name: src.table(data, name) for name in _SECTIONS}
    if "experiment" not in data:
        raise ConfigError(
            f"{path}: the [experiment] section is missing; it needs "
            + ", ".join(_EXPERIMENT_REQUIRED)
        )

    workspace = _workspace_of(path)
    env = _env(src, tables["env"])
    return EvalConfig(
        path=path,
        workspace=workspace,
        experiment=_experiment(src, tables["experiment"], workspace),
        evaluation=_evaluation(src, tables["evaluation"]),
        env=env,
        secrets=_secrets(src, tables["secrets"], env),
        advanced=tables["advanced"],
    )


def _read_toml(path: Path) -> tuple[str, TOMLTable]:
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"eval config {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"eval config {path} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"eval config {path} is not UTF-8 text (bad byte at offset {exc.start})"
        ) from exc
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def _workspace_of(path: Path) -> Path:
    for parent in path.parents:
        if parent.name == "configs":
            return parent.parent
    return path.parent


class _Source:
    """The file being validated, and where each key appears in it."""

    def __init__(self, path: Path, lines: dict[tuple[str, ...], int]) -> None:
        self.path = path
        self.lines = lines

    def error(self, key: tuple[str, ...], message: str) -> ConfigError:
        # tomllib keeps no positions: fall back to the nearest enclosing table that has one.
        for end in range(len(key), 0, -1):
            line = self.lines.get(key[:end])
            if line is not None:
                return ConfigError(f"{self.path}, line {line}: {message}")
        return ConfigError(f"{self.path}: {message}")

    def table(self, data: TOMLTable, name: str) -> TOMLTable:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise self.error((name,), f"[{name}] must be a table, got {_kind(value)}")
        return value

    def reject_unknown(self, table: TOMLTable, section: str, allowed: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                raise self.error(
                    (section, key),
                    f"unknown key '{section}.{key}'; [{section}] accepts " + ", ".join(allowed),
                )

    def string(self, table: TOMLTable, section: str, key: str) -> str:
        value = table[key]
        if not isinstance(value, str):
            raise self.type_error(section, key, value, "a string")
        if not value.strip():
            raise self.error((section, key), f"{section}.{key} must not be empty")
        return value

    def integer(self, table: TOMLTable, section: str, key: str, *, positive: bool) -> int:
        value = table[key]
        # bool is an int subclass in Python, but `true` is no count in TOML.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.type_error(section, key, value, "an integer")
        if positive and value <= 0:
            raise self.error((section, key), f"{section}.{key} must be positive, got {value}")
        return value

    def number(self, table: TOMLTable, section: str, key: str, *, positive: bool) -> float:
        value = table[key]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.type_error(section, key, value, "a number")
        if not math.isfinite(value):
            raise self.error((section, key), f"{section}.{key} must be finite, got {value}")
        if positive and value <= 0:
            raise self.error((section, key), f"{section}.{key} must be positive, got {value}")
        return float(value)

    def type_error(self, section: str, key: str, value: object, expected: str) -> ConfigError:
        return self.error((section, key), f"{section}.{key} must be {expected}, got {_kind(value)}")


def _kind(value: object) -> str:
    for python_type, name in _TOML_TYPES.items():
        if type(value) is python_type:
            return name
    return f"a {type(value).__name__}"


def _experiment(src: _Source, table: TOMLTable, workspace: Path) -> ExperimentConfig:
    src.reject_unknown(table, "experiment", _EXPERIMENT_KEYS)
    for key in _EXPERIMENT_REQUIRED:
        if key not in table:
            raise src.error(("experiment",), f"experiment.{key} is required in [experiment]")
    rollout, entrypoint = _rollout_location(src, table, workspace)
    model_path = _model_path(src, table)
    dataset = _dataset_path(src, table, workspace)
    branch, commit_sha = _provenance(src, table)
    return ExperimentConfig(
        rollout=rollout,
        entrypoint=entrypoint,
        model_path=model_path,
        dataset=dataset,
        branch=branch,
        commit_sha=commit_sha,
    )


def _rollout_location(src: _Source, table: TOMLTable, workspace: Path) -> tuple[str, str]:
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


def _model_path(src: _Source, table: TOMLTable) -> str:
    model_path = src.string(table, "experiment", "model_path")
    # Imported here: the gateway package loads its server stack, which config parsing
    # should not pay for at import time.
    from osmosis_ai.gateway.policies.spec import parse_policy_spec

    try:
        parse_policy_spec(model_path)
    except ConfigError as exc:
        raise src.error(("experiment", "model_path"), f"experiment.model_path: {exc}") from exc
    return model_path


def _dataset_path(src: _Source, table: TOMLTable, workspace: Path) -> Path:
    dataset_text = src.string(table, "experiment", "dataset")
    dataset = Path(dataset_text).expanduser()
    if dataset.suffix.lower().lstrip(".") not in DATASET_FORMATS:
        raise src.error(
            ("experiment", "dataset"),
            f"experiment.dataset {dataset_text!r} must be a local file ending in "
            + ", ".join(f".{ext}" for ext in DATASET_FORMATS),
        )
    return Path(os.path.normpath(workspace / dataset))


def _provenance(src: _Source, table: TOMLTable) -> tuple[str | None, str | None]:
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


def _evaluation(src: _Source, table: TOMLTable) -> EvaluationConfig:
    src.reject_unknown(table, "evaluation", _EVALUATION_KEYS)
    section = "evaluation"
    config = EvaluationConfig()
    limit = config.limit
    if "limit" in table:
        limit = src.integer(table, section, "limit", positive=False)
        limit = limit if limit > 0 else None
    n = src.integer(table, section, "n", positive=True) if "n" in table else config.n
    batch_size = config.batch_size
    if "batch_size" in table:
        batch_size = src.integer(table, section, "batch_size", positive=True)
    threshold = config.pass_threshold
    if "pass_threshold" in table:
        threshold = src.number(table, section, "pass_threshold", positive=False)
    agent = config.agent_timeout_sec
    if "agent_workflow_timeout_s" in table:
        agent = src.number(table, section, "agent_workflow_timeout_s", positive=True)
    grader = config.grader_timeout_sec
    if "grader_timeout_s" in table:
        grader = src.number(table, section, "grader_timeout_s", positive=True)
    return EvaluationConfig(
        limit=limit,
        n=n,
        batch_size=batch_size,
        pass_threshold=threshold,
        agent_timeout_sec=agent,
        grader_timeout_sec=grader,
    )


def _env(src: _Source, table: TOMLTable) -> dict[str, str]:
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


def _secrets(src: _Source, table: TOMLTable, env: dict[str, str]) -> tuple[str, ...]:
    src.reject_unknown(table, "secrets", _SECRETS_KEYS)
    names = table.get("required", [])
    if not isinstance(names, list):
        raise src.type_error("secrets", "required", names, "an array of strings")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise src.error(
                ("secrets", "required"),
                f"secrets.required must hold only strings, got {_kind(name)}",
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
