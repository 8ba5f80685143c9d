"""Malformed requests get a clear 4xx in OpenAI's error shape, and the gateway stays healthy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.gateway import Gateway
from tests.gateway.conftest import chat

CHAT = "/v1/rollouts/r1/chat/completions"


@pytest_asyncio.fixture(autouse=True)
async def stays_healthy(client: httpx2.AsyncClient) -> AsyncIterator[None]:
    yield
    assert (await client.get("/health")).json()["status"] == "ok"
    assert (await client.post(CHAT, json=chat())).status_code == 200


def _error(response: httpx2.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


class _SendsInstead(httpx2.AsyncBaseTransport):
    """A real HTTP transport that sends ``body`` instead of the JSON the SDK wrote, as a
    client with a broken serialiser or a proxy that cut the body would."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._http = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        headers = [(k, v) for k, v in request.headers.multi_items() if k != "content-length"]
        sent = httpx2.Request(request.method, request.url, headers=headers, content=self._body)
        return await self._http.handle_async_request(sent)

    async def aclose(self) -> None:
        await self._http.aclose()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON: Expecting property name enclosed in double quotes at "
         "line 1 column 2"),
        (b'{"a": "\xff\xfe"}', "not UTF-8 JSON"),
        (b'{"messages": ' + b"[" * 200 + b"]" * 200 + b"}", "nests deeper than"),
    ],
)  # fmt: skip
async def test_a_body_that_is_no_json_is_a_bad_request_as_openai_answers_it(
    gateway: Gateway, body: bytes, says: str
) -> None:
    import openai

    # OpenAI's API and vLLM answer 400 here; clients written for them act on that status.
    http = httpx2.AsyncClient(transport=_SendsInstead(body))  # the openai SDK's HTTP client
    async with openai.AsyncOpenAI(
        base_url=gateway.chat_completions_url("r1"), api_key=gateway.token, http_client=http,
        max_retries=0,
    ) as client:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
    assert raised.value.status_code == 400
    assert raised.value.type == "invalid_request_error"
    assert says in raised.value.message


async def test_wrong_content_type(client: httpx2.AsyncClient) -> None:
    response = await client.post(CHAT, content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert "application/json" in _error(response)["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]}, "tools[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}, "tool_choice"),
    ],
)
async def test_invalid_fields_name_the_field(
    client: httpx2.AsyncClient, body: dict[str, Any], param: str
) -> None:
    response = await client.post(CHAT, json=body)
    assert response.status_code == 400
    assert _error(response)["param"] == param
    assert _error(response)["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "field", ["api_key", "api_base", "base_url", "extra_headers", "litellm_params", "_private"]
)
async def test_fields_that_would_reconfigure_the_gateway_are_refused(
    client: httpx2.AsyncClient, field: str
) -> None:
    response = await client.post(CHAT, json=chat(**{field: "x"}))
    assert response.status_code == 400
    message = _error(response)["message"]
    assert repr(field) in message and "remove it" in message


async def test_denied_field_hidden_in_extra_body_is_refused(client: httpx2.AsyncClient) -> None:
    response = await client.post(CHAT, json=chat(extra_body={"api_base": "http://evil"}))
    assert response.status_code == 400
    assert _error(response)["param"] == "api_base"


async def test_oversize_body_is_refused(client: httpx2.AsyncClient) -> None:
    big = chat("x" * (32 * 1024 * 1024 + 1))
    response = await client.post(CHAT, json=big)
    assert response.status_code == 413
    message = _error(response)["message"]
    assert "32.0 MiB" in message and "the gateway's 32 MiB limit" in message


async def test_lone_surrogates_are_refused(client: httpx2.AsyncClient) -> None:
    response = await client.post(
        CHAT,
        content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "surrogate" in _error(response)["message"]


async def test_deeply_nested_body_is_refused(client: httpx2.AsyncClient) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    response = await client.post(CHAT, content=nested, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "deeper than 64 levels" in _error(response)["message"]


async def test_body_nested_past_the_depth_limit_without_recursion_error_is_refused(
    client: httpx2.AsyncClient,
) -> None:
    # 100 levels parse fine but pass the shared limit of 64: refused before any policy sees them.
    nested: Any = "x"
    for _ in range(100):
        nested = [nested]
    response = await client.post(CHAT, json=chat(metadata=nested))
    assert response.status_code == 400
    assert "deeper than 64 levels" in _error(response)["message"]


async def test_a_body_nested_to_the_limit_is_taken_and_one_level_more_is_refused(
    client: httpx2.AsyncClient,
) -> None:
    def nested(levels: int) -> Any:
        value: Any = "x"
        for _ in range(levels):
            value = [value]
        return value

    # The request object is level 1: metadata at 63 list levels reaches 64, the limit.
    at_limit = await client.post(CHAT, json=chat(metadata=nested(63)))
    past_limit = await client.post(CHAT, json=chat(metadata=nested(64)))
    assert at_limit.status_code == 200
    assert past_limit.status_code == 400
    assert "deeper than 64 levels" in _error(past_limit)["message"]


@pytest.mark.parametrize("rollout_id", ["..", ".", "a%2Fb", "a%00b", "x" * 300])
async def test_invalid_rollout_id_in_the_path(client: httpx2.AsyncClient, rollout_id: str) -> None:
    response = await client.post(f"/v1/rollouts/{rollout_id}/chat/completions", json=chat())
    assert response.status_code in (404, 422)
    assert "error" in response.json()


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer", "Bearer wrong", "Basic abc", "bearer {token}"]
)
async def test_missing_or_wrong_bearer_is_401(gateway: Gateway, authorization: str | None) -> None:
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(token=gateway.token)
    async with httpx2.AsyncClient(base_url=gateway.base_url) as http:
        response = await http.post(CHAT, json=chat(), headers=headers)
        calls = await http.get("/v1/rollouts/r1/calls", headers=headers)
        models = await http.get("/v1/models", headers=headers)
    assert response.status_code == calls.status_code == models.status_code == 401
    assert _error(response)["type"] == "authentication_error"


async def test_unauthorized_answer_shows_the_header_to_send(gateway: Gateway) -> None:
    # The help is the gateway's own text: redaction must not turn it into "[REDACTED] token>".
    async with httpx2.AsyncClient(base_url=gateway.base_url) as http:
        response = await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401
    assert _error(response)["message"] == (
        "missing or invalid bearer token; send 'Authorization: Bearer <gateway token>'"
    )


async def test_unknown_route_and_method_answer_in_json(client: httpx2.AsyncClient) -> None:
    missing = await client.post("/v1/chat/completions", json=chat())
    assert missing.status_code == 404 and "error" in missing.json()
    wrong_method = await client.get(CHAT)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
