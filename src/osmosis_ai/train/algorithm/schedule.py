"""AdamW and its learning-rate schedule: linear warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math
from typing import Literal

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

__all__ = ["Decay", "adamw", "lr_factor", "warmup_schedule"]

Decay = Literal["constant", "linear", "cosine"]


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, decay: Decay) -> float:
    """The learning-rate multiplier of optimiser step ``step`` (from 0).

    It rises linearly over ``warmup_steps`` (the first step already moves: 1 / warmup), then
    stays at 1 (``constant``) or falls to 0 at ``total_steps`` (``linear``, ``cosine``).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if decay == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


#: Devices with torch's fused AdamW kernel (one pass over the parameters; on the CPU a step
#: of a 135M model takes 0.09 s against 0.36 s for the per-parameter loop).
_FUSED = ("cpu", "cuda", "mps")


def adamw(model: torch.nn.Module, *, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters (fused where the device has the kernel)."""
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"the learning rate must be a finite number > 0, not {lr!r}")
    parameters = [p for p in model.parameters() if p.requires_grad]
    fused = bool(parameters) and all(p.device.type in _FUSED for p in parameters)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=fused or None)


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int = 0,
    total_steps: int,
    decay: Decay = "constant",
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler applying ``lr_factor`` (call its ``step()`` after each optimiser step)."""
    if decay not in ("constant", "linear", "cosine"):
        raise ConfigError(f"decay must be 'constant', 'linear' or 'cosine', not {decay!r}")
    if warmup_steps < 0 or total_steps < 1:
        raise ConfigError(
            f"need warmup_steps >= 0 and total_steps >= 1 (got {warmup_steps}, {total_steps})"
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay
        ),
    )
