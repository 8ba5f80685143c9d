"""Rollout-server fixtures: real uvicorn servers on 127.0.0.1 ephemeral ports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_ai._serving import bind_socket, running_server
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.server._state import ServerState
from osmosis_ai.rollout.server.app import RolloutServerApp
from tests.rollout.server.workflows import Answer, ExactMatch

PROMPT = [{"role": "user", "content": "What is 6*7?"}]
CHAT_URL = "http://127.0.0.1:9/v1/rollouts/unused"
ROOT = Path(__file__).resolve().parents[3]


async def start_server_process(
    *,
    drain_timeout_sec: float = 10.0,
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, str]:
    """``serve_main`` (a user-style entry point) as a child process, once it answers.

    Args:
        wrapper: A command the interpreter runs under (e.g. ``strace ...``).
        env: Variables added to the child's environment.
    """
    probe = bind_socket()
    port = probe.getsockname()[1]
    probe.close()
    process = await asyncio.create_subprocess_exec(
        *wrapper,
        sys.executable,
        "-m",
        "tests.rollout.server.serve_main",
        str(port),
        str(drain_timeout_sec),
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        },
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx2.AsyncClient() as http, asyncio.timeout(60):
        while True:
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return process, url
            except httpx2.TransportError:
                await asyncio.sleep(0.05)


class Server:
    """A running rollout server with a protocol client and a raw HTTP client."""

    def __init__(
        self,
        base_url: str,
        client: RolloutClient,
        http: httpx2.AsyncClient,
        app: RolloutServerApp,
    ):
        self.base_url = base_url
        self.client = client
        self.http = http
        self.app = app

    @property
    def state(self) -> ServerState:
        return self.app.state.rollout

    async def admit(self, rollout_id: str, **fields: Any) -> httpx2.Response:
        body = {
            "rollout_id": rollout_id,
            "initial_messages": PROMPT,
            "chat_completions_url": CHAT_URL,
            "label": "42",
            **fields,
        }
        return await self.http.post("/rollout", json=body)


ServeFactory = Callable[..., contextlib.AbstractAsyncContextManager[Server]]


@pytest.fixture
def serve() -> ServeFactory:
    """``async with serve(backend=..., **server_kwargs) as server``."""

    @contextlib.asynccontextmanager
    async def start(backend: Any = None, **kwargs: Any) -> AsyncIterator[Server]:
        api_key = kwargs.get("api_key")
        kwargs.setdefault("configure_logging", False)
        app = create_rollout_server(
            backend=backend or LocalBackend(workflow=Answer, grader=ExactMatch), **kwargs
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with (
            running_server(app) as running,
            RolloutClient(url=running.base_url, api_key=api_key) as client,
            httpx2.AsyncClient(base_url=running.base_url, headers=headers, timeout=60) as http,
        ):
            yield Server(running.base_url, client, http, app)

    return start
