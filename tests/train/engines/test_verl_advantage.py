"""verl's advantage step with ``osmosis_grpo``/``osmosis_rloo``: a row that trains nothing
(a failed rollout's) stays out of its group, as in ``osmosis train``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer")

import torch
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from osmosis_ai.train.algorithm.advantages import Baseline, relative_advantages


def _batch() -> DataProto:
    """Two prompts as verl batches them: ``g`` has three rollouts that train (rewards 1, 0.5,
    0, at each response's last token) and a failed one (response mask all 0, reward 0.0, as
    the agent loop gives it); ``h`` has one that trains and one that does not."""
    masks = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]]
    rewards = [1.0, 0.5, 0.0, 0.0, 0.7, 0.0]
    response_mask = torch.tensor(masks, dtype=torch.float32)
    token_rewards = torch.zeros_like(response_mask)
    for row, (mask, reward) in enumerate(zip(masks, rewards, strict=True)):
        token_rewards[row, max(sum(mask) - 1, 0)] = reward
    return DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": response_mask},
        non_tensors={"uid": np.array(["g", "g", "g", "g", "h", "h"], dtype=object)},
    )


@pytest.mark.parametrize(
    ("estimator", "baseline"), [("osmosis_grpo", "grpo"), ("osmosis_rloo", "rloo")]
)
@pytest.mark.parametrize("by_std", [True, False])
def test_a_row_that_trains_nothing_is_left_out_of_its_group(
    estimator: str, baseline: Baseline, by_std: bool
) -> None:
    config = AlgoConfig(adv_estimator=estimator, norm_adv_by_std_in_grpo=by_std)
    data = compute_advantage(_batch(), adv_estimator=estimator, config=config)
    advantages = data.batch["advantages"]
    expected = relative_advantages(
        [1.0, 0.5, 0.0],
        baseline=baseline,
        # RLOO is the reference estimator, never divided by the std.
        scale="std" if by_std and baseline == "grpo" else "none",
    )
    for row, value in enumerate(expected):
        mask = data.batch["response_mask"][row] > 0
        assert advantages[row][mask].tolist() == pytest.approx([value] * int(mask.sum()), abs=1e-6)
    # Rows that train nothing get 0, and a prompt with one trained row has no baseline: 0.
    assert not advantages[3:].any()


def test_verls_own_grpo_counts_the_failed_rows_zero_in_its_group() -> None:
    """What the osmosis estimators fix: with verl's ``grpo`` the failed row's 0.0 enters the
    group's mean and std, so the rollouts that did train get other advantages, and the lone
    trained rollout of ``h`` gets one against a made-up baseline."""
    config = AlgoConfig(adv_estimator="grpo")
    verls = compute_advantage(_batch(), adv_estimator="grpo", config=config).batch["advantages"]
    ours = compute_advantage(_batch(), adv_estimator="osmosis_grpo", config=config).batch[
        "advantages"
    ]
    assert float(verls[0, 0]) != pytest.approx(float(ours[0, 0]), abs=1e-3)
    assert float(verls[4, 0]) > 0 and float(ours[4, 0]) == 0


def test_osmosis_rloo_is_verls_own_rloo_where_every_row_trains() -> None:
    """Without failed rows the two agree: ``r`` minus the mean of the group's others, not
    divided by the std, whatever ``norm_adv_by_std_in_grpo`` says (divided, RLOO would be
    GRPO times G / (G - 1))."""
    batch = _batch()[[0, 1, 2, 4]]
    batch.batch["response_mask"][3] = torch.tensor([1.0, 1.0, 1.0])
    batch.non_tensor_batch["uid"] = np.array(["g", "g", "g", "g"], dtype=object)
    config = AlgoConfig(adv_estimator="rloo", norm_adv_by_std_in_grpo=True)
    verls = compute_advantage(batch, adv_estimator="rloo", config=config).batch["advantages"]
    ours = compute_advantage(batch, adv_estimator="osmosis_rloo", config=config).batch["advantages"]
    # Rewards 1, 0.5, 0, 0.7: the first's others average 0.4, so its advantage is 0.6.
    assert float(ours[0, 0]) == pytest.approx(0.6, abs=1e-6)
    assert torch.allclose(verls, ours, atol=1e-6)


def test_importing_verl_registers_the_estimators_in_any_process() -> None:
    """verl's trainer driver never imports the agent loop: the ``verl.plugins`` entry point
    of the installed package registers the estimators when verl is imported."""
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "for name in ('osmosis_grpo', 'osmosis_rloo'):\n"
        "    print(get_adv_estimator_fn(name).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.split() == ["osmosis_grpo", "osmosis_rloo"]
