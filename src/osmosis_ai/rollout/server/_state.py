"""The state every handler of the rollout server reaches through ``app.state.rollout``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.model_pool import ModelConnectionPool
from osmosis_ai.rollout.server._previews import PreviewHub
from osmosis_ai.rollout.server._registry import Registry
from osmosis_ai.rollout.server._watch import LoopMonitor
from osmosis_ai.rollout.trajectory import TrajectoryReport
from osmosis_ai.rollout.types import RolloutInitRequest

__all__ = ["ReportProvider", "ServerState"]

#: Supplies per-call metrics of a finished rollout for its ``trajectory.json``.
ReportProvider = Callable[[RolloutInitRequest], Awaitable[TrajectoryReport | None]]


@dataclass
class ServerState:
    """Shared state of one rollout server app."""

    backend: ExecutionBackend
    registry: Registry
    monitor: LoopMonitor
    result_wait_timeout_sec: float
    api_key: str | None
    instance_id: str
    process_id: str
    artifact_root: Path | None
    durable_files: bool
    """fsync ``trajectory.json``/``diagnostics.json`` before publishing the result."""
    report_provider: ReportProvider | None
    drain_timeout_sec: float
    accepting: bool = True
    draining: bool = False
    user_lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None
    """The user's lifespan; the server's own runs inside it."""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    http_session: Any = None
    """aiohttp session for fetching trajectory reports, opened on first use."""
    model_pool: ModelConnectionPool = field(default_factory=ModelConnectionPool)
    """Connections to the model endpoints that all rollouts' integration clients share;
    closed at shutdown, after the backend."""
    preview_hub: PreviewHub | None = None
    """Publishes live previews; ``None`` when previews are off."""
    redactor: Redactor = Redactor()
    """Holds the configured secrets: they are scrubbed, like each rollout's key (see
    ``Entry.redactor``), from everything the server writes, answers or logs."""

    def health(self) -> dict[str, Any]:
        """The ``/health`` payload: the backend's facts plus identity and lifecycle."""
        payload = dict(self.backend.health())
        payload["instance_id"] = self.instance_id
        payload["process_id"] = self.process_id
        payload["lifecycle"] = {
            "accepting_rollouts": self.accepting,
            # Live executions, including ones still unwinding after their result was published.
            "active_rollouts": len(self.tasks),
        }
        payload["retention"] = self.registry.retention()
        payload["files"] = {"durable": self.durable_files}
        payload["event_loop"] = self.monitor.health()
        if self.preview_hub is not None:
            payload["previews"] = self.preview_hub.health()
        return payload
