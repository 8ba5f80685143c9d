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
    displayable_policy_spec,
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


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        (
            "openai:http://u:PW-1@127.0.0.1:8000/v1:m",
            "openai:http://[REDACTED]@127.0.0.1:8000/v1:m",
        ),
        ("openai-compatible:https://TOKEN-1@h/v1", "openai-compatible:https://[REDACTED]@h/v1"),
        ("openai:http://u:PW-1@h", "openai:http://[REDACTED]@h"),
        ("openai:http://127.0.0.1:8000/v1:m", "openai:http://127.0.0.1:8000/v1:m"),
        ("openai/gpt-4o-mini", "openai/gpt-4o-mini"),
        ("embedded", "embedded"),
    ],
)
def test_the_displayed_spec_hides_url_credentials(spec: str, shown: str) -> None:
    assert displayable_policy_spec(spec) == shown


def test_url_credentials_never_become_the_model() -> None:
    assert parse_policy_spec("openai:http://u:PW-1@h") == PolicySpec("openai", "http://u:PW-1@h")
    assert parse_policy_spec("openai:http://u:PW-1@h:9/v1:m") == PolicySpec(
        "openai", "http://u:PW-1@h:9/v1", "m"
    )


def test_errors_about_a_spec_hide_its_url_credentials() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy_spec("openai:ftp://u:PW-1@h/v1")
    assert "PW-1" not in str(info.value) and "[REDACTED]" in str(info.value)


def test_url_credentials_are_secrets_of_the_policy() -> None:
    assert build_policy("openai:http://u:PW%2F1@h/v1:m").secrets() == ("PW%2F1", "PW/1")
    assert build_policy("openai:http://TOKEN-1@h/v1:m").secrets() == ("TOKEN-1",)


def test_url_credentials_and_an_api_key_together_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        build_policy("openai:http://u:PW-1@h/v1:m", api_key="k-1")
    message = str(info.value)
    assert "--policy-api-key" in message and "URL" in message
    assert "PW-1" not in message and "k-1" not in message
