"""``create_rollout_server``: the HTTP face of an execution backend (polling-lease protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import math
import os
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from osmosis_ai._log_redaction import registered_secrets
from osmosis_ai._serving import bound_header_time_in_lifespan
from osmosis_ai.errors import ConfigError
from osmosis_ai.redact import Redactor, normalize_secrets
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.request_logs import quiet_request_logs, request_logs_wanted
from osmosis_ai.rollout.server._drain import Drainer
from osmosis_ai.rollout.server._http import (
    Answer,
    BodyError,
    HttpRequest,
    Receive,
    Scope,
    Send,
    encode_json,
    json_answer,
)
from osmosis_ai.rollout.server._previews import PreviewHub
from osmosis_ai.rollout.server._registry import Entry, Registry
from osmosis_ai.rollout.server._routes import Router
from osmosis_ai.rollout.server._state import ReportProvider, ServerState
from osmosis_ai.rollout.server._watch import LoopMonitor, tracked
from osmosis_ai.rollout.server.execution import (
    cancelled_result,
    lease_expired_result,
    run_rollout,
)
from osmosis_ai.rollout.server.results import encode_status, failure
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.storage import durable_files_from_env
from osmosis_ai.rollout.trajectory.preview import PREVIEW_INTERVAL_SEC, preview_root_from_env
from osmosis_ai.rollout.types import (
    POLLING_LEASE_HEADER,
    CancelRolloutsRequest,
    RolloutInitRequest,
)

__all__ = [
    "DEFAULT_DELIVERED_RESULT_GRACE_SEC",
    "DEFAULT_MAX_RETAINED_RESULTS",
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "Previews",
    "RolloutServerApp",
    "backend_from_spec",
    "create_rollout_server",
]

logger = logging.getLogger(__name__)

DEFAULT_RESULT_WAIT_TIMEOUT_SEC = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC = 120.0
DEFAULT_RESULT_RETENTION_SEC = 900.0
DEFAULT_DRAIN_TIMEOUT_SEC = 10.0
#: Restarted by every delivery, so it only needs to outlast the client's longest wait
#: between two retries of a lost answer (8 s), with room for a slow, loaded host.
DEFAULT_DELIVERED_RESULT_GRACE_SEC = 15.0
#: Results and tombstones remembered at most: over a minute of ids at 650 rollouts/s, and
#: 10-20 MB of RSS (a tombstone cost 180-390 bytes of RSS in benchmarks/soak.py).
DEFAULT_MAX_RETAINED_RESULTS = 50_000
#: Longest a poll holds back news of a non-terminal status (``running``, ``grading``) in case
#: the rollout ends meanwhile: a fast rollout then costs one poll instead of two.
STATUS_COALESCE_SEC = 0.05
INSTANCE_ID_ENV = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
#: ``local`` (default), ``ray``, ``ray:ADDRESS``, ``process`` or ``process:sandbox``: run a
#: `LocalBackend`'s rollouts on Ray or in child processes instead (``osmosis eval run
#: --backend`` sets it for the rollout server it starts).
BACKEND_ENV = "OSMOSIS_ROLLOUT_BACKEND"
#: Comma-separated names of environment variables holding secrets (``osmosis eval run`` sets
#: it from the config's ``[secrets]``): their values are scrubbed like rollout keys.
SECRET_ENV_NAMES_ENV = "OSMOSIS_ROLLOUT_SECRET_ENV_NAMES"
_RETRY_AFTER_SEC = "1"
_PROCESS_ID = uuid.uuid4().hex
_LEASE_HEADER = POLLING_LEASE_HEADER.lower().encode()

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]
#: Live previews: ``"auto"`` follows ``$_OSMOSIS_ROLLOUT_PREVIEW_ROOT`` (on, as files and over
#: HTTP, exactly when it names a valid directory); ``"on"`` serves them over HTTP in any case
#: (and writes the files too when the root is set); ``"off"`` turns them off.
Previews = Literal["auto", "on", "off"]
_PREVIEW_CHOICES: tuple[Previews, ...] = ("auto", "on", "off")
M = TypeVar("M", bound=BaseModel)


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    # Never echo the input: it may hold the rollout's key.
    return [
        {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


async def _body(request: HttpRequest, model: type[M]) -> M | Answer:
    """The body validated as ``model``, or the 4xx answer explaining why it is not one."""
    try:
        return model.model_validate(await request.json())
    except BodyError as exc:
        return json_answer({"detail": exc.detail}, exc.status)
    except ValidationError as exc:
        return json_answer({"detail": _validation_detail(exc)}, 422)


async def admit_rollout(state: ServerState, request: HttpRequest) -> Answer:
    """``POST /rollout``: validate, admit, start executing, answer 202 with a lease."""
    init = await _body(request, RolloutInitRequest)
    if isinstance(init, Answer):
        return init
    # No await from here to the task's creation: admission is atomic on the event loop.
    if not state.accepting:
        return json_answer({"detail": "rollout server is shutting down"}, 503)
    if not state.backend.has_capacity():
        return json_answer(
            {"detail": "rollout queue is full; retry later"},
            429,
            {"Retry-After": _RETRY_AFTER_SEC},
        )
    if init.rollout_id in state.registry:
        return json_answer({"detail": "rollout_id is already registered"}, 409)
    entry, token = state.registry.admit(init, state.redactor)
    task = asyncio.get_running_loop().create_task(
        tracked(run_rollout(state, entry, init), state.monitor, entry.rollout_id)
    )
    entry.task = task
    state.tasks.add(task)
    task.add_done_callback(partial(_task_ended, state, entry))
    return Answer(
        _lease_body(
            entry.rollout_id,
            token,
            state.result_wait_timeout_sec,
            state.registry.lease_timeout_sec,
        ),
        202,
    )


def _lease_body(rollout_id: str, token: str, wait_sec: float, lease_sec: float) -> bytes:
    """The 202 body of an admission, filled into a template: every admission sends one,
    and a general encoder costs several times more. The token is URL-safe base64 and the
    timeouts finite numbers (validated at creation), written as JSON writes a float."""
    return (
        b'{"rollout_id":%b,"status":"queued","polling_lease_token":"%b",'
        b'"result_wait_timeout_sec":%b,"polling_lease_timeout_sec":%b}'
        % (
            encode_json(rollout_id),
            token.encode(),
            repr(float(wait_sec)).encode(),
            repr(float(lease_sec)).encode(),
        )
    )


def _task_ended(state: ServerState, entry: Entry, task: asyncio.Task[None]) -> None:
    state.tasks.discard(task)
    # A done task still holds its coroutine and the tracking wrapper (~0.6 KB): a retained
    # result needs none of it.
    entry.task = None
    if not entry.finished:
        # The task ended without publishing: cancelled before it started, or crashed.
        if task.cancelled():
            result = cancelled_result(state)
        else:
            # Outside the rollout's context: its key is redacted by the entry's redactor.
            crash = entry.redactor.text(repr(task.exception()))
            logger.error("rollout %s: task crashed: %s", entry.rollout_id, crash)
            result = failure("rollout task crashed", RolloutErrorCategory.INTERNAL_ERROR)
        state.registry.finish(entry, result)
    # Published, and nothing runs for the rollout any more: nothing is left to redact with
    # its key, so a retained result lets it go (a fifth of a held result's memory).
    entry.redactor = state.redactor


def _expire(state: ServerState, entry: Entry) -> None:
    """Finish an unfinished rollout as ``lease_expired`` and stop its execution."""
    if not state.registry.finish(entry, lease_expired_result(state)):
        return
    logger.warning("rollout %s: polling lease expired; cancelling it", entry.rollout_id)
    _cancel_execution(state, entry)


def _cancel_execution(state: ServerState, entry: Entry) -> str:
    """Ask the backend, else cancel the server's own task; returns the backend's word."""
    try:
        answer = state.backend.cancel_rollouts(ids=[entry.rollout_id]).get(entry.rollout_id)
    except Exception as exc:
        # Outside the rollout's context: its key is redacted by the entry's redactor.
        trace = entry.redactor.text("".join(traceback.format_exception(exc)))
        logger.error("rollout %s: backend.cancel_rollouts failed: %s", entry.rollout_id, trace)
        answer = None
    if answer in (None, "not_found") and entry.task is not None:
        entry.task.cancel()
    return answer or "not_found"


def _leased_entry(state: ServerState, request: HttpRequest, rollout_id: str) -> Entry | Answer:
    """The entry of ``rollout_id`` when the request presents its polling lease."""
    token = request.header(_LEASE_HEADER)
    if not token:
        return json_answer(
            {"detail": f"missing {POLLING_LEASE_HEADER} header; send the polling_lease_token"},
            422,
        )
    entry = state.registry.get(rollout_id)
    if entry is None:
        return _forgotten(state, rollout_id)
    if not entry.holds_lease(token):
        return json_answer({"detail": "invalid polling lease"}, 403)
    return entry


def _forgotten(state: ServerState, rollout_id: str) -> Answer:
    """404 for an id the server does not know; 410 with the status for a freed result."""
    status = state.registry.tombstone(rollout_id)
    if status is None:
        return json_answer({"detail": "unknown rollout_id"}, 404)
    grace = state.registry.grace_sec
    return json_answer(
        {
            "detail": f"rollout finished ({status.value}) and its result was freed "
            f"{grace:g}s after it was last sent to the lease holder; a lost answer must be "
            "polled again within delivered_result_grace_sec",
            "status": status.value,
        },
        410,
    )


async def poll_result(state: ServerState, request: HttpRequest, rollout_id: str) -> Answer:
    """``GET /rollout/{rollout_id}/result``: long poll under the polling lease."""
    entry = _leased_entry(state, request, rollout_id)
    if isinstance(entry, Answer):
        return entry
    if not entry.finished:
        if entry.lease_deadline <= time.monotonic():
            _expire(state, entry)
        else:
            state.registry.renew(entry)
            progress = entry.progress
            if progress.status == entry.reported:
                await progress.wait_for_change(state.result_wait_timeout_sec)
            if progress.status != entry.reported and not progress.terminal:
                await progress.wait_for_change(STATUS_COALESCE_SEC)
    if entry.result_body is not None:
        return Answer(entry.deliver())
    entry.reported = entry.progress.status
    return Answer(encode_status(entry.rollout_id, entry.reported))


async def get_preview(state: ServerState, request: HttpRequest, rollout_id: str) -> Answer:
    """``GET /rollout/{rollout_id}/preview``: the latest live preview, for the lease holder.

    An extension of the reference protocol, so that a controller needs no shared
    filesystem to show previews. 404 while there is none (previews off, the source has
    none, or the rollout opted out).
    """
    entry = _leased_entry(state, request, rollout_id)
    if isinstance(entry, Answer):
        return entry
    if entry.preview is None or entry.preview.latest is None:
        return json_answer({"detail": "no preview for this rollout (yet)"}, 404)
    return Answer(entry.preview.latest)


async def cancel_rollouts(state: ServerState, request: HttpRequest) -> Answer:
    """``POST /rollout/cancel``: cancel by ids, prefix or all; answer a disposition per id."""
    selector = await _body(request, CancelRolloutsRequest)
    if isinstance(selector, Answer):
        return selector
    dispositions: dict[str, str] = {}
    for rollout_id in state.registry.select(selector.ids, selector.prefix, selector.all):
        entry = state.registry.get(rollout_id)
        if entry is None:
            dispositions[rollout_id] = "not_found"
            continue
        if entry.disposition is None and not entry.finished:
            queued = entry.progress.status == RolloutStatus.QUEUED
            answer = _cancel_execution(state, entry)
            if answer not in ("cancelled_queued", "cancelled_running"):
                answer = "cancelled_queued" if queued else "cancelled_running"
            entry.disposition = answer  # type: ignore[assignment]
        dispositions[rollout_id] = entry.disposition or "not_found"
    return json_answer({"dispositions": dispositions})


async def health(state: ServerState, request: HttpRequest) -> Answer:
    """``GET /health``: backend capacity, identity, lifecycle and event-loop lag."""
    return json_answer(state.health())


async def _sweep(state: ServerState, interval_sec: float) -> None:
    """Expire leases, free results past their grace or retention, forever."""
    while True:
        await asyncio.sleep(interval_sec)
        try:
            now = time.monotonic()
            for entry in state.registry.expired_leases(now):
                _expire(state, entry)
            state.registry.drop_retained(now)
        except Exception:  # one bad sweep must not end lease expiry for good
            logger.exception("rollout server sweep failed")


def _freeze_startup_objects() -> None:
    """Keep what exists at startup out of every later garbage collection.

    Modules, classes and the user's resources are a hundred thousand objects or more that
    live as long as the server; without this every full collection walks them all again
    (full collections took 8 % of the server's CPU in a soak before retention was bounded;
    see benchmarks/README.md).
    """
    gc.collect()  # garbage frozen now would never be freed
    gc.freeze()


@asynccontextmanager
async def _running(app: RolloutServerApp) -> AsyncIterator[None]:
    """The server's lifetime, inside the user's lifespan so their resources outlive draining."""
    state = app.state.rollout
    user = state.user_lifespan(app) if state.user_lifespan else contextlib.nullcontext()
    async with user:
        # After the server (uvicorn.run) configured its loggers, so that the level holds.
        if not request_logs_wanted():
            quiet_request_logs()
        await state.backend.start()
        _freeze_startup_objects()
        drainer = Drainer(state)
        drainer.install()
        state.monitor.start()
        interval = min(1.0, state.registry.lease_timeout_sec / 4)
        sweeper = asyncio.get_running_loop().create_task(_sweep(state, interval))
        try:
            yield
        finally:
            await drainer.drain(deliver=False)
            try:
                await state.backend.shutdown()
            finally:
                sweeper.cancel()
                await asyncio.gather(sweeper, return_exceptions=True)
                await state.monitor.stop()
                drainer.uninstall()
                gc.unfreeze()
                await state.model_pool.aclose()
                if state.http_session is not None:
                    await state.http_session.close()


_ROUTER = Router(
    fixed={
        ("POST", "/rollout"): admit_rollout,
        ("POST", "/rollout/cancel"): cancel_rollouts,
        ("GET", "/health"): health,
    },
    per_rollout={
        ("GET", "/rollout/{rollout_id}/result"): poll_result,
        ("GET", "/rollout/{rollout_id}/preview"): get_preview,
    },
)


class _AppState:
    """``app.state``: where the server keeps its `ServerState` (``app.state.rollout``)."""

    def __init__(self, rollout: ServerState) -> None:
        self.rollout = rollout


class RolloutServerApp:
    """The rollout server's ASGI application (returned by `create_rollout_server`)."""

    def __init__(self, state: ServerState) -> None:
        self.state = _AppState(state)
        self._auth = f"Bearer {state.api_key}".encode() if state.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            answer = await self._dispatch(HttpRequest(scope, receive))
            await answer.send(send)

    async def _dispatch(self, request: HttpRequest) -> Answer:
        if self._auth is not None:
            presented = request.header(b"authorization") or ""
            if not hmac.compare_digest(presented.encode("latin-1"), self._auth):
                return json_answer({"detail": "unauthorized"}, 401)
        return await _ROUTER.dispatch(self.state.rollout, request)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # The configured secrets are scrubbed from every log record of the package meanwhile.
        with registered_secrets(self.state.rollout.redactor.secrets):
            await self._lifespan_events(receive, send)

    async def _lifespan_events(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        # Users serve the app with plain uvicorn.run(app), which never bounds header time.
        bound_header_time_in_lifespan(receive)
        started = False
        try:
            async with _running(self):
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()  # lifespan.shutdown
        except Exception as exc:
            phase = "shutdown" if started else "startup"
            logger.exception("rollout server %s failed", phase)
            # The type only: the message may hold a secret.
            await send({"type": f"lifespan.{phase}.failed", "message": type(exc).__name__})
            return
        await send({"type": "lifespan.shutdown.complete"})


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds above 0, got {value!r}")
    return value


def _preview_choice(previews: Previews | bool | None) -> Previews:
    """``previews`` as a choice; ``None``/``True``/``False`` are older spellings."""
    if previews is None:
        return "auto"
    if isinstance(previews, bool):
        return "on" if previews else "off"
    if previews not in _PREVIEW_CHOICES:
        raise ValueError(f"previews must be 'auto', 'on' or 'off', got {previews!r}")
    return previews


def _preview_hub(previews: Previews, interval_sec: float) -> PreviewHub | None:
    if previews == "off":
        return None  # the preview root is not even read (no warning about it)
    root = preview_root_from_env()
    if previews == "auto" and root is None:
        return None
    return PreviewHub(directory=root, interval_sec=interval_sec)


def _configured_redactor(secrets: Iterable[str]) -> Redactor:
    names = [n.strip() for n in os.environ.get(SECRET_ENV_NAMES_ENV, "").split(",") if n.strip()]
    return Redactor((*normalize_secrets(secrets), *(os.environ.get(name, "") for name in names)))


def parse_backend_spec(spec: str, *, label: str = BACKEND_ENV) -> tuple[str, str]:
    """``(kind, option)`` of a backend choice such as ``ray:ADDRESS`` or ``process:sandbox``.

    Raises:
        ConfigError: Not one of local, ray, ray:ADDRESS, process, process:sandbox.
    """
    kind, _, option = spec.strip().partition(":")
    kind = kind or "local"
    valid = (kind == "local" and not option) or kind == "ray"
    valid = valid or (kind == "process" and option in ("", "sandbox"))
    if not valid:
        raise ConfigError(
            f"{label} {spec!r}: expected local, ray, ray:ADDRESS, process or process:sandbox"
        )
    return kind, option


def _backend_from_env(backend: ExecutionBackend) -> ExecutionBackend:
    spec = os.environ.get(BACKEND_ENV, "")
    if not isinstance(backend, LocalBackend):
        if parse_backend_spec(spec)[0] != "local":
            logger.warning(
                "%s=%s ignored: the server's backend is not a LocalBackend", BACKEND_ENV, spec
            )
        return backend
    return backend_from_spec(spec, backend)


def backend_from_spec(
    spec: str, backend: LocalBackend, *, label: str = BACKEND_ENV
) -> ExecutionBackend:
    """The backend ``spec`` names (local, process[:sandbox], ray[:ADDRESS]), running the
    workflow, grader, configs and artifact root of ``backend``.

    Raises:
        ConfigError: ``spec`` names no known backend.
    """
    kind, option = parse_backend_spec(spec, label=label)
    if kind == "local":
        return backend
    if kind == "process":
        from osmosis_ai.rollout.backend.process import ProcessBackend

        where = "child processes inside bubblewrap" if option else "child processes"
        logger.info("%s=%s: rollouts run in %s", label, spec, where)
        return ProcessBackend(
            backend.spec, artifact_root=backend.artifact_root, sandbox=option == "sandbox"
        )
    from osmosis_ai.rollout.backend.ray import RayBackend

    logger.info("%s=%s: rollouts run on Ray executor actors", label, spec)
    return RayBackend(backend.spec, artifact_root=backend.artifact_root, address=option or None)


def create_rollout_server(
    *,
    backend: ExecutionBackend,
    lifespan: Lifespan | None = None,
    configure_logging: bool = True,
    result_wait_timeout_sec: float = DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    polling_lease_timeout_sec: float = DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    result_retention_sec: float = DEFAULT_RESULT_RETENTION_SEC,
    delivered_result_grace_sec: float = DEFAULT_DELIVERED_RESULT_GRACE_SEC,
    max_retained_results: int = DEFAULT_MAX_RETAINED_RESULTS,
    api_key: str | None = None,
    drain_timeout_sec: float = DEFAULT_DRAIN_TIMEOUT_SEC,
    artifact_root: Path | str | None = None,
    durable_files: bool | None = None,
    report_provider: ReportProvider | None = None,
    block_threshold_sec: float = 0.5,
    previews: Previews | bool | None = "auto",
    preview_interval_sec: float = PREVIEW_INTERVAL_SEC,
    secrets: Iterable[str] = (),
) -> RolloutServerApp:
    """An ASGI app serving ``backend`` over the polling-lease rollout protocol.

    Endpoints: ``POST /rollout`` (202 with a lease; 409 for a retained id; 429 with
    ``Retry-After`` when the backend has no capacity; 503 while shutting down; 422 for an
    invalid body), ``GET /rollout/{id}/result`` (long poll with the
    ``X-Osmosis-Rollout-Lease`` header), ``GET /rollout/{id}/preview`` (the latest live
    preview, same lease header), ``POST /rollout/cancel`` and ``GET /health``.

    Every admitted rollout ends with exactly one published result, retained for
    ``result_retention_sec``: its execution task is created before the 202 is sent, the
    result is published after ``trajectory.json``/``diagnostics.json`` were saved, a lease
    not renewed for ``polling_lease_timeout_sec`` cancels it as ``lease_expired``, and a
    crash outside the handler becomes ``internal_error``. On SIGTERM the server stops
    admitting, gives in-flight rollouts ``drain_timeout_sec``, cancels the rest (they
    report ``cancelled``), lets pollers collect results, then exits; then
    ``backend.shutdown()`` runs, then the user's ``lifespan`` exits. ``backend.start()`` runs
    at startup, inside the user's lifespan, before any rollout is admitted.

    Args:
        backend: What runs the rollouts (e.g. ``LocalBackend``). With
            ``$OSMOSIS_ROLLOUT_BACKEND`` set to ``ray`` or ``ray:ADDRESS`` a ``LocalBackend``
            is replaced by a `RayBackend` running the same workflow, grader and configs.
        lifespan: The user's lifespan (an async context manager factory taking the app);
            draining happens inside it.
        configure_logging: Set up INFO logging when the root logger has no handler.
        result_wait_timeout_sec: Longest a result poll waits.
        polling_lease_timeout_sec: Lease duration; must exceed the wait timeout.
        result_retention_sec: How long a final result nobody collected stays available,
            and how long a collected one's id stays reserved (409 on reuse).
        delivered_result_grace_sec: How long a final result stays whole after it was last
            sent to its lease holder, for a retried poll (each delivery restarts it); then
            it is freed and a late poll gets 410 with the terminal status.
        max_retained_results: The most finished rollouts remembered (results held and
            tombstones of freed ones); past it the oldest tombstones go first.
        api_key: When set, every route requires ``Authorization: Bearer <api_key>``.
        drain_timeout_sec: Grace given to in-flight rollouts at shutdown.
        artifact_root: Root of per-rollout files; defaults to
            ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` or ``~/.osmosis``.
        durable_files: fsync ``trajectory.json`` and ``diagnostics.json`` (and their
            directory) before publishing the result, so they survive a machine crash, at
            about 0.2-0.4 ms of CPU per rollout. Either way they are replaced atomically
            and a process crash loses nothing. ``None`` (default): what
            ``$_OSMOSIS_ROLLOUT_DURABLE_FILES`` says (``1``: on; ``osmosis eval run`` sets
            it, its records promise stored files), else off.
        report_provider: Async callable giving per-call metrics for a finished rollout's
            trajectory; by default the URL in ``extra_fields["trajectory_report_url"]``.
        block_threshold_sec: A rollout step holding the event loop longer is logged.
        previews: Live previews of rollouts whose sample source supports them (see
            `Previews`). ``"auto"`` (default): on exactly when
            ``$_OSMOSIS_ROLLOUT_PREVIEW_ROOT`` names a valid directory, where
            ``<rollout_id>/preview.json`` files are written; ``"on"``: also without one
            (served over HTTP only); ``"off"``. ``None``, ``True`` and ``False`` still mean
            ``"auto"``, ``"on"`` and ``"off"``.
        preview_interval_sec: Seconds between two looks at a rollout's sample source.
        secrets: Values scrubbed (``[REDACTED]``) from results, trajectories, diagnostics,
            previews and messages, like each rollout's key; the values of the environment
            variables named in ``$OSMOSIS_ROLLOUT_SECRET_ENV_NAMES`` are added. While the
            server runs they are also scrubbed from every log record of the package
            (loggers ``osmosis_ai.*``), as is the key of the rollout logging.

    Raises:
        ValueError: A timeout is not a positive finite number, the lease does not outlive
            the wait, ``api_key`` is blank, ``max_retained_results`` is below 1, or
            ``previews`` is not a choice.
        TypeError: ``secrets`` is a single ``str`` or holds a non-string, or
            ``max_retained_results`` is not an int.
        ConfigError: ``$OSMOSIS_ROLLOUT_BACKEND`` names no known backend, or
            ``$_OSMOSIS_ROLLOUT_DURABLE_FILES`` is neither ``0`` nor ``1``.
    """
    preview_choice = _preview_choice(previews)
    _positive("result_wait_timeout_sec", result_wait_timeout_sec)
    _positive("preview_interval_sec", preview_interval_sec)
    _positive("polling_lease_timeout_sec", polling_lease_timeout_sec)
    if polling_lease_timeout_sec <= result_wait_timeout_sec:
        raise ValueError("polling_lease_timeout_sec must exceed result_wait_timeout_sec")
    if not math.isfinite(result_retention_sec) or result_retention_sec < 0:
        raise ValueError("result_retention_sec must be a finite number of seconds >= 0")
    if not math.isfinite(delivered_result_grace_sec) or delivered_result_grace_sec < 0:
        raise ValueError("delivered_result_grace_sec must be a finite number of seconds >= 0")
    if isinstance(max_retained_results, bool) or not isinstance(max_retained_results, int):
        raise TypeError(f"max_retained_results must be an int, got {max_retained_results!r}")
    if max_retained_results < 1:
        raise ValueError(f"max_retained_results must be at least 1, got {max_retained_results}")
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key must be a non-empty string, or None for no authentication")
    if configure_logging and not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    backend = _backend_from_env(backend)
    state = ServerState(
        backend=backend,
        registry=Registry(
            lease_timeout_sec=polling_lease_timeout_sec,
            retention_sec=result_retention_sec,
            max_retained=max_retained_results,
            grace_sec=delivered_result_grace_sec,
        ),
        monitor=LoopMonitor(block_threshold_sec=block_threshold_sec),
        result_wait_timeout_sec=result_wait_timeout_sec,
        api_key=api_key,
        instance_id=os.environ.get(INSTANCE_ID_ENV) or str(os.getpid()),
        process_id=_PROCESS_ID,
        artifact_root=Path(artifact_root).expanduser() if artifact_root else None,
        durable_files=durable_files_from_env() if durable_files is None else durable_files,
        report_provider=report_provider,
        drain_timeout_sec=drain_timeout_sec,
        user_lifespan=lifespan,
        redactor=_configured_redactor(secrets),
        preview_hub=_preview_hub(preview_choice, preview_interval_sec),
    )
    return RolloutServerApp(state)
