"""The ``[experiment]``, ``[env]`` and ``[secrets]`` sections the eval and training configs
share, checked against the workspace with line-numbered errors."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple, Protocol

from osmosis_ai.config.schema import Setting
from osmosis_ai.config.source import ConfigSource, TOMLTable, kind_of
from osmosis_ai.environments.config import ENVIRONMENT_ROLLOUT_DIR, EnvironmentConfig
from osmosis_ai.rollout.ids import is_single_path_segment

__all__ = [
    "BRANCH",
    "COMMIT_SHA",
    "DATASET",
    "ENTRYPOINT",
    "PASS_THRESHOLD",
    "ROLLOUT",
    "RolloutSource",
    "SharedExperiment",
    "dataset_path",
    "env_table",
    "provenance",
    "rollout_location",
    "secret_names",
    "shared_experiment",
]

_SECRETS_KEYS = ("required",)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_COMMIT_SHA = re.compile(r"[0-9a-fA-F]{7,40}")
_RESERVED_ENV_PREFIX = "_OSMOSIS_"

# The keys both configs declare (each config's dataclass holds them with `declared`).
ROLLOUT = Setting(
    required=True,
    comment="the rollout's folder, rollouts/<rollout>/",
    docs="the rollout's folder, `rollouts/<rollout>/` (with an `[environment]` and no "
    "`entrypoint`, only the run's name)",
)
# Both are required unless an [environment] serves its own rollout and makes the rows.
ENTRYPOINT = Setting(
    scaffold="main.py",
    comment="the file in it that starts the rollout server",
    docs="the file inside the rollout's folder that starts its server (e.g. `main.py`); "
    "without it, an `[environment]` serves its own workflow and grader",
    docs_default="required without `[environment]`",
)
DATASET = Setting(
    comment="CSV, JSONL or Parquet, relative to the workspace",
    docs="the rows: a CSV, JSONL or Parquet file (relative to the workspace); with an "
    "`[environment]`, which makes the rows, leave it out",
    docs_default="required without `[environment]`",
)
BRANCH = Setting(
    scaffold="main",
    commented=True,
    comment="provenance: the branch the rollout code is from",
    docs="the branch the rollout code comes from; provenance, it selects nothing",
)
COMMIT_SHA = Setting(
    scaffold="0123abc",
    commented=True,
    comment="or the commit (7 to 40 hex digits), not both",
    docs="the commit the rollout code comes from (7 to 40 hex digits), instead of `branch`; "
    "provenance, it selects nothing",
)
PASS_THRESHOLD = Setting(
    bound="any",
    comment="a rollout passes when its reward is at least this",
    docs="a rollout passes when its reward is at least this",
)


class SharedExperiment(NamedTuple):
    """The ``[experiment]`` keys of both configs (all but the model), checked."""

    rollout: str
    entrypoint: str | None
    """``None``: the ``[environment]``'s own rollout (`RolloutSource`)."""
    dataset: Path
    """With an ``[environment]``, the file its rows are written to."""
    branch: str | None
    commit_sha: str | None


def shared_experiment(
    src: ConfigSource,
    table: TOMLTable,
    workspace: Path,
    environment: EnvironmentConfig | None = None,
) -> SharedExperiment:
    """``[experiment]``'s rollout location, dataset and provenance, checked (the keys of the
    table are not: the config's declaration says which it accepts); with an
    ``[environment]``, its task too, and the file of its rows as the dataset."""
    for key in ("entrypoint", "dataset"):
        if environment is None and key not in table:
            raise src.error(
                ("experiment",),
                f"experiment.{key} is required in [experiment] (or an [environment] that "
                "makes the rows and serves its own rollout: docs/environments.md)",
            )
    if environment is None:
        rollout, entrypoint = rollout_location(src, table, workspace)
        return SharedExperiment(
            rollout, entrypoint, dataset_path(src, table, workspace), *provenance(src, table)
        )
    from osmosis_ai.environments.rows import check_environment, rows_file

    if "dataset" in table:
        raise src.error(
            ("experiment", "dataset"),
            "experiment.dataset: the [environment] makes the rows; remove dataset (or the "
            "[environment])",
        )
    check_environment(src, environment)
    dataset = rows_file(workspace, environment)
    if "entrypoint" in table:
        rollout, entrypoint = rollout_location(src, table, workspace)
        return SharedExperiment(rollout, entrypoint, dataset, *provenance(src, table))
    rollout = src.string(table, "experiment", "rollout")
    _check_segment(src, "rollout", rollout, "the run's name")
    return SharedExperiment(rollout, None, dataset, *provenance(src, table))


class _Experiment(Protocol):
    @property
    def rollout(self) -> str: ...

    @property
    def entrypoint(self) -> str | None: ...


class RolloutSource:
    """Where a config's rollout server starts from (both configs have it): the workspace's
    rollout, or (no ``entrypoint``) the ``[environment]``'s own."""

    workspace: Path
    experiment: _Experiment

    @property
    def rollout_dir(self) -> Path:
        """The rollout's directory, ``<workspace>/rollouts/<rollout>`` (or the
        ``[environment]``'s own rollout's)."""
        return self.entrypoint_path.parent

    @property
    def entrypoint_path(self) -> Path:
        """The file that starts the rollout server, inside :attr:`rollout_dir`."""
        if self.experiment.entrypoint is None:
            return ENVIRONMENT_ROLLOUT_DIR / "main.py"
        return self.workspace / "rollouts" / self.experiment.rollout / self.experiment.entrypoint


def _check_segment(src: ConfigSource, key: str, value: str, hint: str) -> None:
    if not is_single_path_segment(value):
        raise src.error(
            ("experiment", key),
            f"experiment.{key} {value!r} must be a single path segment ({hint}); "
            "'..', absolute paths and '/' or '\\' are not allowed",
        )


def rollout_location(src: ConfigSource, table: TOMLTable, workspace: Path) -> tuple[str, str]:
    """``experiment.rollout`` and ``.entrypoint``, checked to exist in the workspace."""
    rollout = src.string(table, "experiment", "rollout")
    entrypoint = src.string(table, "experiment", "entrypoint")
    for key, value, hint in (
        ("rollout", rollout, "the name of a directory under rollouts/"),
        ("entrypoint", entrypoint, "a file name inside the rollout directory, e.g. main.py"),
    ):
        _check_segment(src, key, value, hint)
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
    from osmosis_ai.eval.datasets import DATASET_FORMATS  # eval imports this package

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
