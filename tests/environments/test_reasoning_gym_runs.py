"""A reasoning-gym task evaluated and trained from a config file alone: real CLI runs, a
real stub model server (eval) and the tiny model (training), no rollouts/ folder."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.loop.rows import dataset_rows
from tests.environments.environment_runs import (
    eval_config,
    eval_run_dir,
    osmosis,
    training_config,
)
from tests.train.training_project import lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENVIRONMENT = """[environment]
reasoning_gym = "chain_sum"
size = 24
seed = 7
[environment.settings]
min_terms = 2
max_terms = 2
max_digits = 1
"""
_OPERANDS = re.compile(r"(\d+) ([+-]) (\d+) =")


def _answer(body: dict[str, Any]) -> StubReply:
    """Right (in tags) when the first operand is even, else no number at all (and "ok" to
    the run's check of the model before it starts)."""
    found = _OPERANDS.search(str(body["messages"][-1]["content"]))
    if found is None:
        return StubReply(content="ok")
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    if a % 2:
        return StubReply(content="I cannot say.")
    return StubReply(content=f"<answer>{a + b if op == '+' else a - b}</answer>")


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[ChatStub]:
    async with ChatStub(respond=_answer) as server:
        yield server


def _eval_config(root: Path, stub: ChatStub, evaluation: str = "") -> Path:
    model = f"openai:{stub.base_url}:stub-model"
    keys = evaluation or "agent_workflow_timeout_s = 30"
    return eval_config(root, "gym", model, ENVIRONMENT, keys)


async def test_a_task_evaluates_with_its_own_scorer_and_no_code(
    tmp_path: Path, stub: ChatStub
) -> None:
    config = _eval_config(tmp_path, stub)
    code, out = await osmosis(tmp_path, "eval", "run", str(config))
    assert code == 0, out
    run_dir = eval_run_dir(tmp_path)
    (rows_file,) = (tmp_path / ".osmosis" / "environments").iterdir()
    questions = [json.loads(line)["user_prompt"] for line in rows_file.read_text().splitlines()]
    assert len(questions) == 24
    index = lines(run_dir / "index.jsonl")
    assert len(index) == 24 and all(item["status"] == "success" for item in index)
    for item in index:
        first = int(_OPERANDS.search(questions[item["row_index"]]).group(1))  # type: ignore[union-attr]
        assert item["reward"] == (0.0 if first % 2 else 1.0), item
    # Every model call went through the gateway with the task's system prompt.
    calls = [r["body"] for r in stub.requests if _OPERANDS.search(str(r["body"]["messages"]))]
    assert len(calls) == 24
    assert all("<answer>" in body["messages"][0]["content"] for body in calls)
    assert all(body["max_tokens"] == 256 for body in calls)
    trajectory = json.loads((run_dir / "trajectories" / "row_0_run_0.json").read_text())
    assert "answer_tagged" in json.dumps(trajectory)


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (StubFailure(500, "upstream down"), "agent_error"),
        (StubReply(content="<answer>1</answer>", delay_sec=10), "timeout"),
    ],
    ids=["raises", "times-out"],
)
async def test_a_rollout_that_fails_is_recorded_failed_never_a_zero(
    tmp_path: Path, failure: StubFailure | StubReply, expected: str
) -> None:
    def respond(body: dict[str, Any]) -> StubFailure | StubReply:
        asked = _OPERANDS.search(str(body["messages"][-1]["content"]))
        return failure if asked else StubReply(content="ok")

    async with ChatStub(respond=respond) as stub:
        config = _eval_config(tmp_path, stub, "limit = 2\nagent_workflow_timeout_s = 2")
        code, out = await osmosis(tmp_path, "eval", "run", str(config))
    assert code == 3, out  # every rollout failed
    run_dir = eval_run_dir(tmp_path)
    index = lines(run_dir / "index.jsonl")
    assert len(index) == 2
    for item in index:
        assert item["status"] == "failed" and "reward" not in item, item
        assert expected in item["error_type"], item


async def test_without_reasoning_gym_installed_it_is_one_line_naming_the_install(
    tmp_path: Path, stub: ChatStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "blocked" / "reasoning_gym"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'reasoning_gym'\", name='reasoning_gym')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(blocked.parent))
    config = _eval_config(tmp_path / "ws", stub)
    code, out = await osmosis(tmp_path / "ws", "eval", "run", str(config))
    assert code == 2 and out.strip().count("\n") == 0, out
    assert "missing 'reasoning_gym'" in out and "pip install 'osmosis-ai[reasoning-gym]'" in out
    assert not (tmp_path / "ws" / ".osmosis").exists()


async def test_a_task_trains_two_steps_on_rows_disjoint_from_the_held_out_ones(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    settings = "steps = 2\n[eval]\nrows = 6\nevery = 2"
    config = training_config(tmp_path, "gym", tiny_model_dir, settings, ENVIRONMENT)
    code, out = await osmosis(tmp_path, "train", "run", str(config), limit_sec=300)
    assert code == 0, out
    run_dir = tmp_path / ".osmosis" / "train" / "gym"
    assert [m["step"] for m in lines(run_dir / "metrics.jsonl")] == [1, 2]
    (start,) = [e for e in lines(run_dir / "events.jsonl") if e["event"] == "start"]
    assert start["settings"]["environment"]["reasoning_gym"] == "chain_sum"
    # The run's rows: held-out questions are never trained on, and each rollout used its side.
    items, train, held_out = dataset_rows(load_train_config(config))
    trained = {items[i].prompt[-1]["content"] for i in train}
    held = {items[i].prompt[-1]["content"] for i in held_out}
    assert len(held) == 6 and len(trained) == 18 and not trained & held
    for rollout in (run_dir / "rollouts").iterdir():
        row = int(re.search(r"row-(\d+)", rollout.name).group(1))  # type: ignore[union-attr]
        assert row in (held_out if rollout.name.startswith("eval-") else train), rollout.name
