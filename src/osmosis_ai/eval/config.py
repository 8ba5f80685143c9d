"""The eval TOML (``configs/eval/<name>.toml``): loading, validation and error positions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.config.experiment import (
    BRANCH,
    COMMIT_SHA,
    DATASET,
    ENTRYPOINT,
    PASS_THRESHOLD,
    ROLLOUT,
    RolloutSource,
    env_table,
    secret_names,
    shared_experiment,
)
from osmosis_ai.config.judge import JudgeConfig, parse_judge
from osmosis_ai.config.schema import check_keys, declared, parse_section, section_of, setting
from osmosis_ai.config.source import ConfigSource, TOMLTable, read_config, workspace_of
from osmosis_ai.environments.config import EnvironmentConfig, parse_environment
from osmosis_ai.errors import ConfigError

__all__ = [
    "EVALUATION",
    "EVAL_EXPERIMENT",
    "EvalConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "load_eval_config",
]

_SECTIONS = ("experiment", "environment", "evaluation", "judge", "env", "secrets", "advanced")


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """The ``[experiment]`` section: what is evaluated, on which model and which data."""

    rollout: str = declared(ROLLOUT)
    """Name of the rollout directory, ``<workspace>/rollouts/<rollout>/``."""

    entrypoint: str | None = declared(ENTRYPOINT, None)
    """File inside the rollout directory that starts the rollout server (e.g. ``main.py``);
    ``None``: the ``[environment]``'s own rollout."""

    model_path: str = setting(
        required=True,
        scaffold="embedded",
        comment="or openai:<base_url>[:<model>], or a LiteLLM id provider/model",
        docs='the policy: `"embedded"`, `"openai:<base_url>[:<model>]"`, a LiteLLM id '
        'such as `"openai/gpt-4o-mini"`, or `"torch:<checkpoint dir>"`; see '
        "[gateway](gateway.md#policies)",
    )
    """Gateway policy spec: ``embedded``, ``openai:<base_url>[:<model>]`` or ``provider/model``."""

    dataset: Path = declared(DATASET)
    """The dataset file (CSV, JSONL or Parquet), made absolute against the workspace; with an
    ``[environment]``, the file its rows are written to."""

    branch: str | None = declared(BRANCH, None)
    """Optional branch the rollout code comes from; recorded as provenance only."""

    commit_sha: str | None = declared(COMMIT_SHA, None)
    """Optional commit (7-40 hex digits) the rollout code comes from; provenance only."""


def _limit(src: ConfigSource, table: TOMLTable, section: str) -> int | None:
    limit = src.integer(table, section, "limit", "any")
    return limit if limit > 0 else None


@dataclass(frozen=True)
class EvaluationConfig:
    """The ``[evaluation]`` section: how many rows, attempts and how long each may take."""

    limit: int | None = setting(
        None,
        parse=_limit,
        scaffold=5,
        commented=True,
        comment="only the first N rows (non-positive: all)",
        docs="evaluate only the first N rows (a non-positive number: all); `--rows` overrides it",
        docs_default="all",
    )
    """First rows to evaluate; None (written as a non-positive number, or absent) means all."""

    n: int = setting(
        1, comment="runs per row (pass@k needs n >= 2)", docs="runs per row (pass@k needs n ≥ 2)"
    )
    """Attempts per row."""

    batch_size: int | None = setting(
        None,
        scaffold=4,
        commented=True,
        comment="rollouts in flight (default: the server's capacity)",
        docs="rollouts in flight; `--max-in-flight` overrides it",
        docs_default="the server's capacity, else 4",
    )
    """Concurrency hint; None leaves the choice to the runner."""

    pass_threshold: float = declared(PASS_THRESHOLD, 1.0)
    """A rollout passes when its reward is at least this."""

    agent_timeout_sec: float = setting(
        450.0,
        key="agent_workflow_timeout_s",
        scaffold=300,
        comment="seconds a rollout's agent workflow may take",
        docs="seconds the agent workflow of one rollout may take",
    )
    """Deadline of the agent workflow (``agent_workflow_timeout_s``)."""

    grader_timeout_sec: float = setting(
        150.0,
        key="grader_timeout_s",
        scaffold=30,
        comment="seconds its grader may take",
        docs="seconds the grader of one rollout may take",
    )
    """Deadline of the grader (``grader_timeout_s``)."""


EVAL_EXPERIMENT = section_of(ExperimentConfig, "experiment")
EVALUATION = section_of(EvaluationConfig, "evaluation")


@dataclass(frozen=True)
class EvalConfig(RolloutSource):
    """A validated eval config file."""

    path: Path
    """The absolute path of the TOML file."""

    workspace: Path
    """The directory holding ``configs/`` (else the TOML's own directory)."""

    experiment: ExperimentConfig
    evaluation: EvaluationConfig
    environment: EnvironmentConfig | None = None
    """The ``[environment]`` whose task makes the rows (and, with no entrypoint, grades)."""
    judge: JudgeConfig | None = None
    """The ``[judge]``: the model a ``JudgeGrader`` (and the group judge) asks."""
    env: dict[str, str] = field(default_factory=dict)
    """Literal environment variables for the rollout server (``[env]``)."""

    secrets: tuple[str, ...] = ()
    """Names of the secrets the run needs (``[secrets] required``); values are never stored."""

    advanced: TOMLTable = field(default_factory=dict)
    """The ``[advanced]`` table, kept verbatim as provenance; ignored by local runs."""


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
            + ", ".join(key.name for key in EVAL_EXPERIMENT.keys if key.setting.required)
        )

    workspace = workspace_of(path)
    env = env_table(src, tables["env"])
    environment = parse_environment(src, data, tables["environment"], workspace)
    return EvalConfig(
        path=path,
        workspace=workspace,
        experiment=_experiment(src, tables["experiment"], workspace, environment),
        evaluation=_evaluation(src, tables["evaluation"]),
        environment=environment,
        judge=parse_judge(src, data, tables["judge"]),
        env=env,
        secrets=secret_names(src, tables["secrets"], env),
        advanced=tables["advanced"],
    )


def _experiment(
    src: ConfigSource, table: TOMLTable, workspace: Path, environment: EnvironmentConfig | None
) -> ExperimentConfig:
    check_keys(src, table, EVAL_EXPERIMENT)
    shared = shared_experiment(src, table, workspace, environment)
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
    return parse_section(src, table, EVALUATION)
