"""OsmosisStrandsAgent against a real OpenAI-compatible stub: binding, samples, previews."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from strands import Agent, tool

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
    RolloutStatus,
)
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.rollout.integrations.agents.conftest import API_KEY, rollout, tool_call

PROMPT = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 2 + 3?"},
]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _agent(**kwargs: Any) -> OsmosisStrandsAgent:
    kwargs.setdefault("model", OsmosisRolloutModel())
    kwargs.setdefault("messages", PROMPT)
    return OsmosisStrandsAgent(callback_handler=None, **kwargs)


def test_placeholder_outside_a_rollout_says_to_construct_the_agent_inside_run() -> None:
    with pytest.raises(RuntimeError, match=r"construct the agent inside AgentWorkflow\.run\(\)"):
        _agent()


async def test_placeholder_in_a_plain_strands_agent_fails_with_the_fix() -> None:
    agent = Agent(model=OsmosisRolloutModel(), callback_handler=None)
    with pytest.raises(RuntimeError, match="pass it as model= to an OsmosisStrandsAgent"):
        await agent.invoke_async("hi")


def test_unknown_model_setting_lists_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"temperature.*params=\{\.\.\.\}"):
        OsmosisRolloutModel(temperature=1.0)


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_round_trip_gives_native_sample_and_chat_trajectory(
    stub: ChatStub, stream: bool
) -> None:
    stub.push(tool_call("add", {"a": 2, "b": 3}), StubReply(content="5"))
    model = OsmosisRolloutModel(params={"temperature": 0.5}, stream=stream)
    async with rollout(stub) as rollout_ctx:
        result = await _agent(model=model, tools=[add]).invoke_async()
        sample = await rollout_ctx.get_sample()
    assert result.message["content"] == [{"text": "5"}]
    assert [r["body"].get("stream", False) for r in stub.requests] == [stream, stream]
    for request in stub.requests:
        assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
        assert request["body"]["model"] == "osmosis-rollout"
        assert request["body"]["temperature"] == 0.5
        assert request["body"]["messages"][0] == {"role": "system", "content": "Use the tools."}
    assert sample is not None
    roles = [m["role"] for m in sample.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert sample.messages[1]["content"][0]["toolUse"]["input"] == {"a": 2, "b": 3}
    assert sample.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "5"}]
    chat = sample.trajectory_messages
    assert chat is not None
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
    assert chat[2]["tool_calls"][0]["function"]["name"] == "add"
    assert chat[3] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


async def test_a_failed_call_is_sent_once(stub: ChatStub) -> None:
    """A retried call would be a second sample of the prompt that the agent never sees."""
    stub.push(StubFailure(500))
    async with rollout(stub):
        with pytest.raises(Exception, match="stub failure"):
            await _agent().invoke_async()
    assert len(stub.requests) == 1


async def test_empty_answer_keeps_its_step_in_the_trajectory(stub: ChatStub) -> None:
    stub.push(StubReply(content=""))
    async with rollout(stub) as rollout_ctx:
        await _agent().invoke_async()
        sample = await rollout_ctx.get_sample()
    assert sample is not None and sample.trajectory_messages is not None
    assert [m["role"] for m in sample.trajectory_messages] == ["system", "user", "assistant"]


async def test_agent_without_a_model_is_bound_inside_a_rollout(stub: ChatStub) -> None:
    async with rollout(stub) as rollout_ctx:
        agent = OsmosisStrandsAgent(messages=PROMPT, callback_handler=None)
        await agent.invoke_async()
        assert rollout_ctx.sample_source is not None
    assert stub.requests[0]["body"]["model"] == "osmosis-rollout"


async def test_a_failed_construction_registers_nothing(stub: ChatStub) -> None:
    async with rollout(stub) as rollout_ctx:
        with pytest.raises(TypeError):
            _agent(no_such_strands_option=True)
        assert rollout_ctx.sample_source is None
        _agent()  # a retry works
        assert rollout_ctx.sample_source is not None


async def test_second_agent_in_one_rollout_is_refused(stub: ChatStub) -> None:
    async with rollout(stub):
        _agent()
        with pytest.raises(ConfigError, match="already has a sample source"):
            _agent()


async def test_model_client_is_closed_when_the_rollout_ends(stub: ChatStub) -> None:
    async with rollout(stub):
        agent = _agent()
        await agent.invoke_async()
        client = agent.model._custom_client  # type: ignore[attr-defined]
        assert not client.is_closed()
    assert client.is_closed()


class _ToolWorkflow(AgentWorkflow):
    tools: list[Any] = []
    agents: list[OsmosisStrandsAgent] = []

    async def run(self, ctx: AgentWorkflowContext) -> None:
        agent = OsmosisStrandsAgent(
            model=OsmosisRolloutModel(),
            tools=self.tools,
            messages=ctx.prompt,
            callback_handler=None,
        )
        self.agents.append(agent)
        await agent.invoke_async()


async def _run_backend(stub: ChatStub, workflow: type[AgentWorkflow]) -> Any:
    request = ExecutionRequest(id="r1", prompt=PROMPT, label="5")
    with RolloutContext(chat_completions_url=stub.base_url, api_key=API_KEY, rollout_id="r1"):
        return (await LocalBackend(workflow=workflow).execute(request)).result


async def test_tool_that_raises_becomes_an_error_result_and_the_rollout_goes_on(
    stub: ChatStub,
) -> None:
    @tool
    def divide(a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    class Divides(_ToolWorkflow):
        tools = [divide]

    stub.push(tool_call("divide", {"a": 1, "b": 0}), StubReply(content="cannot divide"))
    result = await _run_backend(stub, Divides)
    assert result.status is RolloutStatus.SUCCESS
    tool_result = result.sample.messages[2]["content"][0]["toolResult"]
    assert tool_result["status"] == "error"
    assert "division by zero" in tool_result["content"][0]["text"]
    sent = stub.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and "division by zero" in str(sent["content"])
    client = Divides.agents[-1].model._custom_client  # type: ignore[attr-defined]
    assert client.is_closed()  # the backend ran the rollout's cleanups


async def test_sync_tools_run_off_the_event_loop(stub: ChatStub) -> None:
    threads: list[int] = []
    ticks: list[float] = []

    @tool
    def slow(x: int) -> int:
        """Return x after a while."""
        threads.append(threading.get_ident())
        threading.Event().wait(0.3)
        return x

    class Slow(_ToolWorkflow):
        tools = [slow]

    async def heartbeat() -> None:
        for _ in range(100):
            ticks.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.02)

    stub.push(tool_call("slow", {"x": 1}), StubReply(content="1"))
    beat = asyncio.create_task(heartbeat())
    result = await _run_backend(stub, Slow)
    beat.cancel()
    assert result.status is RolloutStatus.SUCCESS
    assert threads and threads[0] != threading.get_ident()
    assert max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 0.25


async def test_prompt_is_converted_without_being_modified(stub: ChatStub) -> None:
    prompt = [
        {"role": "system", "content": "From the dataset."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"text": "two"}]},
    ]
    original = repr(prompt)
    async with rollout(stub):
        agent = _agent(messages=prompt, system_prompt="Explicit.")
    assert repr(prompt) == original
    assert agent.system_prompt == "Explicit.\n\nFrom the dataset."
    assert agent.messages == [{"role": "user", "content": [{"text": "part one"}, {"text": "two"}]}]


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, "content[0]"),
        ({"role": "tool", "content": "x", "tool_call_id": "c"}, "tool results"),
        ({"role": "critic", "content": "x"}, "'critic'"),
        ({"role": "user", "content": 3}, "must be a string or a list"),
    ],
)
def test_prompt_entries_strands_cannot_hold_are_named(message: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=r"messages\[1\]") as info:
        OsmosisStrandsAgent(messages=[PROMPT[1], message], callback_handler=None)
    assert named in str(info.value)


async def test_unconvertible_history_keeps_the_sample_and_skips_the_trajectory(
    stub: ChatStub, caplog: pytest.LogCaptureFixture
) -> None:
    async with rollout(stub) as rollout_ctx:
        agent = _agent()
        agent.messages.append({"role": "user", "content": [{"unknownBlock": {}}]})  # type: ignore[typeddict-unknown-key]
        with caplog.at_level(logging.WARNING):
            sample = await rollout_ctx.get_sample()
    assert sample is not None and sample.trajectory_messages is None
    assert sample.messages[-1] == {"role": "user", "content": [{"unknownBlock": {}}]}
    assert "no trajectory is saved" in caplog.text


async def test_preview_is_bounded_isolated_and_media_free(stub: ChatStub) -> None:
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}
    history: list[Any] = [
        {"role": "user", "content": [{"text": "look"}]},
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "hmm"}}},
                {"toolUse": {"toolUseId": "t1", "name": "shot", "input": {}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "t1", "status": "success", "content": [image]}}
            ],
        },
        {"role": "assistant", "content": [{"text": "a cat"}]},
    ]
    async with rollout(stub) as rollout_ctx:
        agent = _agent(messages=history, system_prompt="sys")
        source = rollout_ctx.sample_source
        assert source is not None
        window = await source.get_preview(3)
        whole = await source.get_preview(10)
        assert await source.get_preview(0) is None
    assert window is not None and whole is not None
    assert len(window.messages) == 3
    assert window.extra_fields == {"_preview_truncated": True, "_preview_turn": 2}
    assert whole.extra_fields == {"_preview_truncated": False, "_preview_turn": 2}
    window.messages[0]["content"].clear()
    assert agent.messages[1]["content"]  # the agent's history is untouched
    chat = whole.trajectory_messages
    assert chat is not None
    assert chat[0] == {"role": "system", "content": "sys"}
    text = repr(chat)
    assert "hmm" not in text and "PNG" not in text
    assert "[image omitted from preview]" in text
    # The inserted user note keeps the step count equal to the final trajectory's.
    final = await source.get_sample()
    assert final.trajectory_messages is not None
    assert len(chat) == len(final.trajectory_messages)
    revision = source.preview_revision()
    assert source.preview_revision() == revision  # stable while nothing happens
    agent.messages.append({"role": "user", "content": [{"text": "more"}]})
    assert source.preview_revision() != revision
