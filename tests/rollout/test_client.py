"""RolloutClient against scripted rollout servers (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from osmosis_ai._serving import running_server
from osmosis_ai.errors import RolloutAdmissionTimeoutError, RolloutProtocolError
from osmosis_ai.rollout import RolloutStatus
from osmosis_ai.rollout.client import (
    ClientRequest,
    ClientResponse,
    MockTransport,
    RetryPolicy,
    RolloutClient,
    TransportError,
)

LEASE = {
    "rollout_id": "r1",
    "status": "queued",
    "polling_lease_token": "lease-token",
    "result_wait_timeout_sec": 1.0,
    "polling_lease_timeout_sec": 5.0,
}
DONE = {
    "rollout_id": "r1",
    "status": "success",
    "sample": None,
    "err_message": None,
    "err_category": None,
}
RUNNING = {**DONE, "status": "running"}


class Scripted:
    """A fake rollout server answering from queues of (status, body, headers)."""

    def __init__(self) -> None:
        self.admissions: deque[tuple[int, Any, dict[str, str]]] = deque()
        self.polls: deque[tuple[int, Any, dict[str, str]]] = deque()
        self.seen: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/rollout", self.admit, methods=["POST"]),
                Route("/rollout/{rollout_id}/result", self.poll, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )
        self.health_answers: deque[dict[str, Any]] = deque()

    @staticmethod
    def _answer(item: tuple[int, Any, dict[str, str]]) -> Response:
        status, body, headers = item
        return Response(json.dumps(body), status, headers, media_type="application/json")

    async def admit(self, request: Request) -> Response:
        self.seen.append({"body": await request.json(), "headers": dict(request.headers)})
        return self._answer(self.admissions.popleft())

    async def poll(self, request: Request) -> Response:
        self.seen.append({"headers": dict(request.headers)})
        return self._answer(self.polls.popleft())

    async def health(self, request: Request) -> Response:
        return self._answer((200, self.health_answers.popleft(), {}))


@pytest_asyncio.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, RolloutClient]]:
    server = Scripted()
    async with (
        running_server(server.app) as running,
        RolloutClient(url=running.base_url, api_key="server-key") as client,
    ):
        yield server, client


async def test_429_is_retried_after_retry_after_then_polled_to_completion(
    scripted: tuple[Scripted, RolloutClient],
) -> None:
    server, client = scripted
    server.admissions.extend([(429, {"detail": "full"}, {"Retry-After": "0.05"}), (202, LEASE, {})])
    server.polls.extend([(200, RUNNING, {}), (503, {}, {}), (502, {}, {}), (200, DONE, {})])
    handle = await client.run_rollout([], "http://x", "r1", llm_api_key="k")
    result = await handle
    assert result.status is RolloutStatus.SUCCESS and handle.done()
    assert server.seen[0]["body"]["llm_api_key"] == "k"
    assert server.seen[0]["headers"]["authorization"] == "Bearer server-key"
    polls = [s for s in server.seen if "body" not in s]
    assert {p["headers"]["x-osmosis-rollout-lease"] for p in polls} == {"lease-token"}
    assert len(polls) == 4


async def test_other_admission_statuses_are_protocol_errors(
    scripted: tuple[Scripted, RolloutClient],
) -> None:
    server, client = scripted
    server.admissions.append((500, {"detail": "boom"}, {}))
    with pytest.raises(RolloutProtocolError) as info:
        await client.run_rollout([], "http://x", "r1")
    assert info.value.status_code == 500 and "boom" in str(info.value)


async def test_lease_for_another_id_is_refused(scripted: tuple[Scripted, RolloutClient]) -> None:
    server, client = scripted
    server.admissions.append((202, {**LEASE, "rollout_id": "other"}, {}))
    with pytest.raises(RolloutProtocolError, match="instead of"):
        await client.run_rollout([], "http://x", "r1")


async def test_admission_timeout(scripted: tuple[Scripted, RolloutClient]) -> None:
    server, client = scripted
    server.admissions.extend([(429, {}, {"Retry-After": "0.2"})] * 20)
    client.admission_timeout_sec = 0.5
    with pytest.raises(RolloutAdmissionTimeoutError) as info:
        await client.run_rollout([], "http://x", "r1")
    assert isinstance(info.value, TimeoutError)


async def test_unexpected_poll_status_fails_the_handle(
    scripted: tuple[Scripted, RolloutClient],
) -> None:
    server, client = scripted
    server.admissions.append((202, LEASE, {}))
    server.polls.append((403, {"detail": "invalid polling lease"}, {}))
    handle = await client.run_rollout([], "http://x", "r1")
    with pytest.raises(RolloutProtocolError, match="invalid polling lease"):
        await handle


async def test_retries_stop_at_the_lease_deadline(scripted: tuple[Scripted, RolloutClient]) -> None:
    server, client = scripted
    server.admissions.append((202, {**LEASE, "polling_lease_timeout_sec": 1.2}, {}))
    server.polls.extend([(503, {}, {})] * 50)
    handle = await client.run_rollout([], "http://x", "r1")
    with pytest.raises(RolloutProtocolError, match="polling lease ran out"):
        await handle


async def test_wait_idle_detects_a_restart(scripted: tuple[Scripted, RolloutClient]) -> None:
    server, client = scripted
    busy = {"process_id": "p1", "lifecycle": {"accepting_rollouts": True, "active_rollouts": 2}}
    server.health_answers.extend([busy, {**busy, "process_id": "p2"}])
    with pytest.raises(RolloutProtocolError, match="restarted"):
        await client.wait_idle(timeout_sec=5, poll_interval_sec=0.01, process_id="p1")


async def test_unreachable_server_is_a_protocol_error_without_status() -> None:
    from osmosis_ai._serving import bind_socket

    probe = bind_socket()
    port = probe.getsockname()[1]
    probe.close()
    async with RolloutClient(url=f"http://127.0.0.1:{port}") as client:
        with pytest.raises(RolloutProtocolError) as info:
            await client.health()
    assert info.value.status_code is None


async def test_a_post_after_a_pause_opens_a_connection_the_server_did_not_close() -> None:
    """A server closes a connection idle for its keep-alive (uvicorn's default: 5 s); a
    ``POST /rollout`` written on it then gets no answer, and is never resent (it is not
    idempotent). The client keeps idle connections for less time than that, so after a pause
    the admission goes out on a new connection. Here the server drops any request that comes
    on a connection idle longer than the client's keep-alive: as a real one does to a request
    that crosses its close."""
    import asyncio
    import inspect
    import time

    import uvicorn

    from osmosis_ai.rollout._transport import KEEPALIVE_SEC

    # Read from the signature: building a uvicorn.Config configures the process's logging.
    default = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
    assert default > KEEPALIVE_SEC
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        answered_at: float | None = None
        try:
            for _ in range(10):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                if answered_at is not None and time.monotonic() - answered_at > KEEPALIVE_SEC:
                    return  # closed without an answer
                status, body = (202, LEASE) if head.startswith(b"POST") else (200, {"ok": 1})
                data = json.dumps(body).encode()
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (status, len(data), data)
                )
                await writer.drain()
                answered_at = time.monotonic()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RolloutClient(url=f"http://127.0.0.1:{port}") as client:
            assert await client.health() == {"ok": 1}
            await asyncio.sleep(KEEPALIVE_SEC + 0.3)
            handle = await client.run_rollout([], "http://127.0.0.1:1/v1", "r1")
            assert handle.rollout_id == "r1"
        assert connections == 2
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, 1.0), ("2", 2.0), ("garbage", 1.0), ("inf", 1.0), ("0", 0.05), ("1000", 60.0)],
)
def test_retry_after_is_parsed_and_clamped(header: str | None, seconds: float) -> None:
    assert RetryPolicy().retry_after(header) == seconds


def test_constructor_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        RolloutClient(url="http://x", api_key=" ")
    with pytest.raises(ValueError):
        RolloutClient(url="http://x", admission_timeout_sec=float("inf"))
    with pytest.raises(ValueError, match="session or transport"):
        RolloutClient(url="http://x", session=object(), transport=MockTransport(Script()))


# The same protocol logic without sockets, through MockTransport.

FAST = RetryPolicy(backoff_sec=(0.0,))


class Script:
    """Answers requests from a queue per (method, path suffix); records what was sent."""

    def __init__(self, **answers: list[ClientResponse | Exception]) -> None:
        self.answers = {route: deque(items) for route, items in answers.items()}
        self.sent: list[ClientRequest] = []

    def __call__(self, request: ClientRequest) -> ClientResponse:
        self.sent.append(request)
        route = {"/rollout": "admit", "/result": "poll", "/health": "health"}
        key = next(name for suffix, name in route.items() if request.url.endswith(suffix))
        answer = self.answers[key].popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(body: Any, status: int = 200) -> ClientResponse:
    return ClientResponse(status, json.dumps(body).encode())


async def test_poll_answered_503_twice_then_200_completes_after_three_polls() -> None:
    script = Script(admit=[ok(LEASE, 202)], poll=[ok({}, 503), ok({}, 503), ok(DONE)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=FAST) as client:
        result = await (await client.run_rollout([], "http://gw", "r1", llm_api_key="k"))
    assert result.status is RolloutStatus.SUCCESS
    assert [request.method for request in script.sent] == ["POST", "GET", "GET", "GET"]
    assert json.loads(script.sent[0].body or b"")["llm_api_key"] == "k"


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
async def test_polls_retry_every_status_of_the_one_policy(status: int) -> None:
    # One policy: result polls retry what wait_idle retries (500 and 408 included).
    script = Script(admit=[ok(LEASE, 202)], poll=[ok({}, status), ok(DONE)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=FAST) as client:
        assert (await (await client.run_rollout([], "http://gw", "r1"))).status == "success"


async def test_poll_that_gets_no_answer_is_retried() -> None:
    script = Script(admit=[ok(LEASE, 202)], poll=[TransportError("reset"), ok(DONE)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=FAST) as client:
        assert (await (await client.run_rollout([], "http://gw", "r1"))).status == "success"


async def test_status_outside_the_policy_fails_the_poll_at_once() -> None:
    script = Script(admit=[ok(LEASE, 202)], poll=[ok({"detail": "gone"}, 404)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=FAST) as client:
        handle = await client.run_rollout([], "http://gw", "r1")
        with pytest.raises(RolloutProtocolError, match="returned 404: gone"):
            await handle
    assert len(script.sent) == 2


async def test_a_custom_policy_narrows_what_is_retried() -> None:
    policy = RetryPolicy(statuses=frozenset({503}), backoff_sec=(0.0,))
    script = Script(admit=[ok(LEASE, 202)], poll=[ok({}, 500)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=policy) as c:
        with pytest.raises(RolloutProtocolError) as info:
            await (await c.run_rollout([], "http://gw", "r1"))
    assert info.value.status_code == 500


async def test_wait_idle_retries_through_the_same_policy() -> None:
    idle = {"process_id": "p1", "lifecycle": {"active_rollouts": 0}}
    script = Script(health=[TransportError("refused"), ok({}, 503), ok(idle)])
    async with RolloutClient(url="http://x", transport=MockTransport(script), retry=FAST) as client:
        assert await client.wait_idle(timeout_sec=5, poll_interval_sec=0.0) == idle
    assert all(request.timeout_sec == 30.0 for request in script.sent)


async def test_no_answer_is_a_protocol_error_without_status_or_key() -> None:
    script = Script(health=[TransportError("ClientConnectorError")])
    async with RolloutClient(
        url="http://x", api_key="server-key-77", transport=MockTransport(script)
    ) as client:
        with pytest.raises(RolloutProtocolError) as info:
            await client.health()
    assert info.value.status_code is None and "server-key-77" not in str(info.value)
    assert script.sent[0].headers["Authorization"] == "Bearer server-key-77"


@pytest.mark.parametrize(
    "arguments",
    [
        {"backoff_sec": ()},
        {"backoff_sec": (float("nan"),)},
        {"retry_after_bounds_sec": (2.0, 1.0)},
        {"call_timeout_sec": 0.0},
    ],
)
def test_retry_policy_refuses_unbounded_settings(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**arguments)


def test_backoff_grows_then_repeats_its_last_delay() -> None:
    policy = RetryPolicy(backoff_sec=(0.1, 0.5))
    assert [policy.delay(n) for n in (1, 2, 3, 10)] == [0.1, 0.5, 0.5, 0.5]
