"""Gateway fixtures: a real stub upstream and a real gateway, both on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.gateway import Gateway, OpenAICompatiblePolicy, Policy
from osmosis_ai.testing import ChatStub

PROVIDER_KEY = "sk-provider-7f3a9c1e5d"


@pytest_asyncio.fixture
async def gateway(stub: ChatStub) -> AsyncIterator[Gateway]:
    policy = OpenAICompatiblePolicy(stub.base_url, api_key=PROVIDER_KEY, timeout_sec=5)
    async with Gateway(policy) as running:
        yield running


@contextlib.asynccontextmanager
async def serving(
    policy: Policy, *, client_timeout_sec: float = 30, **gateway_options: Any
) -> AsyncIterator[tuple[Gateway, httpx2.AsyncClient]]:
    """A running gateway for ``policy`` and a client that sends its token."""
    async with Gateway(policy, **gateway_options) as running:
        headers = {"Authorization": f"Bearer {running.token}"}
        async with httpx2.AsyncClient(
            base_url=running.base_url, headers=headers, timeout=client_timeout_sec
        ) as http:
            yield running, http


@pytest.fixture(scope="module")
def served(running: tuple[Policy, Gateway, httpx2.AsyncClient]) -> tuple[Policy, Gateway]:
    """``(policy, gateway)`` of a module's ``running`` fixture (a policy served by
    `serving`), for a module that defines one."""
    return running[0], running[1]


@pytest.fixture(scope="module")
def http(running: tuple[Policy, Gateway, httpx2.AsyncClient]) -> httpx2.AsyncClient:
    """The client of a module's ``running`` fixture."""
    return running[2]


@pytest_asyncio.fixture
async def client(gateway: Gateway) -> AsyncIterator[httpx2.AsyncClient]:
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with httpx2.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=30) as http:
        yield http


def chat(content: str = "hello", **fields: Any) -> dict[str, Any]:
    """A minimal chat-completions body."""
    return {"model": "stub-model", "messages": [{"role": "user", "content": content}], **fields}


def sse_events(text: str) -> list[Any]:
    """Decode a server-sent-events body into its JSON payloads (``[DONE]`` as a string)."""
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
