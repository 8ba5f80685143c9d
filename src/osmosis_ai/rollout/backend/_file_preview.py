"""A preview source fed by a file another process writes (a child, a sandbox, an agent)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from osmosis_ai.errors import RolloutFailure
from osmosis_ai.rollout.context import SampleSource
from osmosis_ai.rollout.sample import RolloutSample

__all__ = ["FilePreviewSource"]

_MAX_BYTES = 8 * 1024 * 1024


class FilePreviewSource(SampleSource):
    """The latest preview window in a JSON file: ``{"trajectory_messages": [...],
    "extra_fields": {...}}`` (the in-container runner's form) or ``{"messages": [...]}``
    (e.g. mini-swe-agent's trajectory). Read off the event loop, only when the file changed;
    a missing, partial or oversized file means no preview yet.

    Registered on the host's rollout context so the server's preview pipeline (redaction,
    clipping, publication) treats it like an in-process source.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int] | None = None
        self._window: RolloutSample | None = None

    async def get_sample(self) -> RolloutSample:
        raise RolloutFailure("this rollout's sample comes from another process, not a preview")

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        return await asyncio.to_thread(self._read, max_messages)

    def _read(self, max_messages: int) -> RolloutSample | None:
        try:
            stat = self._path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self._seen and stat.st_size <= _MAX_BYTES:
                document = json.loads(self._path.read_bytes())
                messages = document.get("trajectory_messages") or document.get("messages")
                if isinstance(messages, list):
                    recent = messages[-max_messages:] if max_messages > 0 else []
                    extra = document.get("extra_fields")
                    self._window = RolloutSample(
                        messages=recent,
                        trajectory_messages=recent,
                        extra_fields=extra if isinstance(extra, dict) else {},
                    )
                self._seen = (stat.st_mtime_ns, stat.st_size)
        except (OSError, ValueError, AttributeError):
            return None
        return self._window
