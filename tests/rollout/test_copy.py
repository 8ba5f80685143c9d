"""Deep copies of message histories."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from osmosis_ai.rollout import RolloutSample
from osmosis_ai.rollout.deep_copy import deep_copy


def _mutable_parts(value: Any) -> list[Any]:
    """Every dict and list inside ``value``, ``value`` included."""
    parts: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            parts.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            parts.append(item)
            stack.extend(item)
    return parts


def test_a_history_is_copied_whole_and_shares_nothing_mutable() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": "{}"}}],
            "usage": {"tokens": 3, "cost": 0.5, "cached": False, "raw": b"\x00"},
        },
    ]
    copied = deep_copy(history)
    assert copied == history
    originals = {id(part) for part in _mutable_parts(history)}
    assert not originals & {id(part) for part in _mutable_parts(copied)}
    copied[1]["tool_calls"][0]["function"]["name"] = "changed"
    assert history[1]["tool_calls"][0]["function"]["name"] == "add"


@dataclasses.dataclass
class Block:
    parts: list[str]


def test_other_objects_are_deep_copied_the_standard_way() -> None:
    history: list[dict[str, Any]] = [{"role": "assistant", "content": (["a"], Block(["b"]))}]
    copied = deep_copy(history)
    content = copied[0]["content"]
    assert content == (["a"], Block(["b"]))
    assert content[0] is not history[0]["content"][0]
    assert content[1].parts is not history[0]["content"][1].parts


def test_a_history_that_contains_itself_is_not_copied(caplog: pytest.LogCaptureFixture) -> None:
    looping: list[Any] = [{"role": "user", "content": "hi"}]
    looping[0]["self"] = looping
    with pytest.raises(RecursionError):
        deep_copy(looping)
    with caplog.at_level(logging.WARNING):
        sample = RolloutSample(messages=looping)
    # The sample stands; only its trajectory copy is given up, with a warning.
    assert sample.trajectory_messages is None
    assert "cannot be deep-copied" in caplog.text
