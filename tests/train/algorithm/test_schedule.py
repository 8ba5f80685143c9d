"""AdamW's learning-rate schedule: linear warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaForCausalLM

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.schedule import Decay, adamw, lr_factor, warmup_schedule


def test_warm_up_rises_linearly_then_each_decay_follows_its_curve() -> None:
    total, warmup = 10, 4
    decays: tuple[Decay, ...] = ("constant", "linear", "cosine")
    for decay in decays:
        factors = [
            lr_factor(s, warmup_steps=warmup, total_steps=total, decay=decay) for s in range(total)
        ]
        assert factors[:warmup] == pytest.approx([1 / 4, 2 / 4, 3 / 4, 1.0])
        progress = [(s - warmup) / (total - warmup) for s in range(warmup, total)]
        expected = {
            "constant": [1.0] * len(progress),
            "linear": [1 - p for p in progress],
            "cosine": [0.5 * (1 + math.cos(math.pi * p)) for p in progress],
        }[decay]
        assert factors[warmup:] == pytest.approx(expected)


def test_the_scheduler_drives_the_optimiser_learning_rate(model: LlamaForCausalLM) -> None:
    optimizer = adamw(model, lr=0.01)
    scheduler = warmup_schedule(optimizer, warmup_steps=2, total_steps=6, decay="linear")
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [
        0.01 * lr_factor(s, warmup_steps=2, total_steps=6, decay="linear") for s in range(6)
    ]
    assert seen == pytest.approx(expected)
    assert isinstance(optimizer, torch.optim.AdamW)


def test_bad_schedule_settings_are_named(model: LlamaForCausalLM) -> None:
    with pytest.raises(ConfigError, match="learning rate"):
        adamw(model, lr=0.0)
    optimizer = adamw(model, lr=0.01)
    with pytest.raises(ConfigError, match="decay"):
        warmup_schedule(optimizer, total_steps=5, decay="step")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="warmup_steps"):
        warmup_schedule(optimizer, warmup_steps=-1, total_steps=5)
