"""examples/pydantic_ai_calculator: its workflow against a real OpenAI-compatible stub (the
sample, the requests, no retries, what Pydantic AI sends after an empty reply), and
``osmosis eval run`` of the example as shipped, on the embedded model."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout import ExecutionRequest, LocalBackend, RolloutContext, RolloutStatus
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.eval.conftest import ROOT
from tests.rollout.integrations.agents.conftest import API_KEY, check_example_evaluates, tool_call

EXAMPLE = "pydantic_ai_calculator"
MAIN = ROOT / "examples" / EXAMPLE / "rollouts" / EXAMPLE / "main.py"
PROMPT = [
    {"role": "system", "content": "Use the calculate tool, then state the final number."},
    {"role": "user", "content": "What is 57 - 19?"},
]
CALL = {"a": 57, "operator": "-", "b": 19}


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    """The example's entrypoint, run as a module (its names: workflow, grader, config)."""
    return runpy.run_path(str(MAIN))


async def _execute(example: dict[str, Any], stub: ChatStub, tmp_path: Path, label: str) -> Any:
    backend = LocalBackend(
        workflow=example["PydanticAICalculatorWorkflow"],
        workflow_config=example["PydanticAICalculatorConfig"](),
        grader=example["LastNumberGrader"],
        artifact_root=tmp_path,
    )
    request = ExecutionRequest(id="r1", prompt=PROMPT, label=label)
    with RolloutContext(chat_completions_url=stub.base_url, api_key=API_KEY, rollout_id="r1"):
        return (await backend.execute(request)).result


def _meaning(message: dict[str, Any]) -> tuple[Any, ...]:
    """A chat message without its ids and JSON layout."""
    calls = tuple(
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in message.get("tool_calls") or ()
    )
    return (message["role"], message.get("content") or "", str(calls))


async def test_a_tool_call_and_the_answer_become_an_openai_chat_sample(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    stub.push(tool_call("calculate", CALL), StubReply(content="57 - 19 = 38"))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS, result
    assert result.sample.reward == 1.0
    messages = result.sample.messages
    assert messages[:2] == PROMPT
    assert messages[2]["role"] == "assistant" and messages[2]["content"] is None
    ((sent_call),) = messages[2]["tool_calls"]
    assert sent_call["id"] == "call_1" and sent_call["function"]["name"] == "calculate"
    assert json.loads(sent_call["function"]["arguments"]) == CALL
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "38"}
    assert messages[4] == {"role": "assistant", "content": "57 - 19 = 38"}
    # Two chat-completions calls on the rollout's endpoint, with its key and the config's
    # sampling; the sample is what the second one sent, then its reply.
    first, second = stub.requests
    assert first["headers"]["authorization"] == f"Bearer {API_KEY}"
    body = first["body"]
    assert body["temperature"] == 0.0
    assert body.get("max_completion_tokens", body.get("max_tokens")) == 256
    ((tool),) = body["tools"]
    assert tool["function"]["name"] == "calculate"
    assert set(tool["function"]["parameters"]["properties"]) == {"a", "operator", "b"}
    assert [_meaning(m) for m in second["body"]["messages"]] == [_meaning(m) for m in messages[:4]]


async def test_a_wrong_final_number_scores_zero(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    stub.push(StubReply(content="It is 37, or maybe 39."))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 0.0
    assert len(stub.requests) == 1


async def test_arguments_that_do_not_validate_are_answered_with_a_retry_result(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    # Pydantic AI's own tool retry: a tool result on the call, appended to the history.
    stub.push(
        tool_call("calculate", {"a": 57, "operator": "^", "b": 19}),
        StubReply(content="57 - 19 = 38"),
    )
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0
    sent = stub.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "call_1"
    assert "literal_error" in sent["content"]
    assert result.sample.messages[3] == sent


async def test_a_failed_model_call_fails_the_rollout_without_a_retry(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    # A retried call would be a second sample of the same prompt that trains as if the
    # agent had seen it.
    stub.push(StubFailure(500))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.FAILURE and result.sample is None, result
    assert len(stub.requests) == 1


async def test_the_model_call_limit_ends_a_tool_loop_and_the_sample_is_kept(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    limit = example["PydanticAICalculatorConfig"]().max_model_calls
    stub.push(*(tool_call("calculate", {"a": 1, "operator": "+", "b": i}) for i in range(9)))
    result = await _execute(example, stub, tmp_path, label="2")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 0.0
    assert len(stub.requests) == limit
    roles = [m["role"] for m in result.sample.messages]
    assert roles == ["system", "user", *["assistant", "tool"] * limit]


async def test_an_empty_reply_is_left_out_of_the_next_request(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    # Pydantic AI answers a reply without text or tool calls with a retry message, and leaves
    # the empty reply out of the history it sends (Chat Completions refuses an assistant
    # message with neither). So that call's request does not continue the empty reply's: under
    # `osmosis train` it starts a sequence of its own (counted in `new_contexts`). The sample
    # keeps the empty reply, as the model gave it.
    stub.push(tool_call("calculate", CALL), StubReply(content=""), StubReply(content="38"))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0
    second, third = (request["body"]["messages"] for request in stub.requests[1:])
    assert [m["role"] for m in third] == [*(m["role"] for m in second), "system"]
    assert "text or call a tool" in third[-1]["content"]
    assert [_meaning(m) for m in result.sample.messages] == [
        *(_meaning(m) for m in third[:-1]),
        ("assistant", "", "()"),  # the empty reply
        _meaning(third[-1]),
        ("assistant", "38", "()"),
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_example_evaluates_on_the_embedded_model(tmp_path: Path) -> None:
    await check_example_evaluates(tmp_path, EXAMPLE)
