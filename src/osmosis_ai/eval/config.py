"""The eval TOML (``configs/eval/<name>.toml``): loading, validation and error positions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval._config_schema import EVAL_EXPERIMENT, EVALUATION, check_keys, parse_section
from osmosis_ai.eval._config_sections import (
    ConfigSource,
    TOMLTable,
    env_table,
    read_config,
    secret_names,
    shared_experiment,
    workspace_of,
)

__all__ = ["EvalConfig", "EvaluationConfig", "ExperimentConfig", "load_eval_config"]

_SECTIONS = ("experiment", "evaluation", "env", "secrets", "advanced")


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

    agent_timeout_sec: float = 450.0
    """Deadline of the agent workflow (``agent_workflow_timeout_s``)."""

    grader_timeout_sec: float = 150.0
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


def load_eval_config(path: Path, overrides: Sequence[str] = ()) -> EvalConfig:
    """Read and validate an eval TOML file.

    Relative paths inside the file (``experiment.dataset``) are resolved against the
    workspace: the directory that contains the nearest ``configs/`` ancestor of the file, or
    the file's own directory when it has none. The rollout directory and its entry point
    must exist (checked here, before a run creates anything); the dataset is not opened.

    Args:
        path: The TOML file, usually ``configs/eval/<name>.toml``.
        overrides: ``section.key=value`` settings that replace the file's (``--set``),
            validated as if the file held them; an error names the flag.

    Returns:
        The validated config.

    Raises:
        ConfigError: The file cannot be read or is not valid TOML; or a section or key is
            unknown, missing, of the wrong type or out of range; or the rollout directory or
            entry point does not exist. The message names the file, the line and the key.
    """
    path = Path(os.path.abspath(path))
    data, src = read_config(path, "eval config", overrides)
    tables = src.sections(data, _SECTIONS, "an eval config")
    if "experiment" not in data:
        raise ConfigError(
            f"{path}: the [experiment] section is missing; it needs "
            + ", ".join(EVAL_EXPERIMENT.required)
        )

    workspace = workspace_of(path)
    env = env_table(src, tables["env"])
    return EvalConfig(
        path=path,
        workspace=workspace,
        experiment=_experiment(src, tables["experiment"], workspace),
        evaluation=_evaluation(src, tables["evaluation"]),
        env=env,
        secrets=secret_names(src, tables["secrets"], env),
        advanced=tables["advanced"],
    )


def _experiment(src: ConfigSource, table: TOMLTable, workspace: Path) -> ExperimentConfig:
    check_keys(src, table, EVAL_EXPERIMENT)
    shared = shared_experiment(src, table, workspace)
    return ExperimentConfig(model_path=_model_path(src, table), **shared._asdict())


def _model_path(src: ConfigSource, table: TOMLTable) -> str:
    model_path = src.string(table, "experiment", "model_path")
    # Imported here: the gateway package loads its server stack, which config parsing
    # should not pay for at import time.
    from osmosis_ai.gateway.policies.spec import parse_policy_spec

    try:
        parse_policy_spec(model_path)
    except ConfigError as exc:
        raise src.error(("experiment", "model_path"), f"experiment.model_path: {exc}") from exc
    return model_path


def _evaluation(src: ConfigSource, table: TOMLTable) -> EvaluationConfig:
    return parse_section(src, table, EVALUATION, EvaluationConfig, {"limit": _limit})


def _limit(src: ConfigSource, table: TOMLTable) -> int | None:
    limit = src.integer(table, "evaluation", "limit", "any")
    return limit if limit > 0 else None
