"""Hostile and malformed bodies: always a 4xx, never a 5xx, and the server stays healthy."""

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
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory, Server
from tests.rollout.server.workflows import Answer

pytestmark = pytest.mark.asyncio(loop_scope="module")

VALID = {"rollout_id": "r", "initial_messages": PROMPT, "chat_completions_url": CHAT_URL}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    app = create_rollout_server(backend=LocalBackend(workflow=Answer), configure_logging=False)
    async with (
        running_server(app) as server,
        httpx2.AsyncClient(base_url=server.base_url, timeout=60) as client,
    ):
        yield client
        health = await client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"


async def _post(http: httpx2.AsyncClient, content: bytes) -> httpx2.Response:
    return await http.post(
        "/rollout", content=content, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"", 422),
        (b"{not json", 422),
        (b"\xff\xfe\x00garbage", 422),
        (b"[1, 2, 3]", 422),
        (b"null", 422),
        (json.dumps({**VALID, "rollout_id": "../etc"}).encode(), 422),
        (json.dumps({**VALID, "rollout_id": ""}).encode(), 422),
        (json.dumps({**VALID, "rollout_id": "a" * 300}).encode(), 422),
        (json.dumps({**VALID, "llm_api_key": ""}).encode(), 422),
        (json.dumps({**VALID, "agent_timeout_sec": "soon"}).encode(), 422),
        (json.dumps({**VALID, "initial_messages": "hi"}).encode(), 422),
        (json.dumps({k: v for k, v in VALID.items() if k != "chat_completions_url"}).encode(), 422),
        (b'{"rollout_id": "x", "agent_timeout_sec": NaN}', 422),
        (b"[" * 100_000 + b"]" * 100_000, 422),
    ],
)
async def test_malformed_bodies_are_422(
    http: httpx2.AsyncClient, content: bytes, status: int
) -> None:
    response = await _post(http, content)
    assert response.status_code == status
    assert "detail" in response.json()


@pytest.mark.parametrize("field", ["agent_timeout_sec", "grader_timeout_sec"])
@pytest.mark.parametrize("value", [-5, 0, -0.001])
async def test_non_positive_timeouts_are_422_naming_the_field(
    http: httpx2.AsyncClient, field: str, value: float
) -> None:
    response = await _post(http, json.dumps({**VALID, field: value}).encode())
    assert response.status_code == 422
    assert field in response.text and "greater than 0" in response.text


async def test_validation_errors_never_echo_the_key(http: httpx2.AsyncClient) -> None:
    body = {**VALID, "rollout_id": "../x", "llm_api_key": "sk-never-echo-4411"}
    response = await _post(http, json.dumps(body).encode())
    assert response.status_code == 422 and "sk-never-echo-4411" not in response.text


async def test_oversized_body_is_413_naming_its_size_and_the_limit(
    http: httpx2.AsyncClient,
) -> None:
    response = await _post(http, b'{"x": "' + b"a" * (33 * 1024 * 1024) + b'"}')
    assert response.status_code == 413
    detail = response.json()["detail"]
    assert "33.0 MiB" in detail and "32 MiB limit" in detail


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


async def test_bodies_nested_past_the_limit_are_refused_at_admission(
    http: httpx2.AsyncClient,
) -> None:
    # The body object is level 1, so metadata may nest 63 levels under the limit of 64.
    fits = {**VALID, "rollout_id": "deep-ok", "metadata": _nested(63)}
    assert (await _post(http, json.dumps(fits).encode())).status_code == 202
    deep = {**VALID, "rollout_id": "deep", "metadata": _nested(300)}
    response = await _post(http, json.dumps(deep).encode())
    assert response.status_code == 422
    assert "deeper than 64 levels" in response.json()["detail"]


async def test_ten_megabyte_strings_and_unicode_garbage_are_accepted_as_data(
    http: httpx2.AsyncClient,
) -> None:
    big = {**VALID, "rollout_id": "big", "label": "x" * (10 * 1024 * 1024)}
    assert (await _post(http, json.dumps(big).encode())).status_code == 202
    odd = {
        **VALID,
        "rollout_id": "odd",
        "initial_messages": [{"role": "user", "content": "\u202e\ufffd\U0001f600\x00"}],
    }
    assert (await _post(http, json.dumps(odd).encode())).status_code == 202


async def test_lone_surrogates_in_messages_do_not_break_the_result(
    http: httpx2.AsyncClient,
) -> None:
    content = (
        b'{"rollout_id": "surrogate", "chat_completions_url": "http://x", '
        b'"initial_messages": [{"role": "user", "content": "\\ud800"}], "label": "\\udfff"}'
    )
    admitted = await _post(http, content)
    assert admitted.status_code == 202
    lease = admitted.json()["polling_lease_token"]
    async with asyncio.timeout(10):
        while True:
            result = await http.get(
                "/rollout/surrogate/result", headers={"X-Osmosis-Rollout-Lease": lease}
            )
            assert result.status_code == 200
            if result.json()["status"] not in ("queued", "running", "grading"):
                break
    assert result.json()["status"] == "success"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "rollout_id": st.text(max_size=20) | JSON,
        "initial_messages": st.lists(
            st.dictionaries(st.text(max_size=8), JSON, max_size=3), max_size=3
        )
        | JSON,
        "chat_completions_url": st.text(max_size=30) | JSON,
        "llm_api_key": st.none() | st.text(max_size=10) | JSON,
        "label": st.none() | st.text(max_size=10) | JSON,
        "metadata": st.none() | st.dictionaries(st.text(max_size=5), JSON, max_size=3) | JSON,
        "grade": st.booleans() | JSON,
        "agent_timeout_sec": st.none() | st.floats() | JSON,
        "grader_timeout_sec": st.none() | st.floats() | JSON,
        "extra_fields": st.none() | JSON,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=FIELDS | JSON)
async def test_fuzzed_admission_bodies_never_cause_a_5xx(
    http: httpx2.AsyncClient, body: Any
) -> None:
    try:
        content = json.dumps(body).encode()
    except ValueError:
        return
    response = await _post(http, content)
    assert response.status_code in (202, 409, 413, 422), response.text


async def test_admitted_fuzz_rollouts_all_finish(serve: ServeFactory) -> None:
    # Separate, fresh server: a few odd-but-valid requests run to a terminal result.
    async with serve() as server:
        assert isinstance(server, Server)
        cases: list[dict[str, Any]] = [{}, {"nested": {"a": [1, None]}}, {"delay": 0}]
        for index, metadata in enumerate(cases):
            handle = await server.client.run_rollout(
                PROMPT, "not even a url", f"fz{index}", metadata=metadata, label=None
            )
            result = await handle
            assert result.terminal
