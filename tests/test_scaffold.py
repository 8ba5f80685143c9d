"""``osmosis rollout init``/``validate`` and the bundled example, on the embedded model."""

from __future__ import annotations

import runpy
import subprocess
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import GraderContext, RolloutSample
from osmosis_ai.scaffold import scaffold_rollout, validate_entrypoint
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.loop.runner import split_rows
from tests.eval.conftest import OSMOSIS, evaluate_example

pytestmark = pytest.mark.slow  # left out of make test-fast


def test_init_writes_a_rollout_that_validates(tmp_path: Path) -> None:
    written = scaffold_rollout(tmp_path, "capitals")
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        "rollouts/capitals/main.py",
        "configs/eval/capitals.toml",
        "configs/training/capitals.toml",
        "data/capitals.jsonl",
    }
    assert len((tmp_path / "data" / "capitals.jsonl").read_text().splitlines()) == 10
    ok, output = validate_entrypoint(tmp_path / "rollouts" / "capitals")
    assert ok, output
    with pytest.raises(ConfigError, match="--force"):
        scaffold_rollout(tmp_path, "capitals")
    scaffold_rollout(tmp_path, "capitals", force=True)
    with pytest.raises(ConfigError):
        scaffold_rollout(tmp_path, "bad name!")


def test_init_writes_a_training_config_that_loads_with_every_key_explained(
    tmp_path: Path,
) -> None:
    scaffold_rollout(tmp_path, "capitals")
    path = tmp_path / "configs" / "training" / "capitals.toml"
    config = load_train_config(path)
    experiment = config.experiment
    assert (experiment.rollout, experiment.entrypoint, experiment.model) == (
        "capitals", "main.py", "embedded"
    )  # fmt: skip
    assert experiment.dataset == tmp_path / "data" / "capitals.jsonl"
    training = config.training
    assert training.steps <= 10 and training.prompts_per_step * training.group_size <= 16
    # The held-out rows leave rows to train on.
    train_rows, held_out = split_rows(10, config.eval.split, training.seed)
    assert held_out and len(train_rows) >= training.prompts_per_step
    # Every key is explained by a comment (tests/config checks each section's keys), and the
    # optional tables, commented out, load once uncommented.
    text = path.read_text()
    assert all("#" in line.split("=", 1)[1] for line in text.splitlines() if "=" in line)
    uncommented = tmp_path / "configs" / "training" / "lora.toml"
    lora = text.split("# [learner.lora]", 1)[1].split("\n\n", 1)[0]
    uncommented.write_text(text.replace(lora, lora.replace("\n# ", "\n")).replace(
        "# [learner.lora]", "[learner.lora]"
    ))  # fmt: skip
    loaded = load_train_config(uncommented).learner.lora
    assert loaded is not None and loaded.rank == 16 and loaded.target_modules == "all-linear"


def test_init_command_names_the_eval_and_training_commands(tmp_path: Path) -> None:
    result = subprocess.run(
        [OSMOSIS, "rollout", "init", "capitals", "--workspace", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    training = tmp_path / "configs" / "training" / "capitals.toml"
    assert f"osmosis train run {training}" in result.stdout
    assert training.is_file()


def test_validate_reports_import_time_errors(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("import osmosis_no_such_module\n")
    ok, output = validate_entrypoint(tmp_path)
    assert not ok and "ModuleNotFoundError" in output
    result = subprocess.run(
        [OSMOSIS, "rollout", "validate", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 1 and "invalid" in result.stderr


@pytest.mark.parametrize(
    ("main", "expected"),
    [
        ("print('imported, nothing served')\n", "must serve the rollout app on the port in "),
        ("import sys\nsys.exit(0)\n", "_OSMOSIS_ROLLOUT_PORT"),
        ('raise RuntimeError("config value [/etc/app] is bad")\n', "[/etc/app] is bad"),
    ],
    ids=["no-server", "exit-at-import", "import-error"],
)
def test_validate_refuses_an_entrypoint_that_does_not_serve(
    tmp_path: Path, main: str, expected: str
) -> None:
    (tmp_path / "main.py").write_text(main)
    result = subprocess.run(
        [OSMOSIS, "rollout", "validate", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout
    assert expected in result.stderr
    assert "ok:" not in result.stdout


async def _grade_scaffold(workspace: Path, label: str | None, answer: str) -> float | None:
    module: dict[str, Any] = runpy.run_path(
        str(workspace / "rollouts" / "capitals" / "main.py"), run_name="scaffold"
    )
    sample = RolloutSample(messages=[{"role": "assistant", "content": answer}])
    await module["CapitalsGrader"]().grade(GraderContext(label=label, sample=sample))
    return sample.reward


@pytest.mark.parametrize(
    ("label", "answer", "reward"),
    [("Paris", "It is Paris.", 1.0), ("Paris", "Lyon", 0.0), ("", "Lyon", 0.0), (None, "x", 0.0)],
)
async def test_scaffolded_grader_never_matches_an_empty_label(
    tmp_path: Path, label: str | None, answer: str, reward: float
) -> None:
    scaffold_rollout(tmp_path, "capitals")
    assert await _grade_scaffold(tmp_path, label, answer) == reward


@pytest.mark.parametrize(
    ("example", "backend"),
    [
        ("calculator", "local"),
        ("strands_calculator", "local"),
        ("openai_agents_calculator", "local"),
        # A child process per phase inside bubblewrap, reaching the gateway by its relay.
        ("calculator", "process:sandbox"),
    ],
)
async def test_example_runs_on_the_embedded_model(
    tmp_path: Path, example: str, backend: str
) -> None:
    # --verbose keeps the per-request lines (an agent framework's client, the access log).
    verbose = ["--verbose"] if example == "strands_calculator" else []
    _, logs, agent = await evaluate_example(
        tmp_path, example, "--backend", backend, *verbose, limit_sec=180
    )
    if backend == "process:sandbox":
        assert "rollouts run in child processes inside bubblewrap" in logs
    requests = ("HTTP Request: POST" in logs, '"GET /rollout' in logs)
    assert requests == ((True, True) if verbose else (False, False)), logs[-3000:]
    assert any(step.get("tool_calls") for step in agent)
