"""verifiers environments (its ``v1`` API): a taskset's tasks as rows, each played by the
environment's own agent loop (the ``null`` harness: a chat loop with the task's tools) against
the rollout's gateway endpoint, so every call is recorded and trainable; its rubric's
weighted reward is the grade and its reward functions' scores and metrics land in the sample.

This module runs in the Python that has ``verifiers`` (it pins ``openai < 3``: an environment
of its own, ``[environment] python``); ``python -m osmosis_ai.environments.verifiers rows
<size> <taskset>`` is how the controller gets the rows from there (`rows.make_rows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import sys
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.environments.served import (
    ENVIRONMENT_REWARD,
    missing_library,
    served_environment,
)
from osmosis_ai.errors import MissingExtraError
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, get_rollout_context
from osmosis_ai.rollout.sample import AgentWorkflowOutput

__all__ = ["VerifiersWorkflow", "episode_messages", "load_environment"]

#: The metadata key of a task row (its index in the taskset).
ROW_KEY = "verifiers"
#: Each rollout's key goes to verifiers' client through a variable of its own (its client
#: reads keys from the environment); "API_KEY" in the name keeps it from the harness process.
_KEY_VARIABLE = "OSMOSIS_ROLLOUT_API_KEY_{}"
_keys = itertools.count()


def _vf() -> Any:
    return import_optional("verifiers.v1", extra="verifiers", feature="[environment] verifiers")


def load_environment(taskset: str, max_turns: int) -> Any:
    """The environment of ``taskset`` (an importable module exporting one ``Taskset``),
    played by the ``null`` harness in a subprocess runtime (no sandbox, no compaction: the
    history only grows, so its calls chain into one training sequence)."""
    vf = _vf()
    config = {
        "taskset": {"id": taskset},
        "agent": {
            "harness": {"id": "null"},
            "runtime": {"type": "subprocess"},
            "max_turns": max_turns,
        },
    }
    return vf.load_environment(vf.resolve_env_config(config))


@functools.cache
def _served_environment() -> Any:
    spec = served_environment()
    return load_environment(spec["verifiers"], spec["max_turns"])


@functools.cache
def _tasks(size: int) -> list[Any]:
    return list(_served_environment().taskset.take(size))


_serving = contextlib.AsyncExitStack()
_serving_started: asyncio.Lock | None = None
_serving_on = False


async def _serve() -> Any:
    """The environment, its servers (the interception server, the tools) started once per
    process, for every rollout after."""
    global _serving_started, _serving_on
    if _serving_started is None:
        _serving_started = asyncio.Lock()
    async with _serving_started:
        environment = await asyncio.to_thread(_served_environment)
        if not _serving_on:
            await _serving.enter_async_context(environment.serving())
            _serving_on = True
    return environment


def episode_messages(trace: Any) -> list[dict[str, Any]]:
    """A trace's messages in the chat-completions form (a tool call's name and arguments
    under ``function``)."""
    messages: list[dict[str, Any]] = []
    for message in trace.messages:
        item = message.model_dump(exclude_none=True)
        if item.get("tool_calls"):
            item["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in item["tool_calls"]
            ]
        messages.append(item)
    return messages


class VerifiersWorkflow(AgentWorkflow):
    """One episode of the row's task, the policy reached at the rollout's gateway endpoint."""

    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        vf = _vf()
        spec = served_environment()
        environment = await _serve()
        recipe = (ctx.metadata or {}).get(ROW_KEY)
        tasks = await asyncio.to_thread(_tasks, spec["size"])
        if not isinstance(recipe, dict) or not 0 <= int(recipe.get("index", -1)) < len(tasks):
            raise ValueError(
                f"the row has no {ROW_KEY}.index metadata of one of the taskset's first "
                f"{len(tasks)} tasks: the rows of an [environment] verifiers come from it"
            )
        task = tasks[int(recipe["index"])]
        rollout = get_rollout_context()
        assert rollout is not None, "run() is called inside a rollout context"
        variable = _KEY_VARIABLE.format(next(_keys))
        os.environ[variable] = rollout.api_key or "none"
        sampling = {"max_tokens": spec["max_tokens"]} if spec["max_tokens"] else {}
        model = vf.ModelContext(
            model="policy",
            client=vf.EvalClientConfig(base_url=rollout.chat_completions_url, api_key_var=variable),
            sampling=vf.SamplingConfig(**sampling),
        )
        try:
            episode = await environment.run_episode(task, model)
        finally:
            del os.environ[variable]
        (trace,) = episode.traces
        if trace.errors:
            first = trace.errors[0]
            raise RuntimeError(f"the verifiers episode failed: {first.type}: {first.message}")
        scores = {f"reward_{name}": r.score for name, r in trace.rewards.items() if r is not None}
        return AgentWorkflowOutput(
            messages=episode_messages(trace),
            metrics={**trace.metrics, **scores, ENVIRONMENT_REWARD: float(trace.reward)},
        )


def _rows(taskset: str, size: int) -> list[dict[str, Any]]:
    """The first ``size`` tasks as rows: the task's prompt (for the viewer; the harness
    builds the messages itself) and its index."""
    tasks = list(load_environment(taskset, 1).taskset.take(size))
    rows = []
    for index, task in enumerate(tasks):
        prompt = task.data.prompt
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
        rows.append({"user_prompt": text, "metadata": {ROW_KEY: {"index": index}}})
    return rows


def main(argv: list[str]) -> int:
    """``rows <size> <taskset>``: the rows as JSON lines, or why not (one line on stderr,
    exit 2)."""
    size, taskset = int(argv[1]), argv[2]
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the rows' alone
            rows = _rows(taskset, size)
    except MissingExtraError as exc:
        print(missing_library(exc), file=sys.stderr)
        return 2
    except Exception as exc:  # the library's own error, whatever it is: one line
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    if len(rows) < size:
        print(f"it has {len(rows)} tasks, fewer than [environment] size = {size}", file=sys.stderr)
        return 2
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
