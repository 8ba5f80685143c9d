"""The keys of the eval and training configs, declared once.

Each section's keys are listed here with their default, type, range, the comment
``osmosis rollout init`` writes next to them and the text of the docs' key table. The
loaders parse through `parse_section`, the scaffold writes `scaffold_toml`, and
``scripts/config_tables.py`` writes `markdown_table` into ``docs/eval.md`` and
``docs/train.md``: a key added here reaches all three, so none can forget it.

Checks that involve several keys (LoRA options without a rank, ``eval_dataset`` with
``eval_rows``...) and paths resolved against the workspace stay with the loaders.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from osmosis_ai.eval._config_sections import Bound, ConfigSource, TOMLTable

__all__ = [
    "EVALUATION",
    "EVAL_EXPERIMENT",
    "TRAINING",
    "TRAIN_EXPERIMENT",
    "VLLM",
    "Key",
    "Kind",
    "Parser",
    "Section",
    "check_keys",
    "markdown_table",
    "parse_section",
    "scaffold_toml",
    "toml_value",
]

#: How a key's value is checked; a ``custom`` key's check is the loader's (a `Parser` it
#: passes to `parse_section`, or its own code for ``[experiment]``).
Kind = Literal["integer", "number", "string", "choice", "custom"]

#: The check of a ``custom`` key: its value in the table, validated (errors through ``src``).
Parser = Callable[[ConfigSource, TOMLTable], object]

_T = TypeVar("_T")

#: The scaffold's comments start in this column (or two spaces after a longer setting).
_COMMENT_COLUMN = 33


@dataclass(frozen=True)
class Key:
    """One key of a section: how it is checked, scaffolded and documented."""

    name: str
    kind: Kind
    default: object = None
    """The dataclass field's default (a test holds them equal); None for "not set"."""
    bound: Bound = "positive"
    """For ``integer`` and ``number`` keys: which values are accepted."""
    choices: tuple[str, ...] = ()
    """For ``choice`` keys: the accepted strings."""
    required: bool = False
    comment: str = ""
    """What the scaffold writes after the key (keys of sections it writes need one)."""
    docs: str = ""
    """The "Meaning" of the docs' table (markdown); empty when the key `joins_row`."""
    joins_row: bool = False
    """The docs' table lists the key in the row of the key before it, which explains both."""
    scaffold: object = None
    """The value the scaffold writes, when it is not `default`."""
    commented: bool = False
    """The scaffold writes the key commented out (an option to uncomment)."""
    docs_default: str = ""
    """The docs' "Default" when it is not `default` written as TOML ("2 × `lora_rank`")."""
    field: str = ""
    """The dataclass field, when it is not `name`."""
    aliases: tuple[str, ...] = ()
    """Other trainers' names for it (TRL's, verl's): a config that uses one is told this
    key's name."""

    @property
    def attribute(self) -> str:
        """The dataclass field the key's value goes to."""
        return self.field or self.name


@dataclass(frozen=True)
class Section:
    """A ``[name]`` table of a config file and the keys it accepts, in the order the scaffold
    and the docs list them."""

    name: str
    keys: tuple[Key, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(key.name for key in self.keys)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(key.name for key in self.keys if key.required)

    @property
    def aliases(self) -> dict[str, str]:
        """Each key's `Key.aliases`, to the key's name."""
        return {alias: key.name for key in self.keys for alias in key.aliases}


def check_keys(src: ConfigSource, table: TOMLTable, section: Section) -> None:
    """Refuse a key ``section`` does not declare, and a missing required one."""
    src.reject_unknown(table, section.name, section.names, section.aliases)
    for name in section.required:
        if name not in table:
            raise src.error(
                (section.name,), f"{section.name}.{name} is required in [{section.name}]"
            )


def parse_section(
    src: ConfigSource,
    table: TOMLTable,
    section: Section,
    build: Callable[..., _T],
    custom: Mapping[str, Parser] | None = None,
) -> _T:
    """``build`` (the section's dataclass) called with the checked value of every key that
    ``table`` sets; the others keep the dataclass's defaults.

    Keys are checked in the file's order, so the first error is the topmost. ``custom``
    holds the parser of each ``custom`` key.

    Raises:
        ConfigError: An unknown or missing key, or a value of the wrong type or range.
    """
    parsers = custom or {}
    unparsed = [key.name for key in section.keys if key.kind == "custom"]
    if sorted(unparsed) != sorted(parsers):
        raise TypeError(f"[{section.name}]: custom keys {unparsed}, parsers {list(parsers)}")
    check_keys(src, table, section)
    keys = {key.name: key for key in section.keys}
    return build(
        **{keys[name].attribute: _value(src, table, section, keys[name], parsers) for name in table}
    )


def _value(
    src: ConfigSource, table: TOMLTable, section: Section, key: Key, parsers: Mapping[str, Parser]
) -> object:
    match key.kind:
        case "integer":
            return src.integer(table, section.name, key.name, key.bound)
        case "number":
            return src.number(table, section.name, key.name, key.bound)
        case "choice":
            return src.choice(table, section.name, key.name, key.choices)
        case "string":
            return src.string(table, section.name, key.name)
        case "custom":
            return parsers[key.name](src, table)


def toml_value(value: object) -> str:
    """``value`` written as TOML (``1e-5``, ``"token"``, ``["q_proj"]``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, float):
        mantissa, _, exponent = repr(value).partition("e")
        return f"{mantissa}e{int(exponent)}" if exponent else mantissa
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = ", ".join(f"{name} = {toml_value(item)}" for name, item in value.items())
        return f"{{ {pairs} }}" if pairs else "{}"
    raise TypeError(f"no TOML for {value!r}")


def scaffold_toml(section: Section, values: Mapping[str, object] | None = None) -> str:
    """The ``[section]`` table the scaffold writes: every key with its comment, set to
    ``values[name]``, else to its scaffold value, else to its default."""
    lines = [f"[{section.name}]"]
    for key in section.keys:
        value = (values or {}).get(key.name, key.default if key.scaffold is None else key.scaffold)
        setting = f"{'# ' if key.commented else ''}{key.name} = {toml_value(value)}"
        lines.append(f"{setting.ljust(max(len(setting) + 2, _COMMENT_COLUMN))}# {key.comment}")
    return "\n".join(lines) + "\n"


def markdown_table(*sections: Section) -> str:
    """The docs' key table of ``sections``: a row per key (or per keys that share one)."""
    lines = ["| Section / key | Default | Meaning |", "|---|---|---|"]
    for section in sections:
        rows: list[list[Key]] = []
        for key in section.keys:
            if key.joins_row:
                rows[-1].append(key)
            else:
                rows.append([key])
        for index, row in enumerate(rows):
            names = [f"`{key.name}`" for key in row]
            if index == 0:
                names[0] = f"`[{section.name}] {row[0].name}`"
            defaults = ", ".join(_docs_default(key) for key in row)
            lines.append(f"| {', '.join(names)} | {defaults} | {row[0].docs} |")
    return "\n".join(lines) + "\n"


def _docs_default(key: Key) -> str:
    if key.docs_default:
        return key.docs_default
    if key.required:
        return "required"
    if key.default is None or key.default == "":
        return "–"
    if key.default == 0 and isinstance(key.default, float):
        return "0"  # reads as "off", as the docs say it
    text = toml_value(key.default)
    return text if isinstance(key.default, int | float) else f"`{text}`"


# --- [experiment] ---------------------------------------------------------------------------------

_ROLLOUT = Key(
    "rollout",
    "custom",
    required=True,
    comment="the rollout's folder, rollouts/<rollout>/",
    docs="the rollout's folder, `rollouts/<rollout>/`",
)
_ENTRYPOINT = Key(
    "entrypoint",
    "custom",
    required=True,
    scaffold="main.py",
    comment="the file in it that starts the rollout server",
    docs="the file inside the rollout's folder that starts its server (e.g. `main.py`)",
)
_DATASET = Key(
    "dataset",
    "custom",
    required=True,
    comment="CSV, JSONL or Parquet, relative to the workspace",
    docs="the rows: a CSV, JSONL or Parquet file (relative to the workspace)",
)
_BRANCH = Key(
    "branch",
    "custom",
    scaffold="main",
    commented=True,
    comment="provenance: the branch the rollout code is from",
    docs="the branch the rollout code comes from; provenance, it selects nothing",
)
_COMMIT_SHA = Key(
    "commit_sha",
    "custom",
    scaffold="0123abc",
    commented=True,
    comment="or the commit (7 to 40 hex digits), not both",
    docs="the commit the rollout code comes from (7 to 40 hex digits), instead of `branch`; "
    "provenance, it selects nothing",
)

EVAL_EXPERIMENT = Section(
    "experiment",
    (
        _ROLLOUT,
        _ENTRYPOINT,
        Key(
            "model_path",
            "custom",
            required=True,
            scaffold="embedded",
            comment="or openai:<base_url>[:<model>], or a LiteLLM id provider/model",
            docs='the policy: `"embedded"`, `"openai:<base_url>[:<model>]"`, a LiteLLM id '
            'such as `"openai/gpt-4o-mini"`, or `"torch:<checkpoint dir>"`; see '
            "[gateway](gateway.md#policies)",
        ),
        _DATASET,
        _BRANCH,
        _COMMIT_SHA,
    ),
)

TRAIN_EXPERIMENT = Section(
    "experiment",
    (
        _ROLLOUT,
        _ENTRYPOINT,
        Key(
            "model",
            "custom",
            required=True,
            scaffold="embedded",
            comment="SmolLM2-135M-Instruct, or a local HuggingFace-format model dir",
            docs='`"embedded"` or a local HuggingFace-format directory',
        ),
        _DATASET,
        _BRANCH,
        _COMMIT_SHA,
    ),
)

# --- [evaluation] ---------------------------------------------------------------------------------

#: Also the training's, where it must be above 0.
_PASS_THRESHOLD = Key(
    "pass_threshold",
    "number",
    default=1.0,
    bound="any",
    comment="a rollout passes when its reward is at least this",
    docs="a rollout passes when its reward is at least this",
)

EVALUATION = Section(
    "evaluation",
    (
        Key(
            "limit",
            "custom",
            scaffold=5,
            commented=True,
            comment="only the first N rows (non-positive: all)",
            docs="evaluate only the first N rows (a non-positive number: all); `--rows` "
            "overrides it",
            docs_default="all",
        ),
        Key(
            "n",
            "integer",
            default=1,
            comment="runs per row (pass@k needs n >= 2)",
            docs="runs per row (pass@k needs n ≥ 2)",
        ),
        Key(
            "batch_size",
            "integer",
            scaffold=4,
            commented=True,
            comment="rollouts in flight (default: the server's capacity)",
            docs="rollouts in flight; `--max-in-flight` overrides it",
            docs_default="the server's capacity, else 4",
        ),
        _PASS_THRESHOLD,
        Key(
            "agent_workflow_timeout_s",
            "number",
            default=450.0,
            scaffold=300,
            comment="seconds a rollout's agent workflow may take",
            docs="seconds the agent workflow of one rollout may take",
            field="agent_timeout_sec",
        ),
        Key(
            "grader_timeout_s",
            "number",
            default=150.0,
            scaffold=30,
            comment="seconds its grader may take",
            docs="seconds the grader of one rollout may take",
            field="grader_timeout_sec",
        ),
    ),
)

# --- [training] -----------------------------------------------------------------------------------

TRAINING = Section(
    "training",
    (
        Key(
            "steps",
            "integer",
            aliases=("max_steps", "num_steps", "total_training_steps"),
            default=10,
            scaffold=4,
            comment="optimiser steps; each runs rollouts, grades them, updates once",
            docs="optimiser steps",
        ),
        Key(
            "prompts_per_step",
            "integer",
            aliases=("batch_size", "train_batch_size", "per_device_train_batch_size"),
            default=4,
            scaffold=2,
            comment="dataset rows per step",
            docs="rows per step, rollouts per row",
        ),
        Key(
            "group_size",
            "integer",
            aliases=("num_generations", "n_samples_per_prompt", "rollout_n", "n_samples"),
            default=4,
            comment="rollouts per row; each is scored against its row's others",
            joins_row=True,
        ),
        Key(
            "learning_rate",
            "number",
            aliases=("lr",),
            default=1e-5,
            comment="AdamW, after a linear warm-up over a tenth of the steps",
            docs="AdamW, with a linear warm-up over a tenth of the steps",
        ),
        Key(
            "loss",
            "choice",
            default="ppo_clip",
            choices=("ppo_clip", "gspo", "cispo"),
            comment='"ppo_clip" (token ratio), "gspo" (sequence ratio), "cispo" (IS weight)',
            docs="the objective: PPO's clipped token ratio (`\"ppo_clip\"`), GSPO's clipped "
            'sequence ratio (`"gspo"`) or CISPO\'s clipped importance weight on the '
            'log-likelihood (`"cispo"`); see [the loss](#the-loss-osmosis_aitraingrpo)',
        ),
        Key(
            "clip_low",
            "number",
            bound="non-negative",
            commented=True,
            scaffold=0.2,
            comment="the ratio is clipped to [1 - clip_low, 1 + clip_high]; default per loss",
            docs="clip bounds of the ratio (CISPO: of its weight)",
            docs_default="0.2 (`gspo`: 3e-4, `cispo`: 1)",
        ),
        Key(
            "clip_high",
            "number",
            bound="non-negative",
            commented=True,
            scaffold=0.28,
            comment="a higher upper bound lets rare good tokens grow (DAPO)",
            joins_row=True,
            docs_default="0.28 (`gspo`: 4e-4, `cispo`: 3)",
        ),
        Key(
            "dual_clip",
            "number",
            bound="non-negative",
            commented=True,
            scaffold=3.0,
            docs_default="3 (0 where `1 + clip_high` ≥ 3)",
            comment="a token with advantage A < 0 loses at most -A x this (0: off)",
            docs="dual clip (`ppo_clip`, `gspo`): the loss of a token with a negative "
            "advantage `A` is at most `-A × dual_clip` however far its ratio rose, so a stale "
            "or mismatched token cannot dominate the update (0: off); see [off-policy "
            "correction](#off-policy-correction)",
        ),
        Key(
            "normalisation",
            "choice",
            default="token",
            choices=("token", "sequence", "constant"),
            comment='loss over all tokens ("token"), per rollout ("sequence"), or "constant"',
            docs='`"token"` (DAPO), `"sequence"` (GRPO) or `"constant"` (Dr. GRPO: each '
            "rollout's tokens summed and divided by `max_tokens`)",
        ),
        Key(
            "epochs",
            "integer",
            aliases=("ppo_epochs", "num_iterations", "num_train_epochs"),
            default=1,
            comment="passes over a step's rollouts",
            docs="passes over a step's rollouts, each in `mini_batches` optimiser steps "
            "(see [epochs and mini-batches](#epochs-and-mini-batches))",
        ),
        Key(
            "mini_batches",
            "integer",
            default=1,
            comment="optimiser steps per pass, each over a share of the rollouts",
            joins_row=True,
        ),
        Key(
            "credit",
            "choice",
            default="outcome",
            choices=("outcome", "turn"),
            commented=True,
            comment='"turn": a turn\'s tokens also get credit from the turn rewards set',
            docs='`"outcome"`: every token gets its rollout\'s advantage; `"turn"`: a turn\'s '
            "tokens also get one from the turn rewards a workflow or grader set "
            "([credit per turn](#credit-per-turn))",
        ),
        Key(
            "turn_discount",
            "number",
            default=0.5,
            bound="non-negative",
            commented=True,
            comment="with credit = \"turn\": a turn's return is r + discount x the next's",
            docs="with `\"turn\"`: γ of a turn's return and λ, the weight of a turn's advantage "
            "beside the outcome's",
        ),
        Key(
            "turn_weight",
            "number",
            default=0.5,
            bound="non-negative",
            commented=True,
            comment='with credit = "turn": the weight of a turn\'s advantage',
            joins_row=True,
        ),
        Key(
            "overlong",
            "choice",
            default="keep",
            choices=("keep", "mask", "penalty"),
            commented=True,
            comment='replies cut at max_tokens: "keep", "mask" (no loss), "penalty" (DAPO)',
            docs="rollouts a call of which stopped at `max_tokens`: trained as they are "
            '(`"keep"`), left out of the loss but not of their group (`"mask"`), or rewarded '
            'less near the limit (`"penalty"`, DAPO); see [overlong replies](#overlong-replies)',
        ),
        Key(
            "overlong_buffer",
            "integer",
            default=0,
            bound="non-negative",
            commented=True,
            comment='with "penalty": it grows from 0 to -1 over the last N tokens',
            docs='with `"penalty"`: the last tokens before `max_tokens` over which it grows '
            "from 0 to -1",
            docs_default="`max_tokens` / 5",
        ),
        Key(
            "advantage",
            "choice",
            default="grpo",
            choices=("grpo", "rloo"),
            comment='baseline: the group\'s mean ("grpo") or the mean of the others ("rloo")',
            docs='the baseline a reward is compared with: the mean of its group (`"grpo"`) or '
            'the mean of the group\'s other rollouts (`"rloo"`, leave-one-out)',
        ),
        Key(
            "advantage_scale",
            "choice",
            choices=("std", "none"),
            commented=True,
            scaffold="std",
            comment='divide by the row\'s reward std ("std") or not ("none"); default per baseline',
            docs='`"std"` (GRPO) or `"none"` (Dr. GRPO; RLOO\'s reference estimator)',
            docs_default='`"std"` (`rloo`: `"none"`)',
        ),
        Key(
            "kl_beta",
            "number",
            aliases=("beta", "kl_coef", "kl_loss_coef", "init_kl_coef"),
            default=0.0,
            bound="non-negative",
            comment="KL penalty to the initial model (> 0 loads a second copy)",
            docs="KL to the initial policy (loads a second copy of the model)",
        ),
        Key(
            "eval_rows",
            "number",
            default=0.2,
            scaffold=2,
            comment="held-out rows (not trained on), evaluated at start and end",
            docs="held-out split: a row count (≥ 1) or a fraction of the dataset",
        ),
        Key(
            "eval_dataset",
            "string",
            scaffold="data/heldout.jsonl",
            commented=True,
            comment="or a held-out file of its own (instead of eval_rows)",
            docs='a held-out file (`"data/heldout.jsonl"`, relative to the workspace; any '
            "dataset format), evaluated as it is instead of splitting `dataset`, whose rows "
            "then all train; not with `eval_rows` (a `--set` of either replaces the file's "
            "other, and the run says so). The journal's `start` event records its path",
        ),
        Key(
            "eval_every",
            "integer",
            default=0,
            bound="non-negative",
            comment="also evaluate every N steps (0: only at start and end)",
            docs="held-out eval every N steps (always at start and end)",
        ),
        Key(
            "eval_samples",
            "integer",
            default=1,
            comment="rollouts per held-out row; > 1 (eval_temperature > 0) adds pass@k",
            docs="rollouts per held-out row; above 1 (with `eval_temperature` > 0) each "
            "evaluation also reports pass@1..k, estimated as `osmosis eval` does (the unbiased "
            "estimator, averaged over the rows)",
        ),
        Key(
            "report_to",
            "custom",
            default=(),
            scaffold=("tensorboard",),
            commented=True,
            comment="trackers: tensorboard, wandb, mlflow, trackio",
            docs='experiment trackers that get every step and evaluation: any of `"tensorboard"`, '
            '`"wandb"`, `"mlflow"`, `"trackio"` (`pip install \'osmosis-ai[track]\'`); see '
            "[Trackers](#trackers)",
        ),
        Key(
            "record_sequences",
            "integer",
            default=0,
            bound="non-negative",
            comment="write the first N steps' training sequences to sequences/ (0: none)",
            docs="write the training sequences of the first N steps to "
            "`sequences/step-NNNN.jsonl`: each as segments of text that carry loss (the "
            "policy's replies) or not (prompt, tool results, template), redacted; see "
            "[What the learner trains on](#what-the-learner-trains-on)",
        ),
        Key(
            "checkpoint_every",
            "integer",
            default=1,
            scaffold=2,
            comment="checkpoint every N steps and at the end; a rerun resumes there",
            docs="checkpoint every N steps (always at the end)",
        ),
        replace(_PASS_THRESHOLD, bound="positive"),
        Key(
            "temperature",
            "number",
            default=1.0,
            bound="non-negative",
            comment="sampling temperature of every training rollout's model call",
            docs="sampling, imposed by the gateway on every call; the learner scores tokens at "
            "the same temperature",
        ),
        Key(
            "max_tokens",
            "integer",
            aliases=(
                "max_completion_length",
                "max_new_tokens",
                "response_length",
                "max_response_length",
            ),
            default=256,
            scaffold=64,
            comment="token limit of every model call",
            joins_row=True,
        ),
        Key(
            "eval_temperature",
            "number",
            default=0.0,
            bound="non-negative",
            comment="sampling temperature of the held-out evaluations (0: greedy)",
            docs="sampling temperature of the held-out evaluations (0: greedy, so two points "
            "compare policies, not luck)",
        ),
        Key(
            "max_minutes",
            "number",
            default=0.0,
            bound="non-negative",
            comment="stop once the steps took this many minutes (0: no limit)",
            docs="stop once the steps took this long in all (0: no limit); see below",
        ),
        Key(
            "precision",
            "choice",
            default="auto",
            choices=("auto", "bf16", "fp32"),
            comment='the update: "bf16" autocast, "fp32", or bf16 where it is native',
            docs='the update\'s forward pass under bf16 autocast (`"bf16"`), in `"fp32"`, or '
            "bf16 where the device computes it natively: a GPU of compute capability 8.0+, a "
            'CPU with AVX512-BF16 or AMX (about twice as fast); never on MPS. `"bf16"` '
            "where the device would emulate it is refused",
        ),
        Key(
            "token_budget",
            "integer",
            default=1024,
            comment="tokens per micro-batch of the update; lower it on out of memory",
            docs="tokens per micro-batch of the update; lower it when memory runs out",
        ),
        Key(
            "max_batch_size",
            "integer",
            default=64,
            comment="most model calls the torch engine generates together",
            docs="most model calls the torch engine generates together; fewer when their KV "
            "cache (prompt + `max_tokens` each) would not fit in a quarter of the device's free "
            "memory. A step's rollouts start together, so their first calls share one prefill",
        ),
        Key(
            "max_staleness",
            "integer",
            default=0,
            bound="non-negative",
            comment="0: synchronous; S >= 1: the next S steps' rollouts run during an update",
            docs="asynchronous training: rollouts of the next S steps keep running while a step "
            "updates, and no token a step trains on was generated by weights more than S "
            "versions older than those it updates (0: synchronous); see "
            "[asynchronous training](#asynchronous-training-max_staleness)",
        ),
        Key(
            "resample_zero_gradient",
            "integer",
            default=0,
            bound="non-negative",
            comment="rerun a row whose rollouts all got one reward, up to N times",
            docs="dynamic sampling: rerun an all-equal group up to N times (0: skip it)",
        ),
        Key(
            "device",
            "custom",
            default="auto",
            comment='"auto" (a GPU when torch sees one, else the CPU), "cpu", "cuda:N"',
            docs='where the learner and the torch engine run: `"auto"` (CUDA when torch sees a '
            'GPU, else the CPU), `"cpu"`, `"cuda"`, `"cuda:N"`, `"mps"`; see [Devices](#devices)',
        ),
        Key(
            "lora_rank",
            "integer",
            default=0,
            bound="non-negative",
            comment="0: train every weight; r > 0: train a LoRA adapter of rank r",
            docs="0: full fine-tuning; r > 0: train a LoRA adapter of rank r ([LoRA](#lora))",
        ),
        Key(
            "lora_alpha",
            "number",
            scaffold=32,
            commented=True,
            comment="with lora_rank: the adapter's scale is alpha / rank (2 x rank)",
            docs="the adapter's scale is `lora_alpha / lora_rank` (only with `lora_rank`)",
            docs_default="2 × `lora_rank`",
        ),
        Key(
            "lora_dropout",
            "number",
            default=0.0,
            bound="non-negative",
            commented=True,
            comment="with lora_rank: dropout on the adapter's input in the update",
            docs="dropout on the adapter's input during the update (only with `lora_rank`)",
        ),
        Key(
            "lora_target_modules",
            "custom",
            default="all-linear",
            commented=True,
            comment="with lora_rank: the layers it wraps, or a list of names",
            docs="the layers the adapter wraps: every linear layer of the attention and MLP "
            'blocks, or a list of module names such as `["q_proj", "v_proj"]` (only with '
            "`lora_rank`)",
        ),
        Key(
            "keep_checkpoints",
            "integer",
            default=1,
            comment="how many of the newest checkpoints stay on disk",
            docs="how many of the newest checkpoints stay on disk (`osmosis train export --step`)",
        ),
        Key(
            "engine",
            "choice",
            default="torch",
            choices=("torch", "vllm"),
            comment='what generates: the learner\'s model, or "vllm" (a [vllm] table)',
            docs='what generates the rollouts: the learner\'s own model (`"torch"`) or a vLLM '
            'server (`"vllm"`, set up by `[vllm]`; see [vLLM](#vllm-as-the-engine))',
        ),
        Key(
            "tool_format",
            "choice",
            default="auto",
            choices=("auto", "native", "instruction"),
            comment='tool calls: the model\'s own syntax ("native"), or "instruction"',
            docs='how the policy calls tools: `"native"` (the model\'s own syntax, rendered by '
            'its chat template: hermes\'s `<tool_call>`), `"instruction"` (a JSON format '
            'described in the system message), or `"auto"` (native when the template has it); '
            "see [tool calls](#tool-calls-in-the-models-own-format)",
        ),
        Key(
            "tis_cap",
            "number",
            bound="non-negative",
            commented=True,
            scaffold=2.0,
            comment="> 0: weight tokens by the learner/engine ratio, capped (gspo: 2)",
            docs="importance sampling against the policy that generated: weight each policy "
            "token's loss by `π_learner / π_engine`, truncated at `tis_cap` or masked outside "
            "`[tis_floor, tis_cap]` (0: off); see [off-policy "
            "correction](#off-policy-correction)",
            docs_default="0 (`gspo`: 2)",
        ),
        Key(
            "tis_mode",
            "choice",
            choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
            commented=True,
            scaffold="token_truncate",
            comment="per token or sequence, truncated or masked (gspo: sequence_truncate)",
            docs="with `tis_cap`: the ratio per token or per sequence (its geometric mean), "
            'truncated at the cap (`"*_truncate"`) or masked outside the band (`"*_mask"`, '
            "IcePop)",
            docs_default='`"token_truncate"` (`gspo`: `"sequence_truncate"`)',
        ),
        Key(
            "tis_floor",
            "number",
            default=0.0,
            bound="non-negative",
            commented=True,
            scaffold=0.5,
            comment='with a "*_mask" tis_mode: a ratio below this is masked too',
            docs='with a `"*_mask"` `tis_mode`: the band\'s lower bound (IcePop: 0.5, with '
            "`tis_cap = 5`; 0: none)",
        ),
        Key(
            "seed",
            "integer",
            default=0,
            bound="non-negative",
            comment="picks the held-out rows and each step's rows",
            docs="the held-out split and each step's rows",
        ),
    ),
)

# --- [vllm] (not scaffolded: the scaffold trains with the torch engine) ---------------------------

VLLM = Section(
    "vllm",
    (
        Key(
            "python",
            "custom",
            default=sys.executable,
            docs="the interpreter of the environment where vLLM is installed (a relative path "
            "is the workspace's)",
            docs_default="this interpreter",
        ),
        Key(
            "url",
            "custom",
            default="",
            docs="attach to a vLLM server you started (with `VLLM_SERVER_DEV_MODE=1`) instead "
            "of starting one",
        ),
        Key(
            "dtype",
            "choice",
            default="auto",
            choices=("auto", "bfloat16", "float16", "half", "float32"),
            docs='`"auto"`, `"bfloat16"`, `"float16"`, `"float32"`; full weights are pushed in it',
        ),
        Key(
            "max_model_len",
            "integer",
            default=0,
            docs="the server's context length",
            docs_default="the model's",
        ),
        Key(
            "gpu_memory_utilization",
            "number",
            default=0.0,
            docs="the share of the GPU vLLM takes: lower it (0.3–0.5) when the learner shares "
            "the GPU. On the CPU, unset, the trainer sizes the KV cache "
            "([vLLM as the engine](#vllm-as-the-engine))",
            docs_default="vLLM's (0.9)",
        ),
        Key(
            "args",
            "custom",
            default=(),
            docs='extra server flags (`["--enforce-eager"]`, `["--kv-cache-memory-bytes", '
            '"2000000000"]`) and environment (`{ VLLM_LOGGING_LEVEL = "WARNING" }`)',
        ),
        Key("env", "custom", default={}, joins_row=True),
        Key(
            "start_timeout_sec",
            "number",
            default=600.0,
            docs="how long the server may take to come up",
        ),
    ),
)
