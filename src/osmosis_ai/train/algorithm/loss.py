"""The GRPO-family loss of a micro-batch, and the settings of a step (`GrpoConfig`).

``grpo_loss`` is one of three objectives (``GrpoConfig.loss``):

- ``ppo_clip``: PPO's clipped ratio per token against the recorded behaviour logprobs, with
  separate low and high clip bounds (DAPO's clip-higher);
- ``gspo``: GSPO's sequence-level ratio (Zheng et al. 2025), the geometric mean of a
  sequence's token ratios, clipped as a whole (its token form: every token of a sequence
  carries the sequence's ratio, and its gradient is the token's own log-likelihood's);
- ``cispo``: CISPO (MiniMax-M1, 2025), REINFORCE on each token's log-likelihood weighted by
  its importance ratio, clipped and without gradient, so no token's gradient is ever cut.

Each has an optional k3 KL estimate to a reference policy, optional truncated importance
sampling, and per-token weights that say how tokens are averaged
(``advantages.token_weights``). `GrpoConfig` lives with the loss, which most of its
settings are for; the update (``update.train_step``) reads the rest.
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

__all__ = ["CLIP_DEFAULTS", "GrpoConfig", "Loss", "LossParts", "grpo_loss"]

Loss = Literal["ppo_clip", "gspo", "cispo"]

#: ``(clip_low, clip_high)`` of each loss when the config sets none. GSPO's ratio is a
#: per-token geometric mean, so its band is three orders narrower (the paper's 3e-4, 4e-4);
#: CISPO's weight has no floor and a cap of 4, as Tinker's default (MiniMax-M1 tuned only the
#: cap).
CLIP_DEFAULTS: dict[str, tuple[float, float]] = {
    "ppo_clip": (0.2, 0.28),
    "gspo": (3e-4, 4e-4),
    "cispo": (1.0, 3.0),
}


@dataclass(frozen=True, slots=True)
class GrpoConfig:
    """Loss and update settings of a GRPO-family step."""

    loss: Loss = "ppo_clip"
    """The objective: PPO's clipped token ratio, GSPO's clipped sequence ratio, or CISPO's
    clipped, gradient-free importance weight on the log-likelihood."""
    clip_low: float | None = None
    """The ratio (CISPO: the weight) is clipped below at ``1 - clip_low``; ``None``: the
    loss's default (`CLIP_DEFAULTS`)."""
    clip_high: float | None = None
    """... and above at ``1 + clip_high`` (DAPO's clip-higher when above ``clip_low``)."""
    advantage: Literal["grpo", "rloo"] = "grpo"
    """The baseline a reward is compared with: the mean of its group (GRPO), or the mean of
    the group's other rollouts (RLOO, leave-one-out)."""
    advantage_scale: Literal["std", "none"] = "std"
    """Divide by the group's reward std (GRPO) or not (Dr. GRPO)."""
    normalisation: Literal["token", "sequence", "constant"] = "token"
    """Average over every policy token of the step (DAPO), per rollout then over rollouts
    (GRPO), or sum each rollout's tokens and divide by ``max_tokens`` (Dr. GRPO)."""
    max_tokens: int = 1024
    """The rollouts' completion limit per call: the constant of ``normalisation="constant"``
    and the length ``overlong`` measures against."""
    overlong: Literal["keep", "mask", "penalty"] = "keep"
    """Rollouts a call of which stopped at ``max_tokens``: trained as they are, left out of
    the loss (``mask``, DAPO's overlong filtering; they still count in their group's
    baseline), or ``penalty``: see ``advantages.overlong_penalty``."""
    overlong_buffer: int = 0
    """The last tokens before ``max_tokens`` over which ``penalty`` grows from 0 to -1
    (0: a fifth of ``max_tokens``)."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (0 turns it off)."""
    credit: Literal["outcome", "turn"] = "outcome"
    """Every token gets its rollout's advantage (``outcome``), or a turn's tokens get it plus
    ``turn_weight`` × the turn's advantage from the turn rewards
    (``advantages.turn_advantages``)."""
    turn_discount: float = 0.5
    """γ of a turn's return: its reward, plus γ × the next turn's return."""
    turn_weight: float = 0.5
    """λ: how much a turn's advantage adds to the outcome's."""
    epochs: int = 1
    """Passes over the step's sequences."""
    mini_batches: int = 1
    """Optimiser steps per pass, each over a share of the step's rollouts."""
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

    @property
    def clip(self) -> tuple[float, float]:
        """``(clip_low, clip_high)`` as set, or the loss's defaults (`CLIP_DEFAULTS`)."""
        low, high = CLIP_DEFAULTS[self.loss]
        return (
            low if self.clip_low is None else self.clip_low,
            high if self.clip_high is None else self.clip_high,
        )

    def __post_init__(self) -> None:
        choices = {
            "loss": tuple(CLIP_DEFAULTS),
            "advantage": ("grpo", "rloo"),
            "advantage_scale": ("std", "none"),
            "normalisation": ("token", "sequence", "constant"),
            "overlong": ("keep", "mask", "penalty"),
            "credit": ("outcome", "turn"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        low, high = self.clip
        bounded = {
            "clip_low": low,
            "clip_high": high,
            "kl_beta": self.kl_beta,
            "tis_cap": self.tis_cap,
        }
        for name, value in bounded.items():
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, not {value!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"temperature must be a finite number > 0, not {self.temperature!r}")
        # CISPO's weight may have no floor (clip_low = 1); a PPO or GSPO ratio floor of 0 or
        # below would clip nothing and read as a setting error.
        if low > 1 or (low == 1 and self.loss != "cispo"):
            bound = "at most 1" if self.loss == "cispo" else "below 1"
            raise ConfigError(f"clip_low must be {bound} (the floor is 1 - clip_low), not {low!r}")
        if not 0 <= self.turn_discount <= 1:
            raise ConfigError(f"turn_discount must be between 0 and 1, not {self.turn_discount!r}")
        if not (math.isfinite(self.turn_weight) and self.turn_weight >= 0):
            raise ConfigError(f"turn_weight must be a finite number >= 0, not {self.turn_weight!r}")
        for name in ("epochs", "mini_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)!r}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, not {self.max_tokens!r}")
        if not 0 <= self.overlong_buffer <= self.max_tokens:
            raise ConfigError(
                f"overlong_buffer must be between 0 and max_tokens ({self.max_tokens}), "
                f"not {self.overlong_buffer!r}"
            )
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
    """Tokens whose ratio fell under ``1 - clip_low`` with a negative advantage (CISPO: any
    advantage, its weight is clipped)."""
    clipped_high: int
    """Tokens whose ratio rose over ``1 + clip_high`` with a positive advantage (CISPO: any)."""
    ratio_sum: float
    """Sum of ``π_learner / π_behaviour`` at the start of the step."""
    ratio_max: float
    """Largest ``π_learner / π_behaviour`` at the start of the step (0 without tokens)."""
    kl_sum: float
    mismatch_kl_sum: float
    """Sum of the k3 estimate of KL(behaviour ‖ learner) at the start of the step."""
    approx_kl_sum: float
    """Sum of the k3 estimate of KL(learner at the step's start ‖ learner now): 0 in a
    step's first update, how far its earlier updates moved the policy in later ones."""
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

    Per token ``w·ℓ + β·k3``, summed with ``batch.weights``, where ``k3 = exp(ref - logπ) -
    (ref - logπ) - 1`` and, with ``ρ = exp(logπ - logπ_anchor)`` and ``(low, high) =
    config.clip``:

    - ``ppo_clip``: ``ℓ = max(-A·ρ, -A·clip(ρ, 1 - low, 1 + high))``;
    - ``gspo``: the same with the sequence's ratio ``s = exp(mean of logπ - logπ_anchor over
      the row's policy tokens)`` for ``ρ``; at each token its gradient is ``s·∇logπ`` of that
      token, so with ``normalisation="sequence"`` the step's gradient is GSPO's;
    - ``cispo``: ``ℓ = -A·sg(clip(ρ, 1 - low, 1 + high))·logπ``.

    Without ``tis_cap`` the anchor is the behaviour policy and ``w = 1``. With it, the anchor
    is the learner at the start of the step (``batch.old_logprobs`` when the step makes
    several updates, else the current logprobs without gradient) and ``w = min(π_start /
    π_behaviour, tis_cap)`` (no gradient). ``gspo`` always anchors at the start of the step
    (as verl recomputes ``old_log_prob`` with the learner): its band (3e-4, 4e-4) is far
    narrower than the gap between the engine's logprobs and the learner's own (a bf16
    update's rounding alone), so anchored on the engine an on-policy sequence's ratio would
    leave it about as often as not and its tokens lose their gradient.
    """
    mask = batch.loss_mask
    on = mask > 0
    low, high = config.clip
    start = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    # where, not a product with the mask: padding must not turn an inf into a NaN.
    gap = torch.where(on, start - batch.behaviour_logprobs, 0.0)
    behaviour_ratio = torch.exp(gap)
    anchor = start if config.tis_cap > 0 or config.loss == "gspo" else batch.behaviour_logprobs
    log_ratio = torch.where(on, logprobs - anchor, 0.0)
    if config.loss == "gspo":
        tokens = on.sum(dim=-1, keepdim=True).clamp(min=1)
        sequence = log_ratio.detach().sum(dim=-1, keepdim=True) / tokens
        log_ratio = torch.where(on, logprobs - logprobs.detach() + sequence, 0.0)
    ratio = torch.exp(log_ratio)
    advantages = batch.advantages
    clamped = torch.clamp(ratio, 1 - low, 1 + high)
    below, above = on & (ratio < 1 - low), on & (ratio > 1 + high)
    if config.loss == "cispo":
        per_token = -advantages * clamped.detach() * torch.where(on, logprobs, 0.0)
    else:
        per_token = torch.maximum(-advantages * ratio, -advantages * clamped)
        # The pessimistic max cuts the gradient only on the side the advantage pushes to.
        below, above = below & (advantages < 0), above & (advantages > 0)
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
        # How far this step's earlier updates moved the policy from where the step started.
        shift = _k3(torch.where(on, logprobs.detach() - start, 0.0))
        parts = LossParts(
            tokens=int(on.sum()),
            clipped_low=int(below.sum()),
            clipped_high=int(above.sum()),
            ratio_sum=float(behaviour_ratio[on].sum()),
            ratio_max=float(behaviour_ratio[on].max()) if bool(on.any()) else 0.0,
            kl_sum=float(kl[on].sum()),
            # exp(δ) - δ - 1 rounds to a hair below 0 in fp32 when δ is ~0.
            mismatch_kl_sum=float(_k3(gap)[on].clamp_min(0).sum()),
            approx_kl_sum=float(shift[on].clamp_min(0).sum()),
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
