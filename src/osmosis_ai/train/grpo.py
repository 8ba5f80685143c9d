"""The GRPO family: group advantages, the clipped per-token loss, and one optimiser step.

The pieces, each usable alone:

- ``group_advantages``: ``(r - mean) / (std + eps)`` within each group of rollouts of one
  dataset row, or ``r - mean`` (``scale="none"``, Dr. GRPO). ``zero_gradient_groups`` names
  the groups whose rewards are all equal: they carry no gradient.
- ``grpo_loss``: PPO's clipped ratio against the recorded behaviour logprobs, with separate
  low and high clip bounds (DAPO's clip-higher), an optional k3 KL estimate to a reference
  policy, and per-token weights that say how tokens are averaged (``token_weights``).
- ``pack_micro_batches`` / ``policy_logprobs`` / ``train_step``: gradient accumulation over
  micro-batches under a token budget, gradient clipping, and refusal of non-finite steps.
  Tokens generated under a grammar are scored under its replayed masks (``grammar_masks``).

TRL's ``selective_log_softmax`` was considered for the logprob gather: ``trl`` 1.16 requires
``accelerate``, ``datasets``, ``pandas`` and ``pyarrow>=21``, and its ``trainer/utils.py``
imports them all, so the few lines are written here instead (same row-wise approach).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.train.sequences import TrainingSequence

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.grammar_masks import (  # noqa: E402
    TokenMasks,
    allowed_logits,
    replayed_masks,
)

__all__ = [
    "GrpoConfig",
    "LossParts",
    "MicroBatch",
    "NonFiniteStepError",
    "StepMetrics",
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


class NonFiniteStepError(OsmosisError, ArithmeticError):
    """A training step produced a non-finite loss or gradient; no update was applied."""


@dataclass(frozen=True, slots=True)
class GrpoConfig:
    """Loss and update settings of a GRPO-family step."""

    clip_low: float = 0.2
    """The ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = 0.28
    """... and above at ``1 + clip_high`` (DAPO's clip-higher when above ``clip_low``)."""
    advantage_scale: Literal["std", "none"] = "std"
    """Divide by the group's reward std (GRPO) or not (Dr. GRPO)."""
    normalisation: Literal["token", "sequence"] = "token"
    """Average over every policy token of the step (DAPO) or per sequence, then over sequences."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (0 turns it off)."""
    micro_batch_tokens: int = 2048
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
        choices = {"advantage_scale": ("std", "none"), "normalisation": ("token", "sequence")}
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


def _group_rewards(sequences: Iterable[TrainingSequence]) -> dict[str, dict[str, float]]:
    """group id -> rollout id -> reward (a rollout's forked sequences count once)."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for sequence in sequences:
        groups[sequence.group_id][sequence.rollout_id] = sequence.reward
    return groups


def zero_gradient_groups(sequences: Iterable[TrainingSequence]) -> set[str]:
    """Groups whose rollouts all have the same reward (a single rollout included).

    Their advantages are all 0, so they add no gradient: a runner skips or resamples them.
    """
    return {
        group
        for group, rewards in _group_rewards(sequences).items()
        if len(set(rewards.values())) == 1
    }


def group_advantages(
    sequences: Sequence[TrainingSequence],
    *,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-4,
) -> list[float]:
    """The advantage of each sequence: its rollout's reward against its group's.

    ``scale="std"`` gives ``(r - mean) / (std + eps)`` with the sample standard deviation
    (Bessel-corrected, as TRL's GRPO); ``"none"`` gives ``r - mean`` (Dr. GRPO). Each rollout
    counts once however many sequences it forked into; zero-gradient groups get 0.
    """
    by_group: dict[str, dict[str, float]] = {}
    for group, rewards in _group_rewards(sequences).items():
        values = list(rewards.values())
        mean = statistics.fmean(values)
        if len(set(values)) == 1:
            by_group[group] = dict.fromkeys(rewards, 0.0)
            continue
        divisor = statistics.stdev(values) + eps if scale == "std" else 1.0
        by_group[group] = {rollout: (r - mean) / divisor for rollout, r in rewards.items()}
    return [by_group[s.group_id][s.rollout_id] for s in sequences]


def token_weights(
    sequences: Sequence[TrainingSequence], normalisation: Literal["token", "sequence"]
) -> list[float]:
    """The weight of one policy token of each sequence, so the step's loss is a weighted sum.

    ``"token"``: 1 / (policy tokens of the whole step), every token counts the same (DAPO).
    ``"sequence"``: 1 / (the sequence's policy tokens × sequences), every sequence counts the
    same (GRPO). Computed over the whole step, so micro-batches add up to the full-batch loss.
    """
    counts = [sequence.policy_tokens for sequence in sequences]
    if normalisation == "token":
        total = sum(counts)
        return [1.0 / total if total else 0.0 for _ in counts]
    trained = sum(1 for count in counts if count)
    return [1.0 / (count * trained) if count else 0.0 for count in counts]


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of sequences grouped so each group's padded size (rows × longest) fits the budget.

    Longest first, each into the current micro-batch while it fits; the order is
    deterministic (ties keep their input order).

    Raises:
        ConfigError: One sequence alone is longer than the budget.
    """
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    for index in order:
        if lengths[index] > token_budget:
            raise ConfigError(
                f"a sequence of {lengths[index]} tokens exceeds micro_batch_tokens="
                f"{token_budget}: raise micro_batch_tokens or lower the rollouts' max_tokens"
            )
        # Sorted longest first, so a batch's first row is its longest.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Right-padded tensors of some sequences; the per-token ones are shifted by one.

    ``input_ids`` and ``attention_mask`` are ``[B, T]``; ``loss_mask``, ``behaviour_logprobs``
    and ``weights`` are ``[B, T - 1]`` and describe tokens 1..T-1 (the ones a position predicts).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    """``[B, 1]``."""
    weights: torch.Tensor
    """Loss weight of each token (0 off the mask)."""
    grammar_masks: torch.Tensor | None = None
    """``[B, T - 1, W]`` packed masks of the tokens each position's grammar allowed (every
    bit set where none applied; see ``grammar_masks``), or ``None``: no grammar at all."""
    unreplayed_tokens: int = 0
    """Constrained tokens whose grammar could not be replayed (scored unmasked)."""

    def to(self, device: torch.device) -> MicroBatch:
        """The same batch on ``device``."""
        masks = self.grammar_masks
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            advantages=self.advantages.to(device),
            weights=self.weights.to(device),
            grammar_masks=masks.to(device) if masks is not None else None,
            unreplayed_tokens=self.unreplayed_tokens,
        )


def collate(
    sequences: Sequence[TrainingSequence],
    advantages: Sequence[float],
    weights: Sequence[float],
    grammars: TokenMasks | None = None,
) -> MicroBatch:
    """Pad ``sequences`` into one micro-batch (their advantages and per-token weights beside),
    on the CPU (`MicroBatch.to` moves it), with their grammar spans replayed by ``grammars``.

    Raises:
        ConfigError: A sequence has grammar spans and no ``grammars`` replays them.
    """
    width = max(len(sequence) for sequence in sequences)
    rows = len(sequences)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.float32)
    behaviour = torch.zeros(rows, width, dtype=torch.float32)
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        input_ids[row, :length] = torch.tensor(sequence.token_ids, dtype=torch.long)
        attention[row, :length] = 1
        mask[row, :length] = torch.tensor(sequence.loss_mask, dtype=torch.float32)
        behaviour[row, :length] = torch.tensor(sequence.behaviour_logprobs, dtype=torch.float32)
    loss_mask = mask[:, 1:]
    packed, unreplayed = None, 0
    if any(sequence.grammar_spans for sequence in sequences):
        if grammars is None:
            raise ConfigError(
                "sequences generated under a grammar need the model's grammar compiler to be "
                "scored (pass grammars=)"
            )
        packed, unreplayed = replayed_masks(sequences, width, grammars)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour[:, 1:],
        advantages=torch.tensor(advantages, dtype=torch.float32).unsqueeze(1),
        weights=loss_mask * torch.tensor(weights, dtype=torch.float32).unsqueeze(1),
        grammar_masks=packed,
        unreplayed_tokens=unreplayed,
    )


def policy_logprobs(
    model: torch.nn.Module, batch: MicroBatch, *, bf16: bool = False, temperature: float = 1.0
) -> torch.Tensor:
    """Logprobs ``[B, T - 1]`` the model gives tokens 1..T-1 of the batch (with gradients),
    on the loss mask, under its logits divided by ``temperature`` and restricted to what the
    batch's grammar masks allow (as the engine sampled them); 0.0 elsewhere.

    The vocabulary projection and log-softmax run only at the masked positions: a rollout is
    mostly context (system prompt, tools, tool results), and for a small model the projection
    onto a 49k vocabulary is a fifth of the forward pass and most of its memory. The body may
    run under bf16 autocast; the log-softmax is taken in fp32, in chunks of positions to
    bound the vocabulary-sized intermediate.
    """
    on = batch.loss_mask > 0  # position t predicts token t + 1
    targets = batch.input_ids[:, 1:][on]
    device = batch.input_ids.device
    masks = batch.grammar_masks[on] if batch.grammar_masks is not None else None
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = _body(model)(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        chosen = hidden[:, :-1][on]
        head: torch.nn.Module = model.get_output_embeddings()  # type: ignore[operator]
        chunks = []
        for index, (part, part_targets) in enumerate(
            zip(torch.split(chosen, _LOGIT_CHUNK), torch.split(targets, _LOGIT_CHUNK), strict=True)
        ):
            logits = head(part).float() / temperature
            if masks is not None:
                start = index * _LOGIT_CHUNK
                logits = allowed_logits(logits, masks[start : start + len(part)])
            picked = torch.log_softmax(logits, dim=-1).gather(-1, part_targets.unsqueeze(-1))
            chunks.append(picked.squeeze(-1))
    values = torch.cat(chunks) if chunks else chosen.new_zeros(0, dtype=torch.float32)
    return torch.zeros(on.shape, dtype=torch.float32, device=device).masked_scatter(on, values)


def reference_logprobs(
    reference_model: torch.nn.Module,
    batch: MicroBatch,
    *,
    bf16: bool = False,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The KL reference's `policy_logprobs` (no gradients); a peft model's are its base
    model's, with the adapter disabled."""
    disabled = getattr(reference_model, "disable_adapter", None)
    with torch.no_grad(), disabled() if disabled is not None else contextlib.nullcontext():
        return policy_logprobs(reference_model, batch, bf16=bf16, temperature=temperature)


#: Positions whose vocabulary logits are held at once in `policy_logprobs`.
_LOGIT_CHUNK = 1024


def _body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer under the vocabulary head of a transformers causal LM.

    Raises:
        ConfigError: A model whose logits are more than its head's output (a logit scale or
            soft cap), where projecting the hidden states would give other logprobs.
    """
    config = getattr(model, "config", None)
    for field in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, field, None):
            raise ConfigError(
                f"the model's config sets {field}: its logits are not its head's output, "
                "which the trainer's selective projection needs"
            )
    body: torch.nn.Module = model.get_decoder()  # type: ignore[operator]
    return body


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


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """What one applied step did."""

    step: int
    loss: float
    grad_norm: float
    """Global gradient norm before clipping."""
    sequences: int
    micro_batches: int
    tokens: int
    """Tokens forwarded (padding excluded)."""
    policy_tokens: int
    clip_fraction: float
    clip_low_fraction: float
    clip_high_fraction: float
    mean_ratio: float
    """Mean ``π_learner / π_behaviour`` per policy token at the start of the step."""
    kl: float
    """Mean k3 estimate per policy token (0 when ``kl_beta`` is 0)."""
    engine_mismatch_kl: float
    """Mean k3 estimate of KL(behaviour ‖ learner) per policy token at the start of the
    step: how far the engine that generated is from the learner (≈ 0 for the torch engine)."""
    tis_capped_fraction: float
    """Share of policy tokens whose importance weight was capped (0 without ``tis_cap``)."""
    constrained_fraction: float = 0.0
    """Share of policy tokens generated under a grammar, scored under its replayed mask."""
    unreplayed_tokens: int = 0
    """Tokens generated under a grammar that the replay did not accept (scored unmasked: the
    engine enforced another grammar than the one recorded)."""


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TrainingSequence],
    config: GrpoConfig,
    *,
    step: int,
    reference_model: torch.nn.Module | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grammars: TokenMasks | None = None,
) -> StepMetrics:
    """Apply one GRPO update from ``sequences`` (micro-batched, gradients accumulated) on
    the model's device.

    ``reference_model`` is the KL reference: a frozen model, or a peft (LoRA) model, whose
    logprobs are then taken with its adapter disabled, the base model, which is usually
    ``model`` itself (no second copy of the weights). ``grammars`` (the model's
    ``GrammarCompiler``) replays the grammars that constrained tokens were generated under.

    Raises:
        ConfigError: No sequences, a sequence over the token budget, or ``kl_beta > 0``
            without a reference model.
        NonFiniteStepError: The loss or the gradient is not finite; nothing was applied.
    """
    if not sequences:
        raise ConfigError(f"step {step}: no training sequences (every rollout was excluded?)")
    if config.kl_beta > 0 and reference_model is None:
        raise ConfigError("kl_beta > 0 needs a reference_model (the initial policy)")
    advantages = group_advantages(sequences, scale=config.advantage_scale, eps=config.advantage_eps)
    weights = token_weights(sequences, config.normalisation)
    batches = pack_micro_batches([len(s) for s in sequences], config.micro_batch_tokens)
    parameters = [p for p in model.parameters() if p.requires_grad]
    device = parameters[0].device if parameters else torch.device("cpu")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    parts: list[LossParts] = []
    for indices in batches:
        batch = collate(
            [sequences[i] for i in indices],
            [advantages[i] for i in indices],
            [weights[i] for i in indices],
            grammars,
        ).to(device)
        reference = None
        if reference_model is not None and config.kl_beta > 0:
            reference = reference_logprobs(
                reference_model, batch, bf16=config.bf16, temperature=config.temperature
            )
        logprobs = policy_logprobs(model, batch, bf16=config.bf16, temperature=config.temperature)
        loss, counted = grpo_loss(logprobs, batch, config, reference)
        value = loss.detach().item()
        if not math.isfinite(value):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStepError(
                f"step {step}: the loss is {value}; no update was applied "
                "(check the behaviour logprobs and lower the learning rate)"
            )
        torch.autograd.backward(loss)
        total_loss += value
        parts.append(counted)
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteStepError(
            f"step {step}: the gradient norm is {grad_norm}; no update was applied "
            "(lower the learning rate or clip gradients with max_grad_norm)"
        )
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    policy = sum(p.tokens for p in parts)
    low = sum(p.clipped_low for p in parts)
    high = sum(p.clipped_high for p in parts)
    return StepMetrics(
        step=step,
        loss=total_loss,
        grad_norm=grad_norm,
        sequences=len(sequences),
        micro_batches=len(batches),
        tokens=sum(len(s) for s in sequences),
        policy_tokens=policy,
        clip_fraction=(low + high) / policy if policy else 0.0,
        clip_low_fraction=low / policy if policy else 0.0,
        clip_high_fraction=high / policy if policy else 0.0,
        mean_ratio=sum(p.ratio_sum for p in parts) / policy if policy else 0.0,
        kl=sum(p.kl_sum for p in parts) / policy if policy else 0.0,
        engine_mismatch_kl=sum(p.mismatch_kl_sum for p in parts) / policy if policy else 0.0,
        tis_capped_fraction=sum(p.tis_capped for p in parts) / policy if policy else 0.0,
        constrained_fraction=sum(p.constrained for p in parts) / policy if policy else 0.0,
        unreplayed_tokens=sum(p.unreplayed for p in parts),
    )
