"""Hostile input against the real rollout server and gateway: 5,000 generated requests each
(methods, paths with traversal and encoding tricks, headers, bodies). None may get a 5xx or
break the server; authentication holds on every route; health stays green."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osmosis_ai._serving import running_server
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ChatStub
from tests.rollout.server.workflows import Answer, ExactMatch

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

#: Requests per app: ``EXAMPLES`` generated batches of ``BATCH`` requests sent concurrently.
EXAMPLES = 100
BATCH = 50
CASES = EXAMPLES * BATCH
SERVER_KEY = "server-key-7f31"

SEGMENTS = st.sampled_from(
    ["r1", "..", "%2e%2e", "..%2F..%2Fetc", "%00", "a" * 300, "é", "%ff", "", ".", "~root",
     "/etc/passwd", "r1%2Fresult", "\\..\\", "{id}", "r 1"]
)  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _body_strategy(fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Valid-looking bodies with one field replaced or dropped, arbitrary JSON, or garbage."""
    mutated = st.builds(
        lambda key, value, drop: json.dumps(
            {k: v for k, v in {**fields, key: value}.items() if not (drop and k == key)},
            default=str,
        ).encode(),
        st.sampled_from(sorted(fields)),
        JSON_VALUES,
        st.booleans(),
    )
    anything = JSON_VALUES.map(lambda v: json.dumps(v, default=str).encode())
    return mutated | anything | st.binary(max_size=200)


def _requests(routes: list[str], fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "method": st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
            "path": st.builds(
                lambda route, a, b: route.replace("{a}", a).replace("{b}", b),
                st.sampled_from(routes),
                SEGMENTS,
                SEGMENTS,
            ),  # fmt: skip
            "body": _body_strategy(fields),
            "content_type": st.sampled_from(
                ["application/json", "text/plain", "", "application/json; charset=latin-1"]
            ),
            "lease": st.sampled_from(["", "x", "a" * 5000, "\u00e9t\u00e9"]),
        }
    )


async def _send(
    client: httpx2.AsyncClient, case: dict[str, Any], auth: str | None
) -> httpx2.Response:
    headers: list[tuple[bytes, bytes]] = []
    if case["content_type"]:
        headers.append((b"Content-Type", case["content_type"].encode()))
    if case["lease"]:
        headers.append((b"X-Osmosis-Rollout-Lease", case["lease"].encode("utf-8")))  # raw bytes
    if auth:
        headers.append((b"Authorization", auth.encode()))
    content = case["body"] if case["method"] not in ("GET", "HEAD") else None
    return await client.request(case["method"], case["path"], content=content, headers=headers)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[httpx2.AsyncClient]:
    app = create_rollout_server(
        backend=LocalBackend(workflow=Answer, grader=ExactMatch),
        configure_logging=False,
        api_key=SERVER_KEY,
    )
    async with (
        running_server(app) as running,
        httpx2.AsyncClient(base_url=running.base_url, timeout=30) as client,
    ):
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[tuple[httpx2.AsyncClient, Gateway]]:
    async with ChatStub() as stub:
        policy = OpenAICompatiblePolicy(base_url=stub.base_url, api_key="upstream-key")
        async with (
            Gateway(policy) as running,
            httpx2.AsyncClient(base_url=running.base_url, timeout=30) as client,
        ):
            yield client, running


SERVER_ROUTES = ["/rollout", "/rollout/{a}/result", "/rollout/{a}/preview", "/rollout/cancel",
                 "/health", "/rollout/{a}/{b}", "/{a}", "/rollout/{a}"]  # fmt: skip
SERVER_FIELDS = {
    "rollout_id": "r1",
    "initial_messages": [{"role": "user", "content": "hi"}],
    "chat_completions_url": "http://127.0.0.1:9/v1",
    "label": "42",
}


SERVER_STATUSES: dict[int, int] = {}
GATEWAY_STATUSES: dict[int, int] = {}
GATEWAY_ROUTES = [
    "/v1/rollouts/{a}/chat/completions",
    "/v1/rollouts/{a}/calls",
    "/v1/rollouts/{a}/trajectory-report",
    "/v1/{a}",
    "/{a}/{b}",
    "/health",
]
GATEWAY_FIELDS = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
CASE_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


@CASE_SETTINGS
@given(cases=st.lists(st.tuples(_requests(SERVER_ROUTES, SERVER_FIELDS), st.booleans()),
                      min_size=BATCH, max_size=BATCH))  # fmt: skip
async def test_server_never_fails_on_generated_requests(
    server: httpx2.AsyncClient, cases: list[tuple[dict[str, Any], bool]]
) -> None:
    keys = [f"Bearer {SERVER_KEY}" if authorised else "Bearer wrong" for _, authorised in cases]
    answers = await asyncio.gather(
        *(_send(server, c, k) for (c, _), k in zip(cases, keys, strict=True))
    )
    for (case, authorised), answer in zip(cases, answers, strict=True):
        SERVER_STATUSES[answer.status_code] = SERVER_STATUSES.get(answer.status_code, 0) + 1
        assert answer.status_code < 500, (case, answer.status_code, answer.text[:300])
        if not authorised:
            assert answer.status_code == 401, (case, answer.status_code)  # every route
        assert SERVER_KEY not in answer.text


async def test_server_stayed_healthy(server: httpx2.AsyncClient) -> None:
    assert sum(SERVER_STATUSES.values()) >= CASES
    assert any(200 <= code < 300 for code in SERVER_STATUSES), SERVER_STATUSES
    health = await server.get("/health", headers={"Authorization": f"Bearer {SERVER_KEY}"})
    assert health.status_code == 200 and health.json()["status"] == "ok"


@CASE_SETTINGS
@given(cases=st.lists(st.tuples(_requests(GATEWAY_ROUTES, GATEWAY_FIELDS), st.booleans()),
                      min_size=BATCH, max_size=BATCH))  # fmt: skip
async def test_gateway_never_fails_on_generated_requests(
    gateway: tuple[httpx2.AsyncClient, Gateway], cases: list[tuple[dict[str, Any], bool]]
) -> None:
    client, running = gateway
    keys = [f"Bearer {running.token}" if authorised else "Bearer x" for _, authorised in cases]
    answers = await asyncio.gather(
        *(_send(client, c, k) for (c, _), k in zip(cases, keys, strict=True))
    )
    for (case, authorised), answer in zip(cases, answers, strict=True):
        GATEWAY_STATUSES[answer.status_code] = GATEWAY_STATUSES.get(answer.status_code, 0) + 1
        assert answer.status_code < 500, (case, answer.status_code, answer.text[:300])
        if not authorised and case["path"].startswith("/v1/rollouts/"):
            assert answer.status_code in (401, 404, 405), (case, answer.status_code)
        assert running.token not in answer.text and "upstream-key" not in answer.text


async def test_gateway_stayed_healthy(gateway: tuple[httpx2.AsyncClient, Gateway]) -> None:
    client, running = gateway
    assert sum(GATEWAY_STATUSES.values()) >= CASES
    reply = await client.post(
        "/v1/rollouts/final/chat/completions",
        json=GATEWAY_FIELDS,
        headers={"Authorization": f"Bearer {running.token}"},
    )
    assert reply.status_code == 200
