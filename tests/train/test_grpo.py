"""``osmosis_ai.train.grpo`` keeps the GRPO family importable from one path."""

from __future__ import annotations

import importlib

import osmosis_ai.train.grpo as grpo

NAMES = {
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
    "packed_tokens",
    "packs_prefix",
    "tokens_per_pass",
    "plan_cost",
    "plan_micro_batches",
    "planned_batches",
    "policy_logprobs",
    "policy_logprobs_and_entropy",
    "reference_logprobs",
    "relative_advantages",
    "reverse_kl",
    "row_prefixes",
    "sequence_logprobs",
    "shared_prefix",
    "shares_prefixes",
    "step_advantages",
    "token_weights",
    "train_step",
    "turn_advantages",
    "zero_gradient_groups",
}
PARTS = ("advantages", "distill", "micro_batches", "logprobs", "loss", "settings", "update")


def test_grpo_exports_each_name_of_its_parts_as_the_same_object() -> None:
    assert set(grpo.__all__) == NAMES
    assert grpo.__all__ == sorted(grpo.__all__)
    homes = {}
    for part in PARTS:
        module = importlib.import_module(f"osmosis_ai.train.algorithm.{part}")
        homes.update(dict.fromkeys(module.__all__, module))
    assert set(homes) == NAMES
    for name in NAMES:
        assert getattr(grpo, name) is getattr(homes[name], name), name
