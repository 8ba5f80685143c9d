"""The training TOML (``configs/training/<name>.toml``): ``[experiment]`` and ``[training]``.

``[experiment]``, ``[env]`` and ``[secrets]`` are read by the validators the eval config uses;
``[training]`` is checked here with the same line-numbered errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from osmosis_ai.eval._config_sections import (
    ConfigSource,
    TOMLTable,
    dataset_path,
    env_table,
    provenance,
    read_toml,
    rollout_location,
    secret_names,
    workspace_of,
)
from osmosis_ai.eval._toml_lines import key_lines

__all__ = ["TrainConfig", "TrainingConfig", "load_train_config"]

_SECTIONS = ("experiment", "training", "env", "secrets")
_EXPERIMENT_REQUIRED = ("rollout", "entrypoint", "model", "dataset")
_EXPERIMENT_KEYS = (*_EXPERIMENT_REQUIRED, "branch", "commit_sha")
_INTEGERS = (
    "steps",
    "prompts_per_step",
    "group_size",
    "eval_every",
    "checkpoint_every",
    "seed",
    "max_tokens",
    "token_budget",
    "resample_zero_gradient",
)
#: Integers where 0 means "off" (the rest must be positive).
_ZERO_OK = ("eval_every", "seed", "resample_zero_gradient")
_NUMBERS = (
    "learning_rate",
    "clip_low",
    "clip_high",
    "kl_beta",
    "temperature",
    "eval_temperature",
    "pass_threshold",
    "max_minutes",
)
_CHOICES = {
    "normalisation": ("token", "sequence"),
    "advantage_scale": ("std", "none"),
    "precision": ("auto", "bf16", "fp32"),
}
_TRAINING_KEYS = (*_INTEGERS, *_NUMBERS, *_CHOICES, "eval_rows")


@dataclass(frozen=True)
class TrainingConfig:
    """The ``[training]`` section."""

    steps: int = 10
    prompts_per_step: int = 4
    """Dataset rows per step (picked with ``seed``)."""
    group_size: int = 4
    """Rollouts per row; advantages are normalised within this group."""
    learning_rate: float = 1e-5
    clip_low: float = 0.2
    clip_high: float = 0.28
    normalisation: Literal["token", "sequence"] = "token"
    advantage_scale: Literal["std", "none"] = "std"
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """The update's forward pass: under bf16 autocast, in fp32, or bf16 where the CPU
    computes it natively (AVX512-BF16 or AMX); logprobs are taken in fp32 either way."""
    kl_beta: float = 0.0
    eval_every: int = 0
    """Held-out eval every this many steps (0: only at start and end)."""
    checkpoint_every: int = 1
    eval_rows: float = 0.2
    """Held-out split: a row count (>= 1) or a fraction of the dataset (< 1)."""
    seed: int = 0
    max_minutes: float = 0.0
    """Stop once the steps have taken this long (0: no limit); evaluations and checkpoints
    are not counted. The run ends as after its last step: checkpoint, held-out evaluation."""
    max_tokens: int = 256
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (imposed by the gateway)."""
    eval_temperature: float = 0.0
    """Sampling temperature of the held-out evaluation (0: greedy)."""
    pass_threshold: float = 1.0
    token_budget: int = 2048
    """Tokens per micro-batch (forward+backward); lower it when memory runs out."""
    resample_zero_gradient: int = 0
    """Dynamic sampling: run a group whose rewards are all equal again, up to this many times
    within the step (0: leave it out of the update)."""


@dataclass(frozen=True)
class TrainConfig:
    """A validated training config file."""

    path: Path
    workspace: Path
    rollout: str
    entrypoint: str
    model: str
    """``embedded`` or a local HuggingFace-format directory."""
    dataset: Path
    training: TrainingConfig
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()

    @property
    def rollout_dir(self) -> Path:
        """The rollout's directory, ``<workspace>/rollouts/<rollout>``."""
        return self.workspace / "rollouts" / self.rollout


def load_train_config(path: Path) -> TrainConfig:
    """Read and validate a training TOML file.

    Raises:
        ConfigError: Unreadable or invalid TOML, or an unknown, missing or out-of-range
            section or key; the message names the file, the line and the key.
    """
    path = Path(os.path.abspath(path))
    text, data = read_toml(path, "training config")
    src = ConfigSource(path, key_lines(text))
    for name in data:
        if name not in _SECTIONS:
            raise src.error(
                (name,),
                f"unknown section or key {name!r}; a training config has only the sections "
                + ", ".join(f"[{s}]" for s in _SECTIONS),
            )
    tables = {name: src.table(data, name) for name in _SECTIONS}
    experiment = tables["experiment"]
    src.reject_unknown(experiment, "experiment", _EXPERIMENT_KEYS)
    for key in _EXPERIMENT_REQUIRED:
        if key not in experiment:
            raise src.error(("experiment",), f"experiment.{key} is required in [experiment]")
    workspace = workspace_of(path)
    rollout, entrypoint = rollout_location(src, experiment, workspace)
    provenance(src, experiment)
    env = env_table(src, tables["env"])
    return TrainConfig(
        path=path,
        workspace=workspace,
        rollout=rollout,
        entrypoint=entrypoint,
        model=_model(src, experiment, workspace),
        dataset=dataset_path(src, experiment, workspace),
        training=_training(src, tables["training"]),
        env=env,
        secrets=secret_names(src, tables["secrets"], env),
    )


def _model(src: ConfigSource, table: TOMLTable, workspace: Path) -> str:
    model = src.string(table, "experiment", "model")
    if model == "embedded":
        return model
    directory = Path(os.path.normpath(workspace / Path(model).expanduser()))
    if not directory.is_dir():
        raise src.error(
            ("experiment", "model"),
            f'experiment.model {model!r}: there is no directory {directory}; use "embedded" '
            "or a local HuggingFace-format model directory",
        )
    return str(directory)


def _training(src: ConfigSource, table: TOMLTable) -> TrainingConfig:
    src.reject_unknown(table, "training", _TRAINING_KEYS)
    values: dict[str, object] = {}
    for key in table:
        if key in _INTEGERS:
            zero_ok = key in _ZERO_OK
            values[key] = src.integer(table, "training", key, positive=not zero_ok)
            if zero_ok and int(table[key]) < 0:
                raise src.error(("training", key), f"training.{key} must not be negative")
        elif key in _NUMBERS:
            zero_ok = key in (
                "kl_beta",
                "temperature",
                "eval_temperature",
                "clip_low",
                "clip_high",
                "max_minutes",
            )
            values[key] = src.number(table, "training", key, positive=not zero_ok)
            if zero_ok and float(table[key]) < 0:
                raise src.error(("training", key), f"training.{key} must not be negative")
        elif key == "eval_rows":
            values[key] = src.number(table, "training", key, positive=True)
        else:
            values[key] = _choice(src, table, key)
    return TrainingConfig(**values)  # type: ignore[arg-type]


def _choice(src: ConfigSource, table: TOMLTable, key: str) -> str:
    allowed = _CHOICES[key]
    value = src.string(table, "training", key)
    if value not in allowed:
        raise src.error(
            ("training", key),
            f"training.{key} must be one of {', '.join(allowed)}, got {value!r}",
        )
    return value
