"""An OpenEnv environment evaluated and trained from a config alone, in an environment of its
own (``.venv-openenv``, `make install-openenv`: OpenEnv pins mcp < 2): real CLI runs, the
environment served on 127.0.0.1 by its package, a real stub model server (eval) and the
tiny model (training)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_ai.testing import ChatStub, StubReply
from osmosis_ai.viewer import Viewer
from tests.environments.environment_runs import (
    eval_config,
    eval_run_dir,
    library_python,
    osmosis,
    training_config,
)
from tests.train.training_project import lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENVS = Path(__file__).resolve().parent / "openenv_envs"


@pytest.fixture
def openenv_python(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Python with ``openenv``, and the tests' environments on the import path."""
    return library_python(".venv-openenv", "install-openenv", ENVS, monkeypatch)


def _environment(name: str, python: Path | None, extra: str = "") -> str:
    line = f'python = "{python}"\n' if python else ""
    return f'[environment]\nopenenv = "envs:{name}"\n{line}size = 10\n{extra}'


def _eval_config(root: Path, model: str, environment: str) -> Path:
    return eval_config(root, "env", model, environment, "agent_workflow_timeout_s = 60")


def _always_three(body: dict[str, Any]) -> StubReply:
    return StubReply(content="3")


async def test_an_episode_is_played_step_by_step_and_its_return_is_the_grade(
    tmp_path: Path, openenv_python: Path
) -> None:
    async with ChatStub(respond=_always_three) as stub:
        model = f"openai:{stub.base_url}:stub-model"
        config = _eval_config(tmp_path, model, _environment("GuessEnvironment", openenv_python))
        code, out = await osmosis(tmp_path, "eval", "run", str(config))
        calls = [r["body"] for r in stub.requests if "Guess" in json.dumps(r["body"])]
    assert code == 0, out
    run_dir = eval_run_dir(tmp_path)
    index = {item["row_index"]: item for item in lines(run_dir / "index.jsonl")}
    # Row i is episode seed i: the number is i, so "3" wins row 3 at once and no other.
    assert {row: item["reward"] for row, item in index.items()} == {
        row: 1.0 if row == 3 else 0.0 for row in range(10)
    }
    # One call a step: row 3 took one, the others their three tries, each call's history the
    # one before it plus the reply and what the environment said back.
    assert len(calls) == 1 + 9 * 3
    longest = max(calls, key=lambda body: len(body["messages"]))
    assert [m["role"] for m in longest["messages"]] == ["user", "assistant"] * 2 + ["user"]
    assert longest["messages"][1:4] == [
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "wrong, again"},
        {"role": "assistant", "content": "3"},
    ]
    trajectory = json.loads((run_dir / "trajectories" / "row_3_run_0.json").read_text())
    assert "environment_reward" in json.dumps(trajectory)
    # The viewer shows the run like any other: row 0's episode, its three tries.
    async with (
        Viewer(tmp_path / ".osmosis" / "evals") as viewer,
        httpx2.AsyncClient(base_url=viewer.served_url, timeout=30) as http,
    ):
        (run,) = (await http.get("/api/runs")).json()
        assert run["name"] == run_dir.name and run["status"] == "finished"
        path = f"/api/runs/{run_dir.name}/rollouts/{index[0]['rollout_id']}"
        steps = (await http.get(path)).json()["trajectory"]["steps"]
    assert [step["source"] for step in steps] == ["user", "agent"] * 3


@pytest.mark.parametrize(
    ("name", "python", "expected"),
    [
        ("TwoTextsEnvironment", True, "its action Pair has 2 text fields"),
        ("NotAnEnvironment", True, "envs:NotAnEnvironment is not an openenv Environment"),
        ("Nowhere", True, "module 'envs' has no 'Nowhere'"),
        ("GuessEnvironment", False, "pip install 'osmosis-ai[openenv]'"),
    ],
    ids=["two-texts", "not-an-env", "unknown", "not-installed"],
)
async def test_a_class_it_cannot_play_is_one_line_before_anything_starts(
    tmp_path: Path, openenv_python: Path, name: str, python: bool, expected: str
) -> None:
    environment = _environment(name, openenv_python if python else None)
    config = _eval_config(tmp_path, "openai:http://127.0.0.1:9/v1:none", environment)
    code, out = await osmosis(tmp_path, "eval", "run", str(config))
    assert code == 2 and out.strip().count("\n") == 0, out
    assert f"environment.openenv 'envs:{name}'" in out and expected in out, out
    assert not (tmp_path / ".osmosis" / "evals").exists()


async def test_an_environment_that_raises_is_a_failed_rollout_never_a_zero(
    tmp_path: Path, openenv_python: Path
) -> None:
    async with ChatStub(respond=_always_three) as stub:
        model = f"openai:{stub.base_url}:stub-model"
        environment = _environment("BrokenEnvironment", openenv_python)
        config = _eval_config(tmp_path, model, environment)
        code, out = await osmosis(tmp_path, "eval", "run", str(config))
    assert code == 3, out  # every rollout failed
    for item in lines(eval_run_dir(tmp_path) / "index.jsonl"):
        assert item["status"] == "failed" and "reward" not in item, item
        assert item["error_type"] == "agent_error", item


@pytest.mark.parametrize("credit", ["outcome", "turn"])
async def test_each_steps_reward_reaches_turn_credit(
    tmp_path: Path, tiny_model_dir: Path, openenv_python: Path, credit: str
) -> None:
    """Every episode's return is 1 and only its steps' rewards differ: under outcome credit
    no group has a gradient (no update in two steps); under turn credit each step trains."""
    turn_credit = "[algorithm.turn_credit]\n" if credit == "turn" else ""
    settings = f"steps = 2\n[eval]\nrows = 2\n{turn_credit}"
    environment = _environment("SplitEnvironment", openenv_python, "max_turns = 2\n")
    config = training_config(tmp_path, "env", tiny_model_dir, settings, environment)
    code, out = await osmosis(tmp_path, "train", "run", str(config), limit_sec=300)
    assert code == 0, out
    metrics = lines(tmp_path / ".osmosis" / "train" / "env" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for line in metrics:
        assert line["reward_mean"] == pytest.approx(1.0), line
        if credit == "outcome":
            assert line["zero_gradient_groups"] == 2 and line["loss"] is None, line
        else:
            assert line["zero_gradient_groups"] == 0 and line["tokens_trained"] > 0, line
