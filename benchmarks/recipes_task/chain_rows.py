"""The rows of the chain task (``chain.py``): start at A, then three operations, each on the
previous result; ``metadata.chain`` holds the three values, ``ground_truth`` the last."""

from __future__ import annotations

import random
from typing import Any

SYSTEM = (
    "You are a careful assistant. Use the calculator tool for every operation, one call at "
    "a time, each on the previous result, then state the final number."
)
_OPERATIONS = {"+": "add {n}", "-": "subtract {n}", "*": "multiply by {n}"}


def chain_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` seeded chains of three operations on small numbers."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        value = rng.randint(2, 30)
        start, steps, values = value, [], []
        for _ in range(3):
            op = rng.choice("+-*")
            n = rng.randint(2, 9) if op == "*" else rng.randint(2, 40)
            value = {"+": value + n, "-": value - n, "*": value * n}[op]
            steps.append(_OPERATIONS[op].format(n=n))
            values.append(value)
        prompt = f"Start at {start}. First {steps[0]}, then {steps[1]}, then {steps[2]}."
        rows.append(
            {
                "system_prompt": SYSTEM,
                "user_prompt": f"{prompt} What is the final number?",
                "ground_truth": str(values[-1]),
                "metadata": {"chain": values},
            }
        )
    return rows
