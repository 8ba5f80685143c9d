"""The task's one reward: the osmosis grader, TRL's reward function and the shared held-out
evaluation of ``make bench-trl`` all call `score`.

Half of it is the answer: the reply's last number equals the ground truth. The other half is
the format the system prompt asks for: the whole half when the reply is that number alone (an
optional final full stop and whitespace aside), and otherwise a part that shrinks with the
reply's length (none from 50 characters on), so that among a group's mostly wrong, wordy
replies the shorter ones still score higher. A reply without a number gets 0. A reply passes
(reward 1) when it is the right number alone.
"""

from __future__ import annotations

import re

__all__ = ["PASS", "score"]

#: The reward at which a reply passes.
PASS = 1.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BARE = re.compile(r"\s*-?\d+(?:\.\d+)?\s*\.?\s*")
#: The format half of a reply that is not a bare number: this much less per character.
_PER_CHARACTER = 0.01


def score(reply: str, ground_truth: str) -> float:
    """The reward of ``reply`` to a question whose answer is ``ground_truth``, in [0, 1]."""
    numbers = _NUMBER.findall(reply)
    if not numbers:
        return 0.0
    right = float(numbers[-1]) == float(ground_truth)
    bare = _BARE.fullmatch(reply) is not None
    form = 1.0 if bare else max(0.0, 0.5 - _PER_CHARACTER * len(reply.strip()))
    return round(0.5 * right + 0.5 * form, 4)
