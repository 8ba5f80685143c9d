"""The OpenAI-compatible policy: any ``/v1/chat/completions`` server (vLLM, SGLang, OpenAI...)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from osmosis_ai.errors import ChatRequestError, ConfigError, PolicyError
from osmosis_ai.gateway.policies._http1 import Upstream, check_base_url, header_line
from osmosis_ai.gateway.policies._scrub_stream import StreamScrubber
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.rollout.scrub import scrub_json

__all__ = ["OpenAICompatiblePolicy"]

_MAX_ERROR_BODY = 4096
_PATH = "/chat/completions"
# Built once (``json.dumps`` builds an encoder per call); ASCII output, as before.
_JSON = json.JSONEncoder(separators=(",", ":"))


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
    """The one place the upstream client's failures become gateway errors."""
    if isinstance(exc, TimeoutError):
        return PolicyError(f"upstream timed out after {timeout_sec:g}s", status_code=504)
    return PolicyError(f"upstream unreachable ({type(exc).__name__})")


class OpenAICompatiblePolicy(Policy):
    """Forwards requests to an OpenAI-compatible server over pooled HTTP connections.

    Upstream 4xx answers keep their status; 5xx become 502, timeouts 504 and connection
    failures 502, all with OpenAI-style error bodies. With ``token_data=True`` the upstream
    is asked for logprobs and token ids (vLLM's ``return_token_ids``), which the gateway
    records per call.

    The HTTP client is a small keep-alive HTTP/1.1 client (``_http1.Upstream``): it costs a
    fraction of aiohttp's CPU per call, and its pool hands out an idle connection in constant
    time, where httpx's polls every idle socket on every request.

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
        ConfigError: ``base_url`` is not an http(s) URL, or it carries credentials and
            ``api_key`` is given too; ``api_key`` holds a line break, or ``session_header``
            is not a header name.
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
        try:
            check_base_url(base_url)
        except ValueError as exc:
            raise ConfigError(f"policy base URL: {exc} (e.g. http://127.0.0.1:8000/v1)") from None
        try:
            if api_key:
                header_line("Authorization", api_key)
            if session_header:
                header_line(session_header, "")
        except ValueError as exc:
            raise ConfigError(
                f"{exc} (the policy's API key or session_header; a key read from a file may "
                "end in a newline: strip it)"
            ) from None
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
        self._upstream: Upstream | None = None

    @property
    def model(self) -> str:
        """The configured model, or ``openai-compatible`` when callers choose."""
        return self._model or "openai-compatible"

    def secrets(self) -> tuple[str, ...]:
        """The upstream key, or the credential in the URL."""
        return self._secrets

    async def start(self) -> None:
        """Open the connection pool."""
        if self._upstream is not None:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._upstream = Upstream(
            self.base_url,
            max_connections=self.max_connections,
            connect_timeout_sec=self.timeout_sec,
            read_timeout_sec=self.timeout_sec,
            headers=headers,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            await upstream.aclose()

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

    def _request(self, request: ChatRequest) -> tuple[Upstream, bytes]:
        if self._upstream is None:
            raise PolicyError("the policy is not started", status_code=503)
        headers = {}
        if self.session_header and request.rollout_id:
            headers[self.session_header] = request.rollout_id
        body = _JSON.encode(self._body(request)).encode("ascii")
        try:
            return self._upstream, self._upstream.request(_PATH, body, headers)
        except ValueError as exc:
            raise ChatRequestError(
                f"the rollout id cannot be sent in the {self.session_header} header ({exc})",
                param="rollout_id",
            ) from None

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One upstream call."""
        upstream, sent = self._request(request)
        try:
            status, content = await upstream.post(sent)
        except (TimeoutError, OSError) as exc:
            raise _transport_error(exc, self.timeout_sec) from exc
        if status != 200:
            raise _status_error(status, content)
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
        upstream, sent = self._request(request)
        scrubber = StreamScrubber(self.secrets())
        try:
            async with upstream.stream(sent) as response:
                if response.status != 200:
                    raise _status_error(response.status, await response.read())
                async for data in _sse_data(response.chunks()):
                    if data == b"[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise PolicyError("upstream sent an invalid stream chunk") from exc
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise PolicyError(_upstream_message(502, data))
                    yield scrubber.feed(chunk)
        except (TimeoutError, OSError) as exc:
            raise _transport_error(exc, self.timeout_sec) from exc
        if (rest := scrubber.flush()) is not None:
            yield rest


async def _sse_data(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent-events body, whatever the line lengths."""
    buffer = b""
    async for piece in pieces:
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if buffer.startswith(b"data:"):
        yield buffer[5:].strip()
