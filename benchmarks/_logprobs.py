"""Recorded behaviour logprobs against a teacher-forced pass of the same weights."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["teacher_forced_deltas"]


def teacher_forced_deltas(
    model: Any, calls: Iterable[tuple[Sequence[int], Sequence[int], Sequence[float]]]
) -> tuple[float, float]:
    """Max |recorded - teacher-forced| logprob over ``calls`` (prompt ids, completion ids,
    recorded logprobs), in fp32 and under bf16 autocast, on the model's device.

    The calls must have been sampled at temperature 1 or 0 with no top-k, top-p or grammar:
    their recorded logprobs are then those of the model's plain softmax.
    """
    import torch

    device = model.device
    deltas = {False: 0.0, True: 0.0}
    for prompt, completion, recorded in calls:
        ids = torch.tensor([[*prompt, *completion]], device=device)
        targets = torch.tensor(list(completion), device=device).unsqueeze(-1)
        for bf16 in deltas:
            with (
                torch.inference_mode(),
                torch.autocast(device.type, torch.bfloat16, enabled=bf16),
            ):
                logits = model(ids).logits[0].float()
            logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            forced = logprobs.gather(-1, targets).squeeze(-1)
            delta = (forced - torch.tensor(list(recorded), device=device)).abs().max()
            deltas[bf16] = max(deltas[bf16], float(delta))
    return deltas[False], deltas[True]
