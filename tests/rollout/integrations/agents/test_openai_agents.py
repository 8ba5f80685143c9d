"""OsmosisAgent and OsmosisMemorySession against a real OpenAI-compatible stub, behind a real
gateway where the agent calls the model: in the SDK's default Responses API and in chat
completions."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
    RolloutErrorCategory,
    RolloutStatus,
)
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    ModelApi,
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.testing import ChatStub, StubFailure, StubReply
from tests.rollout.integrations.agents.conftest import (
    API_KEY,
    UPSTREAM_KEY,
    gateway_rollout,
    rollout,
    stub_gateway,
    tool_call,
)

PROMPT: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _agent(**kwargs: Any) -> OsmosisAgent[Any]:
    kwargs.setdefault("model", OsmosisRolloutModel())
    return OsmosisAgent(name="calc", instructions="Use the tools.", **kwargs)


def test_placeholder_outside_a_rollout_says_to_construct_the_agent_inside_run() -> None:
    with pytest.raises(RuntimeError, match=r"construct the agent inside AgentWorkflow\.run\(\)"):
        _agent()


async def test_placeholder_in_a_plain_agent_fails_with_the_fix() -> None:
    agent = Agent(name="plain", model=OsmosisRolloutModel())
    with pytest.raises(RuntimeError, match="pass it as model= to an OsmosisAgent"):
        await Runner.run(agent, "hi")


async def _streamed(agent: OsmosisAgent[Any], session: OsmosisMemorySession) -> Any:
    result = Runner.run_streamed(agent, PROMPT, session=session)
    async for _ in result.stream_events():
        pass
    return result.final_output


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_tool_round_trip_gives_native_items_and_chat_trajectory(
    stub: ChatStub, stream: bool, api: ModelApi
) -> None:
    stub.push(tool_call("add", {"a": 2, "b": 3}), StubReply(content="5"))
    async with gateway_rollout(stub) as rollout_ctx:
        agent = _agent(
            tools=[add],
            model=OsmosisRolloutModel(api=api),
            model_settings=ModelSettings(temperature=0.5, max_tokens=64),
        )
        session = OsmosisMemorySession()
        if stream:
            output = await _streamed(agent, session)
        else:
            output = (await Runner.run(agent, PROMPT, session=session)).final_output
        sample = await rollout_ctx.get_sample()
    assert output == "5"
    # The gateway passed the SDK's calls on as chat completions, in the SDK's mode.
    for request in stub.requests:
        assert bool(request["body"].get("stream")) is stream
        assert request["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert request["body"]["model"] == "osmosis-rollout"
        assert request["body"]["temperature"] == 0.5
        assert request["body"]["messages"][0] == {"role": "system", "content": "Use the tools."}
    assert sample is not None
    kinds = [item.get("type", item.get("role")) for item in sample.messages]
    assert kinds == ["user", "function_call", "function_call_output", "message"]
    chat = sample.trajectory_messages
    assert chat is not None
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"]
    assert chat[1]["tool_calls"][0]["function"]["name"] == "add"
    assert chat[2]["content"] == "5"


def test_an_unknown_api_is_refused() -> None:
    with pytest.raises(ConfigError, match="'responses' or 'chat_completions'"):
        OsmosisRolloutModel(api="completions")  # type: ignore[arg-type]


async def test_a_failed_call_is_sent_once(stub: ChatStub) -> None:
    """A retried call would be a second sample of the prompt that the agent never sees."""
    stub.push(StubFailure(500))
    async with gateway_rollout(stub):
        with pytest.raises(Exception, match="stub failure"):
            await Runner.run(_agent(), PROMPT, session=OsmosisMemorySession())
    assert len(stub.requests) == 1


async def test_agent_without_a_model_is_bound_inside_a_rollout_in_responses_mode(
    stub: ChatStub,
) -> None:
    async with stub_gateway(stub) as gateway:
        url = gateway.chat_completions_url("r1")
        with RolloutContext(
            chat_completions_url=url, api_key=gateway.token, rollout_id="r1"
        ) as rollout_ctx:
            agent = OsmosisAgent(name="default")
            await Runner.run(agent, PROMPT, session=OsmosisMemorySession())
            await rollout_ctx.run_cleanups()  # as a backend does: closes the agent's client
        (record,) = gateway.records.calls("r1")
    assert type(agent.model).__name__ == "OpenAIResponsesModel"
    assert stub.requests[0]["body"]["model"] == "osmosis-rollout"
    assert record.status == "ok"


async def test_second_session_in_one_rollout_is_refused(stub: ChatStub) -> None:
    async with rollout(stub):
        OsmosisMemorySession()
        with pytest.raises(ConfigError, match="already has a sample source"):
            OsmosisMemorySession()


async def test_several_agents_share_one_rollout(stub: ChatStub) -> None:
    stub.push(StubReply(content="from the specialist"))
    async with gateway_rollout(stub) as rollout_ctx:
        specialist = _agent()
        triage = _agent(handoffs=[specialist])
        session = OsmosisMemorySession()
        await Runner.run(specialist, PROMPT, session=session)
        assert triage.model is not specialist.model
        sample = await rollout_ctx.get_sample()
    assert sample is not None and sample.messages[-1]["role"] == "assistant"


async def test_session_reused_by_another_rollout_is_refused(stub: ChatStub) -> None:
    async with rollout(stub, "first"):
        session = OsmosisMemorySession()
        await session.add_items([{"role": "user", "content": "hi"}])
    async with rollout(stub, "second"):
        with pytest.raises(RuntimeError, match=r"belongs to rollout 'first'.*'second'"):
            await session.get_items()
    assert await session.get_items() == [{"role": "user", "content": "hi"}]  # no rollout: fine


async def test_session_created_outside_the_rollout_fails_loudly_inside_it(stub: ChatStub) -> None:
    stub.push(StubReply(content="5"))
    outside = OsmosisMemorySession()  # e.g. at import time or in a test fixture

    class Outside(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await Runner.run(_agent(), ctx.prompt, session=outside)

    request = ExecutionRequest(id="r1", prompt=PROMPT, label="5")
    with RolloutContext(chat_completions_url=stub.base_url, api_key=API_KEY, rollout_id="r1"):
        result = (await LocalBackend(workflow=Outside).execute(request)).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert result.err_message is not None
    assert "RuntimeError" in result.err_message
    assert "must be created inside the rollout" in result.err_message
    assert stub.requests == []  # refused before any model call was spent
    assert outside.items == []


async def test_session_outside_a_rollout_is_a_plain_session() -> None:
    session = OsmosisMemorySession()
    await session.add_items([{"role": "user", "content": str(i)} for i in range(4)])
    assert [i["content"] for i in await session.get_items(limit=2)] == ["2", "3"]
    assert await session.get_items(limit=0) == []
    assert (await session.pop_item()) == {"role": "user", "content": "3"}
    await session.clear_session()
    assert await session.get_items() == []


async def test_unconvertible_items_keep_the_sample_and_skip_the_trajectory(
    stub: ChatStub, caplog: pytest.LogCaptureFixture
) -> None:
    async with rollout(stub) as rollout_ctx:
        session = OsmosisMemorySession()
        await session.add_items([{"type": "no_such_item", "payload": 1}])
        with caplog.at_level(logging.WARNING):
            sample = await rollout_ctx.get_sample()
    assert sample is not None and sample.trajectory_messages is None
    assert sample.messages == [{"type": "no_such_item", "payload": 1}]
    assert "no trajectory is saved" in caplog.text


class _Failing(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        @function_tool
        def lookup(key: str) -> str:
            """Look a key up."""
            raise KeyError(key)

        agent = OsmosisAgent(name="a", model=OsmosisRolloutModel(), tools=[lookup])
        await Runner.run(agent, ctx.prompt, session=OsmosisMemorySession())


async def test_tool_that_raises_is_reported_to_the_model_and_the_rollout_goes_on(
    stub: ChatStub,
) -> None:
    stub.push(tool_call("lookup", {"key": "missing"}), StubReply(content="not found"))
    request = ExecutionRequest(id="r1", prompt=PROMPT, label="x")
    async with stub_gateway(stub) as gateway:
        url = gateway.chat_completions_url("r1")
        with RolloutContext(chat_completions_url=url, api_key=gateway.token, rollout_id="r1"):
            result = (await LocalBackend(workflow=_Failing).execute(request)).result
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None
    output = next(i for i in result.sample.messages if i.get("type") == "function_call_output")
    # The SDK's default tells the model that the tool failed, without the exception's text.
    assert "error occurred while running the tool" in output["output"]
    sent = stub.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"] == output["output"]


async def test_preview_is_bounded_with_turns_counted(stub: ChatStub) -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "5"}]},
    ]
    async with rollout(stub) as rollout_ctx:
        session = OsmosisMemorySession()
        await session.add_items(items)
        source = rollout_ctx.sample_source
        assert source is not None
        window = await source.get_preview(2)
        whole = await source.get_preview(5)
    assert window is not None and whole is not None
    assert window.messages == items[-2:]
    assert window.extra_fields == {"_preview_truncated": True, "_preview_turn": 2}
    assert whole.extra_fields == {"_preview_truncated": False, "_preview_turn": 2}
    window.messages[0]["output"] = "changed"
    assert session.items[3]["output"] == "5"
    revision = source.preview_revision()
    await session.add_items([{"type": "mystery"}])
    assert source.preview_revision() != revision
    unknown = await source.get_preview(10)
    assert unknown is not None and unknown.extra_fields["_preview_turn"] is None


_TRACING_PROBE = textwrap.dedent(
    """
    import asyncio, json
    from agents.tracing import get_trace_provider
    from osmosis_ai.rollout import RolloutContext
    from osmosis_ai.rollout.integrations.agents.openai_agents import (
        OsmosisAgent, OsmosisRolloutModel,
    )

    async def main():
        with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="r") as c:
            OsmosisAgent(name="a", model=OsmosisRolloutModel())
            await c.run_cleanups()
        trace = get_trace_provider().create_trace("probe")
        print(json.dumps(type(trace).__name__))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(("env", "expected"), [(None, "NoOpTrace"), ("false", "TraceImpl")])
def test_trace_export_is_off_in_rollouts_unless_the_user_opts_in(
    env: str | None, expected: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "OPENAI_AGENTS_DISABLE_TRACING"}
    if env is not None:
        environ["OPENAI_AGENTS_DISABLE_TRACING"] = env
    run = subprocess.run(
        [sys.executable, "-c", _TRACING_PROBE],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == expected
