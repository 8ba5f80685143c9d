"""reasoning-gym tasks as rows and grades: the rows, the scorer, the config's checks."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym

from osmosis_ai.environments import EnvironmentConfig
from osmosis_ai.environments.reasoning_gym import score_reply, task_rows
from osmosis_ai.environments.rows import make_rows, rows_file
from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.config import load_eval_config
from osmosis_ai.train.config import load_train_config, resolved_toml

#: Two one-digit terms: 200 different questions at most, so a size can exceed them.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _environment(**changes: Any) -> EnvironmentConfig:
    return dataclasses.replace(
        EnvironmentConfig(reasoning_gym="chain_sum", size=40, seed=3, settings=SMALL), **changes
    )


def test_rows_are_different_questions_made_again_by_their_recipe() -> None:
    rows = list(task_rows(_environment()))
    questions = [row["user_prompt"] for row in rows]
    assert len(rows) == 40 and len(set(questions)) == 40
    assert rows == list(task_rows(_environment())), "the same seed, the same rows"
    assert questions != [row["user_prompt"] for row in task_rows(_environment(seed=4))]
    for row in rows:
        recipe = row["metadata"]["reasoning_gym"]
        entry = reasoning_gym.create_dataset("chain_sum", seed=3, size=recipe["draws"], **SMALL)[
            recipe["index"]
        ]
        assert (row["user_prompt"], row["ground_truth"]) == (entry["question"], entry["answer"])
        assert "<answer>" in row["system_prompt"]


def test_more_rows_than_the_task_has_questions_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"size = 250: chain_sum made only 19\d different"):
        list(task_rows(_environment(size=250)))


def test_the_rows_file_is_named_by_the_settings_and_written_once(tmp_path: Path) -> None:
    path = rows_file(tmp_path, _environment())
    assert path.parent == tmp_path / ".osmosis" / "environments"
    assert path.name.startswith("chain_sum-")
    assert rows_file(tmp_path, _environment(seed=4)) != path
    assert rows_file(tmp_path, _environment(settings={**SMALL, "max_terms": 3})) != path
    make_rows(_environment(), path, tmp_path)
    written = path.read_text()
    assert written.count("\n") == 40
    make_rows(_environment(), path, tmp_path)  # there already: kept as it is
    assert path.read_text() == written
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no partial file is left"


def test_a_reply_is_scored_by_the_tasks_own_scorer() -> None:
    (row,) = task_rows(_environment(size=1))
    recipe, answer = row["metadata"]["reasoning_gym"], row["ground_truth"]
    assert score_reply(f"Thinking. <answer>{answer}</answer>", recipe) == (1.0, True)
    assert score_reply(f" {answer}\n", recipe) == (1.0, False), "untagged: the whole reply"
    assert score_reply("<answer>no idea</answer>", recipe) == (0.0, True)


# --- the config ---------------------------------------------------------------------------------


def _workspace(tmp_path: Path, environment: str, experiment: str = "") -> tuple[Path, Path]:
    """An eval and a training config of ``environment`` (the ``[environment]`` table's body)
    and ``experiment`` (more ``[experiment]`` keys), with no rollouts folder."""
    for kind in ("eval", "training"):
        (tmp_path / "configs" / kind).mkdir(parents=True)
    body = f"[environment]\n{environment}\n"
    eval_config = tmp_path / "configs" / "eval" / "gym.toml"
    eval_config.write_text(
        f'[experiment]\nrollout = "gym"\nmodel_path = "embedded"\n{experiment}\n{body}'
    )
    train_config = tmp_path / "configs" / "training" / "gym.toml"
    train_config.write_text(
        f'[experiment]\nrollout = "gym"\nmodel = "embedded"\n{experiment}\n{body}'
    )
    return eval_config, train_config


GOOD = 'reasoning_gym = "chain_sum"\nsize = 40\n[environment.settings]\nmin_terms = 2'


def test_a_config_with_an_environment_needs_no_rollout_folder_nor_dataset(
    tmp_path: Path,
) -> None:
    eval_path, train_path = _workspace(tmp_path, GOOD)
    config = load_eval_config(eval_path)
    assert config.environment == EnvironmentConfig(
        reasoning_gym="chain_sum", size=40, settings={"min_terms": 2}
    )
    assert config.experiment.entrypoint is None
    assert config.entrypoint_path.name == "main.py"
    assert config.rollout_dir.parent.name == "environments", "the package's own rollout"
    assert config.experiment.dataset == rows_file(tmp_path, config.environment)
    train = load_train_config(train_path)
    assert train.environment == config.environment
    assert train.settings()["environment"]["reasoning_gym"] == "chain_sum"
    # The resolved config reads back to the same run.
    train_path.write_text(resolved_toml(train))
    again = load_train_config(train_path)
    assert (again.environment, again.experiment) == (train.environment, train.experiment)


@pytest.mark.parametrize(
    ("environment", "experiment", "expected"),
    [
        (
            'reasoning_gym = "chain_summ"',
            "",
            f"line 6: environment.reasoning_gym 'chain_summ' is not a reasoning-gym "
            f"{version('reasoning-gym')} task; did you mean 'chain_sum'?",
        ),
        (
            'reasoning_gym = "chain_sum"\n[environment.settings]\nmin_term = 2',
            "",
            "line 8: environment.settings.min_term: chain_sum has no such setting; did you "
            "mean 'min_terms'? it takes min_terms, max_terms",
        ),
        (
            'reasoning_gym = "chain_sum"\n[environment.settings]\nmin_terms = 0',
            "",
            "environment.settings: chain_sum refuses these settings: min_terms must be positive",
        ),
        (
            'reasoning_gym = "chain_sum"\n[environment.settings]\nseed = 2',
            "",
            "line 8: environment.settings.seed: set it as [environment] seed",
        ),
        (
            'reasoning_gym = "chain_sum"\nprompt = "terse"',
            "",
            "line 7: environment.prompt 'terse' is not one of reasoning-gym's system prompts: "
            "DeepSeekZero, default,",
        ),
        (
            'reasoning_gym = "chain sum"',
            "",
            "line 6: environment.reasoning_gym 'chain sum' is not a task name",
        ),
        (
            'reasoning_gym = "chain_sum"',
            'dataset = "data/rows.jsonl"',
            "line 4: experiment.dataset: the [environment] makes the rows; remove dataset",
        ),
        ("size = 3", "", 'line 5: [environment] names one environment: reasoning_gym = "<task>"'),
    ],
    ids=["task", "setting", "refused", "seed", "prompt", "name", "dataset", "no-task"],
)
def test_a_bad_environment_is_one_line_at_its_key(
    tmp_path: Path, environment: str, experiment: str, expected: str
) -> None:
    for path in _workspace(tmp_path, environment, experiment):
        with pytest.raises(ConfigError) as caught:
            load_eval_config(path) if "eval" in path.parts else load_train_config(path)
        message = str(caught.value)
        assert expected in message and "\n" not in message, message


def test_without_an_environment_the_entrypoint_and_dataset_are_required(tmp_path: Path) -> None:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    path = tmp_path / "configs" / "eval" / "x.toml"
    path.write_text('[experiment]\nrollout = "x"\nmodel_path = "embedded"\n')
    with pytest.raises(ConfigError, match=r"experiment.entrypoint is required in \[experiment\]"):
        load_eval_config(path)
