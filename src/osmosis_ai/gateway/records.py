"""Per-rollout records of every model call the gateway served, bounded in memory."""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from osmosis_ai.gateway.calls import CallData
from osmosis_ai.rollout.trajectory import LlmCallMetrics, SampleReport, TrajectoryReport

__all__ = ["CallRecord", "CallRecords"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One chat-completions call made by a rollout.

    Token ids and logprobs are exactly what the policy returned (no re-tokenisation), kept
    in compact arrays.
    """

    rollout_id: str
    index: int
    """Position of the call within its rollout, from 0."""
    started_at: float
    """Wall-clock start (epoch seconds)."""
    latency_ms: float
    stream: bool
    status: Literal["ok", "error"]
    messages_sha256: str
    """Hash of the request's messages (canonical JSON)."""
    model: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: array[int] | None = None
    completion_token_ids: array[int] | None = None
    logprobs: array[float] | None = None
    error: str | None = None
    """Redacted error message of a failed call."""
    policy_version: int | None = None
    """Training step of the weights that answered, when the policy serves live weights."""
    grammar: str | None = None
    """Lark text of the grammar the engine generated the completion under, if any."""
    temperature: float | None = None
    """The temperature the engine sampled the completion at, when it reports it."""
    top_p: float | None = None
    """The top-p the engine cut the distribution to (1: none), when it reports it."""
    top_k: int | None = None
    """The top-k the engine cut the distribution to (0: none), when it reports it."""
    history_rewritten: bool = False
    """The call continues an earlier one of its rollout, but the chat template rendered that
    earlier call otherwise in this prompt (its ids are no extension of the earlier ones)."""

    @classmethod
    def from_call(
        cls,
        *,
        rollout_id: str,
        index: int,
        started_at: float,
        latency_ms: float,
        stream: bool,
        messages_sha256: str,
        data: CallData | None,
        error: str | None = None,
    ) -> CallRecord:
        """Build a record from what a call produced (``data``) or how it failed (``error``)."""
        data = data or CallData()
        return cls(
            rollout_id=rollout_id,
            index=index,
            started_at=started_at,
            latency_ms=latency_ms,
            stream=stream,
            status="error" if error is not None else "ok",
            messages_sha256=messages_sha256,
            model=data.model,
            finish_reason=data.finish_reason,
            usage=data.usage,
            prompt_token_ids=array("q", data.prompt_token_ids) if data.prompt_token_ids else None,
            completion_token_ids=(
                array("q", data.completion_token_ids) if data.completion_token_ids else None
            ),
            logprobs=array("d", data.logprobs) if data.logprobs else None,
            error=error,
            policy_version=data.policy_version,
            grammar=data.grammar,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            history_rewritten=data.history_rewritten,
        )

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (``GET /v1/rollouts/{id}/calls``)."""
        return {
            "rollout_id": self.rollout_id,
            "index": self.index,
            "started_at": self.started_at,
            "latency_ms": round(self.latency_ms, 3),
            "stream": self.stream,
            "status": self.status,
            "messages_sha256": self.messages_sha256,
            "model": self.model,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "prompt_token_ids": _listed(self.prompt_token_ids),
            "completion_token_ids": _listed(self.completion_token_ids),
            "logprobs": _listed(self.logprobs),
            "error": self.error,
            "policy_version": self.policy_version,
            "grammar": self.grammar,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "history_rewritten": self.history_rewritten,
        }

    def to_llm_call_metrics(self) -> LlmCallMetrics:
        """The record as ATIF per-call metrics, for merging into a trajectory."""
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return LlmCallMetrics(
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            cached_tokens=cached,
            prompt_token_ids=_listed(self.prompt_token_ids),
            completion_token_ids=_listed(self.completion_token_ids),
            logprobs=_listed(self.logprobs),
            model_name=self.model,
        )


def _listed(values: array[Any] | None) -> list[Any] | None:
    return values.tolist() if values is not None else None


class CallRecords:
    """Call records grouped by rollout, bounded in memory.

    At most ``max_rollouts`` rollouts are kept (the least recently active is dropped first),
    each with at most ``max_calls_per_rollout`` calls, and a rollout idle for ``ttl_sec`` is
    dropped. The controller releases a rollout's records when it is done with them.
    """

    def __init__(
        self,
        *,
        max_rollouts: int = 10_000,
        max_calls_per_rollout: int = 4_096,
        ttl_sec: float = 3_600.0,
    ) -> None:
        self.max_rollouts = max_rollouts
        self.max_calls_per_rollout = max_calls_per_rollout
        self.ttl_sec = ttl_sec
        self._by_rollout: OrderedDict[str, tuple[float, list[CallRecord]]] = OrderedDict()
        self._next_index: dict[str, int] = {}
        self.on_release: list[Callable[[str], None]] = []
        """Called with each released rollout's id (the policy forgets its history)."""

    def __len__(self) -> int:
        return len(self._by_rollout)

    def next_index(self, rollout_id: str) -> int:
        """Reserve the index of a new call of ``rollout_id``."""
        index = self._next_index.get(rollout_id, 0)
        self._next_index[rollout_id] = index + 1
        return index

    def add(self, record: CallRecord) -> None:
        """Store ``record`` (dropped when its rollout already holds the maximum)."""
        now = time.monotonic()
        _, calls = self._by_rollout.pop(record.rollout_id, (now, []))
        if len(calls) < self.max_calls_per_rollout:
            calls.append(record)
        self._by_rollout[record.rollout_id] = (now, calls)
        self._evict(now)

    def calls(self, rollout_id: str) -> list[CallRecord]:
        """The calls of ``rollout_id``, in the order they were made."""
        entry = self._by_rollout.get(rollout_id)
        return sorted(entry[1], key=lambda record: record.index) if entry else []

    def release(self, rollout_id: str) -> int:
        """Forget ``rollout_id``; returns how many records were dropped."""
        self._next_index.pop(rollout_id, None)
        entry = self._by_rollout.pop(rollout_id, None)
        for listener in self.on_release:
            listener(rollout_id)
        return len(entry[1]) if entry else 0

    def take(self, rollout_id: str) -> list[CallRecord]:
        """The calls of ``rollout_id`` (`calls`), then forget it (`release`): what a trainer
        does once a rollout has finished, whether its sequences are built here (the native
        loop) or by the trainer that drives it (SkyRL, verl)."""
        calls = self.calls(rollout_id)
        self.release(rollout_id)
        return calls

    def report(self, rollout_id: str) -> TrajectoryReport | None:
        """The successful calls of ``rollout_id`` as a trajectory report, or ``None``."""
        calls = [record for record in self.calls(rollout_id) if record.status == "ok"]
        if not calls:
            return None
        return TrajectoryReport(
            model_name=calls[-1].model,
            samples={
                rollout_id: SampleReport(
                    model_name=calls[-1].model,
                    llm_call_metrics=[record.to_llm_call_metrics() for record in calls],
                )
            },
        )

    def _evict(self, now: float) -> None:
        while self._by_rollout:
            oldest_id, (touched, _) = next(iter(self._by_rollout.items()))
            if len(self._by_rollout) <= self.max_rollouts and now - touched <= self.ttl_sec:
                return
            self.release(oldest_id)
