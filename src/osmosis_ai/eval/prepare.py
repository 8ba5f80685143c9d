"""What an eval run reads and decides before it starts anything: `prepare_run`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

from osmosis_ai.config.judge import JudgeConfig
from osmosis_ai.environments.rows import make_rows
from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.config import EvalConfig, load_eval_config
from osmosis_ai.eval.datasets import Dataset, load_dataset
from osmosis_ai.eval.run_dir import canonical_digest, source_digest
from osmosis_ai.gateway import Judge, Policy, build_policy, displayable_policy_spec
from osmosis_ai.redact import Redactor, credential_env_values
from osmosis_ai.rollout.scrub import scrub_files
from osmosis_ai.rollout.server.app import parse_backend_spec

__all__ = [
    "EvalOptions",
    "PreparedRun",
    "RunKeys",
    "build_judge",
    "judge_keys",
    "prepare_run",
    "secret_values",
]

_ROLLOUT_PROTOCOL = "0.4"


@dataclass(frozen=True)
class EvalOptions:
    """What ``osmosis eval run`` was asked to do."""

    config_path: Path
    overrides: tuple[str, ...] = ()
    """``section.key=value`` settings that replace the file's (``--set``)."""
    name: str | None = None
    output: Path | None = None
    model: str | None = None
    """Replaces the config's ``model_path`` (``--model``)."""
    dataset_file: Path | None = None
    rows: str | None = None
    n: int | None = None
    max_in_flight: int | None = None
    fresh: bool = False
    retry_failed: bool = False
    policy_api_key: str | None = None
    upstream_timeout_sec: float | None = None
    """Bound of one call to the policy's upstream (``--upstream-timeout``); None: 600 s."""
    backend: str = "local"
    """Where the rollout server runs rollouts: ``local``, ``ray``, ``ray:ADDRESS``,
    ``process`` or ``process:sandbox``."""
    request_logs: bool = False
    """Keep the rollout server's per-request log lines in ``logs.txt`` (``--verbose``)."""


@dataclass(frozen=True, repr=False)
class RunKeys:
    """Every key this invocation knows: what it scrubs from its outputs."""

    rollout: str
    """The rollout key (the gateway's token), the only key the rollout server gets."""
    policy: tuple[str, ...]
    """The policy's credentials: withheld from the rollout server."""
    redactor: Redactor
    """Redacts both, and the ``[secrets]`` values."""

    def scrub(self, path: Path) -> list[Path]:
        """Scrub every known key from the files below ``path`` (see `scrub_files`)."""
        return scrub_files(path, self.redactor.secrets)


@dataclass(frozen=True, repr=False)
class PreparedRun:
    """A run's inputs, read and checked; nothing started yet."""

    config: EvalConfig
    dataset: Dataset
    n: int
    inputs: dict[str, Any]
    """What identifies the run (its manifest's inputs)."""
    run_name: str
    output_root: Path
    secrets: dict[str, str]
    """The ``[secrets]`` values, by name."""
    policy: Policy
    keys: RunKeys
    judge: Judge | None = None
    """The ``[judge]``'s model with its limits, served on every rollout's judge route."""

    @property
    def run_dir(self) -> Path:
        return self.output_root / self.run_name

    @property
    def model_label(self) -> str:
        """The model, shown without URL credentials."""
        return displayable_policy_spec(self.config.experiment.model_path)


def _inputs(config: EvalConfig, dataset: Dataset, n: int) -> dict[str, Any]:
    # Only a run with an [environment] has the key: the inputs (and names) of others stay.
    environment = {"environment": asdict(config.environment)} if config.environment else {}
    return {
        **environment,
        "model_path": displayable_policy_spec(config.experiment.model_path),
        "dataset": {
            "sha256": dataset.sha256,
            "selected_source_rows": dataset.selected_source_rows,
        },
        "n": n,
        "rollout": {
            "name": config.experiment.rollout,
            "entrypoint": config.experiment.entrypoint,
            "source_digest": source_digest(config.rollout_dir),
        },
        "env": dict(sorted(config.env.items())),
        "secret_names": sorted(config.secrets),
        "timeouts": {
            "agent_timeout_sec": config.evaluation.agent_timeout_sec,
            "grader_timeout_sec": config.evaluation.grader_timeout_sec,
        },
        "versions": {
            "rollout_protocol": _ROLLOUT_PROTOCOL,
            "dataset_normalization": 1,
            "state_schema": 1,
        },
    }


def secret_values(names: tuple[str, ...]) -> dict[str, str]:
    """The values of the ``[secrets]`` a run needs, from the environment."""
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"[secrets] requires {', '.join(missing)}; set them in the environment first"
        )
    return {name: os.environ[name] for name in names}


def build_judge(config: JudgeConfig | None) -> Judge | None:
    """The run's judge from its ``[judge]`` (not started; the gateway starts it).

    Raises:
        ConfigError: ``api_key_env`` names a variable that is not set, or the model cannot be
            served (a torch directory without its files...).
    """
    if config is None:
        return None
    key = None
    if config.api_key_env is not None:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise ConfigError(
                f"judge.api_key_env: {config.api_key_env} is not set in the environment; set "
                "it to the judge's key, or remove the key"
            )
    try:
        policy = build_policy(config.model, api_key=key, timeout_sec=config.timeout_s)
    except ConfigError as exc:
        raise ConfigError(f"judge.model: {exc}") from None
    return Judge(
        policy,
        label=displayable_policy_spec(config.model),
        concurrency=config.concurrency,
        timeout_sec=config.timeout_s,
        retries=config.retries,
        max_tokens=config.max_tokens,
    )


def judge_keys(judge: Judge | None, config: JudgeConfig | None) -> tuple[str, ...]:
    """The judge's credentials: withheld from the rollout server and redacted everywhere."""
    if judge is None or config is None:
        return ()
    named = os.environ.get(config.api_key_env) if config.api_key_env else None
    return tuple(key for key in (*judge.policy.secrets(), named) if key)


def _policy_credentials(policy: Policy, api_key: str | None) -> tuple[str, ...]:
    # The key from the environment counts even when the caller passed none.
    candidates = (*policy.secrets(), api_key, os.environ.get("OSMOSIS_POLICY_API_KEY"))
    return tuple(dict.fromkeys(key for key in candidates if key))


def _refuse_policy_keys(
    config: EvalConfig, secrets: Mapping[str, str], policy_keys: tuple[str, ...]
) -> None:
    """The rollout server must never get the policy's credentials, even when asked to."""
    for where, entries in (("secrets.required: ", secrets), ("env.", config.env)):
        for name, value in entries.items():
            if any(key in value for key in policy_keys):
                raise ConfigError(
                    f"{where}{name} holds the policy's key, which the rollout server never gets "
                    "(its workflow reaches the model through the gateway with its rollout key); "
                    f"remove {name} from the eval config or give the policy another key"
                )


def prepare_run(options: EvalOptions) -> PreparedRun:
    """Everything that reads files before a run (call it in a worker thread).

    Raises:
        ConfigError: Bad config, backend, dataset, rows or secrets.
    """
    parse_backend_spec(options.backend, label="--backend")
    config = load_eval_config(options.config_path, options.overrides)
    if options.model is not None:
        config = replace(config, experiment=replace(config.experiment, model_path=options.model))
    secrets = secret_values(config.secrets)
    policy = build_policy(
        config.experiment.model_path,
        api_key=options.policy_api_key,
        timeout_sec=options.upstream_timeout_sec,
    )
    judge = build_judge(config.judge)
    policy_keys = (
        *_policy_credentials(policy, options.policy_api_key),
        *judge_keys(judge, config.judge),
    )
    _refuse_policy_keys(config, secrets, policy_keys)
    rollout_key = token_urlsafe(32)
    # Credentials in the environment are the run's secrets too, passed on or not: a
    # workflow may read and write out its environment.
    credentials = credential_env_values(os.environ)
    redactor = Redactor((rollout_key, *policy_keys, *secrets.values(), *credentials))
    if config.environment is not None and options.dataset_file is None:
        make_rows(config.environment, config.experiment.dataset, config.workspace)
    dataset = load_dataset(
        options.dataset_file or config.experiment.dataset,
        rows=options.rows,
        limit=config.evaluation.limit,
    )
    n = options.n or config.evaluation.n
    inputs = _inputs(config, dataset, n)
    return PreparedRun(
        config=config,
        dataset=dataset,
        n=n,
        inputs=inputs,
        run_name=options.name or f"{options.config_path.stem}-{canonical_digest(inputs)[:8]}",
        output_root=(options.output or config.workspace / ".osmosis" / "evals").resolve(),
        secrets=secrets,
        policy=policy,
        keys=RunKeys(rollout_key, policy_keys, redactor),
        judge=judge,
    )
