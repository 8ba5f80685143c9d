"""The polling-lease protocol over real sockets: admission, long polls, leases, cancel, auth."""

from __future__ import annotations

import asyncio
import json
import logging
import string
import time
from typing import Any
from urllib.parse import quote

import pytest

from osmosis_ai.errors import RolloutProtocolError
from osmosis_ai.rollout import LocalBackend, RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.server import app as server_app
from osmosis_ai.rollout.types import POLLING_LEASE_HEADER
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory
from tests.rollout.server.workflows import (
    Answer,
    Behaviours,
    QueueingBackend,
    SlowGrader,
    one_at_a_time,
)


async def _run(server: Any, rollout_id: str, **fields: Any) -> Any:
    fields.setdefault("label", "42")
    handle = await server.client.run_rollout(PROMPT, CHAT_URL, rollout_id, **fields)
    return await handle


async def test_happy_path_with_grading(serve: ServeFactory) -> None:
    async with serve() as server:
        result = await _run(server, "r1", llm_api_key="k-123")
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None and result.sample.reward == 1.0
    assert result.sample.messages[-1] == {"role": "assistant", "content": "42"}
    assert result.err_message is None and result.err_category is None


async def test_grade_false_returns_the_ungraded_sample(serve: ServeFactory) -> None:
    async with serve() as server:
        result = await _run(server, "r1", grade=False)
    assert result.status is RolloutStatus.SUCCESS
    assert result.sample is not None and result.sample.reward is None


async def test_status_progresses_queued_running_grading_success(serve: ServeFactory) -> None:
    backend = LocalBackend(workflow=Answer, grader=SlowGrader)
    async with serve(backend, result_wait_timeout_sec=5) as server:
        handle = await server.client.run_rollout(
            PROMPT, CHAT_URL, "r1", label="42", metadata={"delay": 0.3, "grade_delay": 0.3}
        )
        assert handle.status is RolloutStatus.QUEUED
        seen = [await handle.wait_for_running(), await handle.wait_for_grading()]
        final = await handle
    assert seen == [RolloutStatus.RUNNING, RolloutStatus.GRADING]
    assert final.status is RolloutStatus.SUCCESS


async def test_a_rollout_ending_soon_after_its_start_answers_the_poll_with_its_result(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ample on a loaded machine: the no-op rollout ends well within it.
    monkeypatch.setattr(server_app, "STATUS_COALESCE_SEC", 5.0)
    async with serve(LocalBackend(workflow=Answer)) as server:
        lease = (await server.admit("r1", grade=False)).json()["polling_lease_token"]
        answer = await server.http.get("/rollout/r1/result", headers={POLLING_LEASE_HEADER: lease})
    # Not "running" first: one poll instead of two.
    assert answer.json()["status"] == "success"


async def test_news_of_a_start_waits_for_the_end_no_longer_than_the_window(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_app, "STATUS_COALESCE_SEC", 0.3)
    async with serve(LocalBackend(workflow=Behaviours), drain_timeout_sec=0.1) as server:
        admitted = await server.admit("r1", grade=False, metadata={"do": "hang"})
        lease = admitted.json()["polling_lease_token"]
        started = time.monotonic()
        answer = await server.http.get("/rollout/r1/result", headers={POLLING_LEASE_HEADER: lease})
        elapsed = time.monotonic() - started
    assert answer.json()["status"] == "running"
    assert 0.3 <= elapsed < 5


async def test_the_lease_answer_echoes_the_id_and_the_server_timeouts(
    serve: ServeFactory,
) -> None:
    rollout_id = 'r "quoted" é ✓'
    async with serve(result_wait_timeout_sec=7, polling_lease_timeout_sec=12.5) as server:
        answer = await server.admit(rollout_id)
        assert answer.status_code == 202
        lease = json.loads(answer.content)
        assert lease == {
            "rollout_id": rollout_id,
            "status": "queued",
            "polling_lease_token": lease["polling_lease_token"],
            "result_wait_timeout_sec": 7.0,
            "polling_lease_timeout_sec": 12.5,
        }
        token = lease["polling_lease_token"]
        assert token and set(token) <= set(string.ascii_letters + string.digits + "-_")
        result = await server.http.get(
            f"/rollout/{quote(rollout_id)}/result",
            headers={POLLING_LEASE_HEADER: token},
        )
        assert result.status_code == 200 and result.json()["rollout_id"] == rollout_id


async def test_duplicate_rollout_id_is_409_while_retained(serve: ServeFactory) -> None:
    async with serve() as server:
        await _run(server, "r1")
        response = await server.admit("r1")
    assert response.status_code == 409
    assert response.json() == {"detail": "rollout_id is already registered"}


async def test_no_capacity_is_429_with_retry_after_and_the_client_retries(
    serve: ServeFactory,
) -> None:
    backend = LocalBackend(workflow=Answer, workflow_config=one_at_a_time)
    async with serve(backend) as server:
        first = await server.client.run_rollout(
            PROMPT, CHAT_URL, "slow", label="42", metadata={"delay": 0.5}
        )
        await first.wait_for_running()
        refused = await server.admit("refused")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        second = await _run(server, "retried")
        assert (await first).status is RolloutStatus.SUCCESS
    assert second.status is RolloutStatus.SUCCESS


async def test_unknown_rollout_is_404(serve: ServeFactory) -> None:
    async with serve() as server:
        response = await server.http.get(
            "/rollout/nope/result", headers={POLLING_LEASE_HEADER: "x"}
        )
    assert response.status_code == 404 and response.json()["detail"] == "unknown rollout_id"


async def test_missing_lease_is_422_and_wrong_lease_is_403(serve: ServeFactory) -> None:
    async with serve() as server:
        assert (await server.admit("r1")).status_code == 202
        missing = await server.http.get("/rollout/r1/result")
        wrong = await server.http.get("/rollout/r1/result", headers={POLLING_LEASE_HEADER: "x"})
    assert missing.status_code == 422 and POLLING_LEASE_HEADER in missing.json()["detail"]
    assert wrong.status_code == 403 and wrong.json() == {"detail": "invalid polling lease"}


async def test_lease_expiry_cancels_the_workflow_and_reports_lease_expired(
    serve: ServeFactory,
) -> None:
    backend = LocalBackend(workflow=Behaviours)
    async with serve(backend, result_wait_timeout_sec=0.2, polling_lease_timeout_sec=0.5) as server:
        admitted = await server.admit("abandoned", metadata={"do": "hang"})
        lease = admitted.json()["polling_lease_token"]
        entry = server.state.registry.get("abandoned")
        assert entry is not None and entry.task is not None
        task = entry.task
        async with asyncio.timeout(5):
            await asyncio.wait({task})  # the sweeper expires the lease and cancels it
        response = await server.http.get(
            "/rollout/abandoned/result", headers={POLLING_LEASE_HEADER: lease}
        )
        health = (await server.http.get("/health")).json()
    result = response.json()
    assert result["status"] == "failure"
    assert result["err_category"] == "lease_expired"
    assert "polling lease expired" in result["err_message"]
    assert task.cancelled()
    assert health["lifecycle"]["active_rollouts"] == 0


async def test_polling_keeps_the_lease_alive(serve: ServeFactory) -> None:
    async with serve(result_wait_timeout_sec=0.2, polling_lease_timeout_sec=0.5) as server:
        result = await _run(server, "long", metadata={"delay": 1.5})
    assert result.status is RolloutStatus.SUCCESS


async def test_cancel_running_and_queued_rollouts(serve: ServeFactory) -> None:
    backend = QueueingBackend(workflow=Behaviours, workflow_config=one_at_a_time)
    async with serve(backend) as server:
        running = await server.client.run_rollout(
            PROMPT, CHAT_URL, "running", metadata={"do": "hang"}
        )
        await running.wait_for_running()
        queued = await server.client.run_rollout(
            PROMPT, CHAT_URL, "queued", metadata={"do": "hang"}
        )
        assert backend.health()["concurrency"]["queued"] == 1
        response = await server.http.post(
            "/rollout/cancel", json={"ids": ["running", "queued", "ghost"]}
        )
        results = [await running, await queued]
        repeated = await server.http.post("/rollout/cancel", json={"ids": ["running"]})
    assert response.json()["dispositions"] == {
        "running": "cancelled_running",
        "queued": "cancelled_queued",
        "ghost": "not_found",
    }
    assert [r.status for r in results] == [RolloutStatus.CANCELLED] * 2
    assert results[0].err_message == "cancelled"
    # Memoised: the rollout is finished, but its disposition is still reported.
    assert repeated.json()["dispositions"] == {"running": "cancelled_running"}


async def test_cancel_of_a_finished_rollout_is_not_found(serve: ServeFactory) -> None:
    async with serve() as server:
        await _run(server, "done")
        response = await server.http.post("/rollout/cancel", json={"ids": ["done"]})
    assert response.json()["dispositions"] == {"done": "not_found"}


@pytest.mark.parametrize(
    "selector", [{}, {"ids": ["a"], "prefix": "a"}, {"all": True, "ids": []}, {"ids": "a"}]
)
async def test_cancel_needs_exactly_one_selector(
    serve: ServeFactory, selector: dict[str, Any]
) -> None:
    async with serve() as server:
        response = await server.http.post("/rollout/cancel", json=selector)
    assert response.status_code == 422


async def test_cancel_all(serve: ServeFactory) -> None:
    async with serve(LocalBackend(workflow=Behaviours)) as server:
        handles = [
            await server.client.run_rollout(PROMPT, CHAT_URL, f"r{i}", metadata={"do": "hang"})
            for i in range(3)
        ]
        for handle in handles:
            await handle.wait_for_running()
        response = await server.http.post("/rollout/cancel", json={"all": True})
        results = await asyncio.gather(*handles)
    assert set(response.json()["dispositions"].values()) == {"cancelled_running"}
    assert {r.status for r in results} == {RolloutStatus.CANCELLED}


async def test_auth_is_required_on_every_route_when_configured(serve: ServeFactory) -> None:
    async with serve(api_key="server-secret") as server:
        assert (await _run(server, "ok")).status is RolloutStatus.SUCCESS
        import httpx2

        async with httpx2.AsyncClient(base_url=server.base_url) as anonymous:
            responses = [
                await anonymous.get("/health"),
                await anonymous.post("/rollout", json={}),
                await anonymous.get("/rollout/ok/result"),
                await anonymous.post("/rollout/cancel", json={"all": True}),
                await anonymous.get("/health", headers={"Authorization": "Bearer wrong"}),
            ]
    assert {r.status_code for r in responses} == {401}
    assert responses[0].json() == {"detail": "unauthorized"}


async def test_no_auth_by_default(serve: ServeFactory) -> None:
    async with serve() as server:
        assert (await server.http.get("/health")).status_code == 200


def test_blank_api_key_and_bad_timeouts_are_refused() -> None:
    from osmosis_ai.rollout.server import create_rollout_server

    backend = LocalBackend(workflow=Answer)
    for kwargs in (
        {"api_key": " "},
        {"result_wait_timeout_sec": 0},
        {"result_wait_timeout_sec": float("nan")},
        {"polling_lease_timeout_sec": 10, "result_wait_timeout_sec": 30},
        {"result_retention_sec": -1},
    ):
        with pytest.raises(ValueError):
            create_rollout_server(backend=backend, **kwargs)


async def test_workflow_exception_is_an_agent_error_and_the_key_is_redacted(
    serve: ServeFactory,
) -> None:
    async with serve(LocalBackend(workflow=Behaviours)) as server:
        raised = await _run(server, "raise", metadata={"do": "raise"})
        leaked = await _run(server, "leak", metadata={"do": "leak"}, llm_api_key="sk-leaky-9981")
    assert raised.status is RolloutStatus.FAILURE
    assert raised.err_category is RolloutErrorCategory.AGENT_ERROR
    assert raised.err_message == "workflow raised RuntimeError: the tool exploded"
    assert leaked.err_message is not None and "sk-leaky-9981" not in leaked.err_message


async def test_workflow_past_its_deadline_times_out(serve: ServeFactory) -> None:
    async with serve(LocalBackend(workflow=Behaviours)) as server:
        result = await _run(server, "late", metadata={"do": "hang"}, agent_timeout_sec=0.2)
    assert result.err_category is RolloutErrorCategory.TIMEOUT
    assert result.sample is None and result.err_message == "workflow exceeded its 0.2s deadline"


async def test_loop_blocking_workflow_is_named_by_the_watchdog(
    serve: ServeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with serve(LocalBackend(workflow=Behaviours)) as server:
        result = await _run(server, "blocker", metadata={"do": "block", "seconds": 2})
        health = (await server.http.get("/health")).json()
    assert result.status is RolloutStatus.SUCCESS
    assert "rollout blocker blocked the event loop for 2." in caplog.text
    loop = health["event_loop"]
    assert loop["last_block"]["rollout_id"] == "blocker"
    assert loop["last_block"]["seconds"] >= 2 and loop["max_lag_ms"] >= 1000


async def test_health_reports_identity_capacity_and_lifecycle(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_INSTANCE_ID", "instance-7")
    async with serve(LocalBackend(workflow=Behaviours, workflow_config=one_at_a_time)) as server:
        handle = await server.client.run_rollout(PROMPT, CHAT_URL, "h", metadata={"do": "hang"})
        await handle.wait_for_running()
        busy = await server.client.health()
        await handle.cancel()
        await handle
        idle = await server.client.wait_idle(timeout_sec=5, poll_interval_sec=0.05)
    assert busy["instance_id"] == "instance-7" and len(busy["process_id"]) == 32
    assert busy["concurrency"] == {"max_concurrent": 1, "queued": 0, "running": 1}
    assert busy["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 1}
    assert idle["lifecycle"]["active_rollouts"] == 0


async def test_results_are_retained_then_forgotten(serve: ServeFactory) -> None:
    async with serve(
        result_retention_sec=0.2, polling_lease_timeout_sec=2, result_wait_timeout_sec=1
    ) as server:
        await _run(server, "r1")
        assert (await server.admit("r1")).status_code == 409
        async with asyncio.timeout(5):
            while "r1" in server.state.registry:  # noqa: ASYNC110 -- swept by the server
                await asyncio.sleep(0.05)
        assert (await server.admit("r1")).status_code == 202


async def test_client_reports_protocol_errors(serve: ServeFactory) -> None:
    async with serve() as server:
        await _run(server, "dup")
        with pytest.raises(RolloutProtocolError) as info:
            await server.client.run_rollout(PROMPT, CHAT_URL, "dup")
    assert info.value.status_code == 409 and "already registered" in str(info.value)
