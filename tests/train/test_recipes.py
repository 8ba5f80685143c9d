"""Named recipes (``osmosis_ai.train.recipes``): each trains the calculator example for two
steps, the run keeps its resolved config, and the file's own keys win over the recipe's."""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.settings import (
    RECIPE_NAMES,
    AlgorithmConfig,
    OverlongConfig,
    Recipe,
)
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.recipes import RECIPE_PAPERS, RECIPES, recipe_summary
from tests.train.training_project import lines, train_here

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"
#: Two steps of the calculator at the smallest size that still trains (a group of two).
SMALL = (
    "training.steps=2",
    "training.prompts_per_step=1",
    "training.group_size=2",
    "eval.rows=1",
    "sampling.max_tokens=48",
)


def test_the_registry_names_each_recipe_once_with_its_paper() -> None:
    assert tuple(RECIPES) == RECIPE_NAMES == tuple(RECIPE_PAPERS)
    for name, recipe in RECIPES.items():
        assert recipe.recipe == name and "arXiv:" in RECIPE_PAPERS[name]
        assert recipe_summary(name), f"{name} sets nothing apart from the defaults"
    assert RECIPES["dapo"].overlong == OverlongConfig(mode="penalty")
    assert RECIPES["gspo"].loss == "gspo" and RECIPES["cispo"].loss == "cispo"
    assert RECIPES["dr_grpo"].scale == "none" and RECIPES["rloo"].advantage == "rloo"


def _calculator(root: Path, algorithm: str) -> Path:
    """A copy of the calculator example whose config gets the ``[algorithm]`` table
    ``algorithm``."""
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns(".osmosis"))
    # Partial credit (the example's `CloseAnswer`): a group's rewards differ, so every recipe
    # updates, and DAPO's dynamic sampling has no all-wrong groups to run three times.
    main = root / "rollouts" / "calculator" / "main.py"
    main.write_text(main.read_text().replace("grader=ExactAnswer", "grader=CloseAnswer"))
    config = root / "configs" / "training" / "calculator.toml"
    config.write_text(config.read_text() + f"\n[algorithm]\n{algorithm}\n")
    return config


@pytest.mark.whole_run
@pytest.mark.slow
@pytest.mark.timeout(300)  # ~45 s alone; over 120 s beside CI's other phases
@pytest.mark.parametrize("name", RECIPE_NAMES)
async def test_each_recipe_trains_the_calculator_and_the_run_keeps_its_resolved_config(
    tmp_path: Path, name: Recipe
) -> None:
    config = _calculator(tmp_path / "calculator", f'recipe = "{name}"')
    outcome = await train_here(config, SMALL)
    assert outcome.steps_done == 2
    run_dir = outcome.run_dir
    metrics = lines(run_dir / "metrics.jsonl")
    assert [line["step"] for line in metrics] == [1, 2]
    assert any(line["updates"] for line in metrics), "the recipe's objective updated"
    resolved = tomllib.loads((run_dir / "config.toml").read_text())
    assert resolved["algorithm"]["recipe"] == name
    assert resolved["training"]["steps"] == 2 and resolved["eval"]["rows"] == 1
    # The resolved config, read back from the workspace, is the same run's config.
    again = config.with_name("resolved.toml")
    again.write_text((run_dir / "config.toml").read_text())
    assert load_train_config(again).algorithm == RECIPES[name]
    [start] = [e for e in lines(run_dir / "events.jsonl") if e["event"] == "start"]
    assert start["settings"]["algorithm"]["recipe"] == name


def test_the_file_s_keys_override_the_recipe_s_and_flags_override_both(tmp_path: Path) -> None:
    config = _calculator(
        tmp_path / "calculator",
        'recipe = "dapo"\nresample_zero_gradient = 4\n[algorithm.overlong]\nbuffer = 16',
    )
    algorithm = load_train_config(config).algorithm
    assert algorithm == replace(
        RECIPES["dapo"], resample_zero_gradient=4, overlong=OverlongConfig("penalty", 16)
    )
    flagged = load_train_config(config, ["algorithm.resample_zero_gradient=1"]).algorithm
    assert flagged.resample_zero_gradient == 1 and flagged.clip == (0.2, 0.28)
    # A flag may name the recipe too; the file's keys still apply over it.
    gspo = load_train_config(config, ['algorithm.recipe="gspo"']).algorithm
    assert (gspo.loss, gspo.resample_zero_gradient) == ("gspo", 4)
    assert gspo.overlong == OverlongConfig("penalty", 16)  # the file's table, on its own


def test_an_unknown_recipe_is_one_line_naming_them_all(tmp_path: Path) -> None:
    config = _calculator(tmp_path / "calculator", 'recipe = "ppo"')
    with pytest.raises(ConfigError) as info:
        load_train_config(config)
    message = str(info.value)
    assert "algorithm.recipe must be one of grpo, dr_grpo, dapo, gspo, cispo, rloo" in message
    assert "\n" not in message


def test_no_recipe_is_the_section_s_defaults(tmp_path: Path) -> None:
    config = _calculator(tmp_path / "calculator", "")
    assert load_train_config(config).algorithm == AlgorithmConfig()
