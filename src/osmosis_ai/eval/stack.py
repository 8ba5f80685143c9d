"""The controller's side of a rollout: model gateway, rollout-server child, client.

Shared by every driver of rollouts over the real protocol (``osmosis eval run`` today,
``osmosis train`` next): `rollout_stack` starts the three in order, checks the model on
the way, and stops them in reverse, whatever happens in between.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import OsmosisError
from osmosis_ai.eval.server_process import RolloutServerError, RolloutServerProcess
from osmosis_ai.gateway import Gateway, Judge, Policy, preflight
from osmosis_ai.rollout.client import RolloutClient

__all__ = ["RolloutStack", "RolloutStackError", "rollout_stack"]


class RolloutStackError(OsmosisError):
    """The stack could not start: the model failed its preflight or the server did not start.

    Nothing has been dispatched, and everything that started is stopped again.
    """


@dataclass(frozen=True)
class RolloutStack:
    """The running pieces, for as long as the `rollout_stack` block lasts."""

    gateway: Gateway
    """Holds the policy and its credentials; a rollout reaches it with ``gateway.token``."""
    server: RolloutServerProcess
    """The user's rollout server (started and healthy)."""
    client: RolloutClient
    """Drives rollouts on ``server``."""
    capacity: int | None
    """The server's ``max_concurrent``, when its health reports one."""


@contextlib.asynccontextmanager
async def rollout_stack(
    policy: Policy,
    server: RolloutServerProcess,
    *,
    token: str,
    secrets: Iterable[str],
    model_label: str,
    log: logging.Logger,
    say: Callable[[str], None],
    sampling: Mapping[str, Any] | None = None,
    judge: Judge | None = None,
) -> AsyncIterator[RolloutStack]:
    """Start the gateway (with ``token`` and the ``[secrets]`` values to redact), check the
    model, start ``server`` and connect a client to it.

    ``say`` announces each step; ``model_label`` names the model there (no credentials).
    ``sampling`` fields replace the callers' own on every model call (a trainer's sampling).
    ``judge`` is served on every rollout's judge route (checked like the model).

    Raises:
        RolloutStackError: A fatal model preflight, or a server that did not start.
    """
    async with Gateway(
        policy, token=token, secrets=secrets, sampling=sampling, judge=judge
    ) as gateway:
        say(f"checking model {model_label}")
        check = await preflight(policy)  # needs the policy the gateway started
        log.info("model preflight: %s", check.message, extra={"step": "preflight"})
        if check.fatal:
            raise RolloutStackError(f"model preflight failed: {check.message}")
        if judge is not None:
            say(f"checking judge {judge.label}")
            check = await preflight(judge.policy)
            log.info("judge preflight: %s", check.message, extra={"step": "preflight"})
            if check.fatal:
                raise RolloutStackError(f"judge preflight failed: {check.message}")
        say(f"starting rollout server ({server.entrypoint})")
        try:
            try:
                url = await server.start()
            except RolloutServerError as exc:
                raise RolloutStackError(str(exc)) from None
            async with RolloutClient(url=url) as client:
                capacity = (await client.health()).get("concurrency", {}).get("max_concurrent")
                yield RolloutStack(gateway, server, client, capacity)
        finally:
            await server.stop()
