"""Write ``train.jsonl`` and ``heldout.jsonl``: the arithmetic questions of ``make bench-trl``.

Small sums and differences (and products of small numbers) answered directly, with no
tool: a 135M model gets some right and writes them in many ways, so a short run can teach
it the format and a few more sums. No question of the held-out file is among the training
ones. Run it from this directory: ``python make_rows.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM = "Answer the question with only the number, nothing else."
TRAIN_ROWS = 160
HELD_OUT_ROWS = 40


def _question(chooser: random.Random, index: int) -> tuple[str, int]:
    op = "+-*"[index % 3]
    if op == "*":
        a, b = chooser.randint(2, 12), chooser.randint(2, 9)
    else:
        a, b = chooser.randint(2, 40), chooser.randint(2, 40)
        if op == "-" and b > a:
            a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", value


def rows(count: int, seed: int = 31) -> list[dict[str, str]]:
    """``count`` distinct questions, seeded."""
    chooser = random.Random(seed)
    seen: dict[str, int] = {}
    # Bounded: there are fewer distinct products than sums, so draws repeat.
    for _ in range(100 * count):
        if len(seen) == count:
            break
        question, value = _question(chooser, len(seen))
        seen.setdefault(question, value)
    if len(seen) < count:
        raise ValueError(f"found only {len(seen)} distinct questions, not {count}")
    return [
        {"system_prompt": SYSTEM, "user_prompt": question, "ground_truth": str(value)}
        for question, value in seen.items()
    ]


def main() -> None:
    everything = rows(TRAIN_ROWS + HELD_OUT_ROWS)
    here = Path(__file__).resolve().parent
    for name, part in (
        ("train.jsonl", everything[:TRAIN_ROWS]),
        ("heldout.jsonl", everything[TRAIN_ROWS:]),
    ):
        (here / name).write_text("".join(json.dumps(row) + "\n" for row in part))


if __name__ == "__main__":
    main()
