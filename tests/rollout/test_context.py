"""RolloutContext: the ambient context variable, the one-source rule and progress."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import (
    GraderContext,
    RolloutContext,
    RolloutSample,
    RolloutStatus,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout import context as context_module
from osmosis_ai.rollout.context import RolloutProgress


class Source(SampleSource):
    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=[{"role": "assistant", "content": "hi"}])


def test_no_context_outside_a_rollout() -> None:
    assert get_rollout_context() is None


def test_nested_contexts_restore_the_outer_one() -> None:
    outer = RolloutContext(rollout_id="outer")
    inner = RolloutContext(rollout_id="inner")
    with outer:
        with inner:
            assert get_rollout_context() is inner
        assert get_rollout_context() is outer
        with outer:  # re-entering the same context (server, then backend) is fine
            assert get_rollout_context() is outer
        assert get_rollout_context() is outer
    assert get_rollout_context() is None


async def test_concurrent_tasks_each_see_their_own_context() -> None:
    async def run(rollout_id: str) -> str:
        with RolloutContext(rollout_id=rollout_id):
            await asyncio.sleep(0.01)
            context = get_rollout_context()
            assert context is not None
            return context.rollout_id

    assert await asyncio.gather(*(run(f"r{i}") for i in range(5))) == [f"r{i}" for i in range(5)]


def test_second_sample_source_is_refused_with_a_clear_error() -> None:
    context = RolloutContext(rollout_id="r1")
    first = Source()
    context.set_sample_source(first)
    context.set_sample_source(first)  # registering the same source again is harmless
    with pytest.raises(ConfigError, match="already has a sample source"):
        context.set_sample_source(Source())
    assert context.sample_source is first


async def test_get_sample_without_source_is_none() -> None:
    assert await RolloutContext().get_sample() is None


def test_empty_fields_fall_back_to_osmosis_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_CHAT_COMPLETIONS_URL", "http://127.0.0.1:9/v1/rollouts/x")
    monkeypatch.setenv("OSMOSIS_API_KEY", "env-key")
    monkeypatch.setenv("OSMOSIS_ROLLOUT_ID", "x")
    context = RolloutContext()
    assert (context.chat_completions_url, context.api_key, context.rollout_id) == (
        "http://127.0.0.1:9/v1/rollouts/x",
        "env-key",
        "x",
    )
    explicit = RolloutContext(chat_completions_url="http://a", api_key="k", rollout_id="y")
    assert (explicit.chat_completions_url, explicit.api_key, explicit.rollout_id) == (
        "http://a",
        "k",
        "y",
    )


def test_repr_never_shows_the_api_key() -> None:
    context = RolloutContext(api_key="sk-very-secret-123", rollout_id="r")
    assert "sk-very-secret-123" not in repr(context)


def test_the_context_redactor_holds_the_hosts_secrets_and_the_rollout_key() -> None:
    from osmosis_ai._log_redaction import registered_secrets
    from osmosis_ai.redact import Redactor

    given = RolloutContext(api_key="sk-key-1", redactor=Redactor(("configured-2",)))
    assert set(given.redactor.secrets) == {"sk-key-1", "configured-2"}
    with registered_secrets(["registered-3"]):
        default = RolloutContext(api_key="sk-key-4")
    assert set(default.redactor.secrets) == {"sk-key-4", "registered-3"}
    assert RolloutContext().redactor.text("no secrets here") == "no secrets here"


async def test_progress_ignores_noops_and_changes_after_terminal() -> None:
    progress = RolloutProgress()
    changes = [
        progress.set_status(status)
        for status in (
            RolloutStatus.QUEUED,
            RolloutStatus.RUNNING,
            RolloutStatus.SUCCESS,
            RolloutStatus.RUNNING,
        )
    ]
    assert changes == [False, True, True, False]
    assert progress.status == RolloutStatus.SUCCESS and progress.terminal


async def test_wait_for_change_wakes_on_change_and_times_out_otherwise() -> None:
    progress = RolloutProgress()
    waiter = asyncio.create_task(progress.wait_for_change(5))
    await asyncio.sleep(0)
    progress.set_status(RolloutStatus.RUNNING)
    assert await asyncio.wait_for(waiter, 1) is RolloutStatus.RUNNING
    assert await progress.wait_for_change(0.01) is RolloutStatus.RUNNING
    progress.set_status(RolloutStatus.FAILURE)
    assert await progress.wait_for_change(5) is RolloutStatus.FAILURE  # terminal: immediate


def test_set_status_without_progress_is_a_noop() -> None:
    RolloutContext().set_status(RolloutStatus.RUNNING)


def test_grader_context_can_be_built_from_a_sample_alone() -> None:
    # A user's grader unit test, as written against the reference SDK.
    ctx = GraderContext(sample=RolloutSample(messages=[{"role": "assistant", "content": "4"}]))
    assert (ctx.label, ctx.metadata, ctx.artifacts_dir) == (None, None, None)
    ctx.set_reward(1.0)
    assert ctx.sample is not None and ctx.sample.reward == 1.0


def test_set_reward_without_sample_raises_a_value_error_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"no sample to reward.*sample=RolloutSample"):
        GraderContext().set_reward(1.0)


def test_terminal_statuses_cannot_be_reported_by_user_code() -> None:
    progress = RolloutProgress()
    context = RolloutContext(progress=progress)
    for status in (RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED):
        with pytest.raises(ConfigError, match="published by the rollout server"):
            context.set_status(status)
    context.set_status(RolloutStatus.GRADING)
    assert progress.status == RolloutStatus.GRADING


async def test_cleanups_run_newest_first_and_a_failing_one_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []

    def cleanup(name: str, fail: bool = False) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            ran.append(name)
            if fail:
                raise OSError("sk-never-logged")

        return run

    rollout_ctx = RolloutContext(rollout_id="r1")
    rollout_ctx.add_cleanup(cleanup("first"))
    rollout_ctx.add_cleanup(cleanup("broken", fail=True))
    rollout_ctx.add_cleanup(cleanup("last"))
    with caplog.at_level(logging.WARNING):
        await rollout_ctx.run_cleanups()
    assert ran == ["last", "broken", "first"]
    assert "OSError" in caplog.text and "sk-never-logged" not in caplog.text
    await rollout_ctx.run_cleanups()  # each cleanup runs once
    assert ran == ["last", "broken", "first"]


async def test_cleanups_that_hang_are_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context_module, "CLEANUP_TIMEOUT_SEC", 0.05)
    rollout_ctx = RolloutContext(rollout_id="r1")
    rollout_ctx.add_cleanup(lambda: asyncio.sleep(60))
    async with asyncio.timeout(5):
        await rollout_ctx.run_cleanups()
