"""LocalBackend: return shapes, deadlines, grading, artifacts and failure categories."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    ExecutionRequest,
    Grader,
    GraderConfig,
    GraderContext,
    LocalBackend,
    RolloutContext,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
    SampleSource,
    get_rollout_context,
)

PROMPT = [{"role": "user", "content": "What is 6*7?"}]


def request(rollout_id: str = "r1", **kwargs: Any) -> ExecutionRequest:
    kwargs.setdefault("label", "42")
    return ExecutionRequest(id=rollout_id, prompt=PROMPT, **kwargs)


class Answer(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [*ctx.prompt, {"role": "assistant", "content": "42"}]


class ExactMatch(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


class ListSource(SampleSource):
    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.messages)


# -- return shapes ------------------------------------------------------------------------


async def test_message_list_return_becomes_the_sample_and_is_graded() -> None:
    backend = LocalBackend(workflow=Answer, grader=ExactMatch)
    outcome = await backend.execute(request())
    assert outcome.workflow.status is RolloutStatus.SUCCESS
    assert outcome.grader is not None
    result = outcome.result
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None
    assert result.sample.reward == 1.0
    assert result.sample.messages[-1] == {"role": "assistant", "content": "42"}


async def test_none_return_reads_the_registered_sample_source() -> None:
    class Sourced(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            context = get_rollout_context()
            assert context is not None
            context.set_sample_source(ListSource([{"role": "assistant", "content": "x"}]))

    outcome = await LocalBackend(workflow=Sourced).execute(request())
    assert outcome.result.sample is not None
    assert outcome.result.sample.messages == [{"role": "assistant", "content": "x"}]
    assert outcome.result.sample.label == "42"


async def test_output_without_messages_produces_no_sample() -> None:
    class Empty(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
            return AgentWorkflowOutput(metrics={"x": 1.0})

    outcome = await LocalBackend(workflow=Empty).execute(request())
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample is None


async def test_wrong_return_type_fails_with_validation_error_naming_the_shapes() -> None:
    class Wrong(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> Any:
            return "the answer"

    result = (await LocalBackend(workflow=Wrong).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert result.err_message is not None
    assert "AgentWorkflowOutput" in result.err_message and "got str" in result.err_message


async def test_metric_mutated_to_nan_after_construction_is_rejected() -> None:
    class Mutating(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
            output = AgentWorkflowOutput(messages=[], metrics={"score": 1.0})
            output.metrics["score"] = math.nan
            return output

    result = (await LocalBackend(workflow=Mutating).execute(request())).result
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR


async def test_unknown_output_field_raised_inside_run_is_a_validation_error() -> None:
    class Legacy(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
            return AgentWorkflowOutput(samples=[])  # type: ignore[call-arg]

    result = (await LocalBackend(workflow=Legacy).execute(request())).result
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "samples" in (result.err_message or "")


async def test_exception_in_user_code_is_an_agent_error_with_type_and_traceback() -> None:
    class Broken(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            raise ValueError("bad tool input")

    result = (await LocalBackend(workflow=Broken).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert result.err_message == "workflow raised ValueError: bad tool input"
    assert result.extra_fields is not None
    assert "bad tool input" in result.extra_fields["traceback"]
    assert result.extra_fields["phase"] == "workflow"


@pytest.mark.parametrize("fails", [False, True])
async def test_context_cleanups_run_after_the_sample_is_taken(fails: bool) -> None:
    events: list[str] = []

    class Source(ListSource):
        async def get_sample(self) -> RolloutSample:
            events.append("sample")
            return await super().get_sample()

    class UsesAClient(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            rollout_ctx = get_rollout_context()
            assert rollout_ctx is not None
            rollout_ctx.set_sample_source(Source(list(ctx.prompt)))

            async def close() -> None:
                events.append("closed")

            rollout_ctx.add_cleanup(close)
            if fails:
                raise ValueError("tool broke")

    result = (await LocalBackend(workflow=UsesAClient).execute(request())).result
    assert result.status is (RolloutStatus.FAILURE if fails else RolloutStatus.SUCCESS)
    assert events == (["closed"] if fails else ["sample", "closed"])


async def test_rollout_api_key_never_appears_in_error_message_or_traceback() -> None:
    key = "sk-test-4b1f9c2d"

    class Leaky(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            context = get_rollout_context()
            assert context is not None
            raise RuntimeError(f"upstream said: bad key {context.api_key}")

    with RolloutContext(chat_completions_url="http://x", api_key=key, rollout_id="r1"):
        result = (await LocalBackend(workflow=Leaky).execute(request())).result
    assert result.err_message is not None and key not in result.err_message
    assert "[REDACTED]" in result.err_message
    assert result.extra_fields is not None and key not in result.extra_fields["traceback"]


async def test_label_is_withheld_from_the_workflow() -> None:
    seen: list[AgentWorkflowContext] = []

    class Spy(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            seen.append(ctx)
            return list(ctx.prompt)

    await LocalBackend(workflow=Spy).execute(request(label="secret-answer", metadata={"k": 1}))
    ctx = seen[0]
    assert ctx.metadata == {"k": 1}
    assert "secret-answer" not in repr(ctx)
    assert not hasattr(ctx, "label")


async def test_fresh_workflow_instance_and_private_config_per_rollout() -> None:
    class Config(AgentWorkflowConfig):
        name: str = "cfg"
        counter: list[int] = []

    instances: list[AgentWorkflow[Any]] = []

    class Counting(AgentWorkflow[Config]):
        async def run(self, ctx: AgentWorkflowContext[Config]) -> list[dict[str, Any]]:
            instances.append(self)
            assert ctx.config is self.config and ctx.config is not None
            ctx.config.counter.append(1)
            return []

    config = Config()
    backend = LocalBackend(workflow=Counting, workflow_config=config)
    await asyncio.gather(*(backend.execute(request(f"r{i}")) for i in range(3)))
    assert len({id(instance) for instance in instances}) == 3  # all alive: ids unique
    assert config.counter == []


# -- deadlines ----------------------------------------------------------------------------


async def test_loop_blocking_workflow_past_its_deadline_is_a_timeout() -> None:
    class Blocking(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            time.sleep(0.3)  # noqa: ASYNC251 -- blocks the loop on purpose: the timer cannot fire
            return []

    result = (await LocalBackend(workflow=Blocking).execute(request(agent_timeout_sec=0.1))).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert result.err_message == "workflow exceeded its 0.1s deadline"


async def test_workflow_that_swallows_cancellation_still_times_out() -> None:
    class Stubborn(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(5)
            return []

    started = time.monotonic()
    result = (await LocalBackend(workflow=Stubborn).execute(request(agent_timeout_sec=0.05))).result
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert time.monotonic() - started < 1.0


async def test_slow_workflow_is_cancelled_at_its_deadline() -> None:
    class Slow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await asyncio.sleep(10)

    started = time.monotonic()
    result = (await LocalBackend(workflow=Slow).execute(request(agent_timeout_sec=0.05))).result
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert time.monotonic() - started < 1.0


async def test_queue_time_counts_against_the_agent_deadline() -> None:
    class Config(AgentWorkflowConfig):
        name: str = "one-at-a-time"
        concurrency: ConcurrencyConfig = ConcurrencyConfig(max_concurrent=1)

    class Sleepy(AgentWorkflow[Config]):
        async def run(self, ctx: AgentWorkflowContext[Config]) -> list[dict[str, Any]]:
            await asyncio.sleep(0.75)
            return []

    # The first has 0.65 s of slack (a loaded machine); the second needs at least 1.5 s.
    backend = LocalBackend(workflow=Sleepy, workflow_config=Config())
    first, second = await asyncio.gather(
        backend.execute(request("a", agent_timeout_sec=1.4)),
        backend.execute(request("b", agent_timeout_sec=1.4)),
    )
    assert first.result.status is RolloutStatus.SUCCESS
    assert second.result.err_category is RolloutErrorCategory.TIMEOUT
    assert "spent queued" in (second.result.err_message or "")


async def test_zero_deadline_means_already_expired() -> None:
    result = (await LocalBackend(workflow=Answer).execute(request(agent_timeout_sec=0))).result
    assert result.err_category is RolloutErrorCategory.TIMEOUT


async def test_user_raised_timeout_error_keeps_its_message() -> None:
    class UpstreamTimeout(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            raise TimeoutError("model endpoint took too long")

    result = (
        await LocalBackend(workflow=UpstreamTimeout).execute(request(agent_timeout_sec=30))
    ).result
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert "model endpoint took too long" in (result.err_message or "")


async def test_cancelled_inner_task_is_an_agent_failure_not_a_cancelled_rollout() -> None:
    class InnerCancel(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            inner = asyncio.create_task(asyncio.sleep(10))
            await asyncio.sleep(0)
            inner.cancel()
            await inner

    result = (await LocalBackend(workflow=InnerCancel).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert "CancelledError" in (result.err_message or "")


async def test_external_cancellation_propagates_and_frees_the_slot() -> None:
    class Config(AgentWorkflowConfig):
        name: str = "capped"
        concurrency: ConcurrencyConfig = ConcurrencyConfig(max_concurrent=1)

    started = asyncio.Event()

    class Forever(AgentWorkflow[Config]):
        async def run(self, ctx: AgentWorkflowContext[Config]) -> None:
            started.set()
            await asyncio.sleep(60)

    backend = LocalBackend(workflow=Forever, workflow_config=Config())
    task = asyncio.create_task(backend.execute(request()))
    await started.wait()
    assert not backend.has_capacity()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.has_capacity()
    assert backend.health()["concurrency"] == {"max_concurrent": 1, "queued": 0, "running": 0}


# -- grading ------------------------------------------------------------------------------


async def test_grader_exception_fails_with_category_and_keeps_the_sample() -> None:
    class Crashing(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            raise KeyError("missing")

    result = (await LocalBackend(workflow=Answer, grader=Crashing).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.GRADER_ERROR
    assert result.err_message is not None and result.err_message.startswith(
        "grader raised KeyError"
    )
    assert result.sample is not None and result.sample.messages[-1]["content"] == "42"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", True, None])
async def test_grader_setting_a_non_finite_or_non_numeric_reward_fails(bad: Any) -> None:
    class BadReward(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            ctx.set_reward(bad)

    result = (await LocalBackend(workflow=Answer, grader=BadReward).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR


async def test_grader_that_never_sets_a_reward_fails_with_the_fix_in_the_message() -> None:
    class Silent(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            pass

    result = (await LocalBackend(workflow=Answer, grader=Silent).execute(request())).result
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "ctx.set_reward" in (result.err_message or "")


async def test_removed_sample_needs_no_reward() -> None:
    class Dropper(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            assert ctx.sample is not None
            ctx.sample.remove_sample = True

    result = (await LocalBackend(workflow=Answer, grader=Dropper).execute(request())).result
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None and result.sample.remove_sample


async def test_grading_without_label_or_metadata_says_why_it_cannot_run() -> None:
    backend = LocalBackend(workflow=Answer, grader=ExactMatch)
    result = (await backend.execute(request(label=None))).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "neither a label nor metadata" in (result.err_message or "")


async def test_grading_with_metadata_but_no_label_runs_the_grader() -> None:
    class FromMetadata(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            assert ctx.metadata is not None
            ctx.set_reward(float(ctx.metadata["weight"]))

    backend = LocalBackend(workflow=Answer, grader=FromMetadata)
    result = (await backend.execute(request(label=None, metadata={"weight": 0.5}))).result
    assert result.sample is not None and result.sample.reward == 0.5


async def test_grading_without_a_sample_says_so() -> None:
    class Nothing(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            return None

    result = (await LocalBackend(workflow=Nothing, grader=ExactMatch).execute(request())).result
    assert result.status is RolloutStatus.FAILURE
    assert "no sample to grade" in (result.err_message or "")


async def test_grade_false_skips_the_grader() -> None:
    outcome = await LocalBackend(workflow=Answer, grader=ExactMatch).execute(request(grade=False))
    assert outcome.grader is None
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample is not None and outcome.result.sample.reward is None


async def test_no_grader_returns_the_ungraded_workflow_sample() -> None:
    outcome = await LocalBackend(workflow=Answer).execute(request())
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample is not None and outcome.result.sample.reward is None


async def test_failed_workflow_is_not_graded() -> None:
    class Broken(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            raise RuntimeError("boom")

    outcome = await LocalBackend(workflow=Broken, grader=ExactMatch).execute(request())
    assert outcome.grader is None
    assert outcome.result.err_category is RolloutErrorCategory.AGENT_ERROR


async def test_grader_deadline_is_independent_of_agent_time() -> None:
    class SlowAgent(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            await asyncio.sleep(0.2)
            return [{"role": "assistant", "content": "42"}]

    class SlowGrader(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            await asyncio.sleep(10)

    ok = await LocalBackend(workflow=SlowAgent, grader=ExactMatch).execute(
        request(agent_timeout_sec=5, grader_timeout_sec=0.1)
    )
    assert ok.result.status is RolloutStatus.SUCCESS
    late = await LocalBackend(workflow=Answer, grader=SlowGrader).execute(
        request(grader_timeout_sec=0.05)
    )
    assert late.result.err_category is RolloutErrorCategory.TIMEOUT
    assert late.result.err_message == "grader exceeded its 0.05s deadline"


class _SwallowsThenSleeps(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # keeps going past its deadline, then returns unrewarded


class _SwallowsThenReturns(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)


@pytest.mark.parametrize("grader", [_SwallowsThenSleeps, _SwallowsThenReturns])
async def test_grader_that_swallows_cancellation_still_times_out(grader: type[Grader]) -> None:
    started = time.monotonic()
    outcome = await LocalBackend(workflow=Answer, grader=grader).execute(
        request(grader_timeout_sec=0.05)
    )
    assert time.monotonic() - started < 2.0
    result = outcome.result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert result.err_message == "grader exceeded its 0.05s deadline"
    assert result.sample is not None and result.sample.messages[-1]["content"] == "42"


async def test_workflow_that_swallows_cancellation_then_returns_garbage_is_a_timeout() -> None:
    class StubbornAndWrong(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> Any:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            return "interrupted"  # not a sample shape, but the deadline is what went wrong

    backend = LocalBackend(workflow=StubbornAndWrong)
    result = (await backend.execute(request(agent_timeout_sec=0.05))).result
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert result.err_message == "workflow exceeded its 0.05s deadline"


async def test_status_progresses_through_running_and_grading() -> None:
    from osmosis_ai.rollout.context import RolloutProgress

    seen: list[RolloutStatus] = []

    def observe() -> None:
        context = get_rollout_context()
        assert context is not None and context.progress is not None
        seen.append(context.progress.status)

    class ObservedWorkflow(Answer):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            observe()
            return await super().run(ctx)

    class ObservedGrader(ExactMatch):
        async def grade(self, ctx: GraderContext) -> None:
            observe()
            await super().grade(ctx)

    progress = RolloutProgress()
    with RolloutContext(rollout_id="r1", progress=progress):
        await LocalBackend(workflow=ObservedWorkflow, grader=ObservedGrader).execute(request())
    assert seen == [RolloutStatus.RUNNING, RolloutStatus.GRADING]
    assert progress.status == RolloutStatus.GRADING  # the server, not the backend, ends it


async def test_grader_config_caps_simultaneous_gradings() -> None:
    class Capped(GraderConfig):
        name: str = "capped"
        concurrency: ConcurrencyConfig = ConcurrencyConfig(max_concurrent=1)

    active = 0
    peak = 0

    class Tracking(Grader):
        async def grade(self, ctx: GraderContext) -> None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.01)
            active -= 1
            ctx.set_reward(1.0)

    backend = LocalBackend(workflow=Answer, grader=Tracking, grader_config=Capped())
    await asyncio.gather(*(backend.execute(request(f"r{i}")) for i in range(4)))
    assert peak == 1


# -- one phase at a time, from a custom harness --------------------------------------------


async def test_custom_harness_grades_what_run_workflow_returned() -> None:
    backend = LocalBackend(workflow=Answer, grader=ExactMatch)
    req = request()
    graded = await backend.run_grader(req, await backend.run_workflow(req))
    assert graded.status is RolloutStatus.SUCCESS, graded.err_message
    assert graded.sample is not None and graded.sample.reward == 1.0


async def test_run_grader_passes_a_failed_workflow_result_through_ungraded() -> None:
    graded: list[GraderContext] = []

    class Recording(ExactMatch):
        async def grade(self, ctx: GraderContext) -> None:
            graded.append(ctx)
            await super().grade(ctx)

    class Broken(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            raise RuntimeError("boom")

    backend = LocalBackend(workflow=Broken, grader=Recording)
    req = request()
    workflow = await backend.run_workflow(req)
    result = await backend.run_grader(req, workflow)
    assert graded == []
    assert result is workflow  # its category and message stay the rollout's
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR


async def test_run_grader_still_grades_a_sample_given_directly() -> None:
    backend = LocalBackend(workflow=Answer, grader=ExactMatch)
    sample = RolloutSample(messages=[{"role": "assistant", "content": "41"}])
    result = await backend.run_grader(request(), sample)
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None and result.sample.reward == 0.0


# -- artifacts ----------------------------------------------------------------------------


async def test_artifacts_dir_is_created_per_rollout_and_removed_when_left_empty(
    artifact_root: Path,
) -> None:
    dirs: list[Path | None] = []
    existed: list[bool] = []

    class Spy(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            dirs.append(ctx.artifacts_dir)
            existed.append(ctx.artifacts_dir is not None and ctx.artifacts_dir.is_dir())

    await LocalBackend(workflow=Spy).execute(request("art-1"))
    assert dirs == [artifact_root / "art-1" / "artifacts"]
    assert existed == [True]
    assert not (artifact_root / "art-1" / "artifacts").exists()


async def test_artifacts_written_by_the_workflow_and_the_grader_stay(artifact_root: Path) -> None:
    class Writes(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            if ctx.artifacts_dir:
                log_file = ctx.artifacts_dir / "run.log"
                await asyncio.to_thread(log_file.write_text, "started\n")
            return [{"role": "assistant", "content": "42"}]

    class GraderWrites(ExactMatch):
        async def grade(self, ctx: GraderContext) -> None:
            assert ctx.artifacts_dir is not None
            await asyncio.to_thread((ctx.artifacts_dir / "grade.log").write_text, "graded\n")
            await super().grade(ctx)

    await LocalBackend(workflow=Writes).execute(request("wrote"))
    await LocalBackend(workflow=Answer, grader=GraderWrites).execute(request("graded"))
    assert (artifact_root / "wrote" / "artifacts" / "run.log").read_text() == "started\n"
    assert (artifact_root / "graded" / "artifacts" / "grade.log").read_text() == "graded\n"


async def test_unavailable_artifact_root_gives_none_and_the_rollout_succeeds(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the root should be")
    dirs: list[Path | None] = []

    class Spy(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
            dirs.append(ctx.artifacts_dir)
            return [{"role": "assistant", "content": "42"}]

    backend = LocalBackend(workflow=Spy, grader=ExactMatch, artifact_root=blocker)
    started = time.monotonic()
    result = (await backend.execute(request())).result
    assert dirs == [None]
    assert result.status is RolloutStatus.SUCCESS and result.sample is not None
    assert result.sample.reward == 1.0
    assert time.monotonic() - started < 0.5  # permanent errors are not retried


async def test_unguarded_write_to_missing_artifacts_dir_fails_the_workflow(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")

    class Unguarded(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            (ctx.artifacts_dir / "x.log").write_text("x")  # type: ignore[operator]

    result = (
        await LocalBackend(workflow=Unguarded, artifact_root=blocker).execute(request())
    ).result
    assert result.err_category is RolloutErrorCategory.AGENT_ERROR


# -- construction -------------------------------------------------------------------------


def test_workflow_and_configs_resolve_from_import_strings() -> None:
    backend = LocalBackend(
        workflow="tests.seed.search_workflow:SearchWorkflow",
        workflow_config="tests.seed.search_workflow:search_workflow_config",
    )
    assert backend.workflow_cls.__name__ == "SearchWorkflow"
    assert getattr(backend.workflow_config, "max_iterations", None) == 8


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"workflow": "tests.seed.search_workflow"}, "expected 'module.path:attribute'"),
        ({"workflow": "tests.seed.search_workflow:Nope"}, "has no attribute 'Nope'"),
        ({"workflow": "tests.seed.search_workflow:search_workflow_config"}, "subclass of"),
        ({"workflow": Answer, "grader": Answer}, "subclass of Grader"),
        ({"workflow": Answer, "workflow_config": GraderConfig(name="g")}, "AgentWorkflowConfig"),
    ],
)
def test_bad_references_raise_config_errors_that_name_the_problem(
    kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        LocalBackend(**kwargs)


def test_uncopyable_config_is_refused_at_construction() -> None:
    import threading

    class WithLock(AgentWorkflowConfig):
        name: str = "lock"
        lock: Any = None

    with pytest.raises(ConfigError, match="deep-copied"):
        LocalBackend(workflow=Answer, workflow_config=WithLock(lock=threading.Lock()))


def test_default_concurrency_is_uncapped_with_or_without_config() -> None:
    bare = LocalBackend(workflow=Answer)
    configured = LocalBackend(workflow=Answer, workflow_config=AgentWorkflowConfig(name="x"))
    for backend in (bare, configured):
        assert backend.health()["concurrency"]["max_concurrent"] is None
        assert backend.has_capacity()


@pytest.mark.parametrize("bad_id", ["", ".", "..", "../etc", "a/b", "a\\b", "a\x00b"])
def test_path_traversal_rollout_ids_are_rejected(bad_id: str) -> None:
    with pytest.raises(ConfigError, match="single path segment"):
        ExecutionRequest(id=bad_id, prompt=[])


@pytest.mark.parametrize("bad", [math.nan, math.inf, "10", True])
def test_non_finite_or_non_numeric_timeouts_are_rejected(bad: Any) -> None:
    with pytest.raises(ConfigError, match="agent_timeout_sec"):
        ExecutionRequest(id="r", prompt=[], agent_timeout_sec=bad)
