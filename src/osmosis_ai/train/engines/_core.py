"""The engine-independent part: run a batch of AgentWorkflow rollouts against a policy.

``AgentRollouts`` starts a gateway in front of the engine's inference (the ``policy``) and a
backend (or a client of a remote rollout server), then runs each ``EngineTask`` inside a
rollout context pointing at the gateway's per-rollout URL. Each task ends as one
``EngineRollout``: the final result (never an exception), the gateway's call records and
the training sequences built from them. Adapters turn these into SkyRL rows or verl outputs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from osmosis_ai._context_exit import AsyncUnconditionalExit
from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.records import CallRecord
from osmosis_ai.gateway.server import Gateway
from osmosis_ai.redact import Redactor
from osmosis_ai.rollout.backend.base import ExecutionBackend, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.ids import ensure_single_path_segment
from osmosis_ai.rollout.server.app import backend_from_spec
from osmosis_ai.rollout.server.execution import REPORT_URL_FIELD
from osmosis_ai.rollout.server.results import encode_final, failure, internal_failure
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.types import RolloutResultResponse
from osmosis_ai.rollout.workflow import AgentWorkflow
from osmosis_ai.train.algorithm.sequences import (
    DriftPolicy,
    Exclusion,
    RolloutRecords,
    SequenceStats,
    TrainingSequence,
    build_sequences,
)

__all__ = [
    "AgentRollouts",
    "EngineRollout",
    "EngineTask",
    "batch_metrics",
]

#: Longest a single rollout may take end to end, whatever its own deadlines say (a
#: backend or remote server that never answers must not hang the engine's step).
DEFAULT_ROLLOUT_DEADLINE_SEC = 900.0
DEFAULT_MAX_IN_FLIGHT = 256


@dataclass(frozen=True, slots=True)
class EngineTask:
    """One rollout an engine asks for: a dataset row's prompt, label and metadata."""

    rollout_id: str
    """Unique within a batch; a single path segment (it becomes a URL segment)."""
    group_id: str
    """The prompt group the rollout belongs to (advantages are normalised per group)."""
    prompt: list[dict[str, Any]]
    """The initial messages."""
    label: str | None = None
    """Ground truth, given only to the grader."""
    metadata: dict[str, Any] | None = None
    """Per-row metadata, given to workflow and grader."""

    def __post_init__(self) -> None:
        ensure_single_path_segment(self.rollout_id, label="EngineTask.rollout_id")
        if not isinstance(self.prompt, list) or not all(isinstance(m, dict) for m in self.prompt):
            raise ConfigError(
                f"EngineTask {self.rollout_id!r}: prompt must be a list of message objects "
                "({'role': ..., 'content': ...})"
            )


@dataclass(frozen=True, slots=True)
class EngineRollout:
    """One finished rollout: how it ended, what the policy was called with, what to train."""

    task: EngineTask
    result: RolloutResultResponse
    """The final result as the wire carries it (status, sample with reward, error category
    and message; secrets redacted)."""
    calls: list[CallRecord]
    """The gateway's records of this rollout's model calls, in call order."""
    sequences: list[TrainingSequence]
    """Its training sequences (empty when excluded)."""
    excluded: Exclusion | None
    """Why it gives no training sequence, if it gives none."""
    reward: float | None
    """The grader's reward of a kept, successful sample; else None."""
    seconds: float
    """Wall time from start to final result (queueing for a slot included)."""
    stats: SequenceStats = field(default_factory=SequenceStats)
    """How its calls chained into sequences (drift, merges...)."""


class AgentRollouts(AsyncUnconditionalExit):
    """Runs AgentWorkflow rollouts for a training engine; an async context manager.

    On enter it starts a ``Gateway`` for ``policy`` (127.0.0.1 by default, a free port, a
    random token that is redacted everywhere) and the backend: ``"local"``, ``"process"``,
    ``"process:sandbox"``, ``"ray"`` or ``"ray:ADDRESS"`` (as ``osmosis eval run --backend``),
    an ``ExecutionBackend`` instance, or, with ``server_url``, a remote rollout server
    (which has its own workflow: pass ``workflow=None``).

    Args:
        workflow: The ``AgentWorkflow`` subclass or its ``"module:Class"`` path.
        policy: What serves the model calls (the engine's inference behind a gateway policy).
        grader, workflow_config, grader_config: As for ``LocalBackend``.
        backend: Where rollouts run (ignored with ``server_url``).
        server_url: A rollout server to drive instead of a backend.
        server_api_key: That server's bearer key.
        drift: How sequences treat re-tokenisation drift (``build_sequences``).
        one_sequence: At most one sequence per rollout, its calls realigned into it
            (``build_sequences(one_sequence=True)``; needs ``drift="realign"``).
        agent_timeout_sec, grader_timeout_sec: Per-rollout deadlines (None: none).
        artifact_root: Root of per-rollout files of the backend.
        sampling: Sampling fields imposed on every call (``Gateway(sampling=...)``).
        secrets: Values to redact from results, besides the gateway token.
        gateway_host: Interface of the gateway; rollouts on other machines need one they reach.
        max_in_flight: Rollouts running at once; the rest wait.
        rollout_deadline_sec: Hard bound on one rollout, whatever its own deadlines.

    Raises:
        ConfigError: No workflow and no server, both, an unknown backend name, or
            ``one_sequence`` without ``drift="realign"``.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str | None,
        *,
        policy: Policy,
        grader: type[Grader] | str | None = None,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader_config: GraderConfig | str | None = None,
        backend: str | ExecutionBackend = "local",
        server_url: str | None = None,
        server_api_key: str | None = None,
        drift: DriftPolicy = "fork",
        one_sequence: bool = False,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        artifact_root: Path | str | None = None,
        sampling: Mapping[str, Any] | None = None,
        secrets: Iterable[str] = (),
        gateway_host: str = "127.0.0.1",
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        rollout_deadline_sec: float = DEFAULT_ROLLOUT_DEADLINE_SEC,
    ) -> None:
        if (workflow is None) == (server_url is None):
            raise ConfigError(
                "AgentRollouts needs a workflow (run here) or server_url (a rollout server "
                "that has one), not both and not neither"
            )
        if drift not in ("fork", "realign"):
            raise ConfigError(f"drift must be 'fork' or 'realign', not {drift!r}")
        if one_sequence and drift != "realign":
            raise ConfigError(
                "one_sequence=True realigns every call into one sequence; pass drift='realign'"
            )
        if max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if rollout_deadline_sec <= 0:
            raise ConfigError(f"rollout_deadline_sec must be positive, got {rollout_deadline_sec}")
        self.drift = drift
        self.one_sequence = one_sequence
        self.agent_timeout_sec = agent_timeout_sec
        self.grader_timeout_sec = grader_timeout_sec
        self.rollout_deadline_sec = rollout_deadline_sec
        self._grade = grader is not None or server_url is not None
        self._server_url = server_url
        self._server_api_key = server_api_key
        self._secrets = (*secrets, *([server_api_key] if server_api_key else []))
        self.gateway = Gateway(
            policy,
            secrets=self._secrets,
            sampling=sampling,
            host=gateway_host,
        )
        self.redactor = Redactor((self.gateway.token, *self._secrets, *policy.secrets()))
        self.backend: ExecutionBackend | None = None
        if workflow is not None:
            local = LocalBackend(
                workflow=workflow,
                workflow_config=workflow_config,
                grader=grader,
                grader_config=grader_config,
                artifact_root=artifact_root,
            )
            self.backend = (
                backend
                if isinstance(backend, ExecutionBackend)
                else backend_from_spec(backend, local, label="backend")
            )
        self.client: RolloutClient | None = None
        self._semaphore = asyncio.Semaphore(max_in_flight)

    async def __aenter__(self) -> Self:
        await self.gateway.__aenter__()
        try:
            if self.backend is not None:
                await self.backend.start()
            else:
                assert self._server_url is not None
                self.client = RolloutClient(url=self._server_url, api_key=self._server_api_key)
                await self.client.__aenter__()
        except BaseException:
            await self.gateway.__aexit__(None, None, None)
            raise
        return self

    async def _aexit(self) -> None:
        try:
            if self.backend is not None:
                await self.backend.shutdown()
            if self.client is not None:
                await self.client.aclose()
                self.client = None
        finally:
            await self.gateway.__aexit__(None, None, None)

    async def run(self, tasks: Sequence[EngineTask]) -> list[EngineRollout]:
        """Run ``tasks`` concurrently (at most ``max_in_flight`` at once); one result each,
        in order.

        Raises:
            ConfigError: Two tasks share a rollout id.
        """
        seen = Counter(task.rollout_id for task in tasks)
        repeated = sorted(rid for rid, n in seen.items() if n > 1)
        if repeated:
            raise ConfigError(
                f"EngineTask rollout ids must be unique within a batch; repeated: {repeated[:5]}"
            )
        return list(await asyncio.gather(*(self._one(task) for task in tasks)))

    async def _one(self, task: EngineTask) -> EngineRollout:
        started = time.monotonic()
        records = self.gateway.records
        try:
            async with self._semaphore:
                try:
                    async with asyncio.timeout(self.rollout_deadline_sec):
                        result = await self._execute(task)
                except TimeoutError:
                    result = self._final(
                        task,
                        failure(
                            f"the rollout took longer than rollout_deadline_sec "
                            f"({self.rollout_deadline_sec:g}s) and was cancelled",
                            RolloutErrorCategory.TIMEOUT,
                        ),
                    )
        finally:  # a rollout that raised is forgotten too
            calls = records.take(task.rollout_id)
        seconds = time.monotonic() - started
        sequences, stats = build_sequences(
            [RolloutRecords(result=result, group_id=task.group_id, calls=calls)],
            drift=self.drift,
            one_sequence=self.one_sequence,
        )
        excluded = Exclusion(next(iter(stats.excluded))) if stats.excluded else None
        # The wire form carries a reward only for a kept, successful sample.
        reward = result.sample.reward if result.sample is not None else None
        return EngineRollout(task, result, calls, sequences, excluded, reward, seconds, stats)

    async def _execute(self, task: EngineTask) -> RolloutResultResponse:
        url = self.gateway.chat_completions_url(task.rollout_id)
        if self.client is not None:
            return await self._remote(task, url)
        assert self.backend is not None, "AgentRollouts is used outside `async with`"
        request = ExecutionRequest(
            id=task.rollout_id,
            prompt=task.prompt,
            label=task.label,
            metadata=task.metadata,
            agent_timeout_sec=self.agent_timeout_sec,
            grader_timeout_sec=self.grader_timeout_sec,
            grade=self._grade,
        )
        context = RolloutContext(
            chat_completions_url=url,
            api_key=self.gateway.token,
            rollout_id=task.rollout_id,
            redactor=self.redactor,
        )
        try:
            with context:
                outcome = await self.backend.execute(request)
            result = outcome.result
        except Exception as exc:
            # The backend broke its contract (user failures are results, not exceptions).
            result = internal_failure(exc, phase="the execution backend")
        return self._final(task, result)

    async def _remote(self, task: EngineTask, url: str) -> RolloutResultResponse:
        assert self.client is not None
        try:
            handle = await self.client.run_rollout(
                task.prompt,
                url,
                task.rollout_id,
                llm_api_key=self.gateway.token,
                label=task.label,
                metadata=task.metadata,
                agent_timeout_sec=self.agent_timeout_sec,
                grader_timeout_sec=self.grader_timeout_sec,
                extra_fields={
                    REPORT_URL_FIELD: self.gateway.trajectory_report_url(task.rollout_id)
                },
            )
            result = await handle
        except Exception as exc:
            # An unreachable or refusing server: this rollout has no result to train on.
            return self._final(task, internal_failure(exc, phase="the rollout server"))
        if result.err_message:
            result = result.model_copy(
                update={"err_message": self.redactor.text(result.err_message)}
            )
        return result

    def _final(self, task: EngineTask, result: ExecutionResult) -> RolloutResultResponse:
        # The rollout server's own encoding: rewards only on kept successes, secrets redacted.
        body = encode_final(task.rollout_id, result, self.redactor)
        return RolloutResultResponse.model_validate_json(body)


def batch_metrics(
    rollouts: Sequence[EngineRollout], *, prefix: str = "osmosis/"
) -> dict[str, float]:
    """Per-batch figures both adapters log (pure).

    ``reward_mean`` over rollouts with a reward; ``drift`` transitions where re-tokenisation
    broke a prefix; ``new_contexts`` calls that left the conversation before its last reply;
    ``history_rewrites`` calls whose chat template rendered an earlier call otherwise;
    ``calls_per_rollout`` mean; ``rollout_seconds_mean``/``_max``;
    ``failed`` rollouts and ``failed/<category>``; ``excluded/<reason>`` counts.
    """
    rewards = [r.reward for r in rollouts if r.reward is not None]
    seconds = [r.seconds for r in rollouts]
    metrics: dict[str, float] = {
        "rollouts": float(len(rollouts)),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rewarded": float(len(rewards)),
        "drift": float(sum(r.stats.drift for r in rollouts)),
        "new_contexts": float(sum(r.stats.new_contexts for r in rollouts)),
        "history_rewrites": float(sum(r.stats.history_rewrites for r in rollouts)),
        "calls_per_rollout": statistics.fmean(len(r.calls) for r in rollouts) if rollouts else 0.0,
        "rollout_seconds_mean": statistics.fmean(seconds) if seconds else 0.0,
        "rollout_seconds_max": max(seconds, default=0.0),
    }
    failed = [r for r in rollouts if r.result.status is not RolloutStatus.SUCCESS]
    metrics["failed"] = float(len(failed))
    for category, count in Counter(
        (r.result.err_category.value if r.result.err_category else r.result.status.value)
        for r in failed
    ).items():
        metrics[f"failed/{category}"] = float(count)
    for reason, count in Counter(r.excluded.value for r in rollouts if r.excluded).items():
        metrics[f"excluded/{reason}"] = float(count)
    return {f"{prefix}{key}": value for key, value in sorted(metrics.items())}
