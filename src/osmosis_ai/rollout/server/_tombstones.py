"""What the server remembers of a freed result: its id and terminal status, nothing more."""

from __future__ import annotations

from collections import deque

from osmosis_ai.rollout.status import RolloutStatus

__all__ = ["Tombstones"]

_STATUSES = tuple(RolloutStatus)
_CODES = {status: code for code, status in enumerate(_STATUSES)}
#: Tombstones are kept in this many generations at most (plus the one filling up): expiry
#: and the count cap drop whole generations, oldest first, so no per-id order is stored.
_GENERATIONS = 16


class _Generation:
    """Tombstones added during one stretch of time."""

    __slots__ = ("last_added_at", "started_at", "statuses")

    def __init__(self, now: float) -> None:
        self.started_at = now
        self.last_added_at = now
        # str keys and small-int values: the garbage collector never tracks this dict, so a
        # full collection does not walk the history.
        self.statuses: dict[str, int] = {}


class Tombstones:
    """Ids of freed results with their terminal status, for ``retention_sec`` and at most
    ``max_count`` of them.

    A tombstone is one dict slot (the id string and a cached small int): a few dozen bytes
    beside the id. Each generation spans at most ``retention_sec / 16`` seconds and
    ``max_count / 16`` ids; a generation goes once its newest id is ``retention_sec`` old,
    so an id stays reserved at least ``retention_sec`` and at most a sixteenth longer, and
    the count cap drops the oldest generation first.
    """

    def __init__(self, *, retention_sec: float, max_count: int) -> None:
        self.retention_sec = retention_sec
        self.max_count = max_count
        self._span_sec = retention_sec / _GENERATIONS
        self._per_generation = max(1, max_count // _GENERATIONS)
        self._generations: deque[_Generation] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, rollout_id: str) -> bool:
        return any(rollout_id in g.statuses for g in self._generations)

    def status(self, rollout_id: str) -> RolloutStatus | None:
        """The terminal status of ``rollout_id``'s freed result, if it has a tombstone."""
        for generation in self._generations:
            code = generation.statuses.get(rollout_id)
            if code is not None:
                return _STATUSES[code]
        return None

    def add(self, rollout_id: str, status: RolloutStatus, now: float) -> None:
        """Remember that ``rollout_id`` finished as ``status`` (its result is being freed)."""
        newest = self._generations[-1] if self._generations else None
        if (
            newest is None
            or len(newest.statuses) >= self._per_generation
            or now - newest.started_at >= self._span_sec
        ):
            newest = _Generation(now)
            self._generations.append(newest)
        newest.statuses[rollout_id] = _CODES[status]
        newest.last_added_at = now
        self._count += 1
        self.trim(self.max_count)

    def expire(self, now: float) -> None:
        """Forget generations whose newest tombstone is past retention."""
        generations = self._generations
        while generations and now - generations[0].last_added_at >= self.retention_sec:
            self._count -= len(generations.popleft().statuses)

    def trim(self, limit: int) -> None:
        """Drop the oldest generations until at most ``limit`` tombstones remain."""
        generations = self._generations
        while generations and self._count > max(0, limit):
            self._count -= len(generations.popleft().statuses)
