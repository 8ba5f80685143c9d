"""``RolloutClient``: the controller's side of the polling-lease rollout protocol.

The client admits rollouts (retrying ``429`` after ``Retry-After``) and returns a
`RolloutHandle` per rollout, which long-polls for its result in the background, renewing
the lease with every poll, until the result is final. What is retried, how often and for
how long is one `RetryPolicy`.

It speaks HTTP through a `Transport`: aiohttp by default, whose connection pool stays cheap
with thousands of concurrent long polls (one connection each), or `MockTransport` in tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from osmosis_ai._context_exit import AsyncUnconditionalExit
from osmosis_ai.errors import RolloutAdmissionTimeoutError, RolloutProtocolError
from osmosis_ai.rollout._transport import (
    AiohttpTransport,
    ClientRequest,
    ClientResponse,
    MockTransport,
    Transport,
    TransportError,
)
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import (
    POLLING_LEASE_HEADER,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)

__all__ = [
    "ClientRequest",
    "ClientResponse",
    "MockTransport",
    "RetryPolicy",
    "RolloutAdmissionTimeoutError",
    "RolloutClient",
    "RolloutHandle",
    "RolloutProtocolError",
    "Transport",
    "TransportError",
]

_FEATURE = "RolloutClient"
_SHORT_CALL_TIMEOUT_SEC = 5.0
_EXTRA_POLL_SEC = 10.0
_RUNNING = frozenset({RolloutStatus.RUNNING, RolloutStatus.GRADING})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What the client retries, how often, and for how long: one policy for every call.

    - Retried: result polls and `RolloutClient.wait_idle`'s health checks that got no
      answer (`TransportError`) or an answer in ``statuses`` (a server that is busy,
      restarting or behind a proxy hiccup). Anything else is the caller's error or a
      protocol violation, raised at once. Admission retries only ``429``: any other
      refusal (``503`` while draining, ``409`` for a retained id) is final.
    - Waits between attempts follow ``backoff_sec`` (the last entry repeats); a ``429``
      on admission waits its ``Retry-After`` instead, clamped to ``retry_after_bounds_sec``.
    - Overall bound: a result poll retries until its polling lease would run out,
      admission until ``admission_timeout_sec``, `RolloutClient.wait_idle` until its
      ``timeout_sec``. One health check is bounded by ``call_timeout_sec``.
    """

    statuses: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})
    backoff_sec: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    retry_after_bounds_sec: tuple[float, float] = (0.05, 60.0)
    call_timeout_sec: float = 30.0

    def __post_init__(self) -> None:
        if not self.backoff_sec or any(
            not math.isfinite(delay) or delay < 0 for delay in self.backoff_sec
        ):
            raise ValueError("RetryPolicy.backoff_sec must be finite delays >= 0, at least one")
        low, high = self.retry_after_bounds_sec
        if not 0 <= low <= high or not math.isfinite(high):
            raise ValueError(
                "RetryPolicy.retry_after_bounds_sec must be (low, high), 0 <= low <= high"
            )
        if not math.isfinite(self.call_timeout_sec) or self.call_timeout_sec <= 0:
            raise ValueError("RetryPolicy.call_timeout_sec must be a finite number of seconds > 0")

    def retries(self, status: int | None) -> bool:
        """Whether a call that ended with ``status`` (``None``: no answer) is retried."""
        return status is None or status in self.statuses

    def delay(self, failures: int) -> float:
        """The wait before the next attempt after ``failures`` failed ones (1 or more)."""
        return self.backoff_sec[min(max(failures - 1, 0), len(self.backoff_sec) - 1)]

    def retry_after(self, value: str | None) -> float:
        """A ``Retry-After`` header in seconds (1 when absent or unreadable), clamped."""
        try:
            seconds = float(value) if value is not None else 1.0
        except ValueError:
            seconds = 1.0
        if not math.isfinite(seconds):
            seconds = 1.0
        low, high = self.retry_after_bounds_sec
        return min(max(seconds, low), high)


DEFAULT_RETRY_POLICY = RetryPolicy()


def _detail(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else body[:300].decode("utf-8", "replace")
    return " ".join(str(text).split())


class RolloutHandle:
    """One admitted rollout, polled in the background until its result is final.

    Await the handle (or ``wait_for_completion()``) for the final `RolloutResultResponse`.
    """

    def __init__(
        self, client: RolloutClient, lease: RolloutInitResponse, admitted_at: float
    ) -> None:
        self.rollout_id = lease.rollout_id
        self.lease = lease
        self.status: RolloutStatus = lease.status
        self.latest_result: RolloutResultResponse | None = None
        self._client = client
        self._lease_deadline = admitted_at + lease.polling_lease_timeout_sec
        self._running = asyncio.Event()
        self._grading = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    def done(self) -> bool:
        """Whether the final result (or a failure to get it) is in."""
        return self._task.done()

    async def wait_for_running(self) -> RolloutStatus:
        """Wait until the rollout started (or ended); returns the status then."""
        await self._first(self._running)
        return self.status

    async def wait_for_grading(self) -> RolloutStatus:
        """Wait until grading started (or the rollout ended); returns the status then."""
        await self._first(self._grading)
        return self.status

    async def wait_for_completion(self) -> RolloutResultResponse:
        """The final result.

        Raises:
            RolloutProtocolError: The server answered outside the protocol, or could not be
                reached before the lease deadline.
        """
        return await asyncio.shield(self._task)

    def __await__(self) -> Generator[Any, None, RolloutResultResponse]:
        return self.wait_for_completion().__await__()

    async def cancel(self) -> str:
        """Ask the server to cancel; the final result then reports ``cancelled``."""
        return await self._client.cancel_rollout(self.rollout_id)

    async def preview(self) -> dict[str, Any] | None:
        """The rollout's latest live preview document, or ``None`` while it has none.

        Needs a server with previews on (``GET /rollout/{id}/preview``, an osmosis_ai
        extension of the protocol).

        Raises:
            RolloutProtocolError: The server answered something other than 200 or 404.
        """
        return await self._client._get_preview(self.rollout_id, self.lease)

    async def _first(self, event: asyncio.Event) -> None:
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def _observe(self, result: RolloutResultResponse) -> None:
        self.status = result.status
        self.latest_result = result
        if result.status in _RUNNING or result.terminal:
            self._running.set()
        if result.status is RolloutStatus.GRADING or result.terminal:
            self._grading.set()

    async def _poll(self) -> RolloutResultResponse:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                status, body = await self._client._get_result(self.rollout_id, self.lease)
            except RolloutProtocolError as exc:
                if exc.status_code is not None:
                    raise
                status, body = 0, b""  # transport failure: retried below
            if status == 200:
                try:
                    result = RolloutResultResponse.model_validate_json(body)
                except ValueError as exc:
                    raise RolloutProtocolError(
                        f"GET /rollout/{self.rollout_id}/result returned an invalid result",
                        status_code=status,
                        rollout_id=self.rollout_id,
                    ) from exc
                if result.rollout_id != self.rollout_id:
                    raise RolloutProtocolError(
                        f"result for {result.rollout_id!r} returned for {self.rollout_id!r}",
                        status_code=status,
                        rollout_id=self.rollout_id,
                    )
                self._lease_deadline = started + self.lease.polling_lease_timeout_sec
                self._observe(result)
                failures = 0
                if result.terminal:
                    return result
                continue
            if not self._client.retry.retries(status or None):
                raise RolloutProtocolError(
                    f"GET /rollout/{self.rollout_id}/result returned {status}: {_detail(body)}",
                    status_code=status,
                    rollout_id=self.rollout_id,
                )
            failures += 1
            delay = self._client.retry.delay(failures)
            if time.monotonic() + delay >= self._lease_deadline:
                last = status or "transport error"
                raise RolloutProtocolError(
                    f"could not read the result of {self.rollout_id} before its polling lease "
                    f"ran out ({failures} failed attempts; last status {last})",
                    status_code=status or None,
                    rollout_id=self.rollout_id,
                )
            await asyncio.sleep(delay)


class RolloutClient(AsyncUnconditionalExit):
    """The controller's client of one rollout server.

    Args:
        url: Base URL of the rollout server, e.g. ``http://127.0.0.1:8000``.
        session: An aiohttp ``ClientSession`` to use (not closed by the client); by default
            the client opens its own.
        admission_timeout_sec: Bound on one admission including 429 retries; ``None`` = none.
        api_key: Bearer key the server requires, if any. Never shown in errors.
        max_connections: Size of the client's own connection pool (0 = unlimited).
        retry: What is retried and for how long (`RetryPolicy`).
        transport: Sends the requests instead of aiohttp (e.g. `MockTransport` in tests);
            closed with the client. Excludes ``session``.

    Raises:
        ValueError: ``admission_timeout_sec`` is not finite, ``api_key`` is blank, or both
            ``session`` and ``transport`` are given.
    """

    def __init__(
        self,
        *,
        url: str,
        session: Any = None,
        admission_timeout_sec: float | None = None,
        api_key: str | None = None,
        max_connections: int = 0,
        retry: RetryPolicy = DEFAULT_RETRY_POLICY,
        transport: Transport | None = None,
    ) -> None:
        if admission_timeout_sec is not None and not math.isfinite(admission_timeout_sec):
            raise ValueError("admission_timeout_sec must be finite or None")
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key must be a non-empty string or None")
        if session is not None and transport is not None:
            raise ValueError("pass session or transport, not both (a transport owns its session)")
        self.url = url.rstrip("/")
        self.admission_timeout_sec = admission_timeout_sec
        self.retry = retry
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport: Transport = (
            transport
            if transport is not None
            else AiohttpTransport(
                session=session, max_connections=max_connections, feature=_FEATURE
            )
        )
        self.max_connections = max_connections
        self._closed = False
        self._handles: weakref.WeakSet[RolloutHandle] = weakref.WeakSet()

    async def aclose(self) -> None:
        """Stop every handle's polling, then close the transport.

        A session passed in is left open. Rollouts still running on the server are not
        cancelled; their leases expire.
        """
        self._closed = True
        polling = [handle._task for handle in self._handles if not handle._task.done()]
        for task in polling:
            task.cancel()
        await asyncio.gather(*polling, return_exceptions=True)
        await self._transport.aclose()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def _aexit(self) -> None:
        await self.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout_sec: float | None = None,
    ) -> ClientResponse:
        if self._closed:
            raise RolloutProtocolError(f"{method} {path}: the RolloutClient is closed")
        request = ClientRequest(
            method,
            f"{self.url}{path}",
            {**self._headers, **(headers or {})},
            None if body is None else json.dumps(body).encode(),
            timeout_sec,
        )
        try:
            return await self._transport.send(request)
        except TransportError as exc:
            raise RolloutProtocolError(f"{method} {path} failed: {exc}", status_code=None) from exc

    async def health(self) -> dict[str, Any]:
        """``GET /health``.

        Raises:
            RolloutProtocolError: Not a 200 with a JSON object.
        """
        answer = await self._request("GET", "/health", timeout_sec=self.retry.call_timeout_sec)
        status, body = answer.status, answer.body
        try:
            data = json.loads(body) if status == 200 else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise RolloutProtocolError(
                f"GET /health returned {status}: {_detail(body)}", status_code=status
            )
        return data

    async def wait_idle(
        self,
        *,
        timeout_sec: float = 120.0,
        poll_interval_sec: float = 1.0,
        process_id: str | None = None,
    ) -> dict[str, Any]:
        """Wait until the server reports no active rollouts; returns that health payload.

        Raises:
            RolloutProtocolError: The server reports no lifecycle, restarted (its
                ``process_id`` changed), or is not idle within ``timeout_sec``.
        """
        deadline = time.monotonic() + timeout_sec
        while True:
            try:
                payload: dict[str, Any] | None = await self.health()
            except RolloutProtocolError as exc:
                if not self.retry.retries(exc.status_code):
                    raise
                payload = None
            if payload is not None:
                lifecycle = payload.get("lifecycle")
                if not isinstance(lifecycle, dict) or "process_id" not in payload:
                    raise RolloutProtocolError("the server reports no process_id/lifecycle")
                if process_id is not None and payload["process_id"] != process_id:
                    raise RolloutProtocolError("the rollout server restarted while waiting")
                if lifecycle.get("active_rollouts") == 0:
                    return payload
            if time.monotonic() + poll_interval_sec > deadline:
                raise RolloutProtocolError(f"the server was not idle within {timeout_sec:g}s")
            await asyncio.sleep(poll_interval_sec)

    async def run_rollout(
        self,
        initial_messages: list[dict[str, Any]],
        chat_completions_url: str,
        rollout_id: str,
        llm_api_key: str | None = None,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
        grade: bool = True,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        extra_fields: dict[str, Any] | None = None,
    ) -> RolloutHandle:
        """Admit one rollout and return its handle (polling starts at once).

        Raises:
            RolloutProtocolError: The server refused with anything but 429, answered an
                invalid lease, or could not be reached.
            RolloutAdmissionTimeoutError: Still refused with 429 (or no answer) when
                ``admission_timeout_sec`` ran out. It may have been admitted if an answer
                was in flight; its lease then expires on the server.
            pydantic.ValidationError: The request itself is invalid (e.g. a bad id).
        """
        request = RolloutInitRequest(
            rollout_id=rollout_id,
            initial_messages=initial_messages,
            chat_completions_url=chat_completions_url,
            llm_api_key=llm_api_key,
            label=label,
            metadata=metadata,
            grade=grade,
            agent_timeout_sec=agent_timeout_sec,
            grader_timeout_sec=grader_timeout_sec,
            extra_fields=extra_fields,
        )
        body = request.model_dump(mode="json")
        try:
            async with asyncio.timeout(self.admission_timeout_sec):
                while True:
                    started = time.monotonic()
                    answer = await self._request("POST", "/rollout", body=body)
                    status, content = answer.status, answer.body
                    if status == 202:
                        return self._handle(rollout_id, content, started)
                    if status != 429:
                        raise RolloutProtocolError(
                            f"POST /rollout returned {status}: {_detail(content)}; only 202 and "
                            "429 are expected",
                            status_code=status,
                            rollout_id=rollout_id,
                        )
                    await asyncio.sleep(self.retry.retry_after(answer.header("Retry-After")))
        except TimeoutError as exc:
            raise RolloutAdmissionTimeoutError(
                f"rollout {rollout_id} was not admitted within {self.admission_timeout_sec:g}s "
                "(it may have been admitted if an answer was in flight; its lease will expire)",
                rollout_id=rollout_id,
            ) from exc

    def _handle(self, rollout_id: str, content: bytes, started: float) -> RolloutHandle:
        try:
            lease = RolloutInitResponse.model_validate_json(content)
        except ValueError as exc:
            raise RolloutProtocolError(
                "POST /rollout returned an invalid lease", status_code=202, rollout_id=rollout_id
            ) from exc
        if lease.rollout_id != rollout_id:
            raise RolloutProtocolError(
                f"POST /rollout admitted {lease.rollout_id!r} instead of {rollout_id!r}",
                status_code=202,
                rollout_id=rollout_id,
            )
        handle = RolloutHandle(self, lease, started)
        self._handles.add(handle)
        return handle

    async def _get_result(self, rollout_id: str, lease: RolloutInitResponse) -> tuple[int, bytes]:
        answer = await self._request(
            "GET",
            f"/rollout/{quote(rollout_id, safe='')}/result",
            headers={POLLING_LEASE_HEADER: lease.polling_lease_token},
            timeout_sec=lease.result_wait_timeout_sec + _EXTRA_POLL_SEC,
        )
        return answer.status, answer.body

    async def _get_preview(
        self, rollout_id: str, lease: RolloutInitResponse
    ) -> dict[str, Any] | None:
        path = f"/rollout/{quote(rollout_id, safe='')}/preview"
        answer = await self._request(
            "GET",
            path,
            headers={POLLING_LEASE_HEADER: lease.polling_lease_token},
            timeout_sec=_SHORT_CALL_TIMEOUT_SEC,
        )
        status, body = answer.status, answer.body
        if status == 404:
            return None
        if status != 200:
            raise RolloutProtocolError(
                f"GET {path} returned {status}: {_detail(body)}",
                status_code=status,
                rollout_id=rollout_id,
            )
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise RolloutProtocolError(f"GET {path} returned invalid JSON") from exc
        return dict(document)

    async def cancel_rollout(self, rollout_id: str) -> str:
        """Cancel one rollout; returns its disposition (``not_found`` if already final).

        Raises:
            RolloutProtocolError: The server did not answer 200 within 5 seconds.
        """
        answer = await self._request(
            "POST",
            "/rollout/cancel",
            body={"ids": [rollout_id]},
            timeout_sec=_SHORT_CALL_TIMEOUT_SEC,
        )
        status, body = answer.status, answer.body
        if status != 200:
            raise RolloutProtocolError(
                f"POST /rollout/cancel returned {status}: {_detail(body)}",
                status_code=status,
                rollout_id=rollout_id,
            )
        try:
            disposition = json.loads(body)["dispositions"].get(rollout_id, "not_found")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RolloutProtocolError(
                "POST /rollout/cancel returned an invalid body", status_code=status
            ) from exc
        return str(disposition)
