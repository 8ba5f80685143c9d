"""Parsing the embedded model's constrained replies."""

from __future__ import annotations

import pytest

from osmosis_ai.gateway.policies._tool_prompt import reply_message


def test_tool_call_reply_becomes_a_tool_call() -> None:
    message, finish = reply_message('{"name": "add", "arguments": {"a": 1}}')
    assert finish == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ('{"answer": "It is 8."}', "It is 8."),
        ('{\n    "answer": "It is 8, and', "It is 8, and"),
        ('{"answer": "8"', "8"),
        ('{"answer": "tab\\tthen \\u00e9 and \\u00', "tab\tthen \u00e9 and "),
        ('{"answer": "ends in an escape \\', "ends in an escape "),
        ('{"name": "add", "argum', '{"name": "add", "argum'),
        ("plain words", "plain words"),
    ],
)
def test_cut_off_replies_keep_what_was_written(text: str, content: str) -> None:
    message, finish = reply_message(text)
    assert finish is None
    assert message == {"role": "assistant", "content": content}
