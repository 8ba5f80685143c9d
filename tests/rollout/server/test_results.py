"""What pollers receive: internal errors, wire rewards, JSON-safe samples."""

from __future__ import annotations

from typing import Any

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
    SampleSource,
    get_rollout_context,
)
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory
from tests.rollout.server.workflows import Answer


class ExplodingBackend(ExecutionBackend):
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        raise RuntimeError(f"backend bug near key {get_rollout_context().api_key}")  # type: ignore[union-attr]


class OddMetricsSource(SampleSource):
    async def get_sample(self) -> RolloutSample:
        sample = RolloutSample(messages=[{"role": "assistant", "content": "42"}])
        sample.metrics.update({"ok": 2, "nan": float("nan"), "obj": object()})
        return sample


class OddMetrics(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        context = get_rollout_context()
        assert context is not None
        context.set_sample_source(OddMetricsSource())


class Remover(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(1.0)
        ctx.sample.remove_sample = True


class FailingAfterReward(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)
        raise RuntimeError("grader crashed after rewarding")


async def _result(server: Any, rollout_id: str, **fields: Any) -> Any:
    handle = await server.client.run_rollout(PROMPT, CHAT_URL, rollout_id, label="42", **fields)
    return await handle


async def test_backend_exception_is_an_internal_error_without_the_key(
    serve: ServeFactory,
) -> None:
    async with serve(ExplodingBackend()) as server:
        result = await _result(server, "boom", llm_api_key="sk-internal-7")
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.INTERNAL_ERROR
    assert "backend bug" in result.err_message and "sk-internal-7" not in result.err_message


async def test_non_json_metrics_are_dropped_not_fatal(serve: ServeFactory) -> None:
    async with serve(LocalBackend(workflow=OddMetrics)) as server:
        result = await _result(server, "odd")
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample.metrics == {"ok": 2}


async def test_removed_sample_travels_without_reward(serve: ServeFactory) -> None:
    async with serve(LocalBackend(workflow=Answer, grader=Remover)) as server:
        result = await _result(server, "removed")
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample.remove_sample and result.sample.reward is None


async def test_failed_rollout_travels_without_reward(serve: ServeFactory) -> None:
    async with serve(LocalBackend(workflow=Answer, grader=FailingAfterReward)) as server:
        result = await _result(server, "failed")
    assert result.status is RolloutStatus.FAILURE
    assert result.sample is not None and result.sample.reward is None


class TwoTurns(AgentWorkflow):
    """Two model calls' worth of history; the first call's tool call succeeded."""

    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        messages = [
            *ctx.prompt,
            {"role": "assistant", "content": "6*7"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "42"},
        ]
        return AgentWorkflowOutput(messages=messages, turn_rewards={0: 0.5})


class RewardsTheLastTurn(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)
        ctx.set_turn_reward(1, 0.25)


async def test_turn_rewards_travel_only_when_set(serve: ServeFactory) -> None:
    """Set by the workflow (``AgentWorkflowOutput``) and the grader (``set_turn_reward``),
    the sample's turn rewards reach the poller beside the outcome; a sample without any
    keeps the reference's wire shape, no ``turn_rewards`` key."""
    from osmosis_ai.rollout.types import POLLING_LEASE_HEADER

    async with serve(LocalBackend(workflow=TwoTurns, grader=RewardsTheLastTurn)) as server:
        result = await _result(server, "turns")
    async with serve() as server:  # Answer, graded by ExactMatch: no turn rewards
        lease = (await server.admit("plain")).json()["polling_lease_token"]
        raw = {}
        for _ in range(100):
            raw = (
                await server.http.get(
                    "/rollout/plain/result", headers={POLLING_LEASE_HEADER: lease}
                )
            ).json()
            if raw["status"] == "success":
                break
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample.reward == 1.0 and result.sample.turn_rewards == {0: 0.5, 1: 0.25}
    assert raw["status"] == "success" and "turn_rewards" not in raw["sample"]
