"""The seed document's integration examples, verbatim, end to end: a real rollout server, a
real gateway and the embedded model (tool calls constrained by the gateway)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai._serving import running_server
from osmosis_ai.gateway import EmbeddedPolicy, Gateway
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    LocalBackend,
    RolloutStatus,
    get_rollout_context,
)
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import RolloutResultResponse
from tests.seed.openai_agents_pattern import SimpleOpenAIWorkflow
from tests.seed.private_strands_workflow import PrivateStrandsWorkflow
from tests.seed.strands_pattern import SimpleStrandsWorkflow
from tests.seed.strands_tool_workflow import ToolWorkflow, tool_workflow_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Questions the greedy tiny model answers in a sentence (an open-ended one can run on to the
# token cap, which Strands reports as MaxTokensReachedException).
SHORT_QUESTION = "What is the capital of France? Answer in one word."
SEARCH_PROMPTS = [
    "Search for the capital of France.",
    "Look up who wrote Hamlet.",
    "Find the boiling point of water.",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    # The gateway owns sampling, as a trainer does: greedy and short, so that the tiny model's
    # answers are repeatable and quick although the seed examples ask for temperature 1.0.
    async with Gateway(EmbeddedPolicy(), sampling={"temperature": 0, "max_tokens": 200}) as running:
        yield running


def _prompt(question: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a research assistant. Use the search tool."},
        {"role": "user", "content": question},
    ]


async def _run(
    gateway: Gateway,
    workflow: type[AgentWorkflow[Any]],
    questions: list[str],
    config: AgentWorkflowConfig | None = None,
) -> list[RolloutResultResponse]:
    backend = LocalBackend(workflow=workflow, workflow_config=config)
    app = create_rollout_server(backend=backend, configure_logging=False)
    results = []
    async with running_server(app) as server, RolloutClient(url=server.base_url) as client:
        for index, question in enumerate(questions):
            rollout_id = f"{workflow.__name__.lower()}-{index}"
            handle = await client.run_rollout(
                _prompt(question),
                gateway.chat_completions_url(rollout_id),
                rollout_id,
                llm_api_key=gateway.token,
                extra_fields={"trajectory_report_url": gateway.trajectory_report_url(rollout_id)},
            )
            results.append(await handle)
    return results


def _trajectory(artifact_root: Path, rollout_id: str) -> dict[str, Any]:
    text = (artifact_root / rollout_id / "trajectory.json").read_text()
    return dict(json.loads(text))


def _agent_steps(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for step in trajectory["steps"] if step["source"] == "agent"]


def _assert_per_call_token_metrics(steps: list[dict[str, Any]]) -> None:
    assert steps
    for step in steps:
        metrics = step["metrics"]
        assert len(metrics["completion_token_ids"]) == metrics["completion_tokens"] > 0
        assert len(metrics["prompt_token_ids"]) == metrics["prompt_tokens"] > 0
        assert step["llm_call_count"] == 1


async def test_strands_pattern(gateway: Gateway, artifact_root: Path) -> None:
    (result,) = await _run(gateway, SimpleStrandsWorkflow, [SHORT_QUESTION])
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample is not None and result.sample.messages[-1]["role"] == "assistant"
    trajectory = _trajectory(artifact_root, "simplestrandsworkflow-0")
    assert [s["source"] for s in trajectory["steps"]] == ["system", "user", "agent"]
    _assert_per_call_token_metrics(_agent_steps(trajectory))
    assert gateway.token not in json.dumps(trajectory)


async def test_strands_tool_workflow(gateway: Gateway, artifact_root: Path) -> None:
    results = await _run(gateway, ToolWorkflow, SEARCH_PROMPTS, tool_workflow_config)
    assert all(r.status is RolloutStatus.SUCCESS for r in results), [r.err_message for r in results]
    with_tools = 0
    for index, result in enumerate(results):
        steps = _agent_steps(_trajectory(artifact_root, f"toolworkflow-{index}"))
        _assert_per_call_token_metrics(steps)
        for step in steps:
            for call in step.get("tool_calls", []):
                with_tools += 1
                assert call["function_name"] == "search"
                (observed,) = step["observation"]["results"]
                assert observed["source_call_id"] == call["tool_call_id"]
                assert observed["content"].startswith("results for ")
        assert result.sample is not None
        assert result.sample.messages[-1]["role"] == "assistant"
    assert with_tools >= 1  # each prompt asks for a search; the seeded model makes some


async def test_openai_agents_pattern(gateway: Gateway, artifact_root: Path) -> None:
    (result,) = await _run(gateway, SimpleOpenAIWorkflow, [SHORT_QUESTION])
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert result.sample is not None
    assert result.sample.messages[-1]["type"] == "message"  # native Responses-API items
    trajectory = _trajectory(artifact_root, "simpleopenaiworkflow-0")
    assert [s["source"] for s in trajectory["steps"]] == ["system", "user", "agent"]
    _assert_per_call_token_metrics(_agent_steps(trajectory))


async def test_private_preview_opt_out(gateway: Gateway, artifact_root: Path) -> None:
    seen: list[bool] = []

    class Observed(PrivateStrandsWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await super().run(ctx)
            rollout_ctx = get_rollout_context()
            assert rollout_ctx is not None
            seen.append(rollout_ctx.preview_enabled)

    (result,) = await _run(gateway, Observed, [SHORT_QUESTION])
    assert result.status is RolloutStatus.SUCCESS, result.err_message
    assert seen == [False]
    _assert_per_call_token_metrics(_agent_steps(_trajectory(artifact_root, "observed-0")))
