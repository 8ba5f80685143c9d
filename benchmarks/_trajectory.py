"""Timing of ``save_trajectory`` on a synthetic agent trajectory (used by benchmarks/core.py)."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.trajectory import save_trajectory

__all__ = ["measure_save_trajectory", "synthetic_messages"]

_TOKEN_ARRAY_LENGTH = 100


def synthetic_messages(n_steps: int, *, logprobs: bool = False) -> list[dict[str, Any]]:
    """Chat messages that convert to ``n_steps`` ATIF steps (``n_steps >= 3``).

    A system and a user message, then assistant turns that each call a tool (whose result
    folds into the turn) and carry usage and 100 prompt and 100 completion token ids (plus
    100 logprobs with ``logprobs=True``); the last assistant turn calls no tool.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant with a calculator tool."},
        {"role": "user", "content": "Add up the first numbers, one tool call at a time."},
    ]
    for turn in range(n_steps - 2):
        base = turn * _TOKEN_ARRAY_LENGTH
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"Step {turn}: adding the next number.",
            "model": "policy-model",
            "created_at": 1_700_000_000 + turn,
            "usage": {
                "prompt_tokens": 1000 + turn * 50,
                "completion_tokens": _TOKEN_ARRAY_LENGTH,
                "prompt_tokens_details": {"cached_tokens": 900},
            },
            "prompt_token_ids": list(range(base, base + _TOKEN_ARRAY_LENGTH)),
            "completion_token_ids": list(range(base + 7, base + 7 + _TOKEN_ARRAY_LENGTH)),
        }
        if logprobs:
            message["logprobs"] = [-0.001 * (i + 1) for i in range(_TOKEN_ARRAY_LENGTH)]
        if turn < n_steps - 3:
            call_id = f"call_{turn}"
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": f'{{"a": {turn}, "b": 1}}'},
                }
            ]
            messages.append(message)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": str(turn + 1)})
        else:
            messages.append(message)
    return messages


async def _timed_saves(sample: RolloutSample, root: str, repeats: int) -> list[float]:
    for index in range(10):  # warm-up: worker thread, imports, pydantic schemas
        await save_trajectory(rollout_id=f"warmup-{index}", sample=sample, artifact_root=root)
    durations: list[float] = []
    for index in range(repeats):
        start = time.perf_counter()
        path = await save_trajectory(rollout_id=f"bench-{index}", sample=sample, artifact_root=root)
        durations.append(time.perf_counter() - start)
        if path is None:
            raise RuntimeError("save_trajectory wrote nothing; see the log warning")
    return durations


def measure_save_trajectory(
    n_steps: int = 50, repeats: int = 200, *, logprobs: bool = False
) -> dict[str, Any]:
    """Time ``save_trajectory`` end to end (thread hop, conversion, encoding, fsync'd write).

    Runs a short warm-up, then ``repeats`` sequential saves of one ``n_steps``-step
    trajectory (see `synthetic_messages`) into a temporary directory, each into a new
    rollout directory.

    Returns:
        ``{"n_steps", "repeats", "logprobs", "bytes", "median_s", "p90_s", "min_s"}``.
    """
    sample = RolloutSample(messages=synthetic_messages(n_steps, logprobs=logprobs))
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-") as root:
        durations = asyncio.run(_timed_saves(sample, root, repeats))
        size = Path(root, "bench-0", "trajectory.json").stat().st_size
    durations.sort()
    return {
        "n_steps": n_steps,
        "repeats": repeats,
        "logprobs": logprobs,
        "bytes": size,
        "median_s": statistics.median(durations),
        "p90_s": durations[min(len(durations) - 1, int(len(durations) * 0.9))],
        "min_s": durations[0],
    }


if __name__ == "__main__":
    print(measure_save_trajectory())
    print(measure_save_trajectory(logprobs=True))
