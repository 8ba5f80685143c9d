"""reasoning-gym tasks: a task's generator makes the rows, its scorer grades the replies.

The controller writes the rows once to a JSONL file under ``.osmosis/environments/`` (named
by the task and a digest of its settings), which the eval and the trainer then read like
any dataset. Each row's metadata says how to make its entry again (task, settings, seed,
index), so the grader scores with the very entry the generator made, not a JSON copy of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Iterator
from importlib.metadata import version
from types import ModuleType
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.config.source import ConfigSource, did_you_mean
from osmosis_ai.environments.config import EnvironmentConfig
from osmosis_ai.environments.served import policy_client
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
)

__all__ = [
    "ReasoningGymGrader",
    "ReasoningGymWorkflow",
    "check_task",
    "score_reply",
    "task_rows",
]

#: The metadata key of a row's recipe (task, settings, seed, index).
ROW_KEY = "reasoning_gym"
#: Entries drawn per row asked for before giving up on distinct questions.
_DRAWS_PER_ROW = 4


def _gym() -> ModuleType:
    return import_optional(
        "reasoning_gym", extra="reasoning-gym", feature="[environment] reasoning_gym"
    )


def check_task(src: ConfigSource, environment: EnvironmentConfig) -> None:
    """Refuse, at its line, a task reasoning-gym does not have, a setting its task does not
    take or refuses, and a system prompt it does not name.

    Raises:
        ConfigError: One line naming the key and the fix.
        MissingExtraError: reasoning-gym is not installed (the message names the command).
    """
    _gym()
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS

    task = str(environment.reasoning_gym)
    if task not in DATASETS:
        guess = did_you_mean(task, sorted(DATASETS))
        hint = f"did you mean {guess!r}? " if guess else ""
        raise src.error(
            ("environment", "reasoning_gym"),
            f"environment.reasoning_gym {task!r} is not a reasoning-gym "
            f"{version('reasoning-gym')} task; {hint}list them with: python -c "
            "'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'",
        )
    if environment.prompt not in SYSTEM_PROMPTS:
        raise src.error(
            ("environment", "prompt"),
            f"environment.prompt {environment.prompt!r} is not one of reasoning-gym's system "
            "prompts: " + ", ".join(SYSTEM_PROMPTS),
        )
    config_cls = DATASETS[task][1]
    accepted = [field.name for field in dataclasses.fields(config_cls)]
    for name in environment.settings:
        if name in ("seed", "size"):
            raise src.error(
                ("environment", "settings", name),
                f"environment.settings.{name}: set it as [environment] {name}",
            )
        if name not in accepted:
            guess = did_you_mean(name, accepted)
            hint = f"did you mean {guess!r}? " if guess else ""
            raise src.error(
                ("environment", "settings", name),
                f"environment.settings.{name}: {task} has no such setting; {hint}it takes "
                + ", ".join(a for a in accepted if a not in ("seed", "size")),
            )
    try:
        _dataset(task, _settings_text(environment.settings), environment.seed, 1)
    except (AssertionError, ValueError, TypeError) as exc:
        raise src.error(
            ("environment", "settings"),
            f"environment.settings: {task} refuses these settings: {exc or type(exc).__name__}",
        ) from None


def _settings_text(settings: dict[str, Any]) -> str:
    """``settings`` as a hashable key of `_dataset` (canonical JSON)."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=8)
def _dataset(task: str, settings: str, seed: int, size: int) -> Any:
    """The task's generator (a `ProceduralDataset`); one per recipe, per process."""
    return _gym().create_dataset(task, seed=seed, size=size, **json.loads(settings))


def task_rows(environment: EnvironmentConfig) -> Iterator[dict[str, Any]]:
    """``size`` rows of dataset form, each a question no other row has (a procedural task
    repeats itself; so no split of the rows puts one question on both sides).

    Raises:
        ConfigError: The task makes fewer distinct questions than ``size`` in
            ``4 × size`` draws.
    """
    from reasoning_gym.utils import SYSTEM_PROMPTS

    task, size = str(environment.reasoning_gym), environment.size
    settings = _settings_text(environment.settings)
    draws = size * _DRAWS_PER_ROW
    dataset = _dataset(task, settings, environment.seed, draws)
    seen: set[str] = set()
    for index in range(draws):
        entry = dataset[index]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        recipe = {"task": task, "settings": environment.settings, "seed": environment.seed}
        yield {
            "system_prompt": SYSTEM_PROMPTS[environment.prompt],
            "user_prompt": entry["question"],
            "ground_truth": str(entry["answer"]),
            "metadata": {ROW_KEY: {**recipe, "draws": draws, "index": index}},
        }
        if len(seen) == size:
            return
    raise ConfigError(
        f"[environment] size = {size}: {task} made only {len(seen)} different questions in "
        f"{draws} draws with these settings; lower size or widen [environment.settings]"
    )


def score_reply(reply: str, recipe: dict[str, Any]) -> tuple[float, bool]:
    """The task's own score of ``reply`` against the entry ``recipe`` makes again, and
    whether the reply put its answer in ``<answer>`` tags (without them, the whole reply
    is the answer)."""
    from reasoning_gym.utils import extract_answer

    settings = _settings_text(recipe["settings"])
    dataset = _dataset(recipe["task"], settings, recipe["seed"], recipe["draws"])
    tagged = extract_answer(reply)
    answer = tagged if tagged is not None else reply.strip()
    return float(dataset.score_answer(answer, dataset[recipe["index"]])), tagged is not None


class ReasoningGymWorkflow(AgentWorkflow):
    """One model call on the row's question (with its system prompt)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        async with policy_client() as policy:
            return [*ctx.prompt, await policy.reply(ctx.prompt)]


class ReasoningGymGrader(Grader):
    """The task's scorer on the last reply; ``answer_tagged`` says whether it used the
    ``<answer>`` tags the system prompt asks for."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        recipe = (ctx.metadata or {}).get(ROW_KEY)
        if not isinstance(recipe, dict):
            raise ConfigError(
                f"the row has no {ROW_KEY!r} metadata: ReasoningGymGrader grades the rows "
                "of an [environment] reasoning_gym task"
            )
        reply = next(
            (
                str(m.get("content") or "")
                for m in reversed(ctx.sample.messages)
                if m.get("role") == "assistant"
            ),
            "",
        )
        reward, tagged = await asyncio.to_thread(score_reply, reply, recipe)
        ctx.set_reward(reward)
        ctx.sample.metrics["answer_tagged"] = float(tagged)
