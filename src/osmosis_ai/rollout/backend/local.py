"""``LocalBackend``: runs workflows and graders in this process, on this event loop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Unpack

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout._artifacts import create_artifacts_dir, remove_if_empty
from osmosis_ai.rollout.backend._limiter import ConcurrencyLimiter
from osmosis_ai.rollout.backend.base import ExecutionBackend, ExecutionOutcome, ExecutionRequest
from osmosis_ai.rollout.backend.base import ExecutionResult as Result
from osmosis_ai.rollout.backend.phases import run_grader_phase, run_workflow_phase
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.spec import RolloutSpec, SpecKeywords, spec_argument
from osmosis_ai.rollout.storage import default_artifact_root
from osmosis_ai.rollout.workflow import AgentWorkflow

__all__ = ["LocalBackend"]


class LocalBackend(ExecutionBackend):
    """Runs each rollout's workflow and grader in-process, concurrently, on the event loop.

    Each rollout gets a fresh workflow (and grader) instance with a private deep copy of its
    config, an artifacts directory under the artifact root (removed after ``execute()`` when
    the rollout left it empty), and deadlines: the agent
    deadline counts from submission (time spent waiting for a slot is included, because
    the controller's clock started then), the grader deadline from the start of grading.
    A deadline is reported as ``timeout`` even when user code blocked the event loop or
    swallowed the cancellation. Every failure of user code becomes a result with a
    category; nothing escapes ``execute()`` except cancellation.

    Concurrency: ``workflow_config.concurrency.max_concurrent`` caps simultaneous
    workflows and ``grader_config.concurrency.max_concurrent`` simultaneous gradings. The
    default, with or without a config, is no cap. With a cap, ``has_capacity()`` turns
    false when all slots are busy, so a rollout server answers 429 rather than queueing.

    Calling ``run_workflow()`` or ``execute()`` directly from a custom harness does not save
    trajectories; ``create_rollout_server`` does that.

    Args:
        spec: The workflow, grader and configs as a `RolloutSpec` (instead of the four
            keywords below).
        workflow: An ``AgentWorkflow`` subclass or its ``"module:Class"`` import path.
        workflow_config: A config instance, its ``"module:name"`` path, or ``None``.
        grader: A ``Grader`` subclass, its import path, or ``None`` (no grading).
        grader_config: A grader config instance, its import path, or ``None``.
        artifact_root: Root of per-rollout directories; defaults to
            ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` or ``~/.osmosis``, read at construction.

    Raises:
        ConfigError: A reference does not resolve to the right kind of object, a config
            cannot be deep-copied, or there is no workflow.
    """

    reports_progress = True

    def __init__(
        self,
        spec: RolloutSpec | None = None,
        *,
        artifact_root: Path | str | None = None,
        **refs: Unpack[SpecKeywords],
    ) -> None:
        self.spec = spec_argument(spec, require_workflow=True, **refs)
        self.artifact_root = (
            Path(artifact_root).expanduser() if artifact_root else default_artifact_root()
        )
        grader_cfg = self.spec.grader_config
        grader_cap = grader_cfg.concurrency.max_concurrent if grader_cfg else None
        self._workflows = ConcurrencyLimiter(self.spec.max_concurrent)
        self._graders = ConcurrencyLimiter(grader_cap)

    # The spec's parts under the names this class has always had.

    @property
    def workflow_cls(self) -> type[AgentWorkflow[Any]]:
        """The workflow class."""
        return self.spec.require_workflow()

    @property
    def workflow_config(self) -> AgentWorkflowConfig | None:
        """The workflow's config (each rollout gets a deep copy)."""
        return self.spec.workflow_config

    @property
    def grader_cls(self) -> type[Grader] | None:
        """The grader class, or ``None`` (no grading)."""
        return self.spec.grader

    @property
    def grader_config(self) -> GraderConfig | None:
        """The grader's config (each grading gets a deep copy)."""
        return self.spec.grader_config

    # -- ExecutionBackend ----------------------------------------------------------------

    def has_capacity(self) -> bool:
        """False when every workflow slot is taken (only possible with a cap)."""
        return self._workflows.has_free_slot()

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "concurrency": {"max_concurrent", "queued", "running"}}``."""
        return {"status": "ok", "concurrency": self._workflows.snapshot()}

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the workflow, then the grader when one exists and ``request.grade`` is true."""
        workflow, artifacts_dir = await self._workflow_phase(request, time.monotonic())
        try:
            if not workflow.ok or not request.grade or self.spec.grader is None:
                return ExecutionOutcome(workflow=workflow)
            grader = await run_grader_phase(
                self.spec,
                request,
                workflow.sample,
                artifacts_dir=artifacts_dir,
                slots=self._graders,
            )
            return ExecutionOutcome(workflow=workflow, grader=grader)
        finally:
            await remove_if_empty(artifacts_dir)

    # -- phases, also usable one at a time from a custom harness ---------------------------

    async def run_workflow(
        self, request: ExecutionRequest, *, submitted_at: float | None = None
    ) -> Result:
        """Run only the workflow phase of ``request`` and return its result.

        Args:
            request: The rollout to run.
            submitted_at: ``time.monotonic()`` when the rollout was submitted; queue time
                since then counts against the agent deadline. Defaults to now.
        """
        started = time.monotonic() if submitted_at is None else submitted_at
        result, _ = await self._workflow_phase(request, started)
        return result

    async def _workflow_phase(
        self, request: ExecutionRequest, submitted_at: float
    ) -> tuple[Result, Path | None]:
        # The slot comes first: a rollout counts as queued from its first step.
        await self._workflows.acquire()
        try:
            artifacts_dir = await create_artifacts_dir(self.artifact_root, request.id)
            result = await run_workflow_phase(
                self.spec, request, artifacts_dir=artifacts_dir, submitted_at=submitted_at
            )
            return result, artifacts_dir
        finally:
            self._workflows.release()

    async def run_grader(
        self, request: ExecutionRequest, result: Result | RolloutSample | None
    ) -> Result:
        """Run only the grader phase and return its result.

        As in the reference SDK, a harness passes on what the workflow phase returned:
        ``await backend.run_grader(request, await backend.run_workflow(request))``. A
        failed workflow result comes back unchanged and the grader does not run: there is
        nothing to grade, and the workflow's category and message stay the rollout's.

        Args:
            request: The rollout being graded (its label and metadata reach the grader).
            result: The result of ``run_workflow(request)``, or the sample itself
                (``None``: no sample, which fails saying so).

        Returns:
            The grading's result. It carries the sample whatever happens, so a failed
            grading still shows what was graded.

        Raises:
            ConfigError: The backend has no grader.
        """
        if self.spec.grader is None:
            raise ConfigError("this LocalBackend has no grader; pass grader=... to grade")
        if isinstance(result, Result) and not result.ok:
            return result
        sample = result.sample if isinstance(result, Result) else result
        return await run_grader_phase(
            self.spec,
            request,
            sample,
            artifacts_dir=await create_artifacts_dir(self.artifact_root, request.id),
            slots=self._graders,
        )
