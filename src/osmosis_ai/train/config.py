"""The training TOML (``configs/training/<name>.toml``): ``[experiment]``, ``[training]`` and
``[vllm]``.

The keys of each section are declared in `osmosis_ai.eval._config_schema`, which checks their
types and ranges; ``[experiment]``, ``[env]`` and ``[secrets]`` are read by the validators the
eval config uses. What involves several keys or the workspace is checked here, with the same
line-numbered errors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from osmosis_ai.errors import SettingError
from osmosis_ai.eval._config_schema import (
    TRAIN_EXPERIMENT,
    TRAINING,
    VLLM,
    check_keys,
    parse_section,
)
from osmosis_ai.eval._config_sections import (
    ConfigSource,
    TOMLTable,
    dataset_path,
    env_table,
    read_config,
    secret_names,
    shared_experiment,
    workspace_of,
)
from osmosis_ai.gateway.policies._torch_device import DEVICE_SETTING
from osmosis_ai.train.algorithm.settings import GrpoConfig, TisMode
from osmosis_ai.train.bookkeeping.trackers import TRACKERS

__all__ = ["TrainConfig", "TrainingConfig", "VllmConfig", "grpo_config", "load_train_config"]

_SECTIONS = ("experiment", "training", "vllm", "env", "secrets")
#: LoRA settings other than the rank: they mean nothing for a full fine-tune.
_LORA_OPTIONS = ("lora_alpha", "lora_dropout", "lora_target_modules")
#: The fewest rollouts in flight (`TrainingConfig.rollouts_in_flight`).
_MIN_IN_FLIGHT = 16
#: The attention and MLP projections of the model's blocks (peft: every linear layer but the
#: output head).
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class TrainingConfig:
    """The ``[training]`` section."""

    steps: int = 10
    prompts_per_step: int = 4
    """Dataset rows per step (picked with ``seed``)."""
    group_size: int = 4
    """Rollouts per row; advantages are normalised within this group."""
    learning_rate: float = 1e-5
    loss: Literal["ppo_clip", "gspo", "cispo"] = "ppo_clip"
    """The objective (``algorithm.loss``): PPO's clipped token ratio, GSPO's clipped sequence
    ratio, or CISPO's clipped importance weight on the log-likelihood."""
    clip_low: float | None = None
    """``None``: the loss's default (``algorithm.loss.CLIP_DEFAULTS``)."""
    clip_high: float | None = None
    dual_clip: float | None = None
    """A negative advantage's token loses at most this × |A| (0: off; ``None``: 3, or off
    where ``1 + clip_high`` reaches it)."""
    normalisation: Literal["token", "sequence", "constant"] = "token"
    epochs: int = 1
    """Passes over a step's rollouts, each in ``mini_batches`` optimiser steps."""
    mini_batches: int = 1
    overlong: Literal["keep", "mask", "penalty"] = "keep"
    """Rollouts a model call of which stopped at ``max_tokens``: trained as they are, left
    out of the loss (``mask``), or rewarded less as replies near the limit (``penalty``)."""
    credit: Literal["outcome", "turn"] = "outcome"
    """Whose advantage a token gets: its rollout's, or with turn rewards also its turn's."""
    turn_discount: float = 0.5
    turn_weight: float = 0.5
    overlong_buffer: int = 0
    """``penalty`` grows from 0 to -1 over the last this many tokens (0: a fifth of
    ``max_tokens``)."""
    advantage: Literal["grpo", "rloo"] = "grpo"
    """The baseline of a reward: its group's mean, or the mean of the group's others."""
    advantage_scale: Literal["std", "none"] | None = None
    """``None``: the baseline's own (``std`` for ``grpo``, ``none`` for ``rloo``)."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """The update's forward pass: under bf16 autocast, in fp32, or bf16 where the CPU
    computes it natively (AVX512-BF16 or AMX); logprobs are taken in fp32 either way."""
    kl_beta: float = 0.0
    eval_every: int = 0
    """Held-out eval every this many steps (0: only at start and end)."""
    checkpoint_every: int = 1
    eval_rows: float = 0.2
    """Held-out split: a row count (>= 1) or a fraction of the dataset (< 1)."""
    eval_dataset: str | None = None
    """A held-out file as written (``TrainConfig.eval_dataset`` is its resolved path)."""
    seed: int = 0
    max_minutes: float = 0.0
    """Stop once the steps have taken this long (0: no limit); evaluations and checkpoints
    are not counted. The run ends as after its last step: checkpoint, held-out evaluation."""
    max_tokens: int = 256
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (imposed by the gateway)."""
    eval_temperature: float = 0.0
    """Sampling temperature of the held-out evaluation (0: greedy)."""
    eval_samples: int = 1
    """Rollouts per held-out row; above 1 (with ``eval_temperature`` > 0) the evaluation
    reports pass@1..k, estimated as ``osmosis eval`` does."""
    pass_threshold: float = 1.0
    record_sequences: int = 0
    """Write the training sequences of the first N steps, decoded by loss mask, to
    ``sequences/step-NNNN.jsonl`` (`write_step_sequences`)."""
    token_budget: int = 1024
    """Tokens per micro-batch (forward+backward). The update's activations grow with it (in
    fp32 about 1.7 MB a token for a 135M model): lower it when memory runs out, raise it
    on a GPU with room to spare."""
    max_batch_size: int = 64
    """Most model calls the torch engine generates together (fewer when their KV cache would
    not fit in a quarter of the free memory)."""
    resample_zero_gradient: int = 0
    """Dynamic sampling: run a group whose rewards are all equal again, up to this many times
    within the step (0: leave it out of the update)."""
    max_staleness: int = 0
    """Asynchronous training's bound: a step trains only on tokens generated by weights at
    most this many versions older than the ones it updates; the next steps' rollouts keep
    running while it updates (0: synchronous, each step's rollouts start after the last)."""
    device: str = "auto"
    """Where the learner and the torch engine run: ``auto`` (CUDA when torch sees a GPU, else
    the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    lora_rank: int = 0
    """0: full fine-tuning; r > 0: train a LoRA adapter of rank r (the base stays frozen)."""
    lora_alpha: float | None = None
    """LoRA scaling numerator (the update is scaled by alpha / rank); default 2 x rank."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input during the update (0: the update sees the policy that
    generated, so the clipped ratio compares like with like)."""
    lora_target_modules: tuple[str, ...] | str = ALL_LINEAR
    """Module names the adapter wraps, or ``"all-linear"`` (every linear layer of the
    attention and MLP blocks)."""
    keep_checkpoints: int = 1
    """How many of the newest checkpoints stay on disk."""
    engine: Literal["torch", "vllm"] = "torch"
    """What generates the rollouts: the learner's own model (``torch``) or a vLLM server
    (``vllm``, configured by ``[vllm]``) that receives the weights after every step."""
    tis_cap: float | None = None
    """Importance sampling: each policy token's loss is weighted by the learner's probability
    over the engine's, capped at this (0: off; ``None``: the loss's default, 2 for ``gspo``,
    else off). Corrects for an engine whose logprobs differ from the learner's (vLLM in bf16)
    and for stale tokens."""
    tis_mode: TisMode | None = None
    """Per token or per sequence, truncated or masked (``None``: the loss's default)."""
    tis_floor: float = 0.0
    """The mask modes' lower bound (0: none)."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers that get every step's metrics and every held-out evaluation:
    any of ``tensorboard``, ``wandb``, ``mlflow``, ``trackio`` (the ``track`` extra)."""
    tool_format: Literal["auto", "native", "instruction"] = "auto"
    """How the policy calls tools: ``native`` (the model's own syntax, which its chat template
    renders: hermes's ``<tool_call>``), ``instruction`` (a JSON format described in the system
    message, for templates without tools), or ``auto`` (native when the template has it)."""

    @property
    def rollouts_in_flight(self) -> int:
        """The most rollouts in flight at once: a step's (and under asynchronous training
        those of the next ``max_staleness`` steps), at least 16, so the engine generates
        their calls together; held-out rollouts share the bound."""
        steps = self.max_staleness + 1
        return max(_MIN_IN_FLIGHT, steps * self.prompts_per_step * self.group_size)

    @property
    def lora_scale_alpha(self) -> float:
        """``lora_alpha``, or its default of twice the rank."""
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank


@dataclass(frozen=True)
class VllmConfig:
    """The ``[vllm]`` section: the vLLM server of ``engine = "vllm"``."""

    python: str = sys.executable
    """The interpreter whose environment has vLLM (it may be another virtualenv's)."""
    url: str = ""
    """A vLLM server already running (with ``VLLM_SERVER_DEV_MODE=1``) to attach to instead
    of starting one."""
    dtype: str = "auto"
    max_model_len: int = 0
    """0: the model's own context length."""
    gpu_memory_utilization: float = 0.0
    """Share of the GPU's memory vLLM takes (0: vLLM's default, 0.9); lower it when the
    learner shares the GPU. On the CPU, with no KV cache size given, the trainer sizes it
    (`cpu_kv_cache`)."""
    args: tuple[str, ...] = ()
    """Extra server flags, e.g. ``["--enforce-eager"]``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the server, e.g. ``VLLM_LOGGING_LEVEL = "WARNING"``."""
    start_timeout_sec: float = 600.0


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
    vllm: VllmConfig = field(default_factory=VllmConfig)
    eval_dataset: Path | None = None
    """``[training] eval_dataset``: the held-out rows, instead of a split of ``dataset``."""
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    """The ``--set`` flags applied over the file."""
    notes: tuple[str, ...] = ()
    """What the flags changed beyond their own key, one line each (the run says them)."""

    @property
    def rollout_dir(self) -> Path:
        """The rollout's directory, ``<workspace>/rollouts/<rollout>``."""
        return self.workspace / "rollouts" / self.rollout


def load_train_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a training TOML file, with ``overrides`` (``section.key=value``, the
    ``--set`` flags) validated as if the file held them.

    Raises:
        ConfigError: Unreadable or invalid TOML, or an unknown, missing or out-of-range
            section or key; the message names the file, the line and the key.
    """
    path = Path(os.path.abspath(path))
    data, src = read_config(path, "training config", overrides)
    tables = src.sections(data, _SECTIONS, "a training config")
    experiment = tables["experiment"]
    check_keys(src, experiment, TRAIN_EXPERIMENT)
    workspace = workspace_of(path)
    shared = shared_experiment(src, experiment, workspace)
    env = env_table(src, tables["env"])
    held_out = ("eval_dataset", "eval_rows")
    training_table, note = src.flag_replaces(tables["training"], "training", held_out)
    training = _training(src, training_table)
    if tables["vllm"] and training.engine != "vllm":
        raise src.error(
            ("vllm",),
            f'[vllm] configures the vLLM engine, but training.engine is "{training.engine}"; '
            'set engine = "vllm" in [training], or remove [vllm]',
        )
    return TrainConfig(
        path=path,
        workspace=workspace,
        rollout=shared.rollout,
        entrypoint=shared.entrypoint,
        model=_model(src, experiment, workspace),
        dataset=shared.dataset,
        eval_dataset=_eval_dataset(src, training_table, workspace),
        training=training,
        vllm=_vllm(src, tables["vllm"], workspace),
        env=env,
        secrets=secret_names(src, tables["secrets"], env),
        overrides=tuple(overrides),
        notes=(note,) if note else (),
    )


def _eval_dataset(src: ConfigSource, table: TOMLTable, workspace: Path) -> Path | None:
    if "eval_dataset" not in table:
        return None
    if "eval_rows" in table:
        raise src.error(
            ("training", "eval_rows"),
            "training.eval_rows splits the dataset, but training.eval_dataset names the "
            "held-out rows; keep one",
        )
    return dataset_path(src, table, workspace, "training", "eval_dataset")


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
    parsers = {"device": _device, "lora_target_modules": _target_modules, "report_to": _report_to}
    training = parse_section(src, table, TRAINING, TrainingConfig, parsers)
    if training.group_size < 2:
        raise src.error(
            ("training", "group_size"),
            f"training.group_size must be at least 2, got {training.group_size}: each rollout's "
            "advantage is its reward against the other rollouts of its row, so a group of one "
            "never has a gradient; use 2 or more (4 is the default)",
        )
    if not training.lora_rank:
        for key in _LORA_OPTIONS:
            if key in table:
                raise src.error(
                    ("training", key),
                    f"training.{key} is set but lora_rank is 0 (full fine-tuning); set "
                    f"lora_rank > 0 to train a LoRA adapter, or remove {key}",
                )
    if training.lora_dropout >= 1:
        raise src.error(
            ("training", "lora_dropout"),
            f"training.lora_dropout must be below 1, got {training.lora_dropout}",
        )
    try:  # the update's own rules, so a bad combination is refused at its line now
        grpo_config(training)
    except SettingError as exc:
        key = _UPDATE_KEYS.get(exc.setting, exc.setting)
        message = str(exc)
        if message.startswith(exc.setting):
            message = key + message[len(exc.setting) :]
        raise src.error(("training", key), f"training.{message}") from None
    if training.eval_samples > 1 and not training.eval_temperature:
        raise src.error(
            ("training", "eval_samples"),
            "training.eval_samples > 1 needs training.eval_temperature > 0 (greedy samples "
            "are all the same); set eval_temperature, e.g. 1.0",
        )
    return training


#: `GrpoConfig` fields whose ``[training]`` key has another name.
_UPDATE_KEYS = {"micro_batch_tokens": "token_budget"}


def grpo_config(training: TrainingConfig, *, bf16: bool = False) -> GrpoConfig:
    """The update's settings from ``[training]``; ``bf16`` is the precision the learner's
    device resolved ``precision`` to.

    Raises:
        SettingError: A value the update cannot take, or two that do not go together.
    """
    return GrpoConfig(
        loss=training.loss,
        clip_low=training.clip_low,
        clip_high=training.clip_high,
        dual_clip=training.dual_clip,
        advantage=training.advantage,
        advantage_scale=training.advantage_scale,
        normalisation=training.normalisation,
        max_tokens=training.max_tokens,
        overlong=training.overlong,
        overlong_buffer=training.overlong_buffer,
        credit=training.credit,
        turn_discount=training.turn_discount,
        turn_weight=training.turn_weight,
        epochs=training.epochs,
        mini_batches=training.mini_batches,
        kl_beta=training.kl_beta,
        micro_batch_tokens=training.token_budget,
        bf16=bf16,
        tis_cap=training.tis_cap,
        tis_mode=training.tis_mode,
        tis_floor=training.tis_floor,
        # Greedy rollouts record logprobs of the unscaled distribution.
        temperature=training.temperature or 1.0,
    )


def _report_to(src: ConfigSource, table: TOMLTable) -> tuple[str, ...]:
    value = table["report_to"]
    names = ", ".join(f'"{name}"' for name in TRACKERS)
    if not (isinstance(value, list) and all(isinstance(name, str) for name in value)):
        raise src.error(
            ("training", "report_to"),
            f'training.report_to must be an array of tracker names, e.g. ["tensorboard"]; '
            f"the trackers are {names}",
        )
    for name in value:
        if name not in TRACKERS:
            raise src.error(
                ("training", "report_to"),
                f"training.report_to: unknown tracker {name!r}; the trackers are {names}",
            )
    return tuple(dict.fromkeys(value))


def _device(src: ConfigSource, table: TOMLTable) -> str:
    value = src.string(table, "training", "device")
    if not DEVICE_SETTING.fullmatch(value):
        raise src.error(
            ("training", "device"),
            f'training.device must be "auto", "cpu", "cuda", "cuda:N" or "mps", got {value!r}',
        )
    return value


def _target_modules(src: ConfigSource, table: TOMLTable) -> tuple[str, ...] | str:
    value = table["lora_target_modules"]
    if value == ALL_LINEAR:
        return ALL_LINEAR
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(name, str) and name.strip() for name in value)
    ):
        raise src.error(
            ("training", "lora_target_modules"),
            f'training.lora_target_modules must be "{ALL_LINEAR}" or a non-empty list of '
            'module names such as ["q_proj", "v_proj"]',
        )
    return tuple(value)


def _vllm(src: ConfigSource, table: TOMLTable, workspace: Path) -> VllmConfig:
    def python(src: ConfigSource, table: TOMLTable) -> str:
        value = src.string(table, "vllm", "python")
        # A relative path is the workspace's, as every path of the config is.
        return os.path.normpath(workspace / Path(value).expanduser()) if os.sep in value else value

    parsers = {"python": python, "url": _url, "args": _server_args, "env": _server_env}
    vllm = parse_section(src, table, VLLM, VllmConfig, parsers)
    if vllm.gpu_memory_utilization > 1:
        raise src.error(
            ("vllm", "gpu_memory_utilization"),
            "vllm.gpu_memory_utilization is a share of the GPU's memory (0 to 1), "
            f"got {vllm.gpu_memory_utilization}",
        )
    return vllm


def _url(src: ConfigSource, table: TOMLTable) -> str:
    url = src.string(table, "vllm", "url")
    if not url.startswith(("http://", "https://")):
        raise src.error(("vllm", "url"), f"vllm.url must be an http:// URL, got {url!r}")
    return url


def _server_args(src: ConfigSource, table: TOMLTable) -> tuple[str, ...]:
    args = table["args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise src.type_error("vllm", "args", args, 'an array of strings (["--enforce-eager"])')
    return tuple(args)


def _server_env(src: ConfigSource, table: TOMLTable) -> dict[str, str]:
    env = table["env"]
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise src.type_error("vllm", "env", env, 'a table of strings ({ NAME = "value" })')
    return dict(env)
