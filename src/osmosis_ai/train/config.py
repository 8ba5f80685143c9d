"""The training TOML (``configs/training/<name>.toml``), one dataclass per section.

``[experiment]`` (what is trained, on which rows), ``[training]`` (how long, how many rows),
``[sampling]`` (every training call), ``[algorithm]`` (the update: `AlgorithmConfig`, with a
named recipe), ``[learner]`` (with ``[learner.lora]``), ``[engine]`` (with
``[engine.vllm]``), ``[eval]`` (the held-out rows), ``[checkpoints]``, ``[tracking]``,
``[env]`` and ``[secrets]``. Each setting is declared once, as its field (`setting`); the
parser, the scaffold, the docs' table and the run's resolved config derive from it. A file
in the flat ``[training]`` form of before is refused with a line per key saying where it went
(`osmosis_ai.train.migration`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from osmosis_ai.config.experiment import (
    BRANCH,
    COMMIT_SHA,
    DATASET,
    ENTRYPOINT,
    PASS_THRESHOLD,
    ROLLOUT,
    RolloutSource,
    dataset_path,
    env_table,
    secret_names,
    shared_experiment,
)
from osmosis_ai.config.judge import JUDGE, JudgeConfig, parse_judge
from osmosis_ai.config.schema import (
    Section,
    check_keys,
    declared,
    parse_section,
    section_of,
    setting,
    settings_toml,
    subsection,
    toml_value,
)
from osmosis_ai.config.source import ConfigSource, TOMLTable, read_config, workspace_of
from osmosis_ai.environments.config import ENVIRONMENT, EnvironmentConfig, parse_environment
from osmosis_ai.errors import ConfigError, SettingError
from osmosis_ai.gateway.policies.tool_formats import ToolFormatSetting
from osmosis_ai.gateway.policies.torch_device import DEVICE_SETTING, Precision
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, UpdateSettings
from osmosis_ai.train.bookkeeping.trackers import TRACKERS
from osmosis_ai.train.recipes import RECIPES

__all__ = [
    "ALGORITHM",
    "TRAIN_EXPERIMENT",
    "TRAIN_SECTIONS",
    "CheckpointsConfig",
    "EngineConfig",
    "HeldOutConfig",
    "LearnerConfig",
    "LoraConfig",
    "SamplingConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainExperimentConfig",
    "TrainingConfig",
    "VllmConfig",
    "load_train_config",
    "resolved_toml",
]

#: The fewest rollouts in flight (`TrainingConfig.rollouts_in_flight`).
_MIN_IN_FLIGHT = 16
#: The attention and MLP projections of the model's blocks (peft: every linear layer but the
#: output head).
ALL_LINEAR = "all-linear"


def _device(src: ConfigSource, table: TOMLTable, section: str) -> str:
    value = src.string(table, section, "device")
    if not DEVICE_SETTING.fullmatch(value):
        raise src.error(
            (section, "device"),
            f'{section}.device must be "auto", "cpu", "cuda", "cuda:N" or "mps", got {value!r}',
        )
    return value


def _target_modules(src: ConfigSource, table: TOMLTable, section: str) -> tuple[str, ...] | str:
    value = table["target_modules"]
    if value == ALL_LINEAR:
        return ALL_LINEAR
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(name, str) and name.strip() for name in value)
    ):
        raise src.error(
            (section, "target_modules"),
            f'{section}.target_modules must be "{ALL_LINEAR}" or a non-empty list of module '
            'names such as ["q_proj", "v_proj"]',
        )
    return tuple(value)


def _report_to(src: ConfigSource, table: TOMLTable, section: str) -> tuple[str, ...]:
    value = table["report_to"]
    names = ", ".join(f'"{name}"' for name in TRACKERS)
    if not (isinstance(value, list) and all(isinstance(name, str) for name in value)):
        raise src.error(
            (section, "report_to"),
            f'{section}.report_to must be an array of tracker names, e.g. ["tensorboard"]; '
            f"the trackers are {names}",
        )
    for name in value:
        if name not in TRACKERS:
            raise src.error(
                (section, "report_to"),
                f"{section}.report_to: unknown tracker {name!r}; the trackers are {names}",
            )
    return tuple(dict.fromkeys(value))


def _url(src: ConfigSource, table: TOMLTable, section: str) -> str:
    url = src.string(table, section, "url")
    if not url.startswith(("http://", "https://")):
        raise src.error((section, "url"), f"{section}.url must be an http:// URL, got {url!r}")
    return url


def _server_args(src: ConfigSource, table: TOMLTable, section: str) -> tuple[str, ...]:
    args = table["args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise src.type_error(section, "args", args, 'an array of strings (["--enforce-eager"])')
    return tuple(args)


def _server_env(src: ConfigSource, table: TOMLTable, section: str) -> dict[str, str]:
    env = table["env"]
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise src.type_error(section, "env", env, 'a table of strings ({ NAME = "value" })')
    return dict(env)


def _model(src: ConfigSource, table: TOMLTable, section: str) -> str:
    return src.string(table, section, "model")  # a directory: checked against the workspace


@dataclass(frozen=True, kw_only=True)
class TrainExperimentConfig:
    """``[experiment]``: the rollout, the model it trains, the rows."""

    rollout: str = declared(ROLLOUT)
    entrypoint: str | None = declared(ENTRYPOINT, None)
    """``None``: the ``[environment]``'s own rollout."""
    model: str = setting(
        required=True,
        parse=_model,
        scaffold="embedded",
        comment="SmolLM2-135M-Instruct, or a local HuggingFace-format model dir",
        docs='`"embedded"` or a local HuggingFace-format directory',
    )
    """``embedded`` or a local HuggingFace-format directory (made absolute)."""
    dataset: Path = declared(DATASET)
    branch: str | None = declared(BRANCH, None)
    commit_sha: str | None = declared(COMMIT_SHA, None)


@dataclass(frozen=True)
class TrainingConfig:
    """``[training]``: how long the run is and what each step takes."""

    steps: int = setting(
        10,
        aliases=("max_steps", "num_steps", "total_training_steps"),
        scaffold=4,
        comment="optimiser steps; each runs rollouts, grades them, updates once",
        docs="optimiser steps",
    )
    prompts_per_step: int = setting(
        4,
        aliases=("batch_size", "train_batch_size", "per_device_train_batch_size"),
        scaffold=2,
        comment="dataset rows per step",
        docs="rows per step, rollouts per row",
    )
    """Dataset rows per step (picked with ``seed``)."""
    group_size: int = setting(
        4,
        aliases=("num_generations", "n_samples_per_prompt", "rollout_n", "n_samples"),
        comment="rollouts per row; each is scored against its row's others",
        joins_row=True,
    )
    """Rollouts per row; advantages are normalised within this group."""
    seed: int = setting(
        0,
        bound="non-negative",
        comment="picks the held-out rows and each step's rows",
        docs="the held-out split and each step's rows",
    )
    max_minutes: float = setting(
        0.0,
        bound="non-negative",
        comment="stop once the steps took this many minutes (0: no limit)",
        docs="stop once the steps took this long in all (0: no limit); held-out evaluations "
        "and checkpoints are not counted, and the run ends as after its last step",
    )
    max_staleness: int = setting(
        0,
        bound="non-negative",
        comment="0: synchronous; S >= 1: the next S steps' rollouts run during an update",
        docs="asynchronous training: rollouts of the next S steps keep running while a step "
        "updates, and no token a step trains on was generated by weights more than S versions "
        "older than those it updates (0: synchronous); see [asynchronous "
        "training](async.md)",
    )

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise SettingError(
                "group_size",
                f"group_size must be at least 2, got {self.group_size}: each rollout's "
                "advantage is its reward against the other rollouts of its row, so a group of "
                "one never has a gradient; use 2 or more (4 is the default)",
            )

    @property
    def rollouts_in_flight(self) -> int:
        """The most rollouts in flight at once: a step's (and under asynchronous training
        those of the next ``max_staleness`` steps), at least 16, so the engine generates
        their calls together; held-out rollouts share the bound."""
        steps = self.max_staleness + 1
        return max(_MIN_IN_FLIGHT, steps * self.prompts_per_step * self.group_size)


@dataclass(frozen=True)
class SamplingConfig:
    """``[sampling]``: imposed by the gateway on every model call of a training rollout."""

    temperature: float = setting(
        1.0,
        bound="non-negative",
        comment="sampling temperature of every training rollout's model call",
        docs="sampling temperature of every call; the learner scores tokens at the same "
        "temperature",
        formerly="training.temperature",
    )
    max_tokens: int = setting(
        256,
        aliases=(
            "max_completion_length",
            "max_new_tokens",
            "response_length",
            "max_response_length",
        ),  # fmt: skip
        scaffold=64,
        comment="token limit of every model call",
        docs="each call's completion limit; a reply cut there is what `[algorithm.overlong]` "
        "acts on",
        formerly="training.max_tokens",
    )
    tool_format: ToolFormatSetting = setting(
        "auto",
        comment='tool calls: the model\'s own syntax ("native"), or "instruction"',
        docs='how the policy calls tools: `"native"` (the model\'s own syntax, rendered by its '
        'chat template: hermes\'s `<tool_call>`), `"instruction"` (a JSON format described in '
        'the system message), or `"auto"` (native when the template has it); see [tool '
        "calls](sequences.md#tool-calls-in-the-models-own-format)",
        formerly="training.tool_format",
    )


@dataclass(frozen=True)
class LoraConfig:
    """``[learner.lora]``: train a LoRA adapter of rank ``rank``; the base stays frozen."""

    rank: int = setting(
        required=True,
        scaffold=16,
        comment="the adapter's rank",
        docs="the adapter's rank r",
        formerly="training.lora_rank",
    )
    alpha: float | None = setting(
        None,
        scaffold=32,
        commented=True,
        comment="the adapter's scale is alpha / rank (default 2 x rank)",
        docs="the adapter's scale is `alpha / rank`",
        docs_default="2 × `rank`",
        formerly="training.lora_alpha",
    )
    dropout: float = setting(
        0.0,
        bound="non-negative",
        commented=True,
        comment="dropout on the adapter's input in the update",
        docs="dropout on the adapter's input during the update (0: the update sees the policy "
        "that generated)",
        formerly="training.lora_dropout",
    )
    target_modules: tuple[str, ...] | str = setting(
        ALL_LINEAR,
        parse=_target_modules,
        commented=True,
        comment="the layers it wraps, or a list of names",
        docs="the layers the adapter wraps: every linear layer of the attention and MLP "
        'blocks, or a list of module names such as `["q_proj", "v_proj"]`',
        formerly="training.lora_target_modules",
    )

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise SettingError("rank", f"rank must be at least 1, got {self.rank}")
        if self.dropout >= 1:
            raise SettingError("dropout", f"dropout must be below 1, got {self.dropout}")

    @property
    def scale_alpha(self) -> float:
        """``alpha``, or its default of twice the rank."""
        return self.alpha if self.alpha is not None else 2.0 * self.rank


@dataclass(frozen=True)
class LearnerConfig:
    """``[learner]``: the model being trained, where, how fast, in what precision."""

    learning_rate: float = setting(
        1e-5,
        aliases=("lr",),
        comment="AdamW, after a linear warm-up over a tenth of the steps",
        docs="AdamW, with a linear warm-up over a tenth of the steps",
        formerly="training.learning_rate",
    )
    precision: Precision = setting(
        "auto",
        comment='the update: "bf16" autocast, "fp32", or bf16 where it is native',
        docs='the update\'s forward pass under bf16 autocast (`"bf16"`), in `"fp32"`, or bf16 '
        "where the device computes it natively: a GPU of compute capability 8.0+, a CPU with "
        'AVX512-BF16 or AMX (about twice as fast); never on MPS. `"bf16"` where the device '
        "would emulate it is refused. On a CPU in bf16, attention over at most 128 queries is "
        "computed by matmuls, where PyTorch's fused kernel's backward pass costs up to 3× as "
        "much ([measured](measurements.md#attention-on-the-cpu-in-bf16))",
        formerly="training.precision",
    )
    token_budget: int = setting(
        1024,
        comment="tokens per micro-batch of the update; lower it on out of memory",
        docs="tokens per micro-batch of the update (forward and backward): lower it when "
        "memory runs out, raise it on a GPU with room to spare",
        formerly="training.token_budget",
    )
    share_prefix: bool = setting(
        True,
        comment="compute the first tokens a micro-batch's rollouts share (a group's prompt) once",
        docs="run the first tokens the rollouts of a micro-batch have in common (a group's "
        "prompt: system prompt, tools, task) through the model once, with its gradient, and "
        "their rests against its keys and values: in one packed pass of several groups, no "
        "padding, where the attention is SDPA over full-attention layers, else against a "
        "cache (once for all the micro-batches a group is cut into); the logprobs and the "
        "gradient are the unshared ones within fp32 rounding. `false`: every rollout whole",
    )
    device: str = setting(
        "auto",
        parse=_device,
        comment='"auto" (a GPU when torch sees one, else the CPU), "cpu", "cuda:N"',
        docs='where the learner and the torch engine run: `"auto"` (CUDA when torch sees a '
        'GPU, else the CPU), `"cpu"`, `"cuda"`, `"cuda:N"`, `"mps"`; see '
        "[GPUs](gpu.md)",
        formerly="training.device",
    )
    lora: LoraConfig | None = subsection(
        comment="train a LoRA adapter (absent: every weight)",
        docs="train a LoRA adapter (peft) instead of every weight; see [LoRA](lora.md)",
    )


@dataclass(frozen=True)
class VllmConfig:
    """``[engine.vllm]``: generate with a vLLM server, which gets the weights after every
    step (absent: the learner's own model generates, the torch engine)."""

    python: str = setting(
        sys.executable,
        docs="the interpreter of the environment where vLLM is installed (a relative path is "
        "the workspace's)",
        docs_default="this interpreter",
        formerly="vllm.python",
    )
    """The interpreter whose environment has vLLM (it may be another virtualenv's)."""
    url: str = setting(
        "",
        parse=_url,
        docs="attach to a vLLM server you started (with `VLLM_SERVER_DEV_MODE=1`) instead of "
        "starting one",
        formerly="vllm.url",
    )
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32"] = setting(
        "auto",
        docs='`"auto"`, `"bfloat16"`, `"float16"`, `"float32"`; full weights are pushed in it',
        formerly="vllm.dtype",
    )
    max_model_len: int = setting(
        0, docs="the server's context length", docs_default="the model's",
        formerly="vllm.max_model_len",
    )  # fmt: skip
    gpu_memory_utilization: float = setting(
        0.0,
        docs="the share of the GPU vLLM takes: lower it (0.3–0.5) when the learner shares the "
        "GPU. On the CPU, unset, the trainer sizes the KV cache ([vLLM](vllm.md))",
        docs_default="vLLM's (0.9)",
        formerly="vllm.gpu_memory_utilization",
    )
    args: tuple[str, ...] = setting(
        (),
        parse=_server_args,
        docs='extra server flags (`["--enforce-eager"]`, `["--kv-cache-memory-bytes", '
        '"2000000000"]`) and environment (`{ VLLM_LOGGING_LEVEL = "WARNING" }`)',
        formerly="vllm.args",
    )
    env: dict[str, str] = setting(
        factory=dict, parse=_server_env, joins_row=True, formerly="vllm.env"
    )
    start_timeout_sec: float = setting(
        600.0, docs="how long the server may take to come up", formerly="vllm.start_timeout_sec"
    )

    def __post_init__(self) -> None:
        if self.gpu_memory_utilization > 1:
            raise SettingError(
                "gpu_memory_utilization",
                "gpu_memory_utilization is a share of the GPU's memory (0 to 1), "
                f"got {self.gpu_memory_utilization}",
            )


@dataclass(frozen=True)
class EngineConfig:
    """``[engine]``: what generates the rollouts."""

    max_batch_size: int = setting(
        64,
        comment="most model calls the torch engine generates together",
        docs="most model calls the torch engine generates together; fewer when their KV "
        "cache (prompt + `max_tokens` each) would not fit in a quarter of the device's free "
        "memory. A step's rollouts start together, so their first calls share one prefill",
        formerly="training.max_batch_size",
    )
    precision: Precision = setting(
        "auto",
        comment='the torch engine: "bf16" (a bf16 copy generates), "fp32", or as [learner]',
        docs='what the torch engine generates in: `"fp32"` (the learner\'s own weights, so its '
        'recorded logprobs are the learner\'s), `"bf16"` (a bf16 copy of the weights, copied '
        "in after every step: the engine's logprobs differ a little from the learner's and the "
        'off-policy correction bounds the gap, as with vLLM), or `"auto"`: as `[learner] '
        "precision` resolved ([measured](measurements.md#generation-in-bf16))",
    )
    prefix_cache: bool = setting(
        True,
        comment="keep finished calls' keys and values for later turns that extend them",
        docs="keep a finished call's keys and values, so that a later call whose prompt begins "
        "the same way (an agent's next turn) prefills only its new tokens; emptied at every "
        "update, within a quarter of the engine's cache budget. Not for models with "
        "sliding-window or recurrent layers",
    )
    vllm: VllmConfig | None = subsection(
        docs="generate with a vLLM server instead of the learner's own model (the torch "
        "engine); see [vLLM](vllm.md)",
    )

    @property
    def name(self) -> Literal["torch", "vllm"]:
        """``vllm`` with an ``[engine.vllm]`` table, else ``torch``."""
        return "torch" if self.vllm is None else "vllm"


@dataclass(frozen=True)
class HeldOutConfig:
    """``[eval]``: the held-out rows, evaluated at the start, every ``every`` steps and at
    the end."""

    rows: float | None = setting(
        None,
        scaffold=2,
        comment="held-out rows (not trained on), evaluated at start and end",
        docs="held-out split: a row count (≥ 1) or a fraction of the dataset",
        docs_default="0.2",
        formerly="training.eval_rows",
    )
    dataset: str | None = setting(
        None,
        scaffold="data/heldout.jsonl",
        commented=True,
        comment="or a held-out file of its own (instead of rows)",
        docs='a held-out file (`"data/heldout.jsonl"`, relative to the workspace; any dataset '
        "format), evaluated as it is instead of splitting `dataset`, whose rows then all "
        "train; not with `rows` (a `--set` of either replaces the file's other, and the run "
        "says so). The journal's `start` event records its path",
        formerly="training.eval_dataset",
    )
    """As written (`TrainConfig.eval_dataset` is its resolved path)."""
    every: int = setting(
        0,
        bound="non-negative",
        comment="also evaluate every N steps (0: only at start and end)",
        docs="held-out eval every N steps (always at start and end)",
        formerly="training.eval_every",
    )
    samples: int = setting(
        1,
        comment="rollouts per held-out row; > 1 (temperature > 0) adds pass@k",
        docs="rollouts per held-out row; above 1 (with `temperature` > 0) each evaluation also "
        "reports pass@1..k, estimated as `osmosis eval` does (the unbiased estimator, "
        "averaged over the rows)",
        formerly="training.eval_samples",
    )
    temperature: float = setting(
        0.0,
        bound="non-negative",
        comment="sampling temperature of the held-out evaluations (0: greedy)",
        docs="sampling temperature of the held-out evaluations (0: greedy, so two points "
        "compare policies, not luck)",
        formerly="training.eval_temperature",
    )
    pass_threshold: float = declared(
        replace(PASS_THRESHOLD, bound="positive", formerly="training.pass_threshold"), 1.0
    )
    """A rollout passes when its reward is at least this (the steps' pass rate too)."""

    def __post_init__(self) -> None:
        if self.rows is not None and self.dataset is not None:
            raise SettingError(
                "rows", "rows splits the dataset, but dataset names the held-out rows; keep one"
            )
        if self.samples > 1 and not self.temperature:
            raise SettingError(
                "samples",
                "samples > 1 needs temperature > 0 (greedy samples are all the same); set "
                "temperature, e.g. 1.0",
            )

    @property
    def split(self) -> float:
        """The rows split off ``dataset``: ``rows``, 0 with a held-out file, else 0.2."""
        if self.rows is not None:
            return self.rows
        return 0.0 if self.dataset is not None else 0.2


@dataclass(frozen=True)
class CheckpointsConfig:
    """``[checkpoints]``: when the run saves, and how many saves stay."""

    every: int = setting(
        1,
        scaffold=2,
        comment="checkpoint every N steps and at the end; a rerun resumes there",
        docs="checkpoint every N steps (always at the end); a rerun resumes from the last",
        formerly="training.checkpoint_every",
    )
    keep: int = setting(
        1,
        comment="how many of the newest checkpoints stay on disk",
        docs="how many of the newest checkpoints stay on disk (`osmosis train export --step`)",
        formerly="training.keep_checkpoints",
    )


@dataclass(frozen=True)
class TrackingConfig:
    """``[tracking]``: where the steps' figures go besides ``metrics.jsonl``."""

    report_to: tuple[str, ...] = setting(
        (),
        parse=_report_to,
        scaffold=("tensorboard",),
        commented=True,
        comment="trackers: tensorboard, wandb, mlflow, trackio",
        docs='experiment trackers that get every step and evaluation: any of `"tensorboard"`, '
        '`"wandb"`, `"mlflow"`, `"trackio"` (`pip install \'osmosis-ai[track]\'`); see '
        "[trackers](trackers.md)",
        formerly="training.report_to",
    )
    record_sequences: int = setting(
        0,
        bound="non-negative",
        comment="write the first N steps' training sequences to sequences/ (0: none)",
        docs="write the training sequences of the first N steps to `sequences/step-NNNN.jsonl`: "
        "each as segments of text that carry loss (the policy's replies) or not (prompt, tool "
        "results, template), redacted; see [sequences](sequences.md)",
        formerly="training.record_sequences",
    )


@dataclass(frozen=True)
class TrainConfig(RolloutSource):
    """A validated training config file."""

    path: Path
    workspace: Path
    experiment: TrainExperimentConfig
    training: TrainingConfig = subsection(TrainingConfig)
    sampling: SamplingConfig = subsection(SamplingConfig)
    algorithm: AlgorithmConfig = subsection(AlgorithmConfig)
    learner: LearnerConfig = subsection(LearnerConfig)
    engine: EngineConfig = subsection(EngineConfig)
    eval: HeldOutConfig = subsection(HeldOutConfig)
    checkpoints: CheckpointsConfig = subsection(CheckpointsConfig)
    tracking: TrackingConfig = subsection(TrackingConfig)
    environment: EnvironmentConfig | None = None
    """The ``[environment]`` whose task makes the rows (and, with no entrypoint, grades)."""
    judge: JudgeConfig | None = None
    """The ``[judge]``: the model a ``JudgeGrader`` (and the group judge) asks."""
    eval_dataset: Path | None = None
    """``[eval] dataset`` resolved: the held-out rows, instead of a split of ``dataset``."""
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    """The ``--set`` flags applied over the file."""
    notes: tuple[str, ...] = ()
    """What the flags changed beyond their own key, one line each (the run says them)."""

    def settings(self) -> dict[str, dict[str, object]]:
        """Every section after ``[experiment]`` as plain values, by section name (the
        journal's ``start`` line and the trackers' parameters), ``[environment]`` first when
        the run has one."""
        sections = {s.name: asdict(getattr(self, s.name)) for s in TRAIN_SECTIONS}
        judge = {} if self.judge is None else {"judge": asdict(self.judge)}
        if self.environment is None:
            return {**sections, **judge}
        return {"environment": asdict(self.environment), **sections, **judge}

    def update_settings(self, *, bf16: bool = False) -> UpdateSettings:
        """What the update takes; ``bf16`` is ``[learner] precision`` as the device resolved it.

        Raises:
            SettingError: Values of two sections that do not go together.
        """
        return UpdateSettings(
            algorithm=self.algorithm,
            max_tokens=self.sampling.max_tokens,
            # Greedy rollouts record logprobs of the unscaled distribution.
            temperature=self.sampling.temperature or 1.0,
            token_budget=self.learner.token_budget,
            bf16=bf16,
            share_prefix=self.learner.share_prefix,
        )


TRAIN_EXPERIMENT = section_of(TrainExperimentConfig, "experiment")
#: The sections after ``[experiment]``, in the order the file, the scaffold and the docs have.
TRAIN_SECTIONS: tuple[Section, ...] = tuple(
    sub.section for sub in section_of(TrainConfig, "").subsections
)
ALGORITHM = section_of(AlgorithmConfig, "algorithm")
_TOP = (
    "experiment",
    "environment",
    *(section.name for section in TRAIN_SECTIONS),
    "judge",
    "env",
    "secrets",
)
#: Where a cross-section `UpdateSettings` error's setting is written.
_UPDATE_KEYS = {
    "max_tokens": ("sampling", "max_tokens"),
    "temperature": ("sampling", "temperature"),
    "token_budget": ("learner", "token_budget"),
    "overlong.buffer": ("algorithm", "overlong", "buffer"),
}


def load_train_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a training TOML file, with ``overrides`` (``section.key=value``, the
    ``--set`` flags) validated as if the file held them.

    Raises:
        ConfigError: Unreadable or invalid TOML; a file in the flat form of before (a line per
            key saying where it went); an unknown, missing or out-of-range section or key, or
            two keys that do not go together: the message names the file, the line and the key.
    """
    from osmosis_ai.train.migration import migration_error

    path = Path(os.path.abspath(path))
    data, src = read_config(path, "training config", overrides)
    moved = migration_error(src, data)
    if moved is not None:
        raise moved
    tables = src.sections(data, _TOP, "a training config")
    workspace = workspace_of(path)
    env = env_table(src, tables["env"])
    held_out, note = src.flag_replaces(tables["eval"], "eval", ("dataset", "rows"))
    tables["eval"] = held_out
    sections: dict[str, Any] = {
        section.name: parse_section(src, tables[section.name], section, _base(src, tables, section))
        for section in TRAIN_SECTIONS
    }
    distill = sections["algorithm"].distill
    if distill is not None and distill.teacher.startswith("openai:"):
        from osmosis_ai.gateway.policies.spec import parse_policy_spec

        try:
            parse_policy_spec(distill.teacher)
        except ConfigError as exc:
            raise src.error(
                ("algorithm", "distill", "teacher"), f"algorithm.distill.teacher: {exc}"
            ) from exc
    elif distill is not None:  # a relative path is the workspace's, as every path here
        teacher = Path(os.path.normpath(workspace / Path(distill.teacher).expanduser()))
        if not teacher.is_dir():
            raise src.error(
                ("algorithm", "distill", "teacher"),
                f"algorithm.distill.teacher {distill.teacher!r}: there is no directory "
                f"{teacher}; name a local HuggingFace-format model or checkpoint directory",
            )
        sections["algorithm"] = replace(
            sections["algorithm"], distill=replace(distill, teacher=str(teacher))
        )
    engine: EngineConfig = sections["engine"]
    if engine.vllm is not None and os.sep in engine.vllm.python:
        # A relative path is the workspace's, as every path of the config is.
        python = os.path.normpath(workspace / Path(engine.vllm.python).expanduser())
        sections["engine"] = replace(engine, vllm=replace(engine.vllm, python=python))
    environment = parse_environment(src, data, tables["environment"], workspace)
    config = TrainConfig(
        path=path,
        workspace=workspace,
        experiment=_experiment(src, tables["experiment"], workspace, environment),
        environment=environment,
        judge=parse_judge(src, data, tables["judge"]),
        eval_dataset=(
            dataset_path(src, held_out, workspace, "eval", "dataset")
            if "dataset" in held_out
            else None
        ),
        env=env,
        secrets=secret_names(src, tables["secrets"], env),
        overrides=tuple(overrides),
        notes=(note,) if note else (),
        **sections,
    )
    try:  # the update's own rules across sections, refused at their line now
        config.update_settings()
    except SettingError as exc:
        where = _UPDATE_KEYS.get(exc.setting, ("algorithm", exc.setting))
        section = where[: len(where) - len(exc.setting.split("."))]
        raise src.error(where, f"{'.'.join(section)}.{exc}") from None
    return config


def _base(src: ConfigSource, tables: dict[str, TOMLTable], section: Section) -> object | None:
    """The recipe ``[algorithm]`` names, which its keys then override; ``None`` elsewhere."""
    if section is not ALGORITHM or "recipe" not in tables["algorithm"]:
        return None
    (recipe,) = (key for key in ALGORITHM.keys if key.name == "recipe")
    name = src.choice(tables["algorithm"], "algorithm", "recipe", recipe.choices)
    return RECIPES[name]  # type: ignore[index]


def _experiment(
    src: ConfigSource, table: TOMLTable, workspace: Path, environment: EnvironmentConfig | None
) -> TrainExperimentConfig:
    check_keys(src, table, TRAIN_EXPERIMENT)
    shared = shared_experiment(src, table, workspace, environment)
    model = _model(src, table, "experiment")
    if model != "embedded":
        directory = Path(os.path.normpath(workspace / Path(model).expanduser()))
        if not directory.is_dir():
            raise src.error(
                ("experiment", "model"),
                f'experiment.model {model!r}: there is no directory {directory}; use "embedded" '
                "or a local HuggingFace-format model directory",
            )
        model = str(directory)
    return TrainExperimentConfig(model=model, **shared._asdict())


def resolved_toml(config: TrainConfig) -> str:
    """The run's config as it resolved (recipe, then the file, then the flags): every
    section with every key, a key left to its default's rule as a comment, paths absolute.
    Read from the workspace's ``configs/training/``, it gives the same run."""
    values = {section.name: getattr(config, section.name) for section in TRAIN_SECTIONS}
    if config.eval_dataset is not None:
        values["eval"] = replace(config.eval, dataset=str(config.eval_dataset))
    flags = "".join(f"# --set {flag}\n" for flag in config.overrides)
    text = f"# The resolved config of {config.path}\n{flags}\n"
    # With an [environment], the rows' file is made from it, not named in the config.
    made = ("dataset",) if config.environment is not None else ()
    text += settings_toml(TRAIN_EXPERIMENT, config.experiment, skip=made)
    if config.environment is not None:
        text += "\n" + settings_toml(ENVIRONMENT, config.environment)
    for section in TRAIN_SECTIONS:
        text += "\n" + settings_toml(section, values[section.name])
    if config.judge is not None:
        text += "\n" + settings_toml(JUDGE, config.judge)
    if config.env:
        text += "\n[env]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in config.env.items())
    if config.secrets:
        text += f"\n[secrets]\nrequired = {toml_value(list(config.secrets))}\n"
    return text
