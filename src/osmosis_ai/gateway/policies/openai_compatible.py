"""The OpenAI-compatible policy: any ``/v1/chat/completions`` server (vLLM, SGLang, OpenAI...)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ChatRequestError, ConfigError, PolicyError
from osmosis_ai.gateway.policies._scrub_stream import StreamScrubber
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.rollout._scrub import scrub_json

__all__ = ["OpenAICompatiblePolicy"]

_MAX_ERROR_BODY = 4096
_FEATURE = "The OpenAI-compatible policy"


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``url`` as ``(scheme://, userinfo or None, rest)``, e.g. ``("http://", "u:pw", "h/v1")``.

    The userinfo ends at the last ``@`` before the path, so an unencoded ``@`` inside a
    password stays in it.
    """
    start = url.find("://") + 3
    if start < 3:
        return "", None, url
    slash = url.find("/", start)
    at = url.rfind("@", start, len(url) if slash < 0 else slash)
    if at < 0:
        return url[:start], None, url[start:]
    return url[:start], url[start:at], url[at + 1 :]


def _url_secrets(userinfo: str | None) -> tuple[str, ...]:
    # The password; without one the user part is the credential (https://TOKEN@host).
    if not userinfo:
        return ()
    secret = userinfo.partition(":")[2] if ":" in userinfo else userinfo
    return tuple(dict.fromkeys(s for s in (secret, unquote(secret)) if s))


def _upstream_message(status: int, body: bytes) -> str:
    text = body[:_MAX_ERROR_BODY].decode("utf-8", "replace")
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        text = str(error["message"])
    elif isinstance(error, str):
        text = error
    return f"upstream answered {status}: {' '.join(text.split())}"


def _status_error(status: int, body: bytes) -> PolicyError:
    # The caller's own mistakes (4xx) keep their status; upstream failures become 502.
    message = _upstream_message(status, body)
    if 400 <= status < 500:
        return PolicyError(message, status_code=status, error_type="upstream_request_error")
    return PolicyError(message, status_code=502)


def _transport_error(exc: Exception, timeout_sec: float) -> PolicyError:
    """The one place aiohttp's failures become gateway errors."""
    if isinstance(exc, TimeoutError):
        return PolicyError(f"upstream timed out after {timeout_sec:g}s", status_code=504)
    return PolicyError(f"upstream unreachable ({type(exc).__name__})")


class OpenAICompatiblePolicy(Policy):
    """Forwards requests to an OpenAI-compatible server over pooled HTTP connections.

    Upstream 4xx answers keep their status; 5xx become 502, timeouts 504 and connection
    failures 502, all with OpenAI-style error bodies. With ``token_data=True`` the upstream
    is asked for logprobs and token ids (vLLM's ``return_token_ids``), which the gateway
    records per call.

    The HTTP client is aiohttp: its connection pool hands out an idle connection in constant
    time, where httpx's pool polls every idle socket on every request (about 6x slower
    with a few hundred connections open).

    Args:
        base_url: The server's base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: Model to request; defaults to the model the caller named.
        api_key: Bearer key for the upstream; never shown in errors or logs. Credentials in
            ``base_url`` (``http://user:password@host/v1``) are sent as Basic auth instead;
            the two cannot be combined.
        timeout_sec: Connect timeout, and the longest wait for the next byte of an answer.
        token_data: Ask for logprobs and token ids on every call.
        max_connections: Size of the connection pool.
        session_header: Send each call's rollout id in this header (e.g. ``X-Session-ID``),
            so an upstream that routes by session (SkyRL's inference proxy) keeps a
            rollout's calls on one engine and reuses its prefix cache.

    Raises:
        ConfigError: ``base_url`` carries credentials and ``api_key`` is given too.
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_sec: float = 600.0,
        token_data: bool = False,
        max_connections: int = 512,
        session_header: str | None = None,
    ) -> None:
        userinfo = split_userinfo(base_url)[1]
        if userinfo is not None and api_key:
            raise ConfigError(
                "the policy URL carries credentials (user:password@) and an API key was given "
                "too (--policy-api-key, OSMOSIS_POLICY_API_KEY or --api-key); the upstream takes "
                "one Authorization header: drop the credentials from the URL or the key"
            )
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._api_key = api_key
        self._secrets = (api_key,) if api_key else _url_secrets(userinfo)
        self.timeout_sec = timeout_sec
        self.token_data = token_data
        self.max_connections = max_connections
        self.session_header = session_header
        self._session: Any = None
        self._aiohttp: Any = None

    @property
    def model(self) -> str:
        """The configured model, or ``openai-compatible`` when callers choose."""
        return self._model or "openai-compatible"

    def secrets(self) -> tuple[str, ...]:
        """The upstream key, or the credential in the URL."""
        return self._secrets

    async def start(self) -> None:
        """Open the connection pool."""
        if self._session is not None:
            return
        aiohttp = self._aiohttp = import_optional("aiohttp", extra="server", feature=_FEATURE)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers,
            # One session serves every rollout: a cookie one rollout's answer set must not
            # ride along with the others' calls (and matching cookies costs every call).
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=self.max_connections, force_close=False),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout_sec, sock_read=self.timeout_sec
            ),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _body(self, request: ChatRequest) -> dict[str, Any]:
        model = self._model or request.requested_model
        if not model:
            raise ChatRequestError(
                "this gateway forwards to an upstream with no default model; name one in 'model'",
                param="model",
            )
        body = {**request.body, "model": model}
        if self.token_data:
            body["logprobs"] = True
            body["return_token_ids"] = True
        if request.stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return body

    def _post(self, request: ChatRequest) -> Any:
        if self._session is None:
            raise PolicyError("the policy is not started", status_code=503)
        headers = {}
        if self.session_header and request.rollout_id:
            headers[self.session_header] = request.rollout_id
        return self._session.post(
            f"{self.base_url}/chat/completions",
            json=self._body(request),
            headers=headers,
            allow_redirects=False,
        )

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One upstream call."""
        try:
            async with self._post(request) as response:
                content = await response.read()
        except (TimeoutError, self._aiohttp.ClientError) as exc:
            raise _transport_error(exc, self.timeout_sec) from exc
        if response.status != 200:
            raise _status_error(response.status, content)
        try:
            answer = json.loads(content)
        except ValueError as exc:
            raise PolicyError("upstream answered with invalid JSON") from exc
        if not isinstance(answer, dict):
            raise PolicyError("upstream answered with something other than a JSON object")
        scrubbed: dict[str, Any] = scrub_json(answer, self.secrets())  # an upstream may echo it
        return scrubbed

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """Upstream server-sent events, parsed (and scrubbed of the upstream's key)."""
        scrubber = StreamScrubber(self.secrets())
        try:
            async with self._post(request) as response:
                if response.status != 200:
                    raise _status_error(response.status, await response.read())
                async for data in _sse_data(response.content):
                    if data == b"[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise PolicyError("upstream sent an invalid stream chunk") from exc
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise PolicyError(_upstream_message(502, data))
                    yield scrubber.feed(chunk)
        except (TimeoutError, self._aiohttp.ClientError) as exc:
            raise _transport_error(exc, self.timeout_sec) from exc
        if (rest := scrubber.flush()) is not None:
            yield rest


async def _sse_data(content: Any) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent-events body, whatever the line lengths."""
    buffer = b""
    async for piece in content.iter_any():
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if buffer.startswith(b"data:"):
        yield buffer[5:].strip()
