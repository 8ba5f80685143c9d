"""Policy specifications from command lines and eval configs."""

from __future__ import annotations

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import (
    EmbeddedPolicy,
    LiteLLMPolicy,
    OpenAICompatiblePolicy,
    PolicySpec,
    build_policy,
    parse_policy_spec,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("embedded", PolicySpec("embedded")),
        ("", PolicySpec("embedded")),
        ("openai:http://127.0.0.1:8000/v1", PolicySpec("openai", "http://127.0.0.1:8000/v1")),
        ("openai:http://127.0.0.1:8000", PolicySpec("openai", "http://127.0.0.1:8000")),
        (
            "openai-compatible:http://127.0.0.1:8000/v1:Qwen/Qwen3-8B",
            PolicySpec("openai", "http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B"),
        ),
        (
            "openai:https://api.example.com/v1:gpt-x",
            PolicySpec("openai", "https://api.example.com/v1", "gpt-x"),
        ),
        ("litellm:openai/gpt-4o-mini", PolicySpec("litellm", model="openai/gpt-4o-mini")),
        ("anthropic/claude-x", PolicySpec("litellm", model="anthropic/claude-x")),
    ],
)
def test_specs_parse(spec: str, expected: PolicySpec) -> None:
    assert parse_policy_spec(spec) == expected


@pytest.mark.parametrize("spec", ["gpt-4o", "openai:localhost:8000", "openai:ftp://x", "litellm:"])
def test_unrecognised_specs_explain_the_forms(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy_spec(spec)
    assert spec in str(info.value)


def test_build_policy_constructs_each_kind() -> None:
    assert isinstance(build_policy("embedded"), EmbeddedPolicy)
    openai = build_policy("openai:http://127.0.0.1:1/v1:m", api_key="k")
    assert isinstance(openai, OpenAICompatiblePolicy)
    assert openai.model == "m" and openai.secrets() == ("k",)
    assert isinstance(build_policy("openai/gpt-4o-mini"), LiteLLMPolicy)
