"""Tool calls in the model's own format: a tiny random Llama with the embedded model's tokenizer
and a hermes-style chat template (``tests/gateway/templates/hermes.jinja``), served by the torch
engine behind a real gateway. The grammar guarantees the syntax, so every call parses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway import CallRecord, Gateway, TorchPolicy
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.hf_dir import load_model_dir
from osmosis_ai.gateway.policies.tool_formats import HERMES
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from tests.gateway.conftest import serving
from tests.gateway.test_embedded_policy import CALCULATOR, WEATHER
from tests.train.conftest import (  # noqa: F401 -- fixtures
    hermes_model_dir,
    tiny_model_dir,
    tokenizer_dir,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASK = [{"role": "user", "content": "What is 17*23? And the weather in Oslo?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(
    hermes_model_dir: Path,  # noqa: F811
) -> AsyncIterator[tuple[TorchPolicy, Gateway, httpx2.AsyncClient]]:
    policy = TorchPolicy(hermes_model_dir)
    async with serving(policy, client_timeout_sec=120) as (gateway, http):
        yield policy, gateway, http


async def _answer(http: httpx2.AsyncClient, rollout: str, **body: Any) -> dict[str, Any]:
    body = {"messages": ASK, "tools": [CALCULATOR, WEATHER], "max_tokens": 200, **body}
    response = await http.post(f"/v1/rollouts/{rollout}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _record(gateway: Gateway, rollout: str, index: int = 0) -> CallRecord:
    record = gateway.records.calls(rollout)[index]
    assert record.status == "ok", record.error
    return record


async def test_the_format_follows_the_template_and_the_setting(
    tiny_model_dir: Path,  # noqa: F811
    hermes_model_dir: Path,  # noqa: F811
) -> None:
    _, hermes = load_model_dir(hermes_model_dir, feature="tests")
    _, plain = load_model_dir(tiny_model_dir, feature="tests")
    assert ChatFront(hermes).tool_format is HERMES
    assert ChatFront(hermes, tool_format="instruction").tool_format is None
    assert ChatFront(plain).tool_format is None  # no tools in the template: instruction
    with pytest.raises(ConfigError, match='tool_format = "native", but the model'):
        ChatFront(plain, tool_format="native")
    with pytest.raises(ConfigError, match="tool_format must be"):
        ChatFront(hermes, tool_format="json")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_required_calls_come_back_as_openai_tool_calls(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], seed: int
) -> None:
    gateway = served[1]
    rollout = f"required-{seed}"
    # One call (bounded strings, at most 12 spaces in a row) fits in max_tokens whatever the
    # random model writes; more could be cut short.
    answer = await _answer(
        http, rollout, tool_choice="required", parallel_tool_calls=False, seed=seed,
        temperature=1.0, max_tokens=512,
    )  # fmt: skip
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    for call in choice["message"]["tool_calls"]:
        assert call["function"]["name"] in ("calculator", "weather")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    record = _record(gateway, rollout)
    # The template rendered the tools; the model wrote hermes calls, under a grammar.
    prompt = served[0].front.tokenizer.decode(record.prompt_token_ids or ())
    assert "<tools>" in prompt and "You can call these tools" not in prompt
    completion = served[0].front.tokenizer.decode(record.completion_token_ids or ())
    assert completion.startswith("<tool_call>\n{") and "</tool_call>" in completion
    assert "<tool_call>" in (record.grammar or "")


async def test_a_named_function_is_the_only_one_called(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    for seed in (4, 5):
        answer = await _answer(
            http, f"named-{seed}", tool_choice=named, parallel_tool_calls=False, seed=seed,
            max_tokens=512,
        )  # fmt: skip
        calls = answer["choices"][0]["message"]["tool_calls"]
        assert calls and all(call["function"]["name"] == "weather" for call in calls)


async def test_one_call_when_parallel_calls_are_off(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    for seed in (6, 7):
        answer = await _answer(
            http, f"single-{seed}", tool_choice="required", parallel_tool_calls=False, seed=seed,
            max_tokens=512,
        )  # fmt: skip
        assert len(answer["choices"][0]["message"]["tool_calls"]) == 1


async def test_auto_answers_or_calls_and_none_only_answers(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    gateway = served[1]
    for seed in range(4):
        message = (await _answer(http, f"auto-{seed}", seed=seed))["choices"][0]["message"]
        if message.get("tool_calls"):
            assert all(
                c["function"]["name"] in ("calculator", "weather") for c in message["tool_calls"]
            )
        else:  # a plain answer never starts a call it does not finish
            assert not (message["content"] or "").startswith("<")
    answer = await _answer(http, "none", tool_choice="none", seed=1, max_tokens=12)
    assert "tool_calls" not in answer["choices"][0]["message"]
    assert _record(gateway, "none").grammar is None


async def test_a_tool_conversation_chains_into_one_sequence(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    gateway = served[1]
    first = await _answer(
        http, "chain", tool_choice="required", parallel_tool_calls=False, seed=8, max_tokens=512
    )
    message = first["choices"][0]["message"]
    messages = [*ASK, message] + [
        {"role": "tool", "tool_call_id": call["id"], "content": "391"}
        for call in message["tool_calls"]
    ]
    await _answer(http, "chain", messages=messages, seed=9, max_tokens=24)
    calls = gateway.records.calls("chain")
    result = RolloutResultResponse(rollout_id="chain", status="success", sample={"reward": 1.0})
    sequences, stats = build_sequences([RolloutRecords(result, "g", calls)])
    assert (len(sequences), stats.merges, stats.drift, stats.new_contexts) == (1, 1, 0, 0)


async def test_a_malformed_call_in_the_history_is_rendered_not_crashed_on(
    http: httpx2.AsyncClient,
) -> None:
    """A workflow hand-edited the history: a call's arguments are not JSON, and a reply holds
    half a call as text."""
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "calculator", "arguments": "{17*23"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: bad arguments"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "calcul'},
        {"role": "user", "content": "Try again."},
    ]  # fmt: skip
    answer = await _answer(http, "malformed", messages=messages, seed=1, max_tokens=16)
    assert answer["choices"][0]["message"]["role"] == "assistant"


async def test_the_parser_takes_calls_and_keeps_the_text_around_them() -> None:
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": '
        '"17*23"}}\n</tool_call>\n<tool_call>\n{"name": "weather", "arguments": {"city": '
        '"Oslo"}}\n</tool_call>'
    )
    content, calls = HERMES.parse(text)
    assert content == "Let me compute."
    assert [c["function"]["name"] for c in calls] == ["calculator", "weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo"}
    # Cut short, or not JSON: the reply is text.
    assert HERMES.parse('<tool_call>\n{"name": "calcu') == ('<tool_call>\n{"name": "calcu', [])
    assert HERMES.parse("<tool_call>\nnot json\n</tool_call>")[1] == []
    assert HERMES.parse("plain answer") == ("plain answer", [])
    # A closing tag inside a JSON string is part of the string.
    inside = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1</tool_call>"}}'
    (call,) = HERMES.parse(inside + "\n</tool_call>")[1]
    assert json.loads(call["function"]["arguments"]) == {"expression": "1</tool_call>"}
