"""The server's lifespan: the user's lifespan wraps the backend's start and shutdown."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.server.app import RolloutServerApp
from tests.rollout.server.conftest import ServeFactory
from tests.rollout.server.workflows import Answer, ExactMatch


class Recorded(LocalBackend):
    """A local backend that records when it starts and shuts down."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(workflow=Answer, grader=ExactMatch)
        self.events = events

    async def start(self) -> None:
        self.events.append("backend start")
        await super().start()

    async def shutdown(self) -> None:
        self.events.append("backend shutdown")
        await super().shutdown()


def lifespan_recording(events: list[str], *, fail_at: str = "") -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        events.append(f"user enter {type(app).__name__}")
        if fail_at == "enter":
            raise RuntimeError("user startup broke: sk-hidden-1")
        yield
        events.append("user exit")
        if fail_at == "exit":
            raise RuntimeError("user shutdown broke: sk-hidden-2")

    return lifespan


async def test_user_lifespan_wraps_the_backend(serve: ServeFactory) -> None:
    events: list[str] = []
    async with serve(Recorded(events), lifespan=lifespan_recording(events)) as server:
        assert (await server.http.get("/health")).status_code == 200
        events.append("serving")
    assert events == [
        "user enter RolloutServerApp",
        "backend start",
        "serving",
        "backend shutdown",
        "user exit",
    ]


async def lifespan_messages(app: RolloutServerApp) -> list[dict[str, Any]]:
    """What ``app`` sends through one lifespan (startup, then shutdown) driven in-process."""
    incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(incoming)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app({"type": "lifespan"}, receive, send)
    return sent


async def test_failing_user_startup_fails_the_startup(caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []
    app = create_rollout_server(
        backend=Recorded(events),
        lifespan=lifespan_recording(events, fail_at="enter"),
        configure_logging=False,
    )
    sent = await lifespan_messages(app)
    # The type only: the message may hold a secret.
    assert sent == [{"type": "lifespan.startup.failed", "message": "RuntimeError"}]
    assert events == ["user enter RolloutServerApp"]  # the backend never started
    assert "rollout server startup failed" in caplog.text


async def test_failing_user_shutdown_fails_the_shutdown_after_the_backend_shut_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []
    app = create_rollout_server(
        backend=Recorded(events),
        lifespan=lifespan_recording(events, fail_at="exit"),
        configure_logging=False,
    )
    sent = await lifespan_messages(app)
    assert sent == [
        {"type": "lifespan.startup.complete"},
        {"type": "lifespan.shutdown.failed", "message": "RuntimeError"},
    ]
    assert events[-2:] == ["backend shutdown", "user exit"]
    assert "rollout server shutdown failed" in caplog.text


async def test_startup_objects_are_frozen_out_of_collections_while_serving(
    serve: ServeFactory,
) -> None:
    assert gc.get_freeze_count() == 0
    async with serve() as server:
        frozen = gc.get_freeze_count()
        assert (await server.http.get("/health")).status_code == 200
    # Modules, classes and the app itself: far more than a handful of objects.
    assert frozen > 10_000
    assert gc.get_freeze_count() == 0  # given back at shutdown
