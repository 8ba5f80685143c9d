"""The viewer's ASGI app: a JSON API over run directories and the page that shows it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osmosis_ai._extras import import_optional

import_optional("starlette", extra="viewer", feature="The run viewer")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import FileResponse, JSONResponse, Response  # noqa: E402
from starlette.routing import Mount, Route  # noqa: E402
from starlette.staticfiles import StaticFiles  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

from osmosis_ai.viewer._auth import TokenGate  # noqa: E402
from osmosis_ai.viewer.runs import (  # noqa: E402
    EVAL_RUN,
    TRAIN_RUN,
    TRIALS,
    RunKind,
    RunUnreadableError,
    ViewerRoot,
    artifact_file,
    live_previews,
    rollout_detail,
    run_items,
    run_overview,
    run_summaries,
)
from osmosis_ai.viewer.training import (  # noqa: E402
    ROLLOUTS,
    step_rollouts,
    train_overview,
    train_rollout,
    train_summaries,
)

__all__ = ["create_viewer_app"]

STATIC = Path(__file__).resolve().parent / "static"

# Everything the page needs comes from this origin; nothing inline, nothing remote.
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _host_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = str(value.decode("latin-1")).lower()
            if host.startswith("["):  # [::1]:8000
                return host[1 : host.find("]")]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


class _Guard:
    """Security headers on every answer, and only known Host names (no DNS rebinding: a
    web page cannot rename itself to 127.0.0.1 and read the runs through the browser)."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts is not None and _host_of(scope) not in self.allowed_hosts:
            response = JSONResponse({"detail": "unknown Host"}, status_code=421)
            await response(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _not_found(what: str) -> JSONResponse:
    return JSONResponse({"detail": f"no such {what}"}, status_code=404)


def create_viewer_app(
    path: Path | str, *, host: str = "127.0.0.1", token: str | None = None
) -> ASGIApp:
    """The viewer of the run directory (or folder of run directories) at ``path``.

    Requests must name ``host`` or a loopback name in their Host header, unless ``host``
    binds every interface (``0.0.0.0``/``::``), which the user chose to expose. With a
    ``token``, every request must show it (see `TokenGate`).

    Raises:
        ConfigError: ``token`` is not 16 to 256 URL-safe characters.
    """
    root = ViewerRoot(Path(path))

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    def listing(read: Callable[[ViewerRoot], Any]) -> Callable[[Request], Any]:
        async def handler(request: Request) -> Response:
            return JSONResponse(await asyncio.to_thread(read, root))

        return handler

    def of_run(
        answer: Callable[[Request, Path], Any], kind: RunKind = EVAL_RUN
    ) -> Callable[[Request], Any]:
        """A handler for ``/api/runs/{run}/...`` (or ``/api/train/{run}/...``): 404 for an
        unknown run, else ``answer`` run on a worker thread (it reads files) with the run's
        directory."""

        async def handler(request: Request) -> Response:
            directory = await asyncio.to_thread(root.run, request.path_params["run"], kind)
            if directory is None:
                return _not_found("run")
            try:
                result: Response = await asyncio.to_thread(answer, request, directory)
            except RunUnreadableError as exc:
                # The run's files are damaged: say so, as the runs list does.
                return JSONResponse({"detail": str(exc)}, status_code=409)
            return result

        return handler

    def rollout(request: Request, directory: Path) -> Response:
        detail = rollout_detail(directory, request.path_params["rollout_id"])
        return _not_found("rollout") if detail is None else JSONResponse(detail)

    def train_rollout_of(request: Request, directory: Path) -> Response:
        detail = train_rollout(directory, request.path_params["rollout_id"])
        return _not_found("rollout") if detail is None else JSONResponse(detail)

    def artifact_in(trials: str) -> Callable[[Request, Path], Response]:
        return lambda request, directory: artifact(request, directory, trials)

    def artifact(request: Request, directory: Path, trials: str) -> Response:
        params = request.path_params
        found = artifact_file(directory, params["rollout_id"], params["path"], trials=trials)
        if found is None:
            return _not_found("artifact")
        # Always a download, never rendered here: an artifact may be HTML or script.
        return FileResponse(
            found,
            media_type="application/octet-stream",
            filename=found.name,
            content_disposition_type="attachment",
        )

    def json_of(read: Callable[[Path], Any]) -> Callable[[Request, Path], Response]:
        return lambda request, directory: JSONResponse(read(directory))

    def steps_of(request: Request, directory: Path) -> Response:
        return JSONResponse(step_rollouts(directory, request.path_params["step"]))

    api, train = "/api/runs/{run}", "/api/train/{run}"
    artifacts = "rollouts/{rollout_id}/artifacts/{path:path}"
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/runs", listing(run_summaries)),
            Route(api, of_run(json_of(run_overview))),
            Route(f"{api}/items", of_run(json_of(run_items))),
            Route(f"{api}/previews", of_run(json_of(live_previews))),
            Route(f"{api}/rollouts/{{rollout_id}}", of_run(rollout)),
            Route(f"{api}/{artifacts}", of_run(artifact_in(TRIALS))),
            Route("/api/train", listing(train_summaries)),
            Route(train, of_run(json_of(train_overview), TRAIN_RUN)),
            Route(f"{train}/steps/{{step:int}}", of_run(steps_of, TRAIN_RUN)),
            Route(f"{train}/rollouts/{{rollout_id}}", of_run(train_rollout_of, TRAIN_RUN)),
            Route(f"{train}/{artifacts}", of_run(artifact_in(ROLLOUTS), TRAIN_RUN)),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    exposed = host in ("0.0.0.0", "::", "")
    gated = app if token is None else TokenGate(app, token)
    return _Guard(gated, None if exposed else _LOCAL_HOSTS | {host.lower()})
