"""One update's seconds on the TRL comparison's shape, three ways: unshared, shared through a KV
cache (the prefix's pass, then the rests'), and packed (each group's prompt once, several
groups in one pass).

Run with ``python benchmarks/update_plans.py [--repeats N]`` on an otherwise idle machine
(about 3 minutes on 2 cores). The embedded model (SmolLM2-135M) in the learner's precision
on this CPU (``precision = "auto"``), fused AdamW, ``train_step`` on a step of 1 and of 4
groups of 8: a 20-token system prompt and a 14-token task shared by each group, completions
of 2-8 tokens (`make bench-trl`'s replies are ~4). The cache variant is the packed one with
packing turned off (``packs_prefix`` answering no), so both run the same code otherwise.
Printed: the median seconds of each, its micro-batches and the tokens it computed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from typing import Any

import osmosis_ai.train.algorithm.logprobs as logprobs
import osmosis_ai.train.algorithm.update as update
from osmosis_ai.gateway.policies.hf_dir import load_model_dir
from osmosis_ai.gateway.policies.torch_device import cpu_has_native_bf16
from osmosis_ai.train.algorithm.schedule import adamw
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, UpdateSettings
from osmosis_ai.train.model import resolve_model

SYSTEM = list(range(1000, 1020))


def _step(groups: int, rng: random.Random) -> list[TrainingSequence]:
    sequences = []
    for group in range(groups):
        prompt = SYSTEM + [rng.randrange(2000, 3000) for _ in range(14)]
        for index in range(8):
            completion = [rng.randrange(2000, 3000) for _ in range(rng.randrange(2, 9))]
            sequences.append(
                TrainingSequence(
                    rollout_id=f"r{group}-{index}",
                    group_id=f"g{group}",
                    reward=float(index % 2),
                    token_ids=(*prompt, *completion),
                    loss_mask=(0,) * len(prompt) + (1,) * len(completion),
                    behaviour_logprobs=(0.0,) * len(prompt) + (-1.0,) * len(completion),
                )
            )
    return sequences


_PACKS = logprobs.packs_prefix


def _packing(on: bool) -> None:
    """Let the learner pack (its own test) or not (the KV-cache path)."""
    test: Any = _PACKS if on else (lambda _model: False)
    update.packs_prefix = test  # type: ignore[attr-defined]
    logprobs.packs_prefix = test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, _ = load_model_dir(resolve_model("embedded"), feature="benchmark")
    model.train()
    optimizer = adamw(model, lr=1e-7)
    bf16 = cpu_has_native_bf16()
    base = UpdateSettings(
        AlgorithmConfig(clip_low=0.2, clip_high=0.28, normalisation="token"),
        max_tokens=32,
        bf16=bf16,
    )
    variants = {
        "unshared": (replace(base, share_prefix=False), False),
        "shared, cache": (base, False),
        "shared, packed": (base, True),
    }
    print(f"update precision: {'bf16 autocast' if bf16 else 'fp32'}; {args.repeats} repeats")
    rng = random.Random(0)
    for groups in (1, 4):
        sequences = _step(groups, rng)
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        shapes: dict[str, tuple[int, int]] = {}
        update.train_step(model, optimizer, sequences, base, step=1)  # warm-up, not counted
        for _ in range(args.repeats):
            for name, (settings, packs) in variants.items():  # alternating, same machine state
                _packing(packs)
                started = time.perf_counter()
                metrics = update.train_step(model, optimizer, sequences, settings, step=1)
                seconds[name].append(time.perf_counter() - started)
                shapes[name] = (metrics.micro_batches, metrics.computed_tokens)
        _packing(True)
        print(f"\n{groups} group(s) of 8, {sum(len(s) for s in sequences)} tokens")
        for name, times in seconds.items():
            batches, computed = shapes[name]
            print(
                f"  {name:15s} {statistics.median(times):6.2f} s  "
                f"({batches} micro-batches, {computed} tokens computed)"
            )


if __name__ == "__main__":
    main()
