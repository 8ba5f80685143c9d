"""The GRPO family under one import path: ``from osmosis_ai.train.grpo import train_step``.

Each part has its own module, in the order an update uses them: ``advantages`` (group
advantages and token weights), ``micro_batches`` (packing under a token budget, padding),
``logprobs`` (the policy's and the KL reference's), ``loss`` (`GrpoConfig` and the clipped
loss) and ``update`` (one optimiser step). All but ``advantages`` need torch
(``pip install 'osmosis-ai[train]'``).
"""

from __future__ import annotations

from osmosis_ai.train.algorithm.advantages import (
    group_advantages,
    token_weights,
    zero_gradient_groups,
)
from osmosis_ai.train.algorithm.logprobs import check_head, policy_logprobs, reference_logprobs
from osmosis_ai.train.algorithm.loss import GrpoConfig, LossParts, grpo_loss
from osmosis_ai.train.algorithm.micro_batches import MicroBatch, collate, pack_micro_batches
from osmosis_ai.train.algorithm.update import NonFiniteStepError, StepMetrics, train_step

__all__ = [
    "GrpoConfig",
    "LossParts",
    "MicroBatch",
    "NonFiniteStepError",
    "StepMetrics",
    "check_head",
    "collate",
    "group_advantages",
    "grpo_loss",
    "pack_micro_batches",
    "policy_logprobs",
    "reference_logprobs",
    "token_weights",
    "train_step",
    "zero_gradient_groups",
]
