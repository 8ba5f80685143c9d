"""A chat template that renders earlier turns otherwise (Qwen3-style: an earlier reply loses its
think block once a new user turn follows): the gateway prompts with the template's own ids and
marks the call, and the trainer starts one new sequence there, inventing and dropping no token.
The same conversation under a template that keeps the think block chains into one sequence.
(A tiny random Llama with the embedded model's tokenizer, served by the torch engine behind a
real gateway.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.gateway import CallRecord, TorchPolicy
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.train import RolloutRecords, build_sequences
from tests.gateway.conftest import serving
from tests.gateway.test_exact_history import SHORT_JSON
from tests.train.conftest import tiny_model_dir, tokenizer_dir, with_chat_template  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEMPLATES = Path(__file__).parent / "templates"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["dropped", "kept"])
async def served(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,  # noqa: F811
) -> AsyncIterator[tuple[str, Any, httpx2.AsyncClient]]:
    """``(template, gateway, client)``: the tiny model under a think-dropping or -keeping
    template."""
    template = request.param
    directory = tmp_path_factory.mktemp(f"think-{template}") / "model"
    with_chat_template(tiny_model_dir, directory, TEMPLATES / f"think_{template}.jinja")
    async with serving(TorchPolicy(directory), client_timeout_sec=120) as (gateway, http):
        yield template, gateway, http


async def _reply(
    http: httpx2.AsyncClient, messages: list[dict[str, Any]], **body: Any
) -> dict[str, Any]:
    response = await http.post(
        "/v1/rollouts/r/chat/completions",
        json={"messages": messages, "temperature": 1.0, "seed": 7, **body},
    )
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    assert "history_rewritten" not in response.json()  # recorded, never shown
    return message


def _ids(record: CallRecord) -> list[int]:
    return [*(record.prompt_token_ids or ()), *(record.completion_token_ids or ())]


async def test_one_new_sequence_where_the_template_rewrites_the_history(
    served: tuple[str, Any, httpx2.AsyncClient],
) -> None:
    template, gateway, http = served
    gateway.records.release("r")
    # A question, a reply, a tool result and a reply (the tool loop keeps the think block),
    # then a new user turn (after which this template drops it from the earlier replies).
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    messages.append(await _reply(http, messages, response_format=SHORT_JSON))
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "5"})
    messages.append(await _reply(http, messages, response_format=SHORT_JSON))
    messages.append({"role": "user", "content": "And 3+4?"})
    await _reply(http, messages, max_tokens=4)
    calls = gateway.records.calls("r")
    assert [call.status for call in calls] == ["ok", "ok", "ok"]
    rewritten = template == "dropped"
    assert [call.history_rewritten for call in calls] == [False, False, rewritten]
    assert [call.to_json()["history_rewritten"] for call in calls] == [False, False, rewritten]

    result = RolloutResultResponse(rollout_id="r", status="success", sample={"reward": 1.0})
    for records in (calls, [call.to_json() for call in calls]):  # in-process, and as sent
        sequences, stats = build_sequences([RolloutRecords(result, "g", records)])
        assert (stats.drift, stats.new_contexts, stats.realign_dropped_tokens) == (0, 0, 0)
        # Every token of every sequence is a recorded one, in order: the first call's prompt
        # and completion, the second call's prompt tail and completion...
        first, second, third = calls
        chained = [*_ids(first), *_ids(second)[len(_ids(first)) :]]
        if rewritten:
            assert (stats.merges, stats.history_rewrites) == (1, 1)
            assert [list(s.token_ids) for s in sequences] == [chained, _ids(third)]
            # The new sequence trains the last reply; the earlier ones stay trained in the
            # first, as generated.
            assert sum(sequences[1].loss_mask) == len(third.completion_token_ids or ())
        else:
            assert (stats.merges, stats.history_rewrites) == (2, 0)
            assert [list(s.token_ids) for s in sequences] == [
                [*chained, *_ids(third)[len(chained) :]]
            ]
        policy_tokens = sum(len(call.completion_token_ids or ()) for call in calls)
        assert stats.policy_tokens == policy_tokens


async def test_a_single_sequence_realigns_a_rewriting_turn_and_counts_it(
    served: tuple[str, Any, httpx2.AsyncClient],
) -> None:
    """verl trains one sequence per rollout: a rewriting turn is realigned into it, counted
    as a rewrite (not as drift), with its cut tokens counted."""
    template, gateway, http = served
    gateway.records.release("r")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    messages.append(await _reply(http, messages, response_format=SHORT_JSON))
    messages.append({"role": "user", "content": "Again"})
    await _reply(http, messages, max_tokens=4)
    first, second = gateway.records.calls("r")
    result = RolloutResultResponse(rollout_id="r", status="success", sample={"reward": 1.0})
    (sequence,), stats = build_sequences(
        [RolloutRecords(result, "g", [first, second])], drift="realign", one_sequence=True
    )
    assert stats.drift == 0
    if template == "dropped":
        assert stats.history_rewrites == 1
        # The first reply's think block is gone from the second prompt: everything after
        # the shared start of the reply's turn is cut, and counted.
        assert stats.realign_dropped_tokens == len(first.completion_token_ids or ())
        assert list(sequence.token_ids) == _ids(second)
    else:
        assert (stats.history_rewrites, stats.realign_dropped_tokens, stats.merges) == (0, 0, 1)
        assert list(sequence.token_ids) == [*_ids(first), *_ids(second)[len(_ids(first)) :]]
