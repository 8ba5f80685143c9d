"""The agent-framework examples (Strands, the OpenAI Agents SDK) trained as shipped: the real
frameworks behind a real rollout server, the embedded model, ``osmosis train run`` in a
subprocess with ``--set training.steps=2`` (and a smaller batch, for time). What the learner
got is read back from ``sequences/step-0001.jsonl`` (``record_sequences = 1`` in both
configs): a framework's multi-turn history must become one exact sequence per rollout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FRAMEWORKS = ("strands_calculator", "openai_agents_calculator")
#: Two steps of 2 rows x 4 rollouts (the configs train 4 x 8), one held-out row.
SMALL = (
    "training.steps=2",
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.eval_rows=1",
    "training.max_tokens=64",
)


def copy_example(example: str, root: Path) -> Path:
    """A copy of ``examples/<example>``; returns its training config."""
    workspace = root / example
    shutil.copytree(EXAMPLES / example, workspace, ignore=shutil.ignore_patterns(".osmosis"))
    return workspace / "configs" / "training" / f"{example}.toml"


def flags(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def check_one_exact_sequence_per_rollout(run_dir: Path, steps: int) -> list[dict[str, Any]]:
    """The run's steps chained every rollout's turns into one sequence (no drift, no new
    context), with the template, the prompt and the tool results out of the loss, and
    trained on every step whose rewards varied; returns step 1's recorded sequences."""
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), metrics
    for line in metrics:
        assert (line["drift"], line["new_contexts"], line["excluded"]) == (0, 0, {}), line
    records = _lines(run_dir / "sequences" / "step-0001.jsonl")
    rollouts = [
        r for r in _lines(run_dir / "rollouts.jsonl") if r["rollout_id"].startswith("step-0001-")
    ]
    assert all(r["status"] == "success" for r in rollouts), rollouts
    # One sequence per rollout of the step.
    assert sorted(r["rollout_id"] for r in records) == sorted(r["rollout_id"] for r in rollouts)
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
        results = [
            str(result["content"])
            for step in json.loads(trajectory.read_text())["steps"]
            for result in (step.get("observation") or {}).get("results", [])
        ]
        for result in results:  # every tool result the agent got is context
            assert any(result in text for text in context[1:]), (result, record)
        if results and len(trained) > len(results):
            several_turns += 1  # a tool call, its result, and the reply after it: one sequence
    assert several_turns, "no rollout of step 1 called the tool and answered after it"
    varied = [m for m in metrics if m["zero_gradient_groups"] < 2]
    assert varied, "no step had a group whose rewards differed"
    for line in varied:
        assert line["tokens_trained"] > 0 and line["loss"] is not None, line
    return records


@pytest.mark.parametrize("example", FRAMEWORKS)
async def test_a_framework_example_trains_as_shipped(tmp_path: Path, example: str) -> None:
    config = copy_example(example, tmp_path)
    code, out = await _run(config, *flags(*SMALL), limit_sec=600)
    assert code == 0, out
    run_dir = config.parents[2] / ".osmosis" / "train" / example
    check_one_exact_sequence_per_rollout(run_dir, steps=2)
    # The run's log keeps what a user reads: no line per HTTP request (the framework's
    # client, the rollout server's access log), the server's own lines kept.
    logs = (run_dir / "logs.txt").read_text()
    assert "Application startup complete" in logs
    assert "HTTP Request:" not in logs and '"GET /rollout' not in logs, logs[-3000:]
