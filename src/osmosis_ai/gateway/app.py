"""The gateway's ASGI application: rollout-scoped model calls (chat completions, OpenAI's
Responses, Anthropic's Messages), every one recorded; and each rollout's route to the run's
judge, never recorded."""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from osmosis_ai._log_redaction import registered_secrets
from osmosis_ai.errors import ChatRequestError, GatewayError, JudgeError, PolicyError
from osmosis_ai.gateway.apis import Api, ApiCall, ChatCompletionsApi, MessagesApi, ResponsesApi
from osmosis_ai.gateway.apis.base import openai_error_body
from osmosis_ai.gateway.calls import StreamAccumulator, call_data_from_response, strip_for_caller
from osmosis_ai.gateway.judge import Judge
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.records import CallRecord, CallRecords
from osmosis_ai.gateway.request import ChatRequest, check_sampling, messages_sha256
from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.ids import is_single_path_segment
from osmosis_ai.rollout.json_body import BodyError, asgi_body_chunks, read_json_body
from osmosis_ai.rollout.judge import JUDGE_ROUTE

__all__ = ["GatewayState", "create_gateway_app"]

logger = logging.getLogger(__name__)

_MAX_ERROR_MESSAGE = 1000
_MAX_ID_LENGTH = 256
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: The APIs a rollout's endpoint speaks, by the route after ``/v1/rollouts/{rollout_id}/``;
#: the ``anthropic`` client posts to ``<base_url>/v1/messages``.
_APIS: dict[str, Api] = {
    "chat/completions": ChatCompletionsApi(),
    "responses": ResponsesApi(),
    "messages": MessagesApi(),
}
_API_PATHS = {**{path: path for path in _APIS}, "v1/messages": "messages"}
#: A rollout's judge (``rollout/judge.py``), served apart from its policy and not recorded.
_JUDGE_PATH = f"{JUDGE_ROUTE}/chat/completions"
#: The model-call routes as Starlette matches ``{rollout_id}`` (one non-empty segment).
_CALL_PATH = re.compile(
    r"/v1/rollouts/([^/]+)/("
    + "|".join(re.escape(path) for path in (*_API_PATHS, _JUDGE_PATH))
    + ")"
)
#: Errors of the gateway's own routes are in OpenAI's shape.
_OPENAI_SHAPED = _APIS["chat/completions"]
#: Request headers the call handler reads (ASGI servers send names in lower case).
_CALL_HEADERS = frozenset({b"authorization", b"x-api-key", b"content-type", b"content-length"})


@dataclass
class GatewayState:
    """Everything the handlers share, reached through ``app.state.gateway``."""

    policy: Policy
    token: str
    records: CallRecords
    redactor: Redactor
    sampling: dict[str, Any]
    judge: Judge | None = None
    """The run's judge model, served on each rollout's judge route; ``None``: none."""
    rollout_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Sampling fields imposed on one rollout's calls instead of ``sampling`` (until its
    records are released)."""

    def sampling_of(self, rollout_id: str) -> dict[str, Any]:
        """The sampling fields imposed on ``rollout_id``'s calls."""
        return self.rollout_sampling.get(rollout_id, self.sampling)

    def forget_sampling(self, rollout_id: str) -> None:
        """Drop what was imposed on ``rollout_id`` (its records were released)."""
        self.rollout_sampling.pop(rollout_id, None)

    def error_message(self, exc: BaseException) -> str:
        """``exc``'s message, redacted and capped for an answer or a log line."""
        if isinstance(exc, _Unauthorized):
            text = self.redactor.scrub(str(exc))
        else:
            text = self.redactor.text(str(exc))
        return text if len(text) <= _MAX_ERROR_MESSAGE else text[:_MAX_ERROR_MESSAGE] + "…"


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


class _Unauthorized(GatewayError):
    """401, with the gateway's own help: it shows the header to send, which the text rules
    would hide as a credential (``Authorization: [REDACTED] [REDACTED] token>``), so only the
    secrets are scrubbed from it."""

    def __init__(self) -> None:
        super().__init__(
            "missing or invalid bearer token; send 'Authorization: Bearer <gateway token>'",
            status_code=401,
            error_type="authentication_error",
        )


def _authorize(authorization: str, state: GatewayState) -> None:
    expected = f"Bearer {state.token}"
    if not hmac.compare_digest(authorization.encode(), expected.encode()):
        raise _Unauthorized()


def _authorize_request(request: Request) -> GatewayState:
    state = _state(request)
    _authorize(request.headers.get("authorization", ""), state)
    return state


def _checked_rollout_id(rollout_id: str) -> str:
    if (
        not is_single_path_segment(rollout_id)
        or len(rollout_id) > _MAX_ID_LENGTH
        or not rollout_id.isprintable()
    ):
        raise ChatRequestError(
            f"rollout id in the path must be one printable path segment of at most "
            f"{_MAX_ID_LENGTH} characters (no '/', '\\', '.' or '..')",
            status_code=422,
            param="rollout_id",
        )
    return rollout_id


def _rollout_id(request: Request) -> str:
    return _checked_rollout_id(request.path_params["rollout_id"])


def _call_headers(scope: Scope) -> dict[bytes, str]:
    """The first value of each header in ``_CALL_HEADERS`` (as Starlette's ``Headers.get``)."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _CALL_HEADERS and name not in found:
            found[name] = value.decode("latin-1")
    return found


async def _read_json(headers: dict[bytes, str], receive: Receive) -> object:
    media_type = headers.get(b"content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ChatRequestError(
            "Content-Type must be application/json", status_code=415, param="Content-Type"
        )
    try:
        return await read_json_body(
            asgi_body_chunks(receive),
            content_length=headers.get(b"content-length"),
            server="gateway",
        )
    except BodyError as exc:
        # OpenAI's API and vLLM answer a body that is no JSON with 400, and clients written
        # for them retry or report by that status; the rollout server keeps the reference
        # protocol's 422.
        status = 400 if exc.status == 422 else exc.status
        raise ChatRequestError(exc.detail, status_code=status) from exc


def _as_judge_error(exc: Exception) -> GatewayError:
    """A judge's failure (every try failed or timed out) as the gateway answers it."""
    if isinstance(exc, JudgeError):
        return PolicyError(str(exc))
    return _as_gateway_error(exc)


def _as_gateway_error(exc: Exception) -> GatewayError:
    """``exc`` as an answerable error; anything unexpected becomes an opaque 500.

    Re-raising the original would let the server log its unredacted traceback.
    """
    if isinstance(exc, GatewayError):
        return exc
    return GatewayError("internal gateway error", status_code=500, error_type="internal_error")


class _Call:
    """Bookkeeping of one call: its record is written exactly once, when it ends."""

    def __init__(self, state: GatewayState, rollout_id: str, chat: ChatRequest) -> None:
        self.state = state
        self.rollout_id = rollout_id
        self.stream = chat.stream
        self.index = state.records.next_index(rollout_id)
        self.sha256 = messages_sha256(chat.messages)
        self.started_at = time.time()
        self._started = time.perf_counter()

    def finish(self, data: Any = None, error: BaseException | str | None = None) -> None:
        message = None
        if error is not None:
            message = error if isinstance(error, str) else self.state.error_message(error)
            logger.warning("rollout %s call %d failed: %s", self.rollout_id, self.index, message)
        self.state.records.add(
            CallRecord.from_call(
                rollout_id=self.rollout_id,
                index=self.index,
                started_at=self.started_at,
                latency_ms=(time.perf_counter() - self._started) * 1000,
                stream=self.stream,
                messages_sha256=self.sha256,
                data=data,
                error=message,
            )
        )


class _Route(ABC):
    """A plain ASGI handler of one of a rollout's model-call routes (see `_ApiRoute`)."""

    def __init__(self, state: GatewayState, api: Api) -> None:
        self.state = state
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Reached through the router: an app mounted under a root path."""
        await self.serve(scope["path_params"]["rollout_id"], scope, receive, send)

    async def serve(self, rollout_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one call of ``rollout_id`` (the raw path segment)."""
        try:
            response = await self.answer(rollout_id, scope, receive)
        except GatewayError as exc:
            response = _gateway_error_response(self.state, exc, self.api)
        except Exception as exc:
            response = _unexpected_error_response(self.state, exc, self.api)
        await response(scope, receive, send)

    @abstractmethod
    async def answer(self, rollout_id: str, scope: Scope, receive: Receive) -> Response:
        """The answer to one call (errors are answered by `serve`)."""


class _ApiRoute(_Route):
    """``POST /v1/rollouts/{rollout_id}/<api.path>`` as a plain ASGI handler.

    Every model call of every rollout comes here, so the app serves it ahead of Starlette's
    middleware, router and ``Request`` (``_GatewayApp``); its error answers are the ones the
    other routes get from the app's exception handlers, in the API's own shape.
    """

    async def answer(self, rollout_id: str, scope: Scope, receive: Receive) -> Response:
        state, api = self.state, self.api
        headers = _call_headers(scope)
        _authorize(api.credential(headers), state)
        rollout_id = _checked_rollout_id(rollout_id)
        payload = await _read_json(headers, receive)
        translated = api.parse(
            payload, sampling=state.sampling_of(rollout_id), rollout_id=rollout_id
        )
        chat = translated.chat
        call = _Call(state, rollout_id, chat)
        if chat.stream:
            return await _stream(state, translated, call)
        try:
            response = await state.policy.complete(chat)
        except Exception as exc:
            call.finish(error=exc)
            raise _as_gateway_error(exc) from None
        call.finish(data=call_data_from_response(response))
        return JSONResponse(translated.answer(response))


class _JudgeRoute(_Route):
    """``POST /v1/rollouts/{rollout_id}/judge/chat/completions``: the run's judge model, with
    the rollout's key; nothing is recorded for the rollout (the judge's tokens are no
    policy's), the caller's sampling is kept (the trainer's applies to the policy only)."""

    async def answer(self, rollout_id: str, scope: Scope, receive: Receive) -> Response:
        state = self.state
        headers = _call_headers(scope)
        _authorize(headers.get(b"authorization", ""), state)
        _checked_rollout_id(rollout_id)
        if state.judge is None:
            raise GatewayError(
                "this run serves no judge: give its config a [judge] section with the judge's "
                "model (docs/judges.md)",
                status_code=404,
                error_type="not_found_error",
            )
        chat = state.judge.request(await _read_json(headers, receive))
        try:
            response = await state.judge.complete(chat)
        except Exception as exc:
            raise _as_judge_error(exc) from None
        return JSONResponse(strip_for_caller(response, chat))


async def _stream(state: GatewayState, translated: ApiCall, call: _Call) -> Response:
    chunks = aiter(state.policy.stream(translated.chat))
    try:
        # The first chunk is awaited before answering, so an upstream refusal keeps its status.
        first = await anext(chunks, None)
    except Exception as exc:
        call.finish(error=exc)
        raise _as_gateway_error(exc) from None
    accumulator = StreamAccumulator()

    async def body() -> AsyncIterator[bytes]:
        error: BaseException | str | None = "the caller disconnected"
        try:
            chunk = first
            while chunk is not None:
                accumulator.feed(chunk)
                for event in translated.feed(chunk):
                    yield event
                chunk = await anext(chunks, None)
            error = None
        except Exception as exc:
            error = exc
            answer = _as_gateway_error(exc)
            for event in translated.fail(state.error_message(answer), answer.error_type):
                yield event
        finally:
            with anyio.CancelScope(shield=True):  # cleanup must finish even if cancelled
                await chunks.aclose()  # type: ignore[attr-defined]
            call.finish(data=accumulator.data, error=error)
        if error is None:
            for event in translated.end(accumulator.data):
                yield event

    return StreamingResponse(body(), media_type="text/event-stream", headers=_SSE_HEADERS)


async def list_calls(request: Request) -> Response:
    """``GET /v1/rollouts/{rollout_id}/calls``: the rollout's call records."""
    state = _authorize_request(request)
    rollout_id = _rollout_id(request)
    calls = [record.to_json() for record in state.records.calls(rollout_id)]
    return JSONResponse({"rollout_id": rollout_id, "calls": calls})


async def trajectory_report(request: Request) -> Response:
    """``GET /v1/rollouts/{rollout_id}/trajectory-report``: calls as an ATIF trajectory report.

    A rollout server fetches it (with the rollout's key) to put per-call token ids, logprobs
    and usage into ``trajectory.json``. 404 when the rollout made no successful call.
    """
    state = _authorize_request(request)
    rollout_id = _rollout_id(request)
    report = state.records.report(rollout_id)
    if report is None:
        raise GatewayError(
            f"no recorded calls for rollout {rollout_id!r}",
            status_code=404,
            error_type="not_found_error",
        )
    return Response(report.model_dump_json(exclude_none=True), media_type="application/json")


async def release_calls(request: Request) -> Response:
    """``DELETE /v1/rollouts/{rollout_id}/calls``: forget the rollout's call records."""
    state = _authorize_request(request)
    rollout_id = _rollout_id(request)
    return JSONResponse({"rollout_id": rollout_id, "released": state.records.release(rollout_id)})


async def models(request: Request) -> Response:
    """``GET /v1/models``."""
    state = _authorize_request(request)
    model = {"id": state.policy.model, "object": "model", "created": 0, "owned_by": "osmosis"}
    return JSONResponse({"object": "list", "data": [model]})


async def health(request: Request) -> Response:
    """``GET /health`` (no credentials needed)."""
    state = _state(request)
    return JSONResponse(
        {
            "status": "ok",
            "policy": state.policy.kind,
            "model": state.policy.model,
            "rollouts_recorded": len(state.records),
        }
    )


def _gateway_error_response(
    state: GatewayState, exc: GatewayError, api: Api = _OPENAI_SHAPED
) -> Response:
    return JSONResponse(api.error_body(state.error_message(exc), exc), exc.status_code)


def _unexpected_error_response(
    state: GatewayState, exc: Exception, api: Api = _OPENAI_SHAPED
) -> Response:
    logger.error("gateway error %s: %s", type(exc).__name__, state.error_message(exc))
    return _gateway_error_response(state, _as_gateway_error(exc), api)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _gateway_error_response(_state(request), exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse(openai_error_body(exc.detail, "invalid_request_error"), exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    return _unexpected_error_response(_state(request), exc)


class _GatewayApp(Starlette):
    """The gateway's Starlette app, with rollouts' model calls served ahead of it.

    Starlette's middleware, router and ``Request`` cost about 0.07 ms of CPU per request;
    on the call routes that is paid on every model call of every rollout.
    Under a root path (a mounted app) the router serves the same handlers.
    """

    def __init__(self, calls: dict[str, _Route], **options: Any) -> None:
        super().__init__(**options)
        self._calls = calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _CALL_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._calls[match[2]].serve(match[1], scope, receive, send)
                return
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    state: GatewayState = app.state.gateway
    # The token and the policy's keys are scrubbed from every log record of the package.
    with registered_secrets(state.redactor.secrets):
        async with contextlib.AsyncExitStack() as stack:
            for policy in (state.policy, state.judge.policy if state.judge else None):
                if policy is not None:
                    await policy.start()
                    stack.push_async_callback(policy.aclose)
            yield


def create_gateway_app(
    policy: Policy,
    *,
    token: str,
    records: CallRecords | None = None,
    secrets: Iterable[str] = (),
    sampling: Mapping[str, Any] | None = None,
    judge: Judge | None = None,
) -> Starlette:
    """The gateway ASGI app serving ``policy``.

    The policy (and the judge's) is started when the app starts and closed when it stops.

    Args:
        policy: What answers the calls.
        token: The bearer token callers must send (the per-run key given to rollouts).
        records: Where call records go; a fresh bounded store by default.
        secrets: Extra values redacted from every answer and log line, besides the token
            and the policy's own keys.
        sampling: Sampling fields imposed on every call, replacing the caller's (see
            ``check_sampling``).
        judge: The run's judge, served on each rollout's ``judge/chat/completions`` route
            (its policy's keys are redacted too).

    Raises:
        ConfigError: An unknown or invalid sampling field.
    """
    if not token:
        raise ValueError("the gateway token must be a non-empty string")
    state = GatewayState(
        policy=policy,
        token=token,
        records=records if records is not None else CallRecords(),
        redactor=Redactor(
            (token, *policy.secrets(), *(judge.policy.secrets() if judge else ()), *secrets)
        ),
        sampling=check_sampling(sampling or {}),
        judge=judge,
    )
    state.records.on_release.append(policy.forget)
    state.records.on_release.append(state.forget_sampling)

    calls: dict[str, _Route] = {
        path: _ApiRoute(state, _APIS[api]) for path, api in _API_PATHS.items()
    }
    calls[_JUDGE_PATH] = _JudgeRoute(state, _OPENAI_SHAPED)
    app = _GatewayApp(
        calls,
        routes=[
            *(
                Route(f"/v1/rollouts/{{rollout_id}}/{path}", route, methods=["POST"])
                for path, route in calls.items()
            ),
            Route("/v1/rollouts/{rollout_id}/calls", list_calls, methods=["GET"]),
            Route("/v1/rollouts/{rollout_id}/calls", release_calls, methods=["DELETE"]),
            Route(
                "/v1/rollouts/{rollout_id}/trajectory-report", trajectory_report, methods=["GET"]
            ),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
        lifespan=_lifespan,
    )
    app.state.gateway = state
    return app
