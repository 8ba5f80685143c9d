"""Chat request validation."""

from __future__ import annotations

import pytest

from osmosis_ai.errors import ChatRequestError, ConfigError
from osmosis_ai.gateway.request import check_sampling, messages_sha256, parse_chat_request

MESSAGES = [{"role": "user", "content": "hi"}]


def test_model_is_separated_and_flags_are_read() -> None:
    request = parse_chat_request(
        {
            "model": "m",
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "return_token_ids": True,
            "n": 1,
        }
    )
    assert (
        request.requested_model == "m" and "model" not in request.body and "n" not in request.body
    )
    assert request.stream and request.include_usage
    assert request.want_logprobs and request.want_token_ids
    assert request.messages == MESSAGES and request.tools == []


def test_extra_body_wins_over_top_level_fields() -> None:
    request = parse_chat_request({"messages": MESSAGES, "top_k": 1, "extra_body": {"top_k": 5}})
    assert request.body["top_k"] == 5 and "extra_body" not in request.body


def test_tool_choice_must_name_an_offered_tool() -> None:
    tools = [{"type": "function", "function": {"name": "add"}}]
    ok = {"type": "function", "function": {"name": "add"}}
    assert (
        parse_chat_request({"messages": MESSAGES, "tools": tools, "tool_choice": ok}).tools == tools
    )
    with pytest.raises(ChatRequestError, match="not among the offered tools"):
        parse_chat_request(
            {
                "messages": MESSAGES,
                "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "sub"}},
            }
        )


@pytest.mark.parametrize(
    "field", ["aws_region_name", "azure_deployment", "vertex_project", "mock_response"]
)
def test_provider_routing_fields_are_denied(field: str) -> None:
    with pytest.raises(ChatRequestError) as info:
        parse_chat_request({"messages": MESSAGES, field: "x"})
    assert info.value.param == field and info.value.status_code == 400


def test_messages_hash_is_canonical() -> None:
    assert messages_sha256([{"role": "user", "content": "hi"}]) == messages_sha256(
        [{"content": "hi", "role": "user"}]
    )
    assert messages_sha256(MESSAGES) != messages_sha256([{"role": "user", "content": "ho"}])


@pytest.mark.parametrize(
    ("sampling", "named"),
    [
        ({"stream": True}, "cannot set stream"),
        ({"api_key": "x"}, "cannot set api_key"),
        ({"temperature": 9}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_gateway_sampling_is_checked_up_front(sampling: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        check_sampling(sampling)
