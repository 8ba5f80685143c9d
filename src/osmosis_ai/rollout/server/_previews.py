"""Publishing the live previews of a server's rollouts (see ``trajectory.preview``).

One task serves every previewed rollout of the server, so a thousand rollouts cost a few
wake-ups and one worker-thread hop per tick, not a timer and a hop each. Every
``interval_sec`` per rollout (the first after about one interval, so that ``run()`` can opt
out before it is ever looked at) it asks the rollout's sample source for a snapshot, unless
the source's ``preview_revision()`` says nothing changed. Conversion, clipping, redaction,
encoding and the file write run on a worker thread. Each new snapshot or status change is
stamped, kept for ``GET /rollout/{id}/preview`` and, with a preview root, written to
``<root>/<rollout_id>/preview.json``. When a rollout ends, the server asks for its last
preview before it publishes the result: the source is looked at once more (unless the
rollout opted out) in a tick run at once, so whoever reads the result finds the finished
conversation stamped with the terminal status. Nothing here can fail a rollout, or delay its
result by more than one tick: every error is logged at debug level and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Hashable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.context import RolloutContext, RolloutProgress
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import TERMINAL_STATUSES
from osmosis_ai.rollout.storage import atomic_write_bytes
from osmosis_ai.rollout.trajectory.preview import (
    MAX_PREVIEW_MESSAGES,
    PREVIEW_FILENAME,
    Snapshot,
    StepCache,
    encode_preview,
    snapshot_of,
)

__all__ = ["PreviewHub", "RolloutPreview"]

logger = logging.getLogger(__name__)

_SOURCE_TIMEOUT_SEC = 1.0
_FINISH_TIMEOUT_SEC = 5.0
_UNSEEN = object()
_TERMINAL_VALUES = frozenset(status.value for status in TERMINAL_STATUSES)


class RolloutPreview:
    """The preview state of one rollout; ``latest`` holds its newest document's bytes."""

    def __init__(
        self,
        rollout_id: str,
        context: RolloutContext,
        progress: RolloutProgress,
        *,
        directory: Path | None,
        due: float,
    ) -> None:
        self.rollout_id = rollout_id
        self.latest: bytes | None = None
        self.context: RolloutContext | None = context
        self.progress = progress
        self.due = due
        self.finished = asyncio.Event()
        # Set by `PreviewHub.finish` before the result is published (the rollout's progress
        # turns terminal only with the result, so pollers never see one without the other).
        self.ending_status: str | None = None
        self._directory = None if directory is None else directory / rollout_id
        # Kept past ``context``, which is dropped when the rollout ends.
        self._redactor = context.redactor
        self._revision: Hashable | object = _UNSEEN
        self._fingerprinted = True
        self._snapshot: Snapshot | None = None
        self._steps: StepCache = {}
        self._stamped: str | None = None
        self._version = 0
        self._made_directory = False

    def release(self) -> None:
        """Keep only the last document: the rollout's context holds its whole history, and
        the server retains finished rollouts (with this object) for a while."""
        self.context = None
        self._snapshot = None
        self._steps = {}

    def needs_look(self) -> bool:
        """Whether the source may have something new (a cheap check, on the loop)."""
        context = self.context
        source = context.sample_source if context is not None else None
        if source is None or context is None or not context.preview_enabled:
            return False
        try:
            revision = source.preview_revision()
        except Exception:
            return False
        return revision is None or revision != self._revision

    async def look(self) -> RolloutSample | None:
        """Ask the source for its preview sample; ``None`` when it has none."""
        context = self.context
        source = context.sample_source if context is not None else None
        if source is None or context is None:
            return None
        try:
            revision = source.preview_revision()
            async with asyncio.timeout(_SOURCE_TIMEOUT_SEC):
                sample = await source.get_preview(MAX_PREVIEW_MESSAGES)
        except Exception as exc:
            logger.debug("rollout %s: preview skipped (%s)", self.rollout_id, type(exc).__name__)
            return None
        self._revision = revision
        # With a revision the source already said the preview changed: no need to compare.
        self._fingerprinted = revision is None
        # The flag may have been cleared while the source was being asked.
        return sample if context.preview_enabled else None

    def stale(self, status: str) -> bool:
        """Whether the published document shows another status than ``status``."""
        return self._snapshot is not None and status != self._stamped

    def publish(self, sample: RolloutSample | None, status: str) -> bytes | None:
        """On a worker thread: snapshot ``sample``, stamp, encode and write.

        Returns the document's bytes, or ``None`` when there was nothing new to publish.
        """
        if sample is not None:
            previous = self._snapshot.fingerprint if self._snapshot else None
            snapshot = snapshot_of(
                sample,
                secrets=self._redactor.secrets,
                previous=previous if self._fingerprinted else None,
                fingerprint=self._fingerprinted,
                cache=self._steps,
            )
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
            if not self._made_directory:
                self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._made_directory = True
            # Rewritten every few seconds and worthless after a crash: no fsync.
            atomic_write_bytes(self._directory / PREVIEW_FILENAME, data, durable=False)
        return data


_Work = tuple[RolloutPreview, RolloutSample | None, str]


def _publish_all(work: list[_Work]) -> tuple[list[bytes | None], float]:
    """Publish on this worker thread; returns the documents and the thread's CPU seconds."""
    started = time.thread_time()
    published: list[bytes | None] = []
    for preview, sample, status in work:
        try:
            published.append(preview.publish(sample, status))
        except Exception as exc:  # one broken preview must not stop the others
            logger.debug("rollout %s: no preview (%s)", preview.rollout_id, type(exc).__name__)
            published.append(None)
    return published, time.thread_time() - started


class PreviewHub:
    """Every previewed rollout of one server, served by one task while any is registered.

    Args:
        directory: Where ``<rollout_id>/preview.json`` files go; ``None``: memory only.
        interval_sec: Seconds between two looks at one rollout's source.
    """

    def __init__(self, *, directory: Path | None, interval_sec: float) -> None:
        self.directory = directory
        self.interval_sec = interval_sec
        # Status changes are published within a tick; looks are due once per interval.
        self._tick_sec = min(0.5, interval_sec / 4)
        self._rollouts: dict[str, RolloutPreview] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._publications = 0
        self._cpu_sec = 0.0

    def health(self) -> dict[str, Any]:
        """``/health``'s ``previews`` object: what the machinery has done and cost."""
        return {
            "previewed_rollouts": len(self._rollouts),
            "publications": self._publications,
            "cpu_sec": round(self._cpu_sec, 3),
        }

    def add(
        self,
        rollout_id: str,
        context: RolloutContext,
        progress: RolloutProgress,
    ) -> RolloutPreview:
        """Start previewing a rollout; its documents are redacted by ``context.redactor``."""
        # Spread rollouts admitted together over the interval.
        jitter = 0.5 + random.random()
        preview = RolloutPreview(
            rollout_id,
            context,
            progress,
            directory=self.directory,
            due=time.monotonic() + self.interval_sec * jitter,
        )
        self._rollouts[rollout_id] = preview
        if self._task is None:
            self._task = asyncio.create_task(self._serve(), name="osmosis previews")
        return preview

    async def finish(self, preview: RolloutPreview, status: str) -> None:
        """Publish the rollout's last preview, stamped ``status``, and wait (briefly) for it.

        A tick runs at once rather than at its time, so the result is not held back.
        """
        preview.ending_status = status
        self._wake.set()
        try:
            async with asyncio.timeout(_FINISH_TIMEOUT_SEC):
                await preview.finished.wait()
        except TimeoutError:
            self._rollouts.pop(preview.rollout_id, None)
            logger.debug("rollout %s: final preview not published in time", preview.rollout_id)

    async def _serve(self) -> None:
        try:
            while self._rollouts:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._tick_sec):
                        await self._wake.wait()
                self._wake.clear()
                await self._tick()
        except Exception:  # previews are best effort: never let this task die noisily
            logger.debug("preview task failed", exc_info=True)
        finally:
            # No await between the last check and this line: `add` sees the task gone.
            self._task = None
            for preview in self._rollouts.values():
                preview.finished.set()
            self._rollouts.clear()

    async def _tick(self) -> None:
        # CPU is counted on the loop around each synchronous stretch (the looks at the
        # sources included: they rarely yield) and on the worker thread.
        started = time.thread_time()
        now = time.monotonic()
        work: list[_Work] = []
        looking: list[RolloutPreview] = []
        ended: list[RolloutPreview] = []
        for preview in list(self._rollouts.values()):
            status = preview.ending_status or preview.progress.status.value
            terminal = status in _TERMINAL_VALUES
            if terminal:
                ended.append(preview)
            if terminal or now >= preview.due:
                preview.due = now + self.interval_sec
                if preview.needs_look():
                    looking.append(preview)
                    continue
            if terminal or preview.stale(status):
                work.append((preview, None, status))
        self._cpu_sec += time.thread_time() - started
        samples = await asyncio.gather(*(self._timed_look(preview) for preview in looking))
        for preview, sample in zip(looking, samples, strict=True):
            work.append((preview, sample, preview.ending_status or preview.progress.status.value))
        if work:
            published, cpu_sec = await asyncio.to_thread(_publish_all, work)
            self._cpu_sec += cpu_sec
            for (preview, _, _), data in zip(work, published, strict=True):
                if data is not None:
                    preview.latest = data
                    self._publications += 1
        for preview in ended:
            self._rollouts.pop(preview.rollout_id, None)
            preview.release()
            preview.finished.set()

    async def _timed_look(self, preview: RolloutPreview) -> RolloutSample | None:
        started = time.thread_time()
        try:
            return await preview.look()
        finally:
            self._cpu_sec += time.thread_time() - started
