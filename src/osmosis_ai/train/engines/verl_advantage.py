"""``osmosis_grpo`` and ``osmosis_rloo``: verl advantage estimators that leave a rollout that
trains nothing out of its group, as ``osmosis train`` and the SkyRL adapter do.

verl needs one row per sample, so the verl agent loop gives a failed, timed-out or removed
rollout a row whose response mask is all 0 and whose reward is 0.0 (``verl.verl_row``).
verl's own ``grpo`` then counts that 0.0 in its group's mean and standard deviation: one
crashed tool call moves the advantage of every other rollout of the prompt. These estimators
take each group's statistics over the rows that train (a response mask with a 1) and give
the others 0, with ``osmosis train``'s own arithmetic (`relative_advantages`), 0 for a group
whose rewards are all equal or that has one trained row. ``osmosis_grpo`` divides by the
sample standard deviation plus 1e-4 (``algorithm.norm_adv_by_std_in_grpo=false`` drops the
division: Dr. GRPO); ``osmosis_rloo`` is the reference RLOO, ``r`` minus the mean of the
group's other trained rows, never divided (with the division it would be GRPO times a
constant, as verl's own ``rloo`` is not).

Installing ``osmosis-ai[verl]`` registers them in every process that imports verl (the
``verl.plugins`` entry point), the trainer's driver included: pick one with
``algorithm.adv_estimator=osmosis_grpo``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.train.algorithm.advantages import Baseline, relative_advantages

__all__ = ["ESTIMATORS", "trained_row_advantages"]

_FEATURE = "The verl advantage estimators"
import_optional("torch", extra="verl", feature=_FEATURE)
import_optional("verl.trainer.ppo.core_algos", extra="verl", feature=_FEATURE)

import torch  # noqa: E402
from verl.trainer.ppo.core_algos import register_adv_est  # noqa: E402

#: verl's names for the estimators, by the baseline each compares a reward with.
ESTIMATORS: dict[str, Baseline] = {"osmosis_grpo": "grpo", "osmosis_rloo": "rloo"}


def trained_row_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    *,
    baseline: Baseline,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """Each row's advantage on its response tokens ``[B, T]``: its reward (the sum of its
    token rewards) against its group's (``index``: verl's ``uid`` per row) trained rows;
    0 for a row whose response mask is all 0."""
    rewards = token_level_rewards.sum(dim=-1)
    trained = (response_mask.sum(dim=-1) > 0).tolist()
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, keeps in enumerate(trained):
        if keeps:
            groups[index[row]].append(row)
    advantages = torch.zeros_like(rewards)
    for rows in groups.values():
        values = relative_advantages(
            [float(rewards[row]) for row in rows],
            baseline=baseline,
            scale="std" if scale_by_std else "none",
        )
        advantages[rows] = torch.tensor(values, dtype=advantages.dtype)
    return advantages.unsqueeze(-1) * response_mask


def _estimator(name: str, baseline: Baseline) -> Any:
    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any = None,
        index: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError(
                "the osmosis advantage estimators group rows by verl's 'uid'; the batch has none"
            )
        scale = baseline == "grpo" and (
            config.get("norm_adv_by_std_in_grpo", True) if config is not None else True
        )
        advantages = trained_row_advantages(
            token_level_rewards, response_mask, index, baseline=baseline, scale_by_std=scale
        )
        return advantages, advantages

    estimate.__name__ = estimate.__qualname__ = name
    return estimate


for _name, _baseline in ESTIMATORS.items():
    register_adv_est(_name)(_estimator(_name, _baseline))
