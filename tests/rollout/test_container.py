"""The in-container runner: agent_main and grader_main as a container runs them (a real
subprocess on a bare install's code paths, files in, files out)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_ai.rollout import ExecutionRequest
from osmosis_ai.rollout.container import (
    ContainerInput,
    ContainerPaths,
    ContainerResult,
    agent_main,
    grader_main,
)
from osmosis_ai.rollout.types import RolloutInitRequest
from tests.rollout.backend.process_workflows import Behave, Match, Settings

KEY = "sk-container-canary-0d3b"


@pytest.fixture
def paths(tmp_path: Path) -> ContainerPaths:
    paths = ContainerPaths(
        agent_logs_dir=tmp_path / "agent",
        verifier_logs_dir=tmp_path / "verifier",
        artifacts_dir=tmp_path / "artifacts",
        tests_dir=tmp_path / "tests",
    )
    paths.agent_logs_dir.mkdir()
    paths.tests_dir.mkdir()
    return paths


def _write_input(directory: Path, **fields: object) -> None:
    data = ContainerInput(rollout_id="c1", prompt=[{"role": "user", "content": "q"}], **fields)
    (directory / "container_input.json").write_text(data.model_dump_json())


def _result(directory: Path) -> ContainerResult:
    return ContainerResult.model_validate_json((directory / "container_result.json").read_bytes())


def test_agent_then_grader_round_trip(
    paths: ContainerPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_API_KEY", KEY)
    _write_input(paths.agent_logs_dir, metadata={"kind": "answer"})
    _write_input(paths.tests_dir, label="7", metadata={"kind": "answer"})
    assert agent_main(Behave, Settings(name="s", answer="7"), paths=paths) == 0
    agent = _result(paths.agent_logs_dir)
    assert agent.status == "success" and agent.sample is not None
    assert agent.output is not None and agent.output.messages == agent.sample.messages
    trajectory = json.loads((paths.agent_logs_dir / "trajectory.json").read_text())
    assert [step["source"] for step in trajectory["steps"]] == ["user", "agent"]
    assert grader_main(Match, paths=paths) == 0
    assert json.loads((paths.verifier_logs_dir / "reward.json").read_text()) == {"reward": 1.0}
    assert _result(paths.verifier_logs_dir).sample.reward == 1.0  # type: ignore[union-attr]


def test_failures_keep_their_category_and_never_the_key(
    paths: ContainerPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSMOSIS_API_KEY", KEY)
    _write_input(paths.agent_logs_dir, metadata={"kind": "raise"}, agent_timeout_sec=30)
    assert agent_main(Behave, paths=paths) == 1
    result = _result(paths.agent_logs_dir)
    assert result.err_category == "agent_error"
    assert result.err_message == "workflow raised ValueError: bad tool input"
    assert KEY not in (paths.agent_logs_dir / "container_result.json").read_text()


def test_no_sample_means_no_reward_file(paths: ContainerPaths) -> None:
    _write_input(paths.tests_dir, label="x", metadata={})
    assert grader_main(Match, paths=paths) == 1
    assert not (paths.verifier_logs_dir / "reward.json").exists()
    result = _result(paths.verifier_logs_dir)
    assert result.err_category == "validation_error" and "no sample" in str(result.err_message)


def test_an_invalid_input_names_the_field_without_echoing_it(
    paths: ContainerPaths,
) -> None:
    (paths.agent_logs_dir / "container_input.json").write_text(
        json.dumps({"prompt": "not a list", "api_key": KEY})
    )
    assert agent_main(Behave, paths=paths) == 1
    result = _result(paths.agent_logs_dir)
    assert result.err_category == "validation_error"
    assert "rollout_id" in str(result.err_message) and "prompt" in str(result.err_message)
    assert KEY not in (paths.agent_logs_dir / "container_result.json").read_text()


def test_runs_as_a_process_with_the_environment_for_paths(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    agent.mkdir()
    _write_input(agent, metadata={"kind": "artifact"})
    env = {
        **os.environ,
        "OSMOSIS_AGENT_LOGS_DIR": str(agent),
        "OSMOSIS_ARTIFACTS_DIR": str(tmp_path / "out"),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    code = "from osmosis_ai.rollout.container import agent_main; "
    code += "from tests.rollout.backend.process_workflows import Behave; "
    code += "raise SystemExit(agent_main(Behave))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Agent runner complete: status=success" in done.stdout
    assert (tmp_path / "out" / "note.txt").read_text() == "kept"


def test_a_request_and_its_phase_inputs_carry_the_same_rollout() -> None:
    request = ExecutionRequest(
        id="m1",
        prompt=[{"role": "user", "content": "q"}],
        label="42",
        metadata={"row": 3},
        agent_timeout_sec=30,
        grader_timeout_sec=5,
    )
    agent = ContainerInput.from_request(request, include_label=False, elapsed_sec=1.5)
    grader = ContainerInput.from_request(request, include_label=True)
    assert (agent.label, grader.label) == (None, "42")  # agents never see the ground truth
    for data in (agent, grader):
        assert (data.agent_timeout_sec, data.grader_timeout_sec) == (30, 5)
        assert data.api_key is None  # harnesses pass the key through the environment
    assert agent.elapsed_sec == 1.5
    assert grader.to_request(include_label=True) == dataclasses.replace(request, grade=True)
    assert agent.to_request(include_label=False).label is None


def test_a_wire_request_maps_to_the_execution_request() -> None:
    init = RolloutInitRequest(
        rollout_id="w1",
        initial_messages=[{"role": "user", "content": "q"}],
        chat_completions_url="http://127.0.0.1:9/v1",
        label="7",
        metadata={"k": 1},
        grade=False,
        agent_timeout_sec=12,
        grader_timeout_sec=3,
    )
    assert ExecutionRequest.from_init(init) == ExecutionRequest(
        id="w1",
        prompt=[{"role": "user", "content": "q"}],
        label="7",
        metadata={"k": 1},
        agent_timeout_sec=12,
        grader_timeout_sec=3,
        grade=False,
    )
