"""The rollout server's route table: method and path pattern to handler.

Patterns are compiled once into a dict of fixed paths and, for ``{rollout_id}`` paths, a
fixed prefix and suffix: a request costs one dict lookup or a few ``startswith``/``endswith``
checks and one slice, no regex and no split.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from osmosis_ai.rollout.server._http import Answer, HttpRequest, json_answer
from osmosis_ai.rollout.server._state import ServerState

__all__ = ["Handler", "RolloutHandler", "Router"]

#: Handles a route with a fixed path.
Handler = Callable[[ServerState, HttpRequest], Awaitable[Answer]]
#: Handles a ``/…/{rollout_id}/…`` route; the third argument is the rollout id.
RolloutHandler = Callable[[ServerState, HttpRequest, str], Awaitable[Answer]]

_PARAMETER = "{rollout_id}"


@dataclass(frozen=True, slots=True)
class _Pattern:
    """A path with one ``{rollout_id}`` segment, matched by its fixed prefix and suffix."""

    prefix: str
    suffix: str
    methods: dict[str, RolloutHandler]

    def rollout_id(self, path: str) -> str | None:
        """The segment standing for ``{rollout_id}`` in ``path``, or ``None`` if no match."""
        if not (path.startswith(self.prefix) and path.endswith(self.suffix)):
            return None
        value = path[len(self.prefix) : len(path) - len(self.suffix)]
        # The id is one non-empty path segment (the registry answers for unknown ones).
        return value if value and "/" not in value else None


def _compile(pattern: str) -> tuple[str, str]:
    prefix, found, suffix = pattern.partition(_PARAMETER)
    whole_segment = prefix.endswith("/") and (not suffix or suffix.startswith("/"))
    if not found or not whole_segment or _PARAMETER in suffix:
        raise ValueError(f"route {pattern!r} must have exactly one /{_PARAMETER} segment")
    return prefix, suffix


class Router:
    """Dispatches a request to its handler; answers 404 or 405 for the rest.

    Args:
        fixed: ``(method, path) -> handler`` for paths without a parameter.
        per_rollout: ``(method, pattern) -> handler`` for patterns such as
            ``/rollout/{rollout_id}/result``.

    Raises:
        ValueError: A pattern without exactly one whole ``{rollout_id}`` segment.
    """

    def __init__(
        self,
        *,
        fixed: Mapping[tuple[str, str], Handler],
        per_rollout: Mapping[tuple[str, str], RolloutHandler],
    ) -> None:
        self._fixed: dict[str, dict[str, Handler]] = {}
        for (method, path), handler in fixed.items():
            self._fixed.setdefault(path, {})[method] = handler
        patterns: dict[tuple[str, str], dict[str, RolloutHandler]] = {}
        for (method, pattern), rollout_handler in per_rollout.items():
            patterns.setdefault(_compile(pattern), {})[method] = rollout_handler
        self._patterns = tuple(_Pattern(p, s, methods) for (p, s), methods in patterns.items())

    def dispatch(self, state: ServerState, request: HttpRequest) -> Awaitable[Answer]:
        """The answer of the route matching ``request``, to await.

        Not a coroutine itself: the handler's own coroutine is returned, so routing adds no
        coroutine object per request.
        """
        path = request.path
        methods = self._fixed.get(path)
        if methods is not None:
            handler = methods.get(request.method)
            return handler(state, request) if handler else _answer(_METHOD_NOT_ALLOWED, 405)
        for pattern in self._patterns:
            rollout_id = pattern.rollout_id(path)
            if rollout_id is not None:
                rollout_handler = pattern.methods.get(request.method)
                if rollout_handler is None:
                    return _answer(_METHOD_NOT_ALLOWED, 405)
                return rollout_handler(state, request, rollout_id)
        return _answer("Not Found", 404)


_METHOD_NOT_ALLOWED = "Method Not Allowed"


async def _answer(detail: str, status: int) -> Answer:
    return json_answer({"detail": detail}, status)
