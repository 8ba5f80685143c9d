"""The agent-framework examples (Strands, the OpenAI Agents SDK, LangGraph, Pydantic AI)
trained as shipped: the real frameworks behind a real rollout server (a child process), the
embedded model, ``osmosis train run``'s entry point in this process (``run_training``, as the
CLI calls it, without the CLI's start-up) with ``--set training.steps=2`` (and a smaller
batch, for time). What the learner got is read back from ``sequences/step-0001.jsonl``
(``record_sequences = 1`` in each config): a framework's multi-turn history must become one
exact sequence per rollout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.train.training_project import lines as _lines
from tests.train.training_project import train_here

pytestmark = [pytest.mark.slow, pytest.mark.whole_run, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FRAMEWORKS = (
    "strands_calculator",
    "openai_agents_calculator",
    "langgraph_calculator",
    "pydantic_ai_calculator",
)
#: Two steps of 2 rows x 4 rollouts (the configs train 4 x 8), one held-out row.
SMALL = (
    "training.steps=2",
    "training.prompts_per_step=2",
    "training.group_size=4",
    "eval.rows=1",
    "sampling.max_tokens=64",
)
#: The untrained model solves few rows at temperature 0.8 (none in the first two steps of a
#: shipped Strands run), so the test samples closer to its greedy answers and runs a group
#: whose rewards all agree up to twice more: a step then has a group to train on (with once
#: more, all 32 rollouts of an OpenAI Agents run's two steps failed once in CI). It generates in
#: fp32, as on every CPU: bf16 generation (`"auto"` where the CPU computes bf16 natively)
#: samples other answers on each kind of CPU, and on one with AMX no Pydantic AI row was
#: solved in two steps.
VARIED = (
    "sampling.temperature=0.5",
    "algorithm.resample_zero_gradient=2",
    'engine.precision="fp32"',
)


def copy_example(example: str, root: Path) -> Path:
    """A copy of ``examples/<example>``; returns its training config."""
    workspace = root / example
    shutil.copytree(EXAMPLES / example, workspace, ignore=shutil.ignore_patterns(".osmosis"))
    return workspace / "configs" / "training" / f"{example}.toml"


def flags(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def check_one_exact_sequence_per_rollout(
    run_dir: Path, steps: int, *, varied: bool = True
) -> list[dict[str, Any]]:
    """The run's steps chained every rollout's turns into one sequence (no drift, no new
    context), with the template, the prompt and the tool results out of the loss, and
    trained on every step whose rewards varied (``varied``: there was one); returns step 1's
    recorded sequences."""
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), metrics
    for line in metrics:
        assert (line["drift"], line["new_contexts"], line["excluded"]) == (0, 0, {}), line
    records = _lines(run_dir / "sequences" / "step-0001.jsonl")
    (step_1,) = [
        e for e in _lines(run_dir / "events.jsonl") if e.get("step") == 1 and e["event"] == "step"
    ]
    statuses = {r["rollout_id"]: r["status"] for r in _lines(run_dir / "rollouts.jsonl")}
    assert all(statuses[rollout] == "success" for rollout in step_1["rollouts"]), statuses
    # One sequence per rollout the step kept (a resampled group's last attempt).
    assert sorted(r["rollout_id"] for r in records) == sorted(step_1["rollouts"])
    assert metrics[0]["sequences"] == len(records)
    several_turns = 0
    for record in records:
        segments = record["segments"]
        trained = [s["text"] for s in segments if s["trained"]]
        context = [s["text"] for s in segments if not s["trained"]]
        assert segments[0]["trained"] is False  # the prompt
        assert trained and record["trained_tokens"] == sum(
            s["tokens"] for s in segments if s["trained"]
        )
        # The chat template's own tokens open every turn and never carry loss.
        assert all("<|im_start|>" not in text for text in trained), record
        assert all("<|im_start|>" in text for text in context), record
        trajectory = run_dir / "rollouts" / record["rollout_id"] / "trajectory.json"
        turns = [s for s in json.loads(trajectory.read_text())["steps"] if s["source"] == "agent"]
        # Every tool result the model was sent is context: those of each model call but the
        # last (an agent stopped by its turn limit never sends its last results).
        results = [
            str(result["content"])
            for turn in turns[:-1]
            for result in (turn.get("observation") or {}).get("results", [])
        ]
        for result in results:
            assert any(result in text for text in context[1:]), (result, record)
        if results:
            several_turns += 1  # a tool call, its result, and the reply after it: one sequence
    assert several_turns, "no rollout of step 1 called the tool and answered after it"
    for line in metrics:
        trains = line["zero_gradient_groups"] < 2
        assert (line["tokens_trained"] > 0) == trains == (line["loss"] is not None), line
    if varied:
        assert any(m["zero_gradient_groups"] < 2 for m in metrics), "no reward varied"
    return records


@pytest.mark.parametrize("example", FRAMEWORKS)
async def test_a_framework_example_trains_as_shipped(tmp_path: Path, example: str) -> None:
    config = copy_example(example, tmp_path)
    outcome = await train_here(config, (*SMALL, *VARIED))
    assert outcome.steps_done == 2
    run_dir = config.parents[2] / ".osmosis" / "train" / example
    check_one_exact_sequence_per_rollout(run_dir, steps=2)
    # The run's log keeps what a user reads: no line per HTTP request (the framework's
    # client, the rollout server's access log), the server's own lines kept.
    logs = (run_dir / "logs.txt").read_text()
    assert "Application startup complete" in logs
    assert "HTTP Request:" not in logs and '"GET /rollout' not in logs, logs[-3000:]


async def test_agents_on_the_responses_and_messages_apis_train(tmp_path: Path) -> None:
    """The official ``openai`` client's Responses API and ``anthropic`` client's Messages API
    (streamed), through the rollout's endpoint: their tokens train as one exact sequence per
    rollout. Even rows speak Responses, odd rows Messages (``api_agents/``)."""
    workspace = tmp_path / "api_agents"
    shutil.copytree(Path(__file__).parent / "api_agents", workspace)
    config = workspace / "configs" / "training" / "api_agents.toml"
    outcome = await train_here(config, ("algorithm.resample_zero_gradient=1",))
    assert outcome.steps_done == 2
    run_dir = workspace / ".osmosis" / "train" / "api_agents"
    check_one_exact_sequence_per_rollout(run_dir, steps=2)
    rows = {
        r["row"] for r in _lines(run_dir / "rollouts.jsonl") if r["rollout_id"].startswith("step")
    }
    assert {row % 2 for row in rows} == {0, 1}, rows  # both APIs trained
