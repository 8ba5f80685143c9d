"""Publishing one rollout's live preview while it runs (see ``trajectory.preview``).

One task per previewed rollout. Every ``PREVIEW_INTERVAL_SEC`` (first after one interval, so
that ``run()`` can opt out before it is ever looked at) it asks the rollout's sample source
for a snapshot, unless the source says nothing changed. Conversion, clipping and redaction
run on a worker thread. Each new snapshot or status change is stamped, kept for
``GET /rollout/{id}/preview`` and, with a preview root, written to
``<root>/<rollout_id>/preview.json``. When the rollout ends the source is looked at once
more (unless the rollout opted out), so the last preview, stamped with the terminal status,
shows the finished conversation; then the task ends.
Nothing here can fail or delay the rollout: every error is logged at debug level and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Hashable
from datetime import UTC, datetime
from pathlib import Path

from osmosis_ai.rollout._storage import atomic_write_bytes
from osmosis_ai.rollout.context import RolloutContext, RolloutProgress
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import TERMINAL_STATUSES
from osmosis_ai.rollout.trajectory.preview import (
    MAX_PREVIEW_MESSAGES,
    PREVIEW_FILENAME,
    PREVIEW_INTERVAL_SEC,
    Snapshot,
    encode_preview,
    snapshot_of,
)

__all__ = ["PreviewPublisher"]

logger = logging.getLogger(__name__)

_SOURCE_TIMEOUT_SEC = 1.0
_UNSEEN = object()


class PreviewPublisher:
    """Publishes the previews of one rollout; ``latest`` holds the newest document's bytes."""

    def __init__(
        self,
        rollout_id: str,
        context: RolloutContext,
        progress: RolloutProgress,
        *,
        directory: Path | None,
        secrets: tuple[str, ...],
        interval_sec: float = PREVIEW_INTERVAL_SEC,
    ) -> None:
        self.rollout_id = rollout_id
        self.latest: bytes | None = None
        self._context = context
        self._progress = progress
        self._directory = None if directory is None else directory / rollout_id
        self._secrets = secrets
        self._interval = interval_sec
        self._revision: Hashable | object = _UNSEEN
        self._snapshot: Snapshot | None = None
        self._stamped: str | None = None
        self._version = 0

    async def run(self) -> None:
        """Collect and publish until the rollout's terminal status is published."""
        # The first look waits about one interval, spread so rollouts admitted together
        # are not all looked at in the same instant.
        delay = self._interval * (0.5 + random.random())
        status = await self._progress.wait_for_change(delay)
        while True:
            terminal = status in TERMINAL_STATUSES
            # A last look at the end, so the final preview shows the finished conversation.
            sample = await self._collect()
            if sample is not None or (self._snapshot is not None and status != self._stamped):
                try:
                    data = await asyncio.to_thread(self._publish, sample, status.value)
                except Exception as exc:  # a preview must never hurt the rollout
                    logger.debug("rollout %s: no preview (%s)", self.rollout_id, exc)
                else:
                    self.latest = data or self.latest
            if terminal:
                return
            status = await self._progress.wait_for_change(self._interval)

    async def _collect(self) -> RolloutSample | None:
        """The source's preview sample, or ``None`` when there is none or nothing changed."""
        source = self._context.sample_source
        if source is None or not self._context.preview_enabled:
            return None
        try:
            revision = source.preview_revision()
            if revision is not None and revision == self._revision:
                return None
            async with asyncio.timeout(_SOURCE_TIMEOUT_SEC):
                sample = await source.get_preview(MAX_PREVIEW_MESSAGES)
        except Exception as exc:
            logger.debug("rollout %s: preview skipped (%s)", self.rollout_id, type(exc).__name__)
            return None
        self._revision = revision
        # The flag may have been cleared while the source was being asked.
        return sample if self._context.preview_enabled else None

    def _publish(self, sample: RolloutSample | None, status: str) -> bytes | None:
        """On a worker thread: snapshot ``sample``, stamp, encode and write; the bytes or
        ``None`` when there was nothing new to publish."""
        if sample is not None:
            previous = self._snapshot.fingerprint if self._snapshot else None
            snapshot = snapshot_of(sample, secrets=self._secrets, previous=previous)
            if snapshot is not None:
                self._snapshot = snapshot
            elif status == self._stamped:
                return None
        if self._snapshot is None:
            return None
        self._version += 1
        self._stamped = status
        data = encode_preview(
            self.rollout_id,
            self._snapshot,
            status=status,
            version=self._version,
            updated_at=datetime.now(UTC).isoformat(),
        )
        if self._directory is not None:
            self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Rewritten every few seconds and worthless after a crash: no fsync.
            atomic_write_bytes(self._directory / PREVIEW_FILENAME, data, durable=False)
        return data
