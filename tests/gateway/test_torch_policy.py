"""TorchPolicy behind the real gateway over HTTP, on a tiny random Llama with a real tokenizer."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import ConfigError, MissingExtraError, PolicyError
from osmosis_ai.gateway import (
    CallRecord,
    Gateway,
    PolicySpec,
    TorchPolicy,
    build_policy,
    parse_policy_spec,
)
from osmosis_ai.gateway.policies.chat_front import bounded_strings
from osmosis_ai.gateway.policies.engines import TorchEngine
from osmosis_ai.gateway.policies.engines.grammar import (
    ALL_ALLOWED,
    GrammarCompiler,
    allowed_logits,
    fill_masks,
    grammar_text,
)
from osmosis_ai.gateway.policies.hf_dir import import_llguidance
from osmosis_ai.gateway.request import ChatRequest, parse_chat_request
from tests.eval.conftest import OSMOSIS, Workspace, rows, workspace  # noqa: F401 -- fixture
from tests.gateway.conftest import serving, sse_events
from tests.gateway.test_embedded_policy import CALCULATOR, TOOL_CALL_RESULT, WEATHER
from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tiny_model_dir: Path) -> AsyncIterator[tuple[TorchPolicy, Gateway]]:  # noqa: F811
    policy = TorchPolicy(tiny_model_dir)
    async with Gateway(policy) as gateway:
        yield policy, gateway


@pytest_asyncio.fixture(loop_scope="module")
async def http(served: tuple[TorchPolicy, Gateway]) -> AsyncIterator[httpx2.AsyncClient]:
    gateway = served[1]
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with httpx2.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Any:  # noqa: F811
    """The same weights, loaded separately, for teacher forcing."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    return model.eval()


async def _chat(http: httpx2.AsyncClient, rollout: str, **body: Any) -> dict[str, Any]:
    response = await http.post(f"/v1/rollouts/{rollout}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _one(gateway: Gateway, rollout: str) -> CallRecord:
    (record,) = gateway.records.calls(rollout)
    assert record.status == "ok", record.error
    return record


def _teacher_forced(
    model: Any,
    record: CallRecord,
    temperature: float,
    grammar: Any = None,
    vocab_size: int = 0,
) -> list[float]:
    """Logprobs of the recorded completion under one forward pass of the same weights."""
    import torch

    prompt = list(record.prompt_token_ids or ())
    completion = list(record.completion_token_ids or ())
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    bitmask = torch.full((1, (vocab_size + 31) // 32), ALL_ALLOWED, dtype=torch.int32)
    out = []
    for step, token in zip(steps, completion, strict=True):
        row = step.clone().unsqueeze(0)
        if grammar is not None:
            fill_masks([(0, grammar)], bitmask)
            row = allowed_logits(row, bitmask)
            grammar.consume_token(token)
        scaled = row[0] / temperature if temperature else row[0]
        out.append(float(torch.log_softmax(scaled, dim=-1)[token]))
    return out


def _engine(policy: TorchPolicy) -> TorchEngine:
    engine = policy.engine
    assert isinstance(engine, TorchEngine)
    return engine


def _grammar_text(policy: TorchPolicy, request: ChatRequest) -> str:
    """The Lark text of the grammar the policy generates ``request`` under."""
    grammar = policy.front.prepare(request).generation.grammar
    assert grammar is not None
    return grammar_text(grammar)


def _compiler(policy: TorchPolicy) -> GrammarCompiler:
    """A grammar compiler of the policy's model."""
    return GrammarCompiler.of_model(_engine(policy).model, policy.front.tokenizer)


def _matcher(policy: TorchPolicy, request: ChatRequest) -> Any:
    """A matcher of the grammar the policy generates ``request`` under, at its start."""
    return _compiler(policy).matcher(_grammar_text(policy, request))


def _max_delta(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_plain_answer_records_token_ids_logprobs_and_version(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    policy, gateway = served
    answer = await _chat(http, "plain", messages=_ask("Name a color."), max_tokens=12, seed=3)
    choice = answer["choices"][0]
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    assert answer["model"] == policy.model == Path(policy.model_dir or "").name
    assert "prompt_token_ids" not in answer and "logprobs" not in choice
    assert "policy_version" not in answer and "sampling" not in answer
    record = _one(gateway, "plain")
    # The sampling the engine used is recorded (the learner cuts the same distribution).
    assert (record.temperature, record.top_p, record.top_k) == (1.0, 1.0, 0)
    usage = answer["usage"]
    assert len(record.prompt_token_ids or ()) == usage["prompt_tokens"]
    assert len(record.completion_token_ids or ()) == usage["completion_tokens"] <= 12
    assert len(record.logprobs or ()) == usage["completion_tokens"]
    assert all(logprob <= 0 for logprob in record.logprobs or ())
    assert record.policy_version == _engine(policy).version
    assert record.to_json()["policy_version"] == _engine(policy).version


async def test_caller_can_ask_for_token_ids_and_top_logprobs(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "asked",
        messages=_ask("Say hello."),
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        return_token_ids=True,
    )
    choice = answer["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [entry["id"] for entry in entries] == choice["token_ids"]
    # Greedy: the chosen token is the most likely one.
    assert all(entry["top_logprobs"][0]["id"] == entry["id"] for entry in entries)
    assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
    assert len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"]


async def test_prompt_ids_are_the_chat_template_of_the_messages(
    http: httpx2.AsyncClient,
    served: tuple[TorchPolicy, Gateway],
    tokenizer_dir: Path,  # noqa: F811
) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, *_ask("Hi there")]
    await _chat(http, "template", messages=messages, max_tokens=2)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    text = str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert text.startswith("<|im_start|>system\nBe brief.")
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert list(_one(served[1], "template").prompt_token_ids or ()) == expected


async def test_named_tool_choice_is_a_call_of_that_tool(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http,
        "named",
        messages=_ask("What is the weather in Paris?"),
        tools=[CALCULATOR, WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        max_tokens=160,
        seed=1,
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "weather" and call["id"].startswith("call_")
    city = json.loads(call["function"]["arguments"])["city"]
    assert isinstance(city, str) and len(city) <= 64  # free strings are bounded


async def test_alternatives_are_only_tokens_that_could_be_sampled(
    http: httpx2.AsyncClient,
) -> None:
    answer = await _chat(
        http,
        "forced-alternatives",
        messages=_ask("Weather?"),
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=40,
        top_k=3,
        seed=1,
        logprobs=True,
        top_logprobs=5,
    )
    entries = answer["choices"][0]["logprobs"]["content"]
    counts = [len(entry["top_logprobs"]) for entry in entries]
    # The grammar forces most tokens ({"name": "weather", ...): one possible token each.
    assert 1 in counts and max(counts) <= 3
    assert all(alt["logprob"] <= 0 for entry in entries for alt in entry["top_logprobs"])


@pytest.mark.parametrize("seed", [1, 2])
async def test_required_tool_choice_is_always_a_valid_call(
    http: httpx2.AsyncClient, seed: int
) -> None:
    answer = await _chat(
        http,
        f"required-{seed}",
        messages=_ask("What is 3*4?"),
        tools=[CALCULATOR, WEATHER],
        tool_choice="required",
        max_tokens=160,
        seed=seed,
    )
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    expected_key = {"calculator": "expression", "weather": "city"}[call["function"]["name"]]
    assert set(arguments) == {expected_key}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_auto_tool_choice_is_a_call_or_an_answer(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], seed: int
) -> None:
    answer = await _chat(
        http,
        f"auto-{seed}",
        messages=_ask("What is 3*4?"),
        tools=[CALCULATOR],
        # Room for the longest reply the grammar allows (a bounded string, bounded
        # whitespace): the random model can use all of it.
        max_tokens=256,
        seed=seed,
    )
    choice = answer["choices"][0]
    record = _one(served[1], f"auto-{seed}")
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "calculator"
        assert set(json.loads(call["function"]["arguments"])) == {"expression"}
    else:
        # An answer (possibly cut at max_tokens): its text, never the raw JSON around it.
        assert not choice["message"].get("tool_calls")
        assert not choice["message"]["content"].lstrip().startswith("{")
    if choice["finish_reason"] != "length":
        # The grammar completed, and the turn ended with the end-of-turn token.
        assert (record.completion_token_ids or [0])[-1] == 2


async def test_turn_after_a_tool_result_is_an_answer(http: httpx2.AsyncClient) -> None:
    answer = await _chat(
        http, "after-tool", messages=TOOL_CALL_RESULT, tools=[CALCULATOR], max_tokens=48, seed=1
    )
    message = answer["choices"][0]["message"]
    assert "tool_calls" not in message and isinstance(message["content"], str)


async def test_tool_choice_none_generates_free_text(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    answer = await _chat(
        http,
        "none",
        messages=_ask("What is 2+2?"),
        tools=[CALCULATOR],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert "tool_calls" not in answer["choices"][0]["message"]
    # Unconstrained: the tools are not described in the prompt either.
    prompt = _one(served[1], "none").prompt_token_ids or ()
    assert len(prompt) == answer["usage"]["prompt_tokens"]


async def test_sampled_logprobs_match_teacher_forcing_in_a_padded_batch(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], reference: Any
) -> None:
    policy, gateway = served
    prompts = ["Hi.", "Tell me a long story about the sea and the ships on it.", "Count to ten."]
    settings: list[dict[str, Any]] = [
        {"temperature": 0.7, "seed": 5},
        {"temperature": 0},
        {"temperature": 1.3},
    ]
    async with _engine(policy).updating(
        version=_engine(policy).version
    ):  # hold the batch until all have arrived
        calls = [
            asyncio.create_task(
                _chat(http, f"tf-{index}", messages=_ask(text), max_tokens=24, **setting)
            )
            for index, (text, setting) in enumerate(zip(prompts, settings, strict=True))
        ]
        async with asyncio.timeout(30):
            while _engine(policy).waiting < len(calls):  # noqa: ASYNC110 -- set by the server task
                await asyncio.sleep(0.01)
    await asyncio.gather(*calls)
    for index, setting in enumerate(settings):
        record = _one(gateway, f"tf-{index}")
        expected = _teacher_forced(reference, record, setting["temperature"])
        assert _max_delta(list(record.logprobs or ()), expected) <= 1e-3


async def test_top_p_logprobs_are_of_the_renormalised_distribution(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], reference: Any
) -> None:
    import torch

    await _chat(http, "top-p", messages=_ask("Hi."), max_tokens=16, temperature=1.0, top_p=0.5)
    record = _one(served[1], "top-p")
    full = _teacher_forced(reference, record, 1.0)
    recorded = list(record.logprobs or ())
    # Renormalising over the kept nucleus raises every sampled token's logprob...
    assert all(r >= f - 1e-6 for r, f in zip(recorded, full, strict=True))
    assert any(r > f + 1e-3 for r, f in zip(recorded, full, strict=True))
    # ...to the log of its probability divided by the mass of the kept tokens.
    prompt = list(record.prompt_token_ids or ())
    completion = list(record.completion_token_ids or ())
    with torch.inference_mode():
        logits = reference(torch.tensor([prompt + completion])).logits[0]
    first = torch.softmax(logits[len(prompt) - 1], dim=-1)
    ordered = torch.sort(first, descending=True).values
    kept = ordered[(ordered.cumsum(-1) - ordered) < 0.5].sum()
    assert abs(recorded[0] - (full[0] - float(torch.log(kept)))) <= 1e-4


async def test_top_k_one_samples_the_greedy_tokens_with_certainty(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    body = {"messages": _ask("Hi."), "max_tokens": 8}
    await _chat(http, "greedy", **body, temperature=0)
    await _chat(http, "top-k", **body, temperature=1.5, top_k=1, seed=9)
    greedy, top_k = _one(served[1], "greedy"), _one(served[1], "top-k")
    assert top_k.completion_token_ids == greedy.completion_token_ids
    assert all(logprob == 0 for logprob in top_k.logprobs or ())
    assert (top_k.temperature, top_k.top_k) == (1.5, 1)


async def test_response_format_json_schema_is_enforced(http: httpx2.AsyncClient) -> None:
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    answer = await _chat(
        http,
        "json-schema",
        messages=_ask("Pick a color."),
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        max_tokens=32,
        seed=3,
    )
    assert json.loads(answer["choices"][0]["message"]["content"])["color"] in ("red", "green")
    free = await _chat(
        http,
        "json-object",
        messages=_ask("Reply in JSON."),
        response_format={"type": "json_object"},
        max_tokens=4,
        seed=3,
    )
    assert free["choices"][0]["message"]["content"].startswith("{")


async def test_constrained_logprobs_match_teacher_forcing_under_the_grammar(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], reference: Any
) -> None:
    policy, gateway = served
    answer = await _chat(
        http,
        "tf-tool",
        messages=_ask("Weather in Oslo?"),
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=160,
        temperature=0.8,
        seed=7,
    )
    record = _one(gateway, "tf-tool")
    assert record.finish_reason == "tool_calls"
    # The grammar the policy compiles for this request, replayed token by token.
    request = parse_chat_request(
        {"messages": _ask("Weather in Oslo?"), "tools": [WEATHER], "tool_choice": "required"}
    )
    expected = _teacher_forced(
        reference, record, 0.8, _matcher(policy, request), vocab_size=reference.config.vocab_size
    )
    assert _max_delta(list(record.logprobs or ()), expected) <= 1e-3
    # The record names that grammar (for the learner's replay); the caller never sees it.
    assert record.grammar == _grammar_text(policy, request)
    assert record.to_json()["grammar"] == record.grammar and "grammar" not in answer
    # Tokens the grammar forces (e.g. the tool name) come out with logprob 0.
    assert any(logprob == 0 for logprob in record.logprobs or ())


async def test_tool_replies_may_be_laid_out_as_the_model_likes_within_a_bound(
    served: tuple[TorchPolicy, Gateway],
) -> None:
    request = parse_chat_request({"messages": _ask("1+2?"), "tools": [CALCULATOR]})
    tokenizer = served[0].front.tokenizer

    def accepts(text: str) -> bool:
        matcher = _matcher(served[0], request)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        return bool(matcher.consume_tokens(tokens)) and matcher.is_accepting()

    # Indented JSON, as small chat models were trained to write it (a forced one-line
    # layout pushes them off their own tokens and into nonsense), and the compact form.
    indented = '{\n    "name": "calculator",\n    "arguments": {"expression": "1+2"}\n}'
    assert accepts(indented)
    assert accepts('{"name":"calculator","arguments":{"expression":"1+2"}}')
    assert accepts('{"answer": "3"}')
    # Whitespace is bounded, so a model cannot run on in it until max_tokens.
    assert not accepts("{" + " " * 200 + '"answer": "3"}')


async def test_concurrent_calls_are_generated_in_one_batch(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    policy, gateway = served
    before = sum(_engine(policy).batch_sizes.values())
    async with _engine(policy).updating(version=_engine(policy).version):
        calls = [
            asyncio.create_task(_chat(http, f"batch-{index}", messages=_ask("Hi."), max_tokens=4))
            for index in range(4)
        ]
        async with asyncio.timeout(30):
            while _engine(policy).waiting < 4:  # noqa: ASYNC110 -- set by the server task
                await asyncio.sleep(0.01)
    await asyncio.gather(*calls)
    assert sum(_engine(policy).batch_sizes.values()) == before + 1
    assert _engine(policy).batch_sizes[4] >= 1
    assert all(_one(gateway, f"batch-{index}").status == "ok" for index in range(4))


async def test_calls_join_and_leave_a_running_batch_with_exact_logprobs(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], reference: Any
) -> None:
    policy, gateway = served
    admissions = sum(_engine(policy).batch_sizes.values())
    # A long call starts alone; a short one (shorter prompt) and a long-prompt one arrive
    # while it generates, join its batch, and the short one finishes first.
    long_call = asyncio.create_task(
        _chat(http, "join-long", messages=_ask("Hi."), max_tokens=160, temperature=0.9, seed=3)
    )
    async with asyncio.timeout(30):
        while sum(_engine(policy).batch_sizes.values()) == admissions:  # noqa: ASYNC110 -- set by the worker
            await asyncio.sleep(0.005)
    short = await _chat(
        http, "join-short", messages=_ask("Ok"), max_tokens=3, temperature=0.5, seed=1
    )
    await _chat(
        http,
        "join-wide",
        messages=_ask("Tell me a long story about the sea, the ships on it and their crews."),
        max_tokens=6,
        temperature=0,
    )
    assert not long_call.done(), "the joining calls did not wait for the running one to end"
    await long_call
    assert sum(_engine(policy).batch_sizes.values()) == admissions + 3
    assert short["usage"]["completion_tokens"] == 3
    for rollout, temperature in (("join-long", 0.9), ("join-short", 0.5), ("join-wide", 0.0)):
        record = _one(gateway, rollout)
        expected = _teacher_forced(reference, record, temperature)
        assert _max_delta(list(record.logprobs or ()), expected) <= 1e-3, rollout


async def test_streamed_answer_arrives_with_its_records(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    response = await http.post(
        "/v1/rollouts/stream/chat/completions",
        json={"messages": _ask("Hi."), "max_tokens": 6, "stream": True, "seed": 2,
              "top_p": 0.8, "stream_options": {"include_usage": True}},
    )  # fmt: skip
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert all("policy_version" not in event and "sampling" not in event for event in events[:-1])
    usage = events[-2]["usage"]
    record = _one(served[1], "stream")
    assert record.stream and len(record.completion_token_ids or ()) == usage["completion_tokens"]
    assert record.policy_version == _engine(served[0]).version
    assert record.grammar is None  # free text
    assert (record.top_p, record.top_k) == (0.8, 0)  # recorded from a stream too
    # A constrained stream: its record keeps the grammar, which no chunk carries.
    response = await http.post(
        "/v1/rollouts/stream-tool/chat/completions",
        json={"messages": _ask("Weather in Oslo?"), "tools": [WEATHER], "stream": True,
              "tool_choice": "required", "max_tokens": 160, "seed": 2},
    )  # fmt: skip
    assert all("grammar" not in event for event in sse_events(response.text)[:-1])
    assert "%json" in (_one(served[1], "stream-tool").grammar or "")


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 0.5), ("seed", "x"), ("top_k", -1), ("stop", [1])],
)
async def test_bad_sampling_fields_are_refused_by_name(
    http: httpx2.AsyncClient, field: str, value: Any
) -> None:
    response = await http.post(
        "/v1/rollouts/bad/chat/completions", json={"messages": _ask("Hi."), field: value}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field


async def test_context_overflow_is_a_client_error(http: httpx2.AsyncClient) -> None:
    response = await http.post(
        "/v1/rollouts/overflow/chat/completions",
        json={"messages": _ask("word " * 2100), "max_tokens": 4},
    )
    assert response.status_code == 400
    assert "context of 2048 tokens" in response.json()["error"]["message"]


async def test_stop_string_ends_the_answer_before_it(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    body = {"messages": _ask("Hi."), "max_tokens": 12, "temperature": 1.0, "seed": 11}
    text = (await _chat(http, "free", **body))["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop, text
    stopped = await _chat(http, "stopped", **body, stop=[stop])
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == text[: text.find(stop)]


async def test_weight_update_changes_the_version_and_the_answers(tiny_model_dir: Path) -> None:  # noqa: F811
    import torch

    policy = TorchPolicy(tiny_model_dir, version=7)
    async with serving(policy) as (gateway, http):
        body = {"messages": _ask("Hi."), "max_tokens": 8, "temperature": 0}
        await _chat(http, "update", **body)
        engine = _engine(policy)
        # Trained in place: the engine's own model object changes while generation waits.
        async with engine.updating() as update:
            with torch.no_grad():
                for parameter in engine.model.parameters():
                    parameter.add_(0.05 * torch.randn_like(parameter))
            await update.push(engine.model)
        await _chat(http, "update", **body)
        # Another model's weights are copied in.
        other = copy.deepcopy(engine.model)
        with torch.no_grad():
            for parameter in other.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        async with engine.updating(version=42) as update:
            await update.push(other)
        await _chat(http, "update", **body)
    before, after, pushed = gateway.records.calls("update")
    assert (before.policy_version, after.policy_version, pushed.policy_version) == (7, 8, 42)
    assert list(after.logprobs or ()) != list(before.logprobs or ())
    assert list(pushed.logprobs or ()) != list(after.logprobs or ())
    assert all(
        torch.equal(mine, theirs)
        for mine, theirs in zip(engine.model.parameters(), other.parameters(), strict=True)
    ), "the pushed weights are the engine's now"


async def test_a_call_during_an_update_waits_and_sees_only_the_new_weights(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    import math

    import torch

    policy = TorchPolicy(tiny_model_dir)
    async with serving(policy) as (gateway, http):
        engine = _engine(policy)
        async with engine.updating():
            call = asyncio.create_task(_chat(http, "held", messages=_ask("Hi."), max_tokens=4))
            async with asyncio.timeout(30):
                while engine.waiting < 1:  # noqa: ASYNC110 -- set by the server task
                    await asyncio.sleep(0.01)
            with torch.no_grad():
                for parameter in engine.model.parameters():
                    parameter.zero_()  # all-zero weights: every next token equally likely
            assert not call.done()
        await call
    record = _one(gateway, "held")
    assert record.policy_version == 1
    uniform = -math.log(engine.model.config.vocab_size)
    assert all(abs(logprob - uniform) < 1e-4 for logprob in record.logprobs or ())


async def test_calls_still_waiting_when_the_policy_stops_fail_with_503(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    policy = TorchPolicy(tiny_model_dir)
    await policy.start()
    request = parse_chat_request({"messages": _ask("Hi."), "max_tokens": 2})
    async with _engine(policy).updating():
        calls = [asyncio.create_task(policy.complete(request)) for _ in range(3)]
        async with asyncio.timeout(30):
            while _engine(policy).waiting < 3:  # noqa: ASYNC110 -- set by the dispatcher task
                await asyncio.sleep(0.01)
        await policy.aclose()
    for call in calls:
        with pytest.raises(PolicyError) as info:
            await call
        assert info.value.status_code == 503


async def test_a_live_model_is_served_without_a_directory(tiny_model_dir: Path) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    policy = TorchPolicy(model=model, tokenizer=tokenizer, name="live")
    async with serving(policy) as (gateway, http):
        answer = await _chat(http, "live", messages=_ask("Hi."), max_tokens=3)
    assert answer["model"] == "live"
    assert _one(gateway, "live").policy_version == 0


async def test_a_policy_needs_a_directory_or_a_live_model_and_tokenizer(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    choices: list[dict[str, Any]] = [
        {},
        {"model_dir": tiny_model_dir, "model": object()},
        {"model": object()},
    ]
    for arguments in choices:
        with pytest.raises(ConfigError, match="give one of the two"):
            TorchPolicy(**arguments)


async def test_torch_spec_parses_and_builds(tiny_model_dir: Path) -> None:  # noqa: F811
    assert parse_policy_spec(f"torch:{tiny_model_dir}") == PolicySpec(
        "torch", model=str(tiny_model_dir)
    )
    policy = build_policy(f"torch:{tiny_model_dir}")
    assert isinstance(policy, TorchPolicy) and policy.model_dir is not None
    assert policy.model_dir.is_absolute() and policy.model_dir.name == tiny_model_dir.name


@pytest.mark.parametrize("spec", ["torch:", "torch:  "])
async def test_torch_spec_without_a_directory_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="name the checkpoint directory"):
        parse_policy_spec(spec)


async def test_torch_spec_of_a_missing_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        build_policy(f"torch:{tmp_path / 'nowhere'}")


async def test_bounded_strings_bounds_only_free_strings() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "free": {"type": "string"},
            "pattern": {"type": "string", "pattern": "[0-9]+"},
            "short": {"type": "string", "maxLength": 3},
            "list": {"type": "array", "items": {"type": "string"}},
        },
    }
    bounded: Any = bounded_strings(schema, 10)
    assert bounded["properties"]["free"] == {"type": "string", "maxLength": 10}
    assert bounded["properties"]["pattern"] == schema["properties"]["pattern"]
    assert bounded["properties"]["short"] == {"type": "string", "maxLength": 3}
    assert bounded["properties"]["list"]["items"] == {"type": "string", "maxLength": 10}
    assert schema["properties"]["free"] == {"type": "string"}  # the input is not changed


async def test_missing_llguidance_names_the_train_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'osmosis-ai\[train\]'"):
        import_llguidance("The torch policy")


async def test_gateway_command_serves_a_checkpoint_directory(tiny_model_dir: Path) -> None:  # noqa: F811
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "gateway", "--policy", f"torch:{tiny_model_dir}", "--port", "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        lines: dict[str, str] = {}
        async with asyncio.timeout(60):
            while "token" not in lines:
                key, _, value = (await process.stdout.readline()).decode().partition(":")
                lines[key.strip()] = value.strip()
        assert "policy torch" in lines["gateway"]
        headers = {"Authorization": f"Bearer {lines['token']}"}
        async with httpx2.AsyncClient(
            base_url=lines["gateway"].split()[0], headers=headers, timeout=60
        ) as http:
            await _chat(http, "cli", messages=_ask("Hi."), max_tokens=3)
            (call,) = (await http.get("/v1/rollouts/cli/calls")).json()["calls"]
        assert call["policy_version"] == 0 and len(call["logprobs"]) == len(
            call["completion_token_ids"]
        )
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await process.wait()
    assert code == 0


async def test_gateway_command_names_what_a_checkpoint_lacks(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "gateway", "--policy", f"torch:{tmp_path}",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"has no weights" in stderr and b"tokenizer" in stderr


async def test_eval_run_with_a_torch_checkpoint(
    workspace: Workspace,  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    import transformers

    # The probe sets no max_tokens: the checkpoint's own cap keeps the random model short.
    checkpoint = await asyncio.to_thread(shutil.copytree, tiny_model_dir, tmp_path / "capped")
    capped: Any = transformers.GenerationConfig
    capped(max_new_tokens=6, eos_token_id=2).save_pretrained(str(checkpoint))
    workspace.write_config(model=f"torch:{checkpoint}")
    workspace.write_rows(rows(2))
    code, out = await workspace.run()
    assert code == 0, out
    (run_dir,) = workspace.run_dirs()
    trajectory = json.loads((run_dir / "trajectories" / "row_0_run_0.json").read_text())
    metrics = trajectory["steps"][-1]["metrics"]
    assert 0 < len(metrics["completion_token_ids"]) == len(metrics["logprobs"]) <= 6
    assert metrics["prompt_token_ids"]


async def test_running_out_of_device_memory_while_generating_is_flagged(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    policy = TorchPolicy(model=model.eval(), tokenizer=tokenizer, name="oom")
    async with serving(policy) as (gateway, http):
        await _chat(http, "fits", messages=_ask("Hi."), max_tokens=2)
        assert not _engine(policy).out_of_memory

        def out_of_memory(*args: Any, **kwargs: Any) -> Any:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        model.forward = out_of_memory  # what a GPU does when the batch's cache does not fit
        response = await http.post(
            "/v1/rollouts/oom/chat/completions", json={"messages": _ask("Hi."), "max_tokens": 2}
        )
    assert response.status_code == 500
    assert "OutOfMemoryError: CUDA out of memory" in response.json()["error"]["message"]
    assert _engine(policy).out_of_memory, "the trainer reads this and stops the run"
    assert gateway.records.calls("oom")[0].status == "error"
