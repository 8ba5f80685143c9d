"""examples/langgraph_calculator: its workflow against a real OpenAI-compatible stub (the
sample, the requests, no retries), and ``osmosis eval run`` of the example as shipped, on the
embedded model."""

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

EXAMPLE = "langgraph_calculator"
MAIN = ROOT / "examples" / EXAMPLE / "rollouts" / EXAMPLE / "main.py"
PROMPT = [
    {"role": "system", "content": "Use the calculate tool, then state the final number."},
    {"role": "user", "content": "What is 57 - 19?"},
]


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    """The example's entrypoint, run as a module (its names: workflow, grader, config)."""
    return runpy.run_path(str(MAIN))


async def _execute(example: dict[str, Any], stub: ChatStub, tmp_path: Path, label: str) -> Any:
    backend = LocalBackend(
        workflow=example["LangGraphCalculatorWorkflow"],
        workflow_config=example["LangGraphCalculatorConfig"](),
        grader=example["LastNumberGrader"],
        artifact_root=tmp_path,
    )
    request = ExecutionRequest(id="r1", prompt=PROMPT, label=label)
    with RolloutContext(chat_completions_url=stub.base_url, api_key=API_KEY, rollout_id="r1"):
        return (await backend.execute(request)).result


async def test_a_tool_call_and_the_answer_become_an_openai_chat_sample(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    stub.push(
        tool_call("calculate", {"a": 57, "operator": "-", "b": 19}),
        StubReply(content="57 - 19 = 38"),
    )
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS, result
    assert result.sample.reward == 1.0
    messages = result.sample.messages
    assert messages[:2] == PROMPT
    call = messages[2]
    assert call["role"] == "assistant" and not call["content"]
    ((sent_call),) = call["tool_calls"]
    assert sent_call["id"] == "call_1" and sent_call["function"]["name"] == "calculate"
    assert json.loads(sent_call["function"]["arguments"]) == {"a": 57, "operator": "-", "b": 19}
    assert messages[3]["role"] == "tool"
    assert (messages[3]["tool_call_id"], messages[3]["content"]) == ("call_1", "38")
    assert messages[4] == {"role": "assistant", "content": "57 - 19 = 38"}
    # Two chat-completions calls on the rollout's endpoint, with its key and the config's
    # sampling; the second sends the tool's result.
    first, second = stub.requests
    assert first["headers"]["authorization"] == f"Bearer {API_KEY}"
    body = first["body"]
    assert body["temperature"] == 0.0
    assert body.get("max_completion_tokens", body.get("max_tokens")) == 256
    ((tool),) = body["tools"]
    assert tool["function"]["name"] == "calculate"
    assert set(tool["function"]["parameters"]["properties"]) == {"a", "operator", "b"}
    assert second["body"]["messages"][-1]["role"] == "tool"
    assert second["body"]["messages"][-1]["content"] == "38"


async def test_a_wrong_final_number_scores_zero(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    stub.push(StubReply(content="It is 37, or maybe 39."))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 0.0
    assert len(stub.requests) == 1  # no tool call, no second call


async def test_arguments_that_do_not_validate_are_answered_with_an_error_result(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    stub.push(
        tool_call("calculate", {"a": 57, "operator": "^", "b": 19}),
        StubReply(content="57 - 19 = 38"),
    )
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 1.0
    sent = stub.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "call_1"
    assert "operator" in sent["content"] and "error" in sent["content"]
    assert result.sample.messages[3]["content"] == sent["content"]


async def test_a_failed_model_call_fails_the_rollout_without_a_retry(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    # A retried call would be a second sample of the same prompt that trains as if the
    # agent had seen it.
    stub.push(StubFailure(500))
    result = await _execute(example, stub, tmp_path, label="38")
    assert result.status is RolloutStatus.FAILURE and result.sample is None, result
    assert len(stub.requests) == 1


async def test_the_model_call_limit_ends_a_tool_loop(
    example: dict[str, Any], stub: ChatStub, tmp_path: Path
) -> None:
    limit = example["LangGraphCalculatorConfig"]().max_model_calls
    stub.push(*(tool_call("calculate", {"a": 1, "operator": "+", "b": i}) for i in range(9)))
    result = await _execute(example, stub, tmp_path, label="2")
    assert result.status is RolloutStatus.SUCCESS and result.sample.reward == 0.0
    assert len(stub.requests) == limit
    assert result.sample.messages[-1]["tool_calls"]  # the last call is never run


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_example_evaluates_on_the_embedded_model(tmp_path: Path) -> None:
    await check_example_evaluates(tmp_path, EXAMPLE)
