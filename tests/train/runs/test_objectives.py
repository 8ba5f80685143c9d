"""Each objective, advantage and normalisation through ``osmosis train run`` (in this
process): the config reaches the learner, the step applies, and its metrics say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.training_project import lines, train_here, workspace, write_rows

pytestmark = [pytest.mark.slow, pytest.mark.whole_run]


@pytest.mark.parametrize(
    "settings",
    [
        'loss = "gspo"\nnormalisation = "sequence"',
        'loss = "cispo"\nadvantage = "rloo"',
        'normalisation = "constant"\nadvantage_scale = "none"',
        'tis_cap = 5.0\ntis_mode = "sequence_mask"\ntis_floor = 0.5\ndual_clip = 4.0',
    ],
    ids=["gspo", "cispo-rloo", "dr-grpo", "ppo-masked"],
)
async def test_two_epochs_of_two_mini_batches_train_with_each_objective(
    tmp_path: Path, tiny_model_dir: Path, settings: str
) -> None:
    config = workspace(
        tmp_path / "ws",
        tiny_model_dir,
        'steps = 1\n[learner]\nprecision = "fp32"\n[algorithm]\nepochs = 2\nmini_batches = 2\n'
        + settings,
    )
    write_rows(tmp_path / "ws", metadata={"random_reward": True})
    outcome = await train_here(config)
    assert outcome.steps_done == 1
    run_dir = tmp_path / "ws" / ".osmosis" / "train" / "tiny"
    [line] = lines(run_dir / "metrics.jsonl")
    assert line["updates"] == 4 and list(line["clip_fraction_by_update"]) == ["1", "2", "3", "4"]
    assert line["clip_fraction_by_update"]["1"] == 0  # on-policy at the step's start
    assert line["approx_kl"] > 0 and line["entropy"] > 0
    assert line["engine_mismatch_kl"] < 1e-6, line
    # Every guard reports per step. On-policy, the importance weights are 1: nothing is
    # masked or capped (a later update's ratio may pass the dual clip's 4).
    assert line["tis_masked_fraction"] == line["tis_capped_fraction"] == 0, line
    assert 0 <= line["dual_clip_fraction"] <= 1, line
    [start] = [e for e in lines(run_dir / "events.jsonl") if e["event"] == "start"]
    for setting in settings.split("\n"):
        key, value = (part.strip().strip('"') for part in setting.split("="))
        assert str(start["settings"]["algorithm"][key]) == value, (key, start["settings"])


@pytest.mark.parametrize("credit", ["outcome", "turn"])
async def test_turn_rewards_train_a_group_whose_outcomes_are_all_equal_only_with_turn_credit(
    tmp_path: Path, tiny_model_dir: Path, credit: str
) -> None:
    """Every rollout's outcome is 1 and each call gets a random turn reward: under outcome
    credit no group has a gradient (the step applies no update); under turn credit each does,
    and the step trains."""
    turn_credit = "[algorithm.turn_credit]" if credit == "turn" else ""
    config = workspace(tmp_path / "ws", tiny_model_dir, f"steps = 1\n{turn_credit}")
    write_rows(tmp_path / "ws", metadata={"reward": 1.0, "random_turn_reward": True})
    await train_here(config)
    [line] = lines(tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "metrics.jsonl")
    if credit == "outcome":
        assert line["zero_gradient_groups"] == 2 and line["loss"] is None, line
    else:
        assert line["zero_gradient_groups"] == 0 and line["tokens_trained"] > 0, line
