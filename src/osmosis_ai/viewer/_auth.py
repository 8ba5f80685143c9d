"""The viewer's token: asked once in a ``?token=`` link, then kept in a strict cookie.

Off loopback every request (page, API, artifacts, assets) must show the token: as the
``osmosis_viewer_<port>`` cookie the link sets, or as ``Authorization: Bearer <token>``.
The cookie is ``HttpOnly`` and ``SameSite=Strict``, so no script and no other site can use
it; the page's own fetches carry it.
"""

from __future__ import annotations

import hmac
import re

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from osmosis_ai.errors import ConfigError

__all__ = ["TokenGate", "check_token"]

_PARAM = "token"
# Cookie-safe without quoting, and long enough not to be guessed.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,256}")
_HELP = (
    "this viewer needs its token: open the address 'osmosis view' printed (it ends in "
    "?token=...), or send 'Authorization: Bearer <token>'"
)
_PAGE = (
    "<!doctype html><html lang='en'><meta charset='utf-8'><title>osmosis: token needed</title>"
    "<h1>This viewer needs its token</h1><p>Open the address <code>osmosis view</code> "
    "printed when it started: it ends in <code>?token=...</code>. Your browser then keeps "
    "the token for this viewer, so you need the link only once.</p></html>"
)


def check_token(token: str) -> str:
    """``token`` when it can serve as the viewer's token.

    Raises:
        ConfigError: It is shorter than 16 characters, longer than 256, or holds anything
            but letters, digits and ``. _ ~ -``.
    """
    if _TOKEN.fullmatch(token) is None:
        raise ConfigError(
            "the viewer token must be 16 to 256 letters, digits or '._~-' characters; "
            "leave --token out to get a random one"
        )
    return token


def _cookie_name(scope: Scope) -> str:
    # One cookie per port: viewers on the same host must not overwrite each other's token.
    server = scope.get("server")
    return f"osmosis_viewer_{server[1]}" if server else "osmosis_viewer"


def _same_origin_location(request: Request) -> str:
    """The requested path and query without the token, as a path on this viewer."""
    # "//host" or "/\\host" would leave the viewer (a protocol-relative address).
    path = "/" + request.scope.get("raw_path", b"/").decode("latin-1").lstrip("/\\")
    rest = request.url.remove_query_params(_PARAM).query
    return f"{path}?{rest}" if rest else path


class TokenGate:
    """Passes only requests that show ``token``; a valid ``?token=`` link sets the cookie."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = check_token(token).encode()

    def _valid(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.token)

    def _answer(self, request: Request) -> Response | None:
        """The answer for a request the app must not see, or ``None`` to let it through."""
        name = _cookie_name(request.scope)
        if _PARAM in request.query_params:
            if not self._valid(request.query_params[_PARAM]):
                return _refusal(request)
            # Drop the token from the address bar and history; the cookie carries it now.
            response = RedirectResponse(_same_origin_location(request), status_code=303)
            response.set_cookie(
                name, self.token.decode(), httponly=True, samesite="strict", path="/"
            )
            return response
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if (scheme.lower() == "bearer" and self._valid(bearer)) or self._valid(
            request.cookies.get(name)
        ):
            return None
        return _refusal(request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answer = self._answer(Request(scope))
        if answer is None:
            await self.app(scope, receive, send)
        else:
            await answer(scope, receive, send)


def _refusal(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(_PAGE, status_code=401)
    return JSONResponse({"detail": _HELP}, status_code=401)
