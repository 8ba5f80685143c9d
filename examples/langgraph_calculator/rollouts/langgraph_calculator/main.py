"""LangGraph calculator rollout: a two-node LangGraph agent (model, tools) with one tool.

Osmosis has no LangGraph integration, and none is needed: the workflow points LangChain's
`ChatOpenAI` at the rollout's OpenAI-compatible endpoint (from `get_rollout_context()`),
runs the graph, and returns the conversation as OpenAI chat messages, which become the
sample. The grader compares the last number of the final answer with the dataset's ground
truth.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

import openai
from langchain_core.messages import AIMessage, convert_to_openai_messages
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.server import create_rollout_server

_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


@tool(parse_docstring=True)
def calculate(a: float, operator: Literal["+", "-", "*", "/"], b: float) -> str:
    """Apply an arithmetic operator to two numbers.

    Args:
        a: The left operand.
        operator: One of + - * /.
        b: The right operand.
    """
    try:
        value = float(_OPERATIONS[operator](a, b))
    except ZeroDivisionError:
        return "error: division by zero"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


class LangGraphCalculatorConfig(AgentWorkflowConfig):
    name: str = "langgraph-calculator"
    temperature: float = 0.0
    max_tokens: int = 256
    max_model_calls: int = 4


def rollout_chat_model(config: LangGraphCalculatorConfig) -> ChatOpenAI:
    """A `ChatOpenAI` on the active rollout's endpoint, its connection closed with the rollout.

    ``max_retries=0``: the `openai` SDK retries a failed call twice by default, and under
    training a retried call is a second sample of the same prompt that the agent never sees,
    whose tokens would train as if it had. The HTTP client borrows the rollout server's
    pooled connection when there is one (`RolloutContext.model_pool`) and gives it back when
    the rollout's cleanups close it.
    """
    rollout = get_rollout_context()
    if rollout is None or not rollout.chat_completions_url:
        raise RuntimeError("build the model inside AgentWorkflow.run(), where a rollout is active")
    pool = rollout.model_pool
    http_client = (
        openai.DefaultAsyncHttpxClient(transport=pool.transport())
        if pool is not None
        else openai.DefaultAsyncHttpxClient(verify=tls_context())
    )
    rollout.add_cleanup(http_client.aclose)
    return ChatOpenAI(
        model="osmosis-rollout",  # the rollout's endpoint decides what serves it
        base_url=rollout.chat_completions_url,
        api_key=rollout.api_key or "osmosis-no-key",  # the client refuses to start without one
        http_async_client=http_client,
        # ChatOpenAI also builds a sync client, which `ainvoke` never uses; left to itself it
        # makes one per endpoint URL (one per rollout), loading the CA bundle each time
        # (~40 ms of CPU on the event loop). This one shares the process's TLS context and
        # opens no connection.
        http_client=openai.DefaultHttpxClient(verify=tls_context()),
        max_retries=0,
        use_responses_api=False,  # chat completions (the endpoint serves Responses too)
        temperature=config.temperature,
        max_tokens=config.max_tokens,
    )


def build_agent(model: ChatOpenAI, max_model_calls: int) -> CompiledStateGraph[Any]:
    """model → tools → model … until a reply without tool calls or ``max_model_calls``."""
    tools = [calculate]
    bound = model.bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    def after_model(state: MessagesState) -> str:
        messages = state["messages"]
        calls = sum(isinstance(message, AIMessage) for message in messages)
        last = messages[-1]
        wants_tools = isinstance(last, AIMessage) and bool(last.tool_calls)
        return "tools" if wants_tools and calls < max_model_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", after_model, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile()


class LangGraphCalculatorWorkflow(AgentWorkflow[LangGraphCalculatorConfig]):
    async def run(
        self, ctx: AgentWorkflowContext[LangGraphCalculatorConfig]
    ) -> list[dict[str, Any]]:
        config = ctx.config or LangGraphCalculatorConfig()
        agent = build_agent(rollout_chat_model(config), config.max_model_calls)
        state = await agent.ainvoke({"messages": ctx.prompt})
        # LangChain messages → OpenAI chat messages (role, content, tool_calls, tool_call_id):
        # returned from run(), they are the sample the grader reads and the trajectory.
        messages: list[dict[str, Any]] = convert_to_openai_messages(state["messages"])
        return messages


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _final_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts
                return " ".join(part.get("text", "") for part in content)
            return str(content)
    return ""


class LastNumberGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        numbers = _NUMBER.findall(_final_text(ctx.sample.messages))
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(ctx.label or "nan") else 0.0)


langgraph_calculator_config = LangGraphCalculatorConfig()
backend = LocalBackend(
    workflow=LangGraphCalculatorWorkflow,
    workflow_config=langgraph_calculator_config,
    grader=LastNumberGrader,
)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
