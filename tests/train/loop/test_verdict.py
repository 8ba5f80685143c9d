"""A run that trained little or nothing says so at its end; a finished run run again says
it is finished from its files; a workflow that never calls the model stops the run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.train.config import (
    SamplingConfig,
    TrainConfig,
    TrainExperimentConfig,
    TrainingConfig,
)
from osmosis_ai.train.loop.outcome import TrainingStopped
from osmosis_ai.train.loop.step import EQUAL_REWARDS
from osmosis_ai.train.loop.verdict import finished_run, training_verdict
from tests.train.training_project import lines, run, train_here, workspace, write_rows


def _config(training: TrainingConfig, temperature: float = 1.0) -> TrainConfig:
    experiment = TrainExperimentConfig(rollout="r", entrypoint="m.py", model="m", dataset=Path("d"))
    return TrainConfig(
        Path("c.toml"), Path("."), experiment, training, SamplingConfig(temperature=temperature)
    )


TRAINING = _config(TrainingConfig(steps=4, group_size=2), temperature=0.7)


def _steps(*no_update: str | None) -> list[dict[str, Any]]:
    return [{"step": n, "no_update": reason} for n, reason in enumerate(no_update, 1)]


def test_a_run_whose_steps_all_updated_has_nothing_to_say() -> None:
    assert training_verdict(_steps(None, None, None, None), TRAINING) is None
    assert training_verdict(_steps(EQUAL_REWARDS, None), TRAINING) is None  # half updated
    assert training_verdict([], TRAINING) is None


def test_no_updated_step_is_nothing_trained_with_the_reasons_and_what_to_try() -> None:
    verdict = training_verdict(_steps(EQUAL_REWARDS, EQUAL_REWARDS), TRAINING)
    assert verdict == (
        "nothing was trained: 0 of 2 steps updated the weights (every group's rewards were "
        "equal in 2). The rollouts of each row scored alike: try a higher temperature (now "
        "0.7), more rollouts per row (group_size, now 2), [algorithm] resample_zero_gradient = "
        '2 (or recipe = "dapo"), or a grader with partial credit'
    )


def test_few_updated_steps_is_little_trained_naming_each_reason() -> None:
    left_out = "every rollout was left out (failed 4)"
    verdict = training_verdict(_steps(left_out, left_out, None, left_out), TRAINING)
    assert verdict == (
        "little was trained: 1 of 4 steps updated the weights (every rollout was left out "
        "(failed 4) in 3)"
    )


def _journal(checkpoint: int, evals: list[int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"event": "start", "step": 0}]
    events += [{"event": "eval", "step": s, "pass_rate": 0.5, "mean_reward": 0.5} for s in evals]
    return [*events, {"event": "checkpoint", "step": checkpoint}]


def test_a_run_is_finished_once_its_last_step_is_checkpointed_and_evaluated() -> None:
    finished = finished_run(_journal(4, [0, 4]), _steps(None, None, None, None), TRAINING)
    assert finished is not None
    message, evals = finished
    assert message == (
        "nothing to do: it trained all 4 steps; to train further raise training.steps (or "
        "--fresh starts over)"
    )
    assert [point.step for point in evals] == [0, 4]
    assert finished_run(_journal(4, [0]), [], TRAINING) is None  # its last evaluation is due
    assert finished_run(_journal(2, [0, 2]), [], TRAINING) is None  # steps are left


def test_a_run_is_finished_once_its_steps_took_max_minutes() -> None:
    training = _config(TrainingConfig(steps=10, max_minutes=1.0))
    metrics = [{"step": 1, "generation_sec": 50.0}, {"step": 2, "update_sec": 20.0}]
    finished = finished_run(_journal(2, [0, 2]), metrics, training)
    assert finished is not None and "its 2 steps took max_minutes (1)" in finished[0]
    # A killed run's step after its checkpoint runs again: its time does not count.
    assert finished_run(_journal(1, [0, 1]), metrics, training) is None


@pytest.mark.whole_run
@pytest.mark.slow
async def test_a_task_never_solved_ends_saying_nothing_was_trained_and_a_rerun_loads_nothing(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The newcomer's case: two rollouts per row, a reward that never varies. Every step says
    why it did not update, the run ends with the verdict, and running it again prints the
    same results from the run's files without loading the model."""
    config = workspace(tmp_path / "ws", tiny_model_dir, "steps = 2")
    write_rows(config.parents[2], metadata={"reward": 0.0})
    code, out = await run(config, "--set", "training.group_size=2")
    assert code == 0, out
    step_lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(step_lines) == 2
    assert all(line.endswith(f"no update: {EQUAL_REWARDS}") for line in step_lines), out
    last = " ".join(out.split())
    assert last.endswith(
        "warning: nothing was trained: 0 of 2 steps updated the weights (every group's rewards "
        "were equal in 2). The rollouts of each row scored alike: try a higher temperature "
        "(now 1), more rollouts per row (group_size, now 2), [algorithm] resample_zero_gradient "
        '= 2 (or recipe = "dapo"), or a grader with partial credit'
    ), out
    started = time.monotonic()
    code, again = await run(config, "--set", "training.group_size=2")
    elapsed = time.monotonic() - started
    assert code == 0, again
    assert "nothing to do: it trained all 2 steps" in again
    assert "tool calls:" not in again  # said once the model is loaded: it was not
    assert "held-out results" in again and "warning: nothing was trained" in again
    print(f"a finished run's rerun took {elapsed:.1f} s")


@pytest.mark.whole_run
@pytest.mark.slow
async def test_a_workflow_that_never_calls_the_model_stops_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = workspace(tmp_path / "ws", tiny_model_dir, "steps = 2")
    write_rows(config.parents[2], metadata={"no_call": True})
    with pytest.raises(TrainingStopped) as stopped:
        await train_here(config)
    assert str(stopped.value).startswith(
        "every rollout of step 1 made no model call through the gateway, so there is nothing "
        "to train: the workflow must call get_rollout_context().chat_completions_url"
    )
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    assert [e["step"] for e in lines(run_dir / "events.jsonl") if e["event"] == "stopped"] == [1]
