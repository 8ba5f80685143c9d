"""Exact history: a call that continues an earlier call of its rollout is prompted with the
model's own ids for it (a tiny random Llama with the embedded model's tokenizer, behind a real
gateway, served by the torch engine)."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osmosis_ai.gateway import CallRecord, Gateway, TorchPolicy
from osmosis_ai.gateway.policies._history import message_meaning
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from tests.gateway.conftest import serving
from tests.gateway.test_embedded_policy import CALCULATOR
from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

_PROPERTY_ROLLOUTS = itertools.count()

#: A JSON reply of bounded length: the tiny random model ends it with its end-of-turn token.
SHORT_JSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "reply",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string", "maxLength": 12}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(
    tiny_model_dir: Path,  # noqa: F811
) -> AsyncIterator[tuple[TorchPolicy, Gateway, httpx2.AsyncClient]]:
    policy = TorchPolicy(tiny_model_dir)
    async with serving(policy, client_timeout_sec=120) as (gateway, http):
        yield policy, gateway, http


async def _reply(
    http: httpx2.AsyncClient, rollout: str, messages: list[dict[str, Any]], **body: Any
) -> dict[str, Any]:
    response = await http.post(
        f"/v1/rollouts/{rollout}/chat/completions",
        json={"messages": messages, "temperature": 1.0, "max_tokens": 96, **body},
    )
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def _calls(gateway: Gateway, rollout: str) -> list[CallRecord]:
    calls = gateway.records.calls(rollout)
    assert all(call.status == "ok" for call in calls), calls
    return calls


def _ids(record: CallRecord) -> tuple[list[int], list[int]]:
    return list(record.prompt_token_ids or ()), list(record.completion_token_ids or ())


def _sequences(rollout: str, calls: list[CallRecord]) -> tuple[list[Any], Any]:
    result = RolloutResultResponse(rollout_id=rollout, status="success", sample={"reward": 1.0})
    return build_sequences([RolloutRecords(result, "g", calls)])


def _rerendered(policy: TorchPolicy, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt ids of ``messages`` rendered and tokenised anew (no history replayed)."""
    front = policy.front
    return front.encode(front.render(messages))


async def _reply_that_tokenises_otherwise(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway], name: str
) -> tuple[str, list[dict[str, Any]], list[int], list[int]]:
    """A rollout whose first reply (sampled JSON, token by token under the grammar) the
    tokenizer splits otherwise when it is rendered again (the drift the splice removes): its
    id, the follow-up conversation, and the first call's prompt and completion ids."""
    policy, gateway = served
    for seed in range(40):  # bounded: most sampled replies qualify
        rollout = f"{name}-{seed}"
        first = [{"role": "user", "content": "Say yes or no."}]
        reply = await _reply(http, rollout, first, seed=seed, response_format=SHORT_JSON)
        prompt, completion = _ids(_calls(gateway, rollout)[0])
        follow_up = [*first, reply, {"role": "user", "content": "Why?"}]
        if _rerendered(policy, follow_up)[: len(prompt) + len(completion)] != prompt + completion:
            return rollout, follow_up, prompt, completion
    pytest.fail("no sampled reply tokenised otherwise when rendered again")


async def test_a_reply_that_tokenises_otherwise_is_replayed_as_generated(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    gateway = served[1]
    rollout, follow_up, prompt, completion = await _reply_that_tokenises_otherwise(
        http, served, "split"
    )
    await _reply(http, rollout, follow_up, seed=1, max_tokens=4)
    first_call, second_call = _calls(gateway, rollout)
    assert _ids(second_call)[0][: len(prompt) + len(completion)] == prompt + completion
    (sequence,), stats = _sequences(rollout, [first_call, second_call])
    assert (stats.merges, stats.drift, stats.new_contexts) == (1, 0, 0)
    assert list(sequence.token_ids[len(prompt) : len(prompt) + len(completion)]) == completion


async def test_a_tool_call_the_agent_sends_back_is_replayed_as_the_model_wrote_it(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    """The front re-renders a tool call as indented JSON, the model writes it its own way; the
    turn after the tool result is held to an answer without changing the system message."""
    _, gateway = served
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    call = await _reply(
        http, "tool", messages, tools=[CALCULATOR], tool_choice="required", seed=5, max_tokens=96
    )
    (tool_call,) = call["tool_calls"]
    # The agent's framework sends the call back re-serialised (other key order and spacing).
    arguments = json.loads(tool_call["function"]["arguments"])
    resent = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                **tool_call,
                "function": {"arguments": json.dumps(arguments, indent=1), "name": "calculator"},
            }
        ],
    }
    assert message_meaning(resent) == message_meaning(call)
    messages += [resent, {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}]
    await _reply(http, "tool", messages, tools=[CALCULATOR], seed=6, max_tokens=32)
    calls = _calls(gateway, "tool")
    prompt, completion = _ids(calls[0])
    assert _ids(calls[1])[0][: len(prompt) + len(completion)] == prompt + completion
    (_,), stats = _sequences("tool", calls)
    assert (stats.merges, stats.drift, stats.new_contexts) == (1, 0, 0)


async def test_a_rewritten_history_is_a_new_context(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    policy, gateway = served
    first = [{"role": "user", "content": "Say yes or no."}]
    reply = await _reply(http, "rewritten", first, seed=3, response_format=SHORT_JSON)
    # A summarising agent replaces the reply before asking on.
    follow_up = [
        *first,
        {"role": "assistant", "content": "(summary)"},
        {"role": "user", "content": "Go on."},
    ]
    assert message_meaning(follow_up[1]) != message_meaning(reply)
    await _reply(http, "rewritten", follow_up, seed=4, max_tokens=4)
    calls = _calls(gateway, "rewritten")
    assert _ids(calls[1])[0] == _rerendered(policy, follow_up)
    sequences, stats = _sequences("rewritten", calls)
    assert len(sequences) == 2 and stats.new_contexts + stats.drift == 1


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    question=st.text(min_size=1, max_size=40),
    follow_up=st.text(min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
async def test_a_spliced_prompt_reads_as_the_rendered_conversation(
    http: httpx2.AsyncClient,
    served: tuple[TorchPolicy, Gateway],
    question: str,
    follow_up: str,
    seed: int,
) -> None:
    """Decoded, the spliced ids are the template's text of the conversation: the agent's
    messages reach the model unchanged, only the reply's split is the model's own."""
    policy, gateway = served
    rollout = f"property-{next(_PROPERTY_ROLLOUTS)}"
    first = [{"role": "user", "content": question}]
    reply = await _reply(http, rollout, first, seed=seed, response_format=SHORT_JSON)
    messages = [*first, reply, {"role": "user", "content": follow_up}]
    await _reply(http, rollout, messages, seed=seed, max_tokens=2)
    first_call, second_call = _calls(gateway, rollout)
    prompt, completion = _ids(first_call)
    spliced = _ids(second_call)[0]
    assert spliced[: len(prompt) + len(completion)] == prompt + completion
    # The text the tokenizer gives back for the conversation rendered anew (which is the text
    # itself but for characters its vocabulary cannot spell).
    tokenizer = policy.front.tokenizer
    assert tokenizer.decode(spliced) == tokenizer.decode(_rerendered(policy, messages))


async def test_a_released_rollout_is_forgotten(
    http: httpx2.AsyncClient, served: tuple[TorchPolicy, Gateway]
) -> None:
    policy, gateway = served
    rollout, follow_up, _, _ = await _reply_that_tokenises_otherwise(http, served, "released")
    gateway.records.release(rollout)  # the controller is done with the rollout
    await _reply(http, rollout, follow_up, seed=2, max_tokens=4)
    (call,) = _calls(gateway, rollout)
    assert _ids(call)[0] == _rerendered(policy, follow_up)
