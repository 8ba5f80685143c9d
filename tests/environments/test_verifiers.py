"""A verifiers environment (its v1 API; ``examples/verifiers``' taskset, with a tool)
evaluated and trained from a config alone, in an environment of its own (``.venv-verifiers``,
`make install-verifiers`: verifiers pins openai < 3): real CLI runs, its own agent loop and
tool server, a real stub model server (eval) and the embedded model (training)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing import ChatStub, StubReply
from tests.environments.environment_runs import (
    ROOT,
    eval_config,
    eval_run_dir,
    library_python,
    osmosis,
    training_config,
)
from tests.train.training_project import lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TASKSETS = ROOT / "examples" / "verifiers"
_PAIR = re.compile(r"compute (\d+)\+(\d+)")


@pytest.fixture
def verifiers_python(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Python with ``verifiers``, and the example's taskset on the import path."""
    return library_python(".venv-verifiers", "install-verifiers", TASKSETS, monkeypatch)


def _environment(python: Path, extra: str = "") -> str:
    return f'[environment]\nverifiers = "add_tasks"\npython = "{python}"\nsize = 8\n{extra}'


def _adder(body: dict[str, Any]) -> StubReply:
    """Calls the tool on the task's numbers, then answers with its result (odd sums wrong)."""
    messages = body["messages"]
    found = _PAIR.search(json.dumps(messages))
    if found is None:
        return StubReply(content="ok")  # the run's check of the model
    if messages[-1]["role"] != "tool":
        arguments = json.dumps({"a": int(found.group(1)), "b": int(found.group(2))})
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": arguments},
        }
        return StubReply(content="", tool_calls=[call])
    total = int(messages[-1]["content"])
    return StubReply(content=str(total if total % 2 == 0 else total + 1))


async def test_a_taskset_with_a_tool_evaluates_through_the_gateway(
    tmp_path: Path, verifiers_python: Path
) -> None:
    async with ChatStub(respond=_adder) as stub:
        model = f"openai:{stub.base_url}:stub-model"
        environment = _environment(verifiers_python)
        config = eval_config(tmp_path, "add", model, environment, "agent_workflow_timeout_s = 120")
        code, out = await osmosis(tmp_path, "eval", "run", str(config))
        calls = [r["body"] for r in stub.requests if _PAIR.search(json.dumps(r["body"]))]
    assert code == 0, out
    run_dir = eval_run_dir(tmp_path)
    index = {item["row_index"]: item for item in lines(run_dir / "index.jsonl")}
    (rows,) = (tmp_path / ".osmosis" / "environments").iterdir()
    prompts = [json.loads(line)["user_prompt"] for line in rows.read_text().splitlines()]
    pairs = [_PAIR.search(prompt) for prompt in prompts]
    sums = [int(found.group(1)) + int(found.group(2)) for found in pairs if found]
    # The rubric's weighted sum: 1 for the right sum (even ones), 0.5 for using the tool.
    assert {row: item["reward"] for row, item in index.items()} == {
        row: 1.5 if total % 2 == 0 else 0.5 for row, total in enumerate(sums)
    }
    # Two calls a task, the tool offered in OpenAI's form; the second call's history is the
    # first's, then the reply and the tool's result.
    assert len(calls) == 2 * len(sums) == 16
    assert all(body["tools"][0]["function"]["name"] == "add" for body in calls)
    firsts = [body for body in calls if body["messages"][-1]["role"] == "user"]
    seconds = [body for body in calls if body["messages"][-1]["role"] == "tool"]
    for second in seconds:
        (first,) = [f for f in firsts if f["messages"] == second["messages"][: len(f["messages"])]]
        assert [m["role"] for m in second["messages"][len(first["messages"]) :]] == [
            "assistant",
            "tool",
        ]
    trajectory = json.loads((run_dir / "trajectories" / "row_0_run_0.json").read_text())
    text = json.dumps(trajectory)
    assert "reward_correct" in text and "tool_calls" in text and "environment_reward" in text


async def test_a_taskset_trains_two_steps_its_tool_turns_one_exact_sequence(
    tmp_path: Path, verifiers_python: Path
) -> None:
    """The embedded model (SmolLM2, which calls the tool): each rollout's calls, the tool's
    result between them, chain into one sequence with no drift."""
    environment = _environment(verifiers_python, "max_turns = 3\n")
    settings = (
        "steps = 2\nprompts_per_step = 2\ngroup_size = 2\n[sampling]\nmax_tokens = 48\n"
        "[eval]\nrows = 1\n"
    )
    config = training_config(tmp_path, "add", Path("embedded"), settings, environment)
    code, out = await osmosis(tmp_path, "train", "run", str(config), limit_sec=600)
    assert code == 0, out
    run_dir = tmp_path / ".osmosis" / "train" / "add"
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for line in metrics:
        assert (line["drift"], line["new_contexts"], line["excluded"]) == (0, 0, {}), line
        assert line["sequences"] == 4, line  # one a rollout
    # Some rollouts called the tool and answered after it: several calls, one sequence.
    assert sum(line["merges"] for line in metrics) > 0, metrics
    statuses = [r["status"] for r in lines(run_dir / "rollouts.jsonl")]
    assert statuses and all(status == "success" for status in statuses), statuses


@pytest.mark.parametrize(
    ("taskset", "python", "expected"),
    [
        ("vf_nowhere", True, "ModuleNotFoundError"),
        ("add_tasks", False, "pip install 'osmosis-ai[verifiers]'"),
    ],
    ids=["unknown", "not-installed"],
)
async def test_a_taskset_it_cannot_load_is_one_line_before_anything_starts(
    tmp_path: Path, verifiers_python: Path, taskset: str, python: bool, expected: str
) -> None:
    environment = _environment(verifiers_python).replace('"add_tasks"', f'"{taskset}"')
    if not python:
        environment = environment.replace(f'python = "{verifiers_python}"\n', "")
    config = eval_config(tmp_path, "add", "openai:http://127.0.0.1:9/v1:none", environment, "")
    code, out = await osmosis(tmp_path, "eval", "run", str(config))
    assert code == 2 and out.strip().count("\n") == 0, out
    assert f"environment.verifiers '{taskset}'" in out and expected in out, out
    assert not (tmp_path / ".osmosis" / "evals").exists()
