"""The GRPO family under one import path: ``from osmosis_ai.train.grpo import train_step``.

Each part has its own module, in the order an update uses them: ``advantages`` (group
advantages and token weights), ``distill`` (on-policy distillation's per-token advantages),
``micro_batches`` (packing under a token budget, padding),
``logprobs`` (the policy's and the KL reference's), ``loss`` (the objectives: PPO's clip,
GSPO, CISPO, and the importance weights to the policy that generated) and ``update`` (a step:
one optimiser step, or epochs × mini-batches of them); `AlgorithmConfig` (the ``[algorithm]``
section) and `UpdateSettings` are ``settings``'. All but
``advantages`` and ``settings`` need torch (``pip install 'osmosis-ai[train]'``).
"""

from __future__ import annotations

from osmosis_ai.train.algorithm.advantages import (
    Baseline,
    Normalisation,
    Scale,
    baseline_scale,
    group_advantages,
    overlong_penalty,
    overlong_shaped,
    relative_advantages,
    step_advantages,
    token_weights,
    turn_advantages,
    zero_gradient_groups,
)
from osmosis_ai.train.algorithm.distill import distill_advantages, reverse_kl
from osmosis_ai.train.algorithm.logprobs import (
    SharedPrefixes,
    check_head,
    policy_logprobs,
    policy_logprobs_and_entropy,
    reference_logprobs,
    sequence_logprobs,
    shares_prefixes,
)
from osmosis_ai.train.algorithm.loss import LossParts, grpo_loss, importance_weights
from osmosis_ai.train.algorithm.micro_batches import (
    PASS_TOKENS_BF16,
    PASS_TOKENS_FP32,
    MicroBatch,
    batch_prefix,
    cluster_prefixes,
    collate,
    computed_tokens,
    pack_micro_batches,
    plan_cost,
    plan_micro_batches,
    planned_batches,
    shared_prefix,
    tokens_per_pass,
)
from osmosis_ai.train.algorithm.settings import (
    ADVANTAGE_EPS,
    CLIP_DEFAULTS,
    DUAL_CLIP_DEFAULT,
    RECIPE_NAMES,
    TIS_DEFAULTS,
    TIS_MODES,
    AlgorithmConfig,
    DistillConfig,
    Loss,
    OverlongConfig,
    Recipe,
    TisMode,
    TurnCreditConfig,
    UpdateSettings,
)
from osmosis_ai.train.algorithm.update import (
    NonFiniteStepError,
    StepMetrics,
    carries_loss,
    train_step,
)

__all__ = [
    "ADVANTAGE_EPS",
    "AlgorithmConfig",
    "Baseline",
    "CLIP_DEFAULTS",
    "DUAL_CLIP_DEFAULT",
    "DistillConfig",
    "Loss",
    "LossParts",
    "MicroBatch",
    "NonFiniteStepError",
    "Normalisation",
    "OverlongConfig",
    "PASS_TOKENS_BF16",
    "PASS_TOKENS_FP32",
    "RECIPE_NAMES",
    "Recipe",
    "Scale",
    "SharedPrefixes",
    "StepMetrics",
    "TIS_DEFAULTS",
    "TIS_MODES",
    "TisMode",
    "TurnCreditConfig",
    "UpdateSettings",
    "baseline_scale",
    "batch_prefix",
    "carries_loss",
    "check_head",
    "cluster_prefixes",
    "collate",
    "computed_tokens",
    "distill_advantages",
    "group_advantages",
    "grpo_loss",
    "importance_weights",
    "overlong_penalty",
    "overlong_shaped",
    "pack_micro_batches",
    "plan_cost",
    "plan_micro_batches",
    "planned_batches",
    "policy_logprobs",
    "policy_logprobs_and_entropy",
    "reference_logprobs",
    "relative_advantages",
    "reverse_kl",
    "sequence_logprobs",
    "shared_prefix",
    "shares_prefixes",
    "step_advantages",
    "token_weights",
    "tokens_per_pass",
    "train_step",
    "turn_advantages",
    "zero_gradient_groups",
]
