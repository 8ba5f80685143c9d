"""The gateway app: the chat route served ahead of Starlette, and the same answers either way."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from osmosis_ai._serving import running_server
from osmosis_ai.gateway import (
    CallRecords,
    Gateway,
    OpenAICompatiblePolicy,
    Policy,
    create_gateway_app,
)
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.testing import ChatStub
from tests.gateway.conftest import PROVIDER_KEY, chat, serving

CHAT = "/v1/rollouts/r1/chat/completions"
TOKEN = "gateway-token-5b8e2d"


async def test_under_a_root_path_the_router_serves_the_same_chat_handler(stub: ChatStub) -> None:
    # Mounted, the app sees a root path: the chat route goes through Starlette's router.
    records = CallRecords()
    policy = OpenAICompatiblePolicy(stub.base_url, api_key=PROVIDER_KEY)
    gateway = create_gateway_app(policy, token=TOKEN, records=records)
    outer = Starlette(routes=[Mount("/gw", app=gateway)])
    async with (
        running_server(outer) as server,
        httpx2.AsyncClient(base_url=server.base_url) as http,
    ):
        # Starlette runs a mounted app's lifespan only if the outer app forwards it.
        await policy.start()
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            answered = await http.post(f"/gw{CHAT}", json=chat("hi"), headers=headers)
            refused = await http.post(f"/gw{CHAT}", json=chat("hi"))
            wrong_id = await http.post(
                "/gw/v1/rollouts/a%00b/chat/completions", json=chat(), headers=headers
            )
        finally:
            await policy.aclose()
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["message"]["content"] == "echo: hi"
    assert [record.status for record in records.calls("r1")] == ["ok"]
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert wrong_id.status_code == 422
    assert wrong_id.json()["error"]["param"] == "rollout_id"


async def test_a_content_type_with_parameters_and_the_first_bearer_are_taken(
    gateway: Gateway,
) -> None:
    # The chat handler reads headers from the ASGI scope as Starlette's Headers.get does.
    async with httpx2.AsyncClient(base_url=gateway.base_url) as http:
        response = await http.post(
            CHAT,
            content=b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
            headers=[
                ("Content-Type", "Application/JSON; charset=utf-8"),
                ("Authorization", f"Bearer {gateway.token}"),
                ("Authorization", "Bearer wrong"),
            ],
        )
        second_wrong = await http.post(
            CHAT,
            json=chat(),
            headers=[
                ("Authorization", "Bearer wrong"),
                ("Authorization", f"Bearer {gateway.token}"),
            ],
        )
    assert response.status_code == 200
    assert second_wrong.status_code == 401


class _UnencodableAnswer(Policy):
    """Answers with a NaN, which the gateway's strict JSON encoding refuses."""

    kind = "unencodable"

    @property
    def model(self) -> str:
        return "nan-model"

    def secrets(self) -> tuple[str, ...]:
        return (PROVIDER_KEY,)

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        message = {"role": "assistant", "content": "x"}
        return {
            "object": "chat.completion",
            "model": "nan-model",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "score": float("nan"),
        }

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        yield await self.complete(request)


async def test_an_answer_that_cannot_be_encoded_is_an_opaque_500_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(_UnencodableAnswer()) as (_, http):
        response = await http.post(CHAT, json=chat())
        healthy = (await http.get("/health")).json()["status"]
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "internal gateway error",
        "type": "internal_error",
        "param": None,
        "code": None,
    }
    assert healthy == "ok"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split(":")[0] for r in errors] == ["gateway error ValueError"]
    # No server traceback: an exception's text is only ever logged redacted.
    assert not any(r.exc_info for r in caplog.records)
