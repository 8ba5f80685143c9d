"""The environments' examples as shipped: every config loads (its library's checks
included), and the training configs resolve as ``osmosis train run --print-config`` prints
them. Their whole runs are the other modules' (the same environments, the same code)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from osmosis_ai.eval.config import load_eval_config
from osmosis_ai.train.config import load_train_config
from tests.eval.conftest import OSMOSIS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = sorted(
    path.relative_to(EXAMPLES)
    for name in ("reasoning_gym", "openenv", "verifiers")
    for path in (EXAMPLES / name / "configs").rglob("*.toml")
)


def test_each_environment_has_an_eval_and_a_training_config() -> None:
    kinds = {(path.parts[0], path.parts[2]) for path in CONFIGS}
    assert kinds == {
        (name, kind)
        for name in ("reasoning_gym", "openenv", "verifiers")
        for kind in ("eval", "training")
    }


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_an_example_config_loads(config: Path) -> None:
    path = EXAMPLES / config
    loaded = load_eval_config(path) if "eval" in config.parts else load_train_config(path)
    assert loaded.environment is not None
    assert loaded.experiment.entrypoint is None, "no workflow code"
    if loaded.environment.python is not None:  # the repository's venv of the library
        assert Path(loaded.environment.python).is_file(), loaded.environment.python


@pytest.mark.parametrize("config", [c for c in CONFIGS if "training" in c.parts], ids=str)
def test_a_training_example_resolves_as_the_run_would(config: Path) -> None:
    workspace = EXAMPLES / config.parts[0]
    done = subprocess.run(
        [OSMOSIS, "train", "run", str(config.relative_to(config.parts[0])), "--print-config"],
        cwd=workspace, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[environment]" in done.stdout and "dataset" not in done.stdout.split("[environment]")[0]
