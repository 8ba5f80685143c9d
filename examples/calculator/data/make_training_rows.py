"""Write ``arithmetic_train.jsonl``: 160 seeded questions (+, - and *) for training.

`configs/training/calculator.toml` holds 40 of them out for the before/after pass rate.
Run it from this directory: ``python make_training_rows.py``.
"""

from __future__ import annotations

import json
import random

SYSTEM = (
    "You are a careful assistant. Use the calculator tool for arithmetic, "
    "then state the final number."
)


def rows(count: int = 160, seed: int = 17) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        op = "+-*"[index % 3]
        if op == "*":
            a, b = rng.randint(3, 49), rng.randint(3, 29)
        else:
            a, b = rng.randint(10, 199), rng.randint(2, 99)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        out.append(
            {
                "system_prompt": SYSTEM,
                "user_prompt": f"What is {a} {op} {b}?",
                "ground_truth": str(value),
            }
        )
    return out


if __name__ == "__main__":
    with open("arithmetic_train.jsonl", "w", encoding="utf-8") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows())
