"""One GRPO update: a step's sequences, micro-batched, as one optimiser step.

Gradients are accumulated over micro-batches under a token budget, clipped to a global norm,
and a step whose loss or gradient is not finite is refused before anything is applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.train.algorithm.advantages import group_advantages, token_weights
from osmosis_ai.train.algorithm.sequences import TrainingSequence

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.algorithm.grammar_masks import TokenMasks  # noqa: E402
from osmosis_ai.train.algorithm.logprobs import policy_logprobs, reference_logprobs  # noqa: E402
from osmosis_ai.train.algorithm.loss import GrpoConfig, LossParts, grpo_loss  # noqa: E402
from osmosis_ai.train.algorithm.micro_batches import collate, pack_micro_batches  # noqa: E402

__all__ = ["NonFiniteStepError", "StepMetrics", "train_step"]


class NonFiniteStepError(OsmosisError, ArithmeticError):
    """A training step produced a non-finite loss or gradient; no update was applied."""


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
    max_ratio: float
    """Largest ``π_learner / π_behaviour`` of a policy token at the start of the step (stale
    tokens of asynchronous training move it away from 1)."""
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
    advantages = group_advantages(
        sequences,
        baseline=config.advantage,
        scale=config.advantage_scale,
        eps=config.advantage_eps,
    )
    weights = token_weights(sequences, config.normalisation)
    batches = pack_micro_batches([len(s) for s in sequences], config.micro_batch_tokens)
    parameters = [p for p in model.parameters() if p.requires_grad]
    device = parameters[0].device if parameters else torch.device("cpu")
    _without_dropout(model)
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
        max_ratio=max((p.ratio_max for p in parts), default=0.0),
        kl=sum(p.kl_sum for p in parts) / policy if policy else 0.0,
        engine_mismatch_kl=sum(p.mismatch_kl_sum for p in parts) / policy if policy else 0.0,
        tis_capped_fraction=sum(p.tis_capped for p in parts) / policy if policy else 0.0,
        constrained_fraction=sum(p.constrained for p in parts) / policy if policy else 0.0,
        unreplayed_tokens=sum(p.unreplayed for p in parts),
    )


def _without_dropout(model: torch.nn.Module) -> None:
    """Put the model in the update's mode: no dropout in its own layers (attention, hidden or
    embedding dropout would make every token's ratio noise, not ``π_learner / π_behaviour``;
    TRL turns it off too), but a LoRA adapter's ``lora_dropout``, which the user set, on."""
    model.eval()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "lora_dropout":
            module.train()
