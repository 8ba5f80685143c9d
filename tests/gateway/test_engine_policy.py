"""The engine seam: a scripted token engine behind the real chat front and gateway.

The engine sees only token ids, sampling and a grammar; the chat front renders, plans tool
calls and builds answers, and the gateway's call records come out as they do for the torch
engine: the template's exact prompt ids, the engine's completion ids and logprobs, the
weight version.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies import ChatFront, EnginePolicy
from osmosis_ai.gateway.policies.engines import (
    Generation,
    GenerationRequest,
    JsonGrammar,
    TokenEngine,
    WeightUpdate,
)
from tests.gateway.conftest import serving
from tests.gateway.test_embedded_policy import CALCULATOR
from tests.train.conftest import tokenizer_dir  # noqa: F401 -- fixture

LOGPROB = -0.25


class _NoWeights:
    async def push(self, model: Any) -> None:
        pass


class ScriptedEngine(TokenEngine):
    """Answers every call with the next scripted text's token ids, logprob -0.25 each."""

    kind = "scripted"
    refused_sampling = ("min_p",)

    def __init__(self, tokenizer: Any, replies: list[str], *, end_id: int) -> None:
        self._tokenizer, self._replies, self._end_id = tokenizer, list(replies), end_id
        self.requests: list[GenerationRequest] = []
        self.stop_at: int | None = None

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        ids = [*self._tokenizer(self._replies.pop(0), add_special_tokens=False)["input_ids"]]
        ids.append(self._end_id)
        alternatives = [[(token, LOGPROB), (token + 1, LOGPROB - 1)] for token in ids]
        return Generation(
            token_ids=ids,
            logprobs=[LOGPROB] * len(ids),
            finish_reason="stop",
            version=self.version,
            top_logprobs=alternatives if request.sampling.top_logprobs else [],
            stop_at=self.stop_at,
        )

    @contextlib.asynccontextmanager
    async def updating(self, version: int | None = None) -> AsyncIterator[WeightUpdate]:
        yield _NoWeights()
        self.version = self.version + 1 if version is None else version


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> Any:  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@contextlib.asynccontextmanager
async def _served(
    tokenizer: Any, *replies: str
) -> AsyncIterator[tuple[ScriptedEngine, Gateway, httpx2.AsyncClient]]:
    engine = ScriptedEngine(tokenizer, list(replies), end_id=tokenizer.eos_token_id)
    policy = EnginePolicy(ChatFront(tokenizer, context_length=2048), engine, name="scripted")
    async with serving(policy) as (gateway, http):
        yield engine, gateway, http


async def _chat(http: httpx2.AsyncClient, rollout: str, **body: Any) -> httpx2.Response:
    return await http.post(f"/v1/rollouts/{rollout}/chat/completions", json=body)


async def test_records_carry_the_templates_ids_the_engines_tokens_and_the_version(
    tokenizer: Any,
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
    ]
    async with _served(tokenizer, "Blue.", "Red.") as (engine, gateway, http):
        first = await _chat(http, "r", messages=messages, temperature=0.7, max_tokens=9, seed=4)
        async with engine.updating(version=5):
            pass
        await _chat(http, "r", messages=messages)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Blue."}
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["model"] == "scripted"
    template_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if not isinstance(template_ids, list):  # a BatchEncoding in some transformers releases
        template_ids = template_ids["input_ids"]
    request = engine.requests[0]
    assert request.prompt_ids == list(template_ids)
    sampling = request.sampling
    assert (sampling.temperature, sampling.max_tokens, sampling.seed) == (0.7, 9, 4)
    assert request.grammar is None
    before, after = gateway.records.calls("r")
    completion = [
        *tokenizer("Blue.", add_special_tokens=False)["input_ids"],
        tokenizer.eos_token_id,
    ]
    assert list(before.prompt_token_ids or ()) == list(template_ids)
    assert list(before.completion_token_ids or ()) == completion
    assert list(before.logprobs or ()) == [LOGPROB] * len(completion)
    assert (before.policy_version, after.policy_version) == (0, 5)
    assert before.usage == {
        "prompt_tokens": len(template_ids),
        "completion_tokens": len(completion),
        "total_tokens": len(template_ids) + len(completion),
    }


async def test_tool_calls_are_planned_constrained_and_parsed_by_the_front(
    tokenizer: Any,
) -> None:
    reply = '{"name": "calculator", "arguments": {"expression": "2+2"}}'
    async with _served(tokenizer, reply) as (engine, gateway, http):
        response = await _chat(
            http, "tool", messages=[{"role": "user", "content": "2+2?"}], tools=[CALCULATOR],
            tool_choice="required",
        )  # fmt: skip
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2+2"}
    # The engine got the plan's grammar: a call of the tool, free strings bounded.
    grammar = engine.requests[0].grammar
    assert isinstance(grammar, JsonGrammar) and grammar.max_whitespace == 12
    schema = json.loads(grammar.schema)
    (option,) = schema["anyOf"]  # required: no answer allowed
    assert option["properties"]["name"] == {"const": "calculator"}
    assert option["properties"]["arguments"]["properties"]["expression"]["maxLength"] == 64
    # ... and the prompt's system message describes the tools.
    prompt = tokenizer.decode(engine.requests[0].prompt_ids)
    assert "You can call these tools:" in prompt and '"calculator"' in prompt
    (record,) = gateway.records.calls("tool")
    assert record.finish_reason == "tool_calls"


async def test_what_the_engine_cannot_honour_is_refused_before_it_is_called(
    tokenizer: Any,
) -> None:
    async with _served(tokenizer, "unused") as (engine, _, http):
        response = await _chat(http, "r", messages=[{"role": "user", "content": "Hi"}], min_p=0.1)
        bad = await _chat(http, "r", messages=[{"role": "user", "content": "Hi"}], top_k=-2)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "min_p"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_k"
    assert engine.requests == []


async def test_stop_strings_cut_the_text_and_asked_for_logprobs_show_each_token(
    tokenizer: Any,
) -> None:
    async with _served(tokenizer, "one two three") as (engine, _, http):
        engine.stop_at = len("one two")
        response = await _chat(
            http, "r", messages=[{"role": "user", "content": "Count"}], logprobs=True,
            top_logprobs=2, stop=[" three"],
        )  # fmt: skip
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == "one two"
    assert engine.requests[0].sampling.stop == (" three",)
    entries = choice["logprobs"]["content"]
    ids = tokenizer("one two three", add_special_tokens=False)["input_ids"]
    assert [entry["token"] for entry in entries[:-1]] == [tokenizer.decode([i]) for i in ids]
    assert all(entry["logprob"] == LOGPROB for entry in entries)
    assert [alt["id"] for alt in entries[0]["top_logprobs"]] == [ids[0], ids[0] + 1]
