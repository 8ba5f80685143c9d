"""The GRPO-family loss of a micro-batch.

``grpo_loss`` is one of three objectives (``AlgorithmConfig.loss``):

- ``ppo_clip``: PPO's clipped ratio per token against the recorded behaviour logprobs, with
  separate low and high clip bounds (DAPO's clip-higher) and the dual clip of a negative
  advantage;
- ``gspo``: GSPO's sequence-level ratio (Zheng et al. 2025), the geometric mean of a
  sequence's token ratios, clipped as a whole (its token form: every token of a sequence
  carries the sequence's ratio, and its gradient is the token's own log-likelihood's);
- ``cispo``: CISPO (MiniMax-M1, 2025), REINFORCE on each token's log-likelihood weighted by
  its importance ratio, clipped and without gradient, so no token's gradient is ever cut.

Each has an optional k3 KL estimate to a reference policy, optional importance sampling
against the policy that generated (truncated or masked, per token or per sequence), and
per-token weights that say how tokens are averaged (``advantages.token_weights``). The
settings are `AlgorithmConfig`'s (``settings``).
"""

from __future__ import annotations

from dataclasses import dataclass

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, TisMode

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.algorithm.micro_batches import MicroBatch  # noqa: E402

__all__ = ["LossParts", "grpo_loss", "importance_weights"]


@dataclass(frozen=True, slots=True)
class LossParts:
    """Token counts and sums of a micro-batch's loss terms (added up over micro-batches).

    Every figure is over the tokens the loss counts: policy tokens of a sequence with a token
    weight above 0 (not those of a rollout that ``overlong = "mask"`` left out).
    """

    tokens: int
    clipped_low: int
    """Tokens whose ratio fell under ``1 - clip_low`` with a negative advantage (CISPO: any
    advantage, its weight is clipped)."""
    clipped_high: int
    """Tokens whose ratio rose over ``1 + clip_high`` with a positive advantage (CISPO: any)."""
    dual_clipped: int
    """Tokens with a negative advantage whose ratio rose over the dual clip's bound."""
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
    """Tokens whose importance weight was capped at ``tis_cap`` (a truncate mode)."""
    tis_masked: int
    """Tokens the importance weight masked (a mask mode: the ratio left its band)."""
    carrying: int
    """Tokens whose loss has a gradient: counted, with an advantage and not masked, or with a
    KL term. An update none of whose tokens carries one is not applied (Adam's momentum
    would move the weights on a zero gradient)."""
    constrained: int
    """Tokens scored under their grammar's replayed mask."""
    unreplayed: int
    """Constrained tokens the replay did not accept (scored unmasked)."""


def _k3(delta: torch.Tensor) -> torch.Tensor:
    """The k3 estimate ``exp(δ) - δ - 1`` of a KL divergence, per sample, from the log-ratio
    δ of the other distribution to the sampling one (non-negative, unbiased)."""
    return torch.exp(delta) - delta - 1


def _row_mean(values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: the mean of each row's ``values`` over its ``on`` positions (0 for none)."""
    count = on.sum(dim=-1, keepdim=True).clamp(min=1)
    return torch.where(on, values, 0.0).sum(dim=-1, keepdim=True) / count


def importance_weights(
    gap: torch.Tensor, on: torch.Tensor, mode: TisMode, cap: float, floor: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each token's importance weight from ``gap = log π_start - log π_behaviour`` (``[B, T -
    1]``), and which ``on`` tokens it capped and masked.

    ``token_*`` weighs each token by its own ratio ``exp(gap)``; ``sequence_*`` each token of
    a row by the row's ratio, the geometric mean ``exp(mean gap)`` over its ``on`` tokens (a
    band then means the same for 10 tokens as for 1,000; the product, which TRL and verl take,
    leaves any band on a long sequence from rounding alone). ``*_truncate``: ``min(ratio,
    cap)``; ``*_mask``: the ratio inside ``[floor, cap]``, 0 outside (IcePop's M). A cap of 0:
    every weight 1.
    """
    none = torch.zeros_like(on)
    if cap == 0:
        return torch.ones_like(gap), none, none
    log_ratio = _row_mean(gap, on).expand_as(gap) if mode.startswith("sequence") else gap
    ratio = torch.exp(torch.where(on, log_ratio, 0.0))
    if mode.endswith("_truncate"):
        return torch.clamp(ratio, max=cap), on & (ratio > cap), none
    inside = (ratio >= floor) & (ratio <= cap)
    return torch.where(inside, ratio, 0.0), none, on & ~inside


def grpo_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    config: AlgorithmConfig,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossParts]:
    """The micro-batch's share of the step loss, and its counts for the step's metrics.

    Per token ``w·ℓ + β·k3``, summed with ``batch.weights``, where ``k3 = exp(ref - logπ) -
    (ref - logπ) - 1`` and, with ``ρ = exp(logπ - logπ_anchor)`` and ``(low, high) =
    config.clip``:

    - ``ppo_clip``: ``ℓ = max(-A·ρ, -A·clip(ρ, 1 - low, 1 + high))``, and for ``A < 0`` at
      most ``-A·c``, ``c = config.dual`` (the dual clip; 0 turns it off);
    - ``gspo``: the same with the sequence's ratio ``s = exp(mean of logπ - logπ_anchor over
      the row's policy tokens)`` for ``ρ``; at each token its gradient is ``s·∇logπ`` of that
      token, so with ``normalisation="sequence"`` the step's gradient is GSPO's;
    - ``cispo``: ``ℓ = -A·sg(clip(ρ, 1 - low, 1 + high))·logπ``.

    Without importance sampling (``tis_cap`` 0) the anchor is the behaviour policy and ``w =
    1``: the ratio's clip is what bounds a stale or mismatched token. With it, the anchor is
    the learner at the start of the step (``batch.old_logprobs`` when the step makes several
    updates, else the current logprobs without gradient), so the clip bounds the step's own
    trust region, and ``w`` (no gradient) is the ratio ``π_start / π_behaviour`` weighed as
    ``tis_mode`` says (`importance_weights`). ``gspo`` always takes it (its default cap is
    2): its band (3e-4, 4e-4) is far narrower than the gap between the engine's logprobs and
    the learner's own (a bf16 update's rounding alone), so anchored on the engine an
    on-policy sequence's ratio would leave it about as often as not and its tokens lose their
    gradient; the weight is what corrects a stale or mismatched sequence.
    """
    mask = batch.loss_mask
    on = mask > 0
    # The tokens the loss counts: a rollout left out with weight 0 (overlong = "mask") is not.
    counted = on & (batch.weights > 0)
    low, high = config.clip
    mode, cap = config.tis
    start = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
    # where, not a product with the mask: padding must not turn an inf into a NaN.
    gap = torch.where(on, start - batch.behaviour_logprobs, 0.0)
    behaviour_ratio = torch.exp(gap)
    anchor = start if cap > 0 else batch.behaviour_logprobs
    log_ratio = torch.where(on, logprobs - anchor, 0.0)
    if config.loss == "gspo":
        sequence = _row_mean(log_ratio.detach(), on)
        log_ratio = torch.where(on, logprobs - logprobs.detach() + sequence, 0.0)
    ratio = torch.exp(log_ratio)
    advantages = batch.advantages
    clamped = torch.clamp(ratio, 1 - low, 1 + high)
    below, above = on & (ratio < 1 - low), on & (ratio > 1 + high)
    dual = torch.zeros_like(on)
    if config.loss == "cispo":
        per_token = -advantages * clamped.detach() * torch.where(on, logprobs, 0.0)
    else:
        per_token = torch.maximum(-advantages * ratio, -advantages * clamped)
        # The pessimistic max cuts the gradient only on the side the advantage pushes to.
        below, above = below & (advantages < 0), above & (advantages > 0)
        if config.dual > 0:
            # A negative advantage's unclipped branch grows with ρ: bound it at -A·c.
            bound = -advantages * config.dual
            dual = on & (advantages < 0) & (per_token > bound)
            per_token = torch.where(advantages < 0, torch.minimum(per_token, bound), per_token)
    weight, capped, masked = importance_weights(gap, on, mode, cap, config.tis_floor)
    per_token = per_token * weight
    kl = torch.zeros_like(per_token)
    if config.kl_beta > 0:
        if reference_logprobs is None:
            raise ConfigError("kl_beta > 0 needs the reference policy's logprobs")
        kl = _k3(torch.where(on, reference_logprobs - logprobs, 0.0))
        per_token = per_token + config.kl_beta * kl
    loss = torch.where(on, per_token * batch.weights, 0.0).sum()
    with torch.no_grad():
        # How far this step's earlier updates moved the policy from where the step started.
        shift = _k3(torch.where(on, logprobs.detach() - start, 0.0))
        # A token with a policy-gradient term (an advantage, not masked) or a KL one.
        carrying = counted & ((~masked & (advantages != 0)) | (config.kl_beta > 0))
        parts = LossParts(
            tokens=int(counted.sum()),
            clipped_low=int((below & counted).sum()),
            clipped_high=int((above & counted).sum()),
            dual_clipped=int((dual & counted).sum()),
            ratio_sum=float(behaviour_ratio[counted].sum()),
            ratio_max=float(behaviour_ratio[counted].max()) if bool(counted.any()) else 0.0,
            kl_sum=float(kl[counted].sum()),
            # exp(δ) - δ - 1 rounds to a hair below 0 in fp32 when δ is ~0.
            mismatch_kl_sum=float(_k3(gap)[counted].clamp_min(0).sum()),
            approx_kl_sum=float(shift[counted].clamp_min(0).sum()),
            tis_capped=int((capped & counted).sum()),
            tis_masked=int((masked & counted).sum()),
            carrying=int(carrying.sum()),
            constrained=_constrained(batch, counted),
            unreplayed=batch.unreplayed_tokens,
        )
    return loss, parts


def _constrained(batch: MicroBatch, on: torch.Tensor) -> int:
    """Policy tokens of ``batch`` whose grammar mask restricts them."""
    if batch.grammar_masks is None:
        return 0
    return int((on & (batch.grammar_masks != -1).any(dim=-1)).sum())
