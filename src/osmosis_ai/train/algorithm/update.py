"""One training step: a step's sequences as one optimiser step, or as ``epochs`` ×
``mini_batches`` of them.

Gradients are accumulated over micro-batches under a token budget and clipped to a global
norm. A step whose loss or gradient is not finite is refused whole: with one update before
anything is applied, with several by restoring the weights and optimiser state it started
with, so a step is applied whole or not at all. An update none of whose tokens has a gradient
(every one masked, or without an advantage) is not applied: the optimiser does not step, since
Adam's momentum and weight decay would move the weights on a zero gradient.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.train.algorithm.advantages import step_advantages, token_weights
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import UpdateSettings

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.algorithm.grammar_masks import TokenMasks  # noqa: E402
from osmosis_ai.train.algorithm.logprobs import (  # noqa: E402
    SharedPrefixes,
    packs_prefix,
    policy_logprobs,
    policy_logprobs_and_entropy,
    reference_logprobs,
)
from osmosis_ai.train.algorithm.loss import LossParts, grpo_loss  # noqa: E402
from osmosis_ai.train.algorithm.micro_batches import MicroBatch, planned_batches  # noqa: E402

__all__ = ["NonFiniteStepError", "StepMetrics", "carries_loss", "train_step"]


class NonFiniteStepError(OsmosisError, ArithmeticError):
    """A training step produced a non-finite loss or gradient; no update was applied."""


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """What one applied step did."""

    step: int
    loss: float
    """The loss of the step's update (the mean over its updates, when it made several)."""
    grad_norm: float
    """Global gradient norm before clipping (the largest of the step's applied updates; 0
    when none was)."""
    sequences: int
    micro_batches: int
    """Forward and backward passes, over all of the step's updates."""
    tokens: int
    """Tokens of the step's sequences (padding excluded), each counted once: the tokens
    trained."""
    policy_tokens: int
    """Policy tokens the loss counts, each once: those of a rollout ``overlong = "mask"``
    left out are not (every figure below is over these)."""
    clip_fraction: float
    """Share of the policy tokens the clip cut, over all of the step's updates."""
    clip_low_fraction: float
    clip_high_fraction: float
    dual_clip_fraction: float
    """Share of the policy tokens whose loss the dual clip bounded, over all updates."""
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
    tis_masked_fraction: float
    """Share of policy tokens the importance weight masked (a mask ``tis_mode``)."""
    constrained_fraction: float = 0.0
    """Share of policy tokens generated under a grammar, scored under its replayed mask."""
    unreplayed_tokens: int = 0
    """Tokens generated under a grammar that the replay did not accept (scored unmasked: the
    engine enforced another grammar than the one recorded)."""
    updates: int = 1
    """Optimiser steps the step made (``epochs × mini_batches``, less those skipped)."""
    skipped_updates: int = 0
    """Updates not applied: none of their tokens had a gradient (the optimiser did not step;
    with every update skipped, neither did the learning-rate schedule)."""
    clip_fraction_by_update: tuple[float, ...] = ()
    """The clip fraction of each update, in order: 0 in the first (the policy has not moved
    yet), above 0 in later ones once it moved past the band."""
    approx_kl: float = 0.0
    """Mean k3 estimate of KL(policy at the step's start ‖ policy when a token was scored),
    over every update's tokens: 0 with one update, how far the step moved the policy with
    several."""
    entropy: float = 0.0
    """Mean entropy of the distribution each policy token was scored under, in the step's
    first pass over them (before any update with one mini-batch)."""
    computed_tokens: int = 0
    """Tokens the step's first pass over its sequences ran through the model: ``tokens``
    less the shared prefixes computed once rather than in every row (``[learner]
    share_prefix``)."""


@dataclass(frozen=True, slots=True)
class _Applied:
    """One optimiser step of a training step."""

    loss: float
    grad_norm: float
    parts: list[LossParts]
    entropy_sum: float
    computed_tokens: int
    """Tokens its forward passes computed (shared prefixes once, padding excluded)."""
    applied: bool = True
    """False: no token had a gradient, and the optimiser did not step."""


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TrainingSequence],
    config: UpdateSettings,
    *,
    step: int,
    reference_model: torch.nn.Module | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grammars: TokenMasks | None = None,
    advantages: Sequence[float | tuple[float, ...]] | None = None,
) -> StepMetrics:
    """Apply one training step from ``sequences`` on the model's device: ``[algorithm]
    epochs`` passes over them, each in ``mini_batches`` optimiser steps (one by default),
    each accumulating gradients over micro-batches. ``advantages`` are the sequences'
    (`step_advantages`, which a runner computed with the step's batch); ``None``: computed
    here the same way.

    The advantages are the whole step's groups'; each mini-batch holds whole rollouts (in an
    order drawn from ``step``) and averages its own tokens as ``normalisation`` says. With
    several updates the learner's logprobs at the start of the step are taken first (one
    pass without gradients): the truncated-importance anchor and weight use them, and the
    step's start-of-step figures are theirs. The scheduler steps once per training step.

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
    algorithm = config.algorithm
    if algorithm.kl_beta > 0 and reference_model is None:
        raise ConfigError("kl_beta > 0 needs a reference_model (the initial policy)")
    if advantages is None:
        advantages = step_advantages(sequences, algorithm)
    parameters = [p for p in model.parameters() if p.requires_grad]
    device = parameters[0].device if parameters else torch.device("cpu")
    _without_dropout(model)
    groups = _mini_batches(sequences, algorithm.mini_batches, step)
    several = algorithm.epochs * len(groups) > 1
    old = _start_logprobs(model, sequences, config, grammars, device) if several else None
    saved = _saved(model, optimizer) if several else None
    applied: list[_Applied] = []
    try:
        for _ in range(algorithm.epochs):
            for indices in groups:
                applied.append(
                    _apply(
                        model, optimizer, parameters, config,
                        [sequences[i] for i in indices],
                        [advantages[i] for i in indices],
                        [old[i] for i in indices] if old is not None else None,
                        device=device, step=step, reference_model=reference_model,
                        grammars=grammars,
                    )
                )  # fmt: skip
    except NonFiniteStepError:
        if saved is not None and applied:
            _restore(model, optimizer, saved)
        raise
    if scheduler is not None and any(update.applied for update in applied):
        scheduler.step()
    return _metrics(step, sequences, applied, first_epoch=len(groups))


def _apply(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    parameters: list[torch.nn.Parameter],
    config: UpdateSettings,
    sequences: list[TrainingSequence],
    advantages: list[float | tuple[float, ...]],
    old: list[torch.Tensor] | None,
    *,
    device: torch.device,
    step: int,
    reference_model: torch.nn.Module | None,
    grammars: TokenMasks | None,
) -> _Applied:
    """One optimiser step over ``sequences`` (micro-batched, gradients accumulated), or
    none when no token has a gradient.

    Raises:
        NonFiniteStepError: Its loss or gradient is not finite (its gradients are dropped).
    """
    optimizer.zero_grad(set_to_none=True)
    total, entropy_sum, computed = 0.0, 0.0, 0
    parts: list[LossParts] = []
    # A cluster's prefix computed once for its micro-batches: the policy's (with gradients,
    # released before the gradients are read), the reference's apart (other weights).
    prefixes, reference_prefixes = SharedPrefixes(), SharedPrefixes()
    for _, planned in _planned(
        model, sequences, config, grammars,
        advantages=advantages, weights=_weights(sequences, config), old_logprobs=old,
    ):  # fmt: skip
        batch = planned.to(device)
        computed += batch.computed_tokens
        reference = None
        if reference_model is not None and config.algorithm.kl_beta > 0:
            reference = reference_logprobs(
                reference_model, batch, bf16=config.bf16, temperature=config.temperature,
                prefixes=reference_prefixes,
            )  # fmt: skip
        logprobs, entropy = policy_logprobs_and_entropy(
            model, batch, bf16=config.bf16, temperature=config.temperature, prefixes=prefixes
        )
        loss, counted = grpo_loss(logprobs, batch, config.algorithm, reference)
        value = loss.detach().item()
        if not math.isfinite(value):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStepError(
                f"step {step}: the loss is {value}; no update was applied "
                "(check the behaviour logprobs and lower the learning rate)"
            )
        if counted.carrying:  # else its gradient is 0 exactly
            torch.autograd.backward(loss)
        total += value
        entropy_sum += float(entropy[batch.weights > 0].sum())
        parts.append(counted)
    prefixes.release()
    reference_prefixes.release()
    computed += prefixes.computed_tokens
    if not any(part.carrying for part in parts):
        optimizer.zero_grad(set_to_none=True)
        return _Applied(total, 0.0, parts, entropy_sum, computed, applied=False)
    max_norm = config.algorithm.max_grad_norm or math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteStepError(
            f"step {step}: the gradient norm is {grad_norm}; no update was applied "
            "(lower the learning rate or [algorithm] max_grad_norm)"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return _Applied(total, grad_norm, parts, entropy_sum, computed)


def _planned(
    model: torch.nn.Module,
    sequences: Sequence[TrainingSequence],
    config: UpdateSettings,
    grammars: TokenMasks | None,
    **given: Any,
) -> Iterator[tuple[list[int], MicroBatch]]:
    """`planned_batches` of ``sequences`` under the config's budget and sharing, packed
    where ``model`` can run a packed row."""
    return planned_batches(
        sequences,
        token_budget=config.token_budget,
        share_prefix=config.share_prefix,
        grammars=grammars,
        bf16=config.bf16,
        packs=config.share_prefix and packs_prefix(model),
        **given,
    )


def _weights(sequences: Sequence[TrainingSequence], config: UpdateSettings) -> list[float]:
    """`token_weights` as ``config`` says: under ``[algorithm.overlong] mode = "mask"`` a
    truncated rollout's tokens weigh 0 and are not counted."""
    overlong = config.algorithm.overlong
    return token_weights(
        sequences,
        config.algorithm.normalisation,
        config.max_tokens,
        leave_out_truncated=overlong is not None and overlong.mode == "mask",
    )


def carries_loss(sequences: Sequence[TrainingSequence], config: UpdateSettings) -> bool:
    """Whether any policy token of ``sequences`` has a weight in the step's loss: not when
    ``overlong = "mask"`` leaves out every one of their rollouts (a runner then applies no
    update and says why)."""
    return any(_weights(sequences, config))


def _mini_batches(sequences: Sequence[TrainingSequence], count: int, step: int) -> list[list[int]]:
    """The indices of ``sequences`` in ``count`` mini-batches of whole rollouts (a forked
    rollout's pieces stay together), dealt in an order drawn from ``step``; fewer when the
    step has fewer rollouts."""
    by_rollout: dict[str, list[int]] = {}
    for index, sequence in enumerate(sequences):
        by_rollout.setdefault(sequence.rollout_id, []).append(index)
    rollouts = list(by_rollout.values())
    if count > 1:
        random.Random(step).shuffle(rollouts)
    dealt = [rollouts[start::count] for start in range(min(count, len(rollouts)))]
    return [sorted(i for rollout in group for i in rollout) for group in dealt]


def _start_logprobs(
    model: torch.nn.Module,
    sequences: Sequence[TrainingSequence],
    config: UpdateSettings,
    grammars: TokenMasks | None,
    device: torch.device,
) -> list[torch.Tensor]:
    """Each sequence's policy logprobs ``[len - 1]`` before the step's first update (on the
    CPU, no gradient)."""
    start: list[torch.Tensor] = [torch.zeros(0)] * len(sequences)
    prefixes = SharedPrefixes()
    with torch.no_grad():
        for indices, batch in _planned(model, sequences, config, grammars):
            logprobs = policy_logprobs(
                model,
                batch.to(device),
                bf16=config.bf16,
                temperature=config.temperature,
                prefixes=prefixes,
            ).cpu()
            for row, index in enumerate(indices):
                start[index] = logprobs[row, : len(sequences[index]) - 1].clone()
    prefixes.release()
    return start


def _saved(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """Copies (on the CPU) of the trainable weights and the optimiser state."""
    weights = {
        name: parameter.detach().to("cpu", copy=True)
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }
    return weights, _on_cpu(optimizer.state_dict())


def _restore(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: tuple[Any, Any]
) -> None:
    weights, state = saved
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in weights:
                parameter.copy_(weights[name])
    optimizer.load_state_dict(state)  # its tensors move back to each parameter's device


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_on_cpu(item) for item in value]
    return value


def _metrics(
    step: int, sequences: Sequence[TrainingSequence], applied: list[_Applied], first_epoch: int
) -> StepMetrics:
    """The step's figures: start-of-step ones from its first pass over the sequences (each
    token once), the clip and the policy's movement over every update."""
    first = [part for update in applied[:first_epoch] for part in update.parts]
    every = [part for update in applied for part in update.parts]
    policy = sum(p.tokens for p in first)
    scored = sum(p.tokens for p in every)

    def share(total: float, count: int) -> float:
        return total / count if count else 0.0

    low = sum(p.clipped_low for p in every)
    high = sum(p.clipped_high for p in every)
    return StepMetrics(
        step=step,
        loss=sum(update.loss for update in applied) / len(applied),
        grad_norm=max((update.grad_norm for update in applied if update.applied), default=0.0),
        sequences=len(sequences),
        micro_batches=sum(len(update.parts) for update in applied),
        tokens=sum(len(s) for s in sequences),
        computed_tokens=sum(update.computed_tokens for update in applied[:first_epoch]),
        policy_tokens=policy,
        clip_fraction=share(low + high, scored),
        clip_low_fraction=share(low, scored),
        clip_high_fraction=share(high, scored),
        dual_clip_fraction=share(sum(p.dual_clipped for p in every), scored),
        mean_ratio=share(sum(p.ratio_sum for p in first), policy),
        max_ratio=max((p.ratio_max for p in first), default=0.0),
        kl=share(sum(p.kl_sum for p in every), scored),
        engine_mismatch_kl=share(sum(p.mismatch_kl_sum for p in first), policy),
        tis_capped_fraction=share(sum(p.tis_capped for p in first), policy),
        tis_masked_fraction=share(sum(p.tis_masked for p in first), policy),
        constrained_fraction=share(sum(p.constrained for p in first), policy),
        unreplayed_tokens=sum(p.unreplayed for p in first),
        updates=sum(update.applied for update in applied),
        skipped_updates=sum(not update.applied for update in applied),
        clip_fraction_by_update=tuple(
            share(
                sum(p.clipped_low + p.clipped_high for p in update.parts),
                sum(p.tokens for p in update.parts),
            )
            for update in applied
        ),
        approx_kl=share(sum(p.approx_kl_sum for p in every), scored),
        entropy=share(sum(update.entropy_sum for update in applied[:first_epoch]), policy),
    )


def _without_dropout(model: torch.nn.Module) -> None:
    """Put the model in the update's mode: no dropout in its own layers (attention, hidden or
    embedding dropout would make every token's ratio noise, not ``π_learner / π_behaviour``;
    TRL turns it off too), but a LoRA adapter's ``lora_dropout``, which the user set, on."""
    model.eval()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "lora_dropout":
            module.train()
