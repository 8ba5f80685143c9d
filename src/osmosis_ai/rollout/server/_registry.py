"""The server's rollouts: leases, status, final results, retention and cancellation."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Iterable

from osmosis_ai._unique import token_bytes
from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.backend.base import CancelDisposition, ExecutionResult
from osmosis_ai.rollout.context import RolloutProgress
from osmosis_ai.rollout.server._previews import RolloutPreview
from osmosis_ai.rollout.server._tombstones import Tombstones
from osmosis_ai.rollout.server.results import encode_final
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.rollout.types import RolloutInitRequest

__all__ = ["Entry", "Registry"]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _lease_token() -> str:
    # Unguessable without a getrandom call per admission (see osmosis_ai._unique).
    return base64.urlsafe_b64encode(token_bytes(32)).rstrip(b"=").decode()


class Entry:
    """One admitted rollout, from admission until its retention ends."""

    __slots__ = (
        "delivered_at",
        "disposition",
        "finished_at",
        "lease_deadline",
        "lease_digest",
        "preview",
        "progress",
        "redactor",
        "reported",
        "result_body",
        "rollout_id",
        "task",
    )

    def __init__(
        self, request: RolloutInitRequest, lease_digest: bytes, deadline: float, redactor: Redactor
    ) -> None:
        self.rollout_id = request.rollout_id
        #: The server's secrets and this rollout's key: nothing of the rollout leaves without it.
        key = request.llm_api_key
        self.redactor = redactor.with_secrets(key) if key else redactor
        self.lease_digest = lease_digest
        self.lease_deadline = deadline
        self.progress = RolloutProgress()
        self.task: asyncio.Task[None] | None = None
        self.result_body: bytes | None = None
        self.finished_at: float | None = None
        self.disposition: CancelDisposition | None = None
        #: When the final result was last sent to the lease holder: it is freed a grace later.
        self.delivered_at: float | None = None
        # The status the lease holder last received: a poll returns at once when it differs.
        self.reported = RolloutStatus.QUEUED
        self.preview: RolloutPreview | None = None

    @property
    def finished(self) -> bool:
        """Whether the final result is published."""
        return self.result_body is not None

    def deliver(self) -> bytes:
        """The final result, noted as sent to the lease holder: the grace starts again."""
        assert self.result_body is not None
        self.delivered_at = time.monotonic()
        return self.result_body

    def holds_lease(self, token: str) -> bool:
        """Constant-time check of a presented lease token (only its digest is stored)."""
        return hmac.compare_digest(_digest(token), self.lease_digest)


class Registry:
    """All rollouts the server knows, keyed by id: entries while they run and shortly after,
    then tombstones.

    A final result stays whole until ``grace_sec`` after it was last sent to its lease holder
    (a retried poll gets it again, and starts the grace again), or until ``retention_sec``
    if nobody collects it. It is
    then freed; a delivered one leaves a tombstone (id and terminal status) that keeps its
    id reserved, so a late duplicate admission is refused rather than mixed up, until
    ``retention_sec`` after its freeing. An entry stays while its execution task runs. At
    most ``max_retained`` finished rollouts are remembered (results and tombstones): past
    that the oldest tombstones go first, then the oldest uncollected results.
    """

    def __init__(
        self,
        *,
        lease_timeout_sec: float,
        retention_sec: float,
        max_retained: int,
        grace_sec: float,
    ) -> None:
        self.lease_timeout_sec = lease_timeout_sec
        self.retention_sec = retention_sec
        self.max_retained = max_retained
        self.grace_sec = grace_sec
        self._entries: dict[str, Entry] = {}
        self._tombstones = Tombstones(retention_sec=retention_sec, max_count=max_retained)
        self._results = 0  # finished entries still held

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._entries or rollout_id in self._tombstones

    def get(self, rollout_id: str) -> Entry | None:
        """The entry of ``rollout_id``, if held."""
        return self._entries.get(rollout_id)

    def tombstone(self, rollout_id: str) -> RolloutStatus | None:
        """The terminal status of ``rollout_id`` when its delivered result was freed."""
        return self._tombstones.status(rollout_id)

    def admit(self, request: RolloutInitRequest, redactor: Redactor) -> tuple[Entry, str]:
        """Register ``request``; returns its entry and the new lease token.

        ``redactor`` holds the server's configured secrets; the entry's adds the rollout's key.
        """
        token = _lease_token()
        deadline = time.monotonic() + self.lease_timeout_sec
        entry = Entry(request, _digest(token), deadline, redactor)
        self._entries[request.rollout_id] = entry
        return entry, token

    def renew(self, entry: Entry) -> None:
        """Extend the lease of an unfinished rollout from now."""
        entry.lease_deadline = time.monotonic() + self.lease_timeout_sec

    def finish(self, entry: Entry, result: ExecutionResult) -> bool:
        """Publish ``entry``'s final result; the first publication wins. Returns whether it won."""
        if entry.finished:
            return False
        entry.result_body = encode_final(entry.rollout_id, result, entry.redactor)
        entry.finished_at = time.monotonic()
        entry.progress.set_status(result.status)
        self._results += 1
        return True

    def select(self, ids: list[str] | None, prefix: str | None, everything: bool) -> Iterable[str]:
        """Ids chosen by a cancel request (unknown ids included, to answer ``not_found``)."""
        if ids is not None:
            return ids
        if prefix is not None:
            return [rollout_id for rollout_id in self._entries if rollout_id.startswith(prefix)]
        assert everything
        return list(self._entries)

    def undelivered(self) -> int:
        """Finished rollouts whose final result no poller has collected yet."""
        return sum(1 for e in self._entries.values() if e.finished and e.delivered_at is None)

    def expired_leases(self, now: float) -> list[Entry]:
        """Unfinished rollouts whose lease deadline has passed."""
        return [e for e in self._entries.values() if not e.finished and e.lease_deadline <= now]

    def retention(self) -> dict[str, int]:
        """For ``/health``: results held whole, tombstones, and the cap on both."""
        return {
            "results": self._results,
            "tombstones": len(self._tombstones),
            "max_retained_results": self.max_retained,
        }

    def drop_retained(self, now: float) -> int:
        """Free what retention, the delivery grace and the count cap let go; returns how
        many results were freed.

        Walks the held entries only (running ones and results not yet freed), never the
        tombstones: the cost of a sweep does not grow with the server's history.
        """
        stale: list[Entry] = []
        delivered: list[Entry] = []
        for entry in self._entries.values():
            if entry.finished_at is None or not (entry.task is None or entry.task.done()):
                continue
            if now - entry.finished_at >= self.retention_sec:
                stale.append(entry)
            elif entry.delivered_at is not None and now - entry.delivered_at >= self.grace_sec:
                delivered.append(entry)
        for entry in stale:
            self._forget(entry)
        for entry in delivered:
            self._forget(entry)
            self._tombstones.add(entry.rollout_id, entry.progress.status, now)
        self._tombstones.expire(now)
        self._tombstones.trim(self.max_retained - self._results)
        return len(stale) + len(delivered) + self._hold_cap()

    def _hold_cap(self) -> int:
        """Forget the oldest results past the count cap (tombstones are gone by now)."""
        excess = self._results + len(self._tombstones) - self.max_retained
        if excess <= 0:
            return 0
        oldest = [
            entry
            for entry in self._entries.values()
            if entry.finished_at is not None and (entry.task is None or entry.task.done())
        ]
        oldest.sort(key=lambda entry: entry.finished_at or 0.0)
        for entry in oldest[:excess]:
            self._forget(entry)
        return min(excess, len(oldest))

    def _forget(self, entry: Entry) -> None:
        del self._entries[entry.rollout_id]
        self._results -= 1
