"""A real optimisation: GRPO steps on a tiny Llama raise a deterministic reward."""

from __future__ import annotations

import statistics

import pytest
import torch
from transformers import LlamaForCausalLM

from osmosis_ai.train import TrainingSequence
from osmosis_ai.train.algorithm.advantages import zero_gradient_groups
from osmosis_ai.train.algorithm.schedule import adamw, warmup_schedule
from osmosis_ai.train.algorithm.settings import UpdateSettings
from osmosis_ai.train.algorithm.update import train_step
from tests.train.conftest import tiny_llama

TARGET = 5
COMPLETION = 8
GROUPS = 4
GROUP_SIZE = 4
MAX_STEPS = 40
WINDOW = 3


@torch.no_grad()
def _rollouts(
    model: LlamaForCausalLM, step: int, generator: torch.Generator
) -> list[TrainingSequence]:
    """G samples per prompt from the model itself, with their behaviour logprobs."""
    model.train(False)
    prompts = torch.tensor([[1, 2 + group] for group in range(GROUPS)]).repeat_interleave(
        GROUP_SIZE, dim=0
    )
    ids = prompts
    sampled: list[torch.Tensor] = []
    for _ in range(COMPLETION):
        logprobs = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
        token = torch.multinomial(logprobs.exp(), 1, generator=generator)
        sampled.append(logprobs.gather(-1, token))
        ids = torch.cat([ids, token], dim=1)
    behaviour = torch.cat(sampled, dim=1)
    sequences = []
    for row in range(ids.shape[0]):
        completion = ids[row, 2:].tolist()
        sequences.append(
            TrainingSequence(
                rollout_id=f"s{step}-r{row}",
                group_id=f"s{step}-g{row // GROUP_SIZE}",
                # The grader: the fraction of generated tokens equal to the target token.
                reward=completion.count(TARGET) / COMPLETION,
                token_ids=tuple(ids[row].tolist()),
                loss_mask=(0, 0) + (1,) * COMPLETION,
                behaviour_logprobs=(0.0, 0.0, *behaviour[row].tolist()),
            )
        )
    return sequences


@pytest.mark.slow
def test_grpo_steps_raise_the_reward_of_a_tiny_model() -> None:
    model = tiny_llama(seed=0)
    generator = torch.Generator().manual_seed(0)
    optimizer = adamw(model, lr=3e-3)
    scheduler = warmup_schedule(optimizer, warmup_steps=3, total_steps=MAX_STEPS)
    config = UpdateSettings(token_budget=64)
    rewards: list[float] = []
    for step in range(MAX_STEPS):
        sequences = _rollouts(model, step, generator)
        rewards.append(statistics.fmean(s.reward for s in sequences))
        if step >= 2 * WINDOW and statistics.fmean(rewards[-WINDOW:]) >= (
            statistics.fmean(rewards[:WINDOW]) + 0.3
        ):
            break
        trained = [s for s in sequences if s.group_id not in zero_gradient_groups(sequences)]
        if trained:
            metrics = train_step(model, optimizer, trained, config, step=step, scheduler=scheduler)
            assert metrics.grad_norm > 0
    start, end = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    assert end >= start + 0.3, f"rewards per step: {[round(r, 2) for r in rewards]}"
