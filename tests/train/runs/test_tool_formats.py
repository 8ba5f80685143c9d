"""The calculator example trained in the model's own tool format: the embedded model with a
hermes-style chat template, a real `osmosis train run` subprocess, and its tool calls parsed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.train.conftest import first_turn_calls, with_chat_template
from tests.train.training_project import lines as _lines
from tests.train.training_project import run as _run

pytestmark = [pytest.mark.slow, pytest.mark.whole_run, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "calculator"


async def test_the_calculator_trains_with_native_tool_calls(
    tmp_path: Path, embedded_hf_dir: Path
) -> None:
    model = with_chat_template(embedded_hf_dir, tmp_path / "hermes-smollm2")
    workspace = tmp_path / "calculator"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns(".osmosis"))
    main = workspace / "rollouts" / "calculator" / "main.py"
    main.write_text(first_turn_calls(main.read_text()))
    config = workspace / "configs" / "training" / "native.toml"
    config.write_text(
        '[experiment]\nrollout = "calculator"\nentrypoint = "main.py"\n'
        f'model = "{model}"\ndataset = "data/arithmetic_train.jsonl"\n'
        "[training]\nsteps = 2\nprompts_per_step = 2\ngroup_size = 2\n[eval]\nrows = 1\n"
        '[sampling]\nmax_tokens = 48\ntemperature = 0.8\ntool_format = "native"\n'
        "[learner]\nlearning_rate = 5e-5\n"
    )
    code, out = await _run(config, limit_sec=600)
    assert code == 0, out
    assert "tool calls: native (hermes) format" in out
    run_dir = workspace / ".osmosis" / "train" / "native"
    assert "tool calls: native (hermes) format" in (run_dir / "logs.txt").read_text()
    assert [line["step"] for line in _lines(run_dir / "metrics.jsonl")] == [1, 2]
    # Every tool call the policy made parsed into an OpenAI call the workflow could run.
    calls: list[dict[str, Any]] = []
    for trajectory in run_dir.glob("rollouts/step-*/trajectory.json"):
        for step in json.loads(trajectory.read_text())["steps"]:
            calls += step.get("tool_calls") or []
    assert calls, "the policy made no tool call in 8 rollouts"
    for call in calls:
        assert call["function_name"] == "calculator"
        assert isinstance(call["arguments"], dict)
