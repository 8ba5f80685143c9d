"""Named recipes: presets of the ``[algorithm]`` section, each as its paper describes it.

``[algorithm] recipe = "dapo"`` starts the section from `RECIPES` ``["dapo"]``; the file's own
``[algorithm]`` keys (and ``--set`` flags) then override it, key by key. Without a recipe the
section starts from `AlgorithmConfig`'s defaults: PPO's clip with DAPO's clip-higher and
token-level loss, a dual clip, GRPO's std-scaled group baseline.

What a recipe leaves to the rest of the config: the learning rate, the group size, the
sampling (a paper's long generation budgets are not a laptop's), and KL (0 here; GRPO's paper
used 0.04, which loads a second copy of the model: set ``kl_beta`` to add it). `bench-recipes`
(``benchmarks/recipes.py``) and the tests run every entry of `RECIPES`.
"""

from __future__ import annotations

import dataclasses

from osmosis_ai.train.algorithm.settings import (
    AlgorithmConfig,
    OverlongConfig,
    Recipe,
)

__all__ = ["RECIPES", "RECIPE_PAPERS", "recipe_summary"]

#: Each recipe's paper, as the docs cite it.
RECIPE_PAPERS: dict[Recipe, str] = {
    "grpo": "Shao et al. 2024, DeepSeekMath (arXiv:2402.03300)",
    "dr_grpo": "Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv:2503.20783)",
    "dapo": "Yu et al. 2025, DAPO (arXiv:2503.14476)",
    "gspo": "Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071)",
    "cispo": "MiniMax 2025, MiniMax-M1 (arXiv:2506.13585)",
    "rloo": "Ahmadian et al. 2024, Back to Basics (arXiv:2402.14740)",
}

RECIPES: dict[Recipe, AlgorithmConfig] = {
    # PPO's symmetric clip, each rollout's loss averaged over its own tokens, then over the
    # group: the rewards' z-score within the group.
    "grpo": AlgorithmConfig(
        recipe="grpo", loss="ppo_clip", clip_low=0.2, clip_high=0.2, normalisation="sequence"
    ),
    # GRPO without its two length and difficulty biases: no division by the group's std, and
    # each rollout's token sum divided by one constant (the generation budget).
    "dr_grpo": AlgorithmConfig(
        recipe="dr_grpo",
        clip_low=0.2,
        clip_high=0.2,
        normalisation="constant",
        advantage_scale="none",
    ),
    # Clip-higher (0.2 / 0.28), token-level loss, dynamic sampling (an all-equal group runs
    # again), and the soft overlong penalty over the last fifth of the budget.
    "dapo": AlgorithmConfig(
        recipe="dapo",
        clip_low=0.2,
        clip_high=0.28,
        normalisation="token",
        resample_zero_gradient=2,
        overlong=OverlongConfig(mode="penalty"),
    ),
    # The ratio per sequence (the geometric mean of its tokens'), clipped to the paper's
    # narrow band (3e-4, 4e-4), each sequence averaged over its tokens.
    "gspo": AlgorithmConfig(recipe="gspo", loss="gspo", normalisation="sequence"),
    # A clipped, gradient-free importance weight on every token's log-likelihood: no token is
    # dropped from the gradient by the clip; token-level loss.
    "cispo": AlgorithmConfig(recipe="cispo", loss="cispo", normalisation="token"),
    # REINFORCE with the leave-one-out baseline (the mean of the group's other rewards), not
    # divided by a std: an unbiased estimate of the policy gradient.
    "rloo": AlgorithmConfig(recipe="rloo", advantage="rloo", normalisation="sequence"),
}


def recipe_summary(name: Recipe) -> str:
    """The keys ``name`` sets apart from the section's defaults: ``loss = "gspo", ...``."""
    from osmosis_ai.config.schema import toml_value

    recipe, plain = RECIPES[name], AlgorithmConfig()
    changed = [
        (item.name, getattr(recipe, item.name))
        for item in dataclasses.fields(AlgorithmConfig)
        if item.name != "recipe" and getattr(recipe, item.name) != getattr(plain, item.name)
    ]
    parts = []
    for key, value in changed:
        if dataclasses.is_dataclass(value):
            inner = ", ".join(
                f"{f.name} = {toml_value(getattr(value, f.name))}"
                for f in dataclasses.fields(value)
            )
            parts.append(f"[algorithm.{key}] {inner}")
        else:
            parts.append(f"{key} = {toml_value(value)}")
    return "; ".join(parts)
