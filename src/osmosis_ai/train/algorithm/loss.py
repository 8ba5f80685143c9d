"""The GRPO-family loss of a micro-batch, and the settings of a step (`GrpoConfig`).

``grpo_loss`` is PPO's clipped ratio against the recorded behaviour logprobs, with separate
low and high clip bounds (DAPO's clip-higher), an optional k3 KL estimate to a reference
policy, optional truncated importance sampling, and per-token weights that say how tokens
are averaged (``advantages.token_weights``). `GrpoConfig` lives with the loss, which most of
its settings are for; the update (``update.train_step``) reads the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.algorithm.micro_batches import MicroBatch  # noqa: E402

__all__ = ["GrpoConfig", "LossParts", "grpo_loss"]


@dataclass(frozen=True, slots=True)
class GrpoConfig:
    """Loss and update settings of a GRPO-family step."""

    clip_low: float = 0.2
    """The ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = 0.28
    """... and above at ``1 + clip_high`` (DAPO's clip-higher when above ``clip_low``)."""
    advantage: Literal["grpo", "rloo"] = "grpo"
    """The baseline a reward is compared with: the mean of its group (GRPO), or the mean of
    the group's other rollouts (RLOO, leave-one-out)."""
    advantage_scale: Literal["std", "none"] = "std"
    """Divide by the group's reward std (GRPO) or not (Dr. GRPO)."""
    normalisation: Literal["token", "sequence"] = "token"
    """Average over every policy token of the step (DAPO) or per rollout, then over rollouts."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (0 turns it off)."""
    micro_batch_tokens: int = 1024
    """Token budget of one micro-batch, padding included (lower it when memory runs out)."""
    max_grad_norm: float | None = 1.0
    """Gradients are clipped to this global norm (``None``: measured, not clipped)."""
    bf16: bool = False
    """Run the forward pass under bf16 autocast (logprobs are still taken in fp32)."""
    tis_cap: float = 0.0
    """Truncated importance sampling (0: off). When set, the ratio is taken against the
    learner's own logprobs at the start of the step, and each token's loss is weighted by
    ``min(π_learner / π_behaviour, tis_cap)``: the engine's logprobs (vLLM in bf16) need
    not match the learner's for the gradient to be the learner's policy gradient."""
    temperature: float = 1.0
    """The rollouts' sampling temperature: the learner divides its logits by it, so that its
    logprobs are of the distribution the engine sampled from (the behaviour logprobs')."""
    advantage_eps: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high", "kl_beta", "tis_cap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, not {value!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"temperature must be a finite number > 0, not {self.temperature!r}")
        if self.clip_low >= 1:
            raise ConfigError(
                f"clip_low must be below 1 (the ratio floor is 1 - clip_low), not {self.clip_low!r}"
            )
        choices = {
            "advantage": ("grpo", "rloo"),
            "advantage_scale": ("std", "none"),
            "normalisation": ("token", "sequence"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        if self.micro_batch_tokens < 2:
            raise ConfigError(
                f"micro_batch_tokens must be at least 2, not {self.micro_batch_tokens!r}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(f"max_grad_norm must be > 0 or None, not {self.max_grad_norm!r}")
        if not self.advantage_eps > 0:
            raise ConfigError(f"advantage_eps must be > 0, not {self.advantage_eps!r}")


@dataclass(frozen=True, slots=True)
class LossParts:
    """Token counts and sums of a micro-batch's loss terms (added up over micro-batches)."""

    tokens: int
    clipped_low: int
    """Tokens whose ratio fell under ``1 - clip_low`` with a negative advantage."""
    clipped_high: int
    """Tokens whose ratio rose over ``1 + clip_high`` with a positive advantage."""
    ratio_sum: float
    """Sum of ``π_learner / π_behaviour`` at the start of the step."""
    ratio_max: float
    """Largest ``π_learner / π_behaviour`` at the start of the step (0 without tokens)."""
    kl_sum: float
    mismatch_kl_sum: float
    """Sum of the k3 estimate of KL(behaviour ‖ learner) at the start of the step."""
    tis_capped: int
    """Tokens whose importance weight was capped at ``tis_cap``."""
    constrained: int
    """Tokens scored under their grammar's replayed mask."""
    unreplayed: int
    """Constrained tokens the replay did not accept (scored unmasked)."""


def _k3(delta: torch.Tensor) -> torch.Tensor:
    """The k3 estimate ``exp(δ) - δ - 1`` of a KL divergence, per sample, from the log-ratio
    δ of the other distribution to the sampling one (non-negative, unbiased)."""
    return torch.exp(delta) - delta - 1


def grpo_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    config: GrpoConfig,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossParts]:
    """The micro-batch's share of the step loss, and its counts for the step's metrics.

    Per token: ``w·max(-A·ρ, -A·clip(ρ, 1 - clip_low, 1 + clip_high)) + β·k3`` with
    ``ρ = exp(logπ - logπ_anchor)`` and ``k3 = exp(ref - logπ) - (ref - logπ) - 1``; the
    loss is their sum weighted by ``batch.weights``. Without ``tis_cap`` the anchor is the
    behaviour policy and ``w = 1``; with it, the anchor is the learner's own logprobs (no
    gradient) and ``w = min(exp(logπ - logπ_behaviour), tis_cap)`` (no gradient).
    """
    mask = batch.loss_mask
    on = mask > 0
    # where, not a product with the mask: padding must not turn an inf into a NaN.
    gap = torch.where(on, logprobs.detach() - batch.behaviour_logprobs, 0.0)
    behaviour_ratio = torch.exp(gap)
    anchor = logprobs.detach() if config.tis_cap > 0 else batch.behaviour_logprobs
    ratio = torch.exp(torch.where(on, logprobs - anchor, 0.0))
    advantages = batch.advantages
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if config.tis_cap > 0:
        per_token = per_token * torch.clamp(behaviour_ratio, max=config.tis_cap)
    kl = torch.zeros_like(per_token)
    if config.kl_beta > 0:
        if reference_logprobs is None:
            raise ConfigError("kl_beta > 0 needs the reference policy's logprobs")
        kl = _k3(torch.where(on, reference_logprobs - logprobs, 0.0))
        per_token = per_token + config.kl_beta * kl
    loss = torch.where(on, per_token * batch.weights, 0.0).sum()
    with torch.no_grad():
        capped = on & (behaviour_ratio > config.tis_cap) if config.tis_cap > 0 else None
        parts = LossParts(
            tokens=int(on.sum()),
            clipped_low=int((on & (ratio < 1 - config.clip_low) & (advantages < 0)).sum()),
            clipped_high=int((on & (ratio > 1 + config.clip_high) & (advantages > 0)).sum()),
            ratio_sum=float(behaviour_ratio[on].sum()),
            ratio_max=float(behaviour_ratio[on].max()) if bool(on.any()) else 0.0,
            kl_sum=float(kl[on].sum()),
            # exp(δ) - δ - 1 rounds to a hair below 0 in fp32 when δ is ~0.
            mismatch_kl_sum=float(_k3(gap)[on].clamp_min(0).sum()),
            tis_capped=int(capped.sum()) if capped is not None else 0,
            constrained=_constrained(batch, on),
            unreplayed=batch.unreplayed_tokens,
        )
    return loss, parts


def _constrained(batch: MicroBatch, on: torch.Tensor) -> int:
    """Policy tokens of ``batch`` whose grammar mask restricts them."""
    if batch.grammar_masks is None:
        return 0
    return int((on & (batch.grammar_masks != -1).any(dim=-1)).sum())
