"""The in-container runner: run one phase of a rollout from files, inside a sandbox.

A harness (Harbor's trial, `ProcessBackend`'s child process, your own container runner)
writes ``container_input.json``, starts a process that calls `agent_main` or
`grader_main`, and reads the files that come back:

* agent phase: ``<agent logs>/container_input.json`` in; ``<agent logs>/container_result.json``
  (status, the full sample, its lossy ``output`` projection, the error with its category)
  and a best-effort ATIF ``<agent logs>/trajectory.json`` out.
* grader phase: ``/tests/container_input.json`` (else the agent's copy) and the agent's
  ``container_result.json`` in; ``<verifier logs>/reward.json`` (``{"reward": r}``) and
  ``<verifier logs>/container_result.json`` (the graded sample) out.

The endpoint, key and rollout id come from the input file, else from the environment
(``OSMOSIS_CHAT_COMPLETIONS_URL``, ``OSMOSIS_API_KEY``, ``OSMOSIS_ROLLOUT_ID``); harnesses
should pass the key through the environment so it is never written to a file. Workflows
and graders run through the same code as `LocalBackend`, so validation, categories and
messages are identical to in-process execution. Works on a bare ``osmosis-ai`` install.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.backend.base import ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.backend.phases import run_grader_phase as _grade
from osmosis_ai.rollout.backend.phases import run_workflow_phase
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.sample import AgentWorkflowOutput, JSONObject, RolloutSample
from osmosis_ai.rollout.spec import RolloutSpec
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.storage import atomic_write_bytes
from osmosis_ai.rollout.trajectory.preview import PREVIEW_INTERVAL_SEC
from osmosis_ai.rollout.workflow import AgentWorkflow

__all__ = [
    "INPUT_FILE",
    "RESULT_FILE",
    "REWARD_FILE",
    "ContainerInput",
    "ContainerPaths",
    "ContainerResult",
    "agent_main",
    "grader_main",
    "run_agent_phase",
    "run_grader_phase",
]

logger = logging.getLogger(__name__)

INPUT_FILE = "container_input.json"
RESULT_FILE = "container_result.json"
REWARD_FILE = "reward.json"
TRAJECTORY_FILE = "trajectory.json"

#: Environment variables overriding the default directories (for runners outside Harbor).
AGENT_LOGS_DIR_ENV = "OSMOSIS_AGENT_LOGS_DIR"
VERIFIER_LOGS_DIR_ENV = "OSMOSIS_VERIFIER_LOGS_DIR"
ARTIFACTS_DIR_ENV = "OSMOSIS_ARTIFACTS_DIR"
TESTS_DIR_ENV = "OSMOSIS_TESTS_DIR"
#: Set by harnesses that cap memory, so a ``MemoryError`` can name the cap.
MEMORY_LIMIT_ENV = "OSMOSIS_MEMORY_LIMIT_BYTES"

_PREVIEW_MESSAGES = 100


class ContainerInput(BaseModel):
    """``container_input.json``: what one phase of one rollout needs."""

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    rollout_id: str
    prompt: list[JSONObject] = []
    label: str | None = None
    """Ground truth; harnesses leave it out of the agent phase's copy."""
    metadata: dict[str, Any] | None = None
    chat_completions_url: str = ""
    api_key: str | None = None
    """Prefer ``OSMOSIS_API_KEY`` in the environment: a file may outlive the rollout."""
    preview_path: str | None = None
    """Where the agent phase writes its live preview window (JSON), if anywhere."""
    preview_interval_sec: float = Field(default=PREVIEW_INTERVAL_SEC, gt=0)
    """How often the preview window is looked at (an extension)."""
    agent_timeout_sec: float | None = None
    """Deadline of the agent phase (an extension; the harness enforces it too)."""
    grader_timeout_sec: float | None = None
    """Deadline of the grader phase (an extension)."""
    elapsed_sec: float = 0.0
    """Time already spent on the rollout (queued, starting) that counts against the agent
    deadline (an extension)."""

    @classmethod
    def from_request(
        cls,
        request: ExecutionRequest,
        *,
        include_label: bool,
        preview_path: str | None = None,
        preview_interval_sec: float = PREVIEW_INTERVAL_SEC,
        elapsed_sec: float = 0.0,
    ) -> ContainerInput:
        """The input of one phase of ``request``; the agent phase's leaves the label out.

        The key is not copied: harnesses pass it through the environment.
        """
        return cls(
            rollout_id=request.id,
            prompt=request.prompt,
            label=request.label if include_label else None,
            metadata=request.metadata,
            agent_timeout_sec=request.agent_timeout_sec,
            grader_timeout_sec=request.grader_timeout_sec,
            preview_path=preview_path,
            preview_interval_sec=preview_interval_sec,
            elapsed_sec=elapsed_sec,
        )

    def to_request(self, *, include_label: bool) -> ExecutionRequest:
        """The request this input describes (without the label for the agent phase)."""
        return ExecutionRequest(
            id=self.rollout_id,
            prompt=self.prompt,
            label=self.label if include_label else None,
            metadata=self.metadata,
            agent_timeout_sec=self.agent_timeout_sec,
            grader_timeout_sec=self.grader_timeout_sec,
        )


class ContainerResult(BaseModel):
    """``container_result.json``: how a phase ended and the sample it produced."""

    model_config = ConfigDict(extra="ignore")

    status: RolloutStatus
    output: AgentWorkflowOutput | None = None
    """Lossy projection of the sample (messages and finite metrics), for older readers."""
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None
    diagnostics: dict[str, Any] | None = None

    def to_execution_result(self) -> ExecutionResult:
        """The phase as a backend result."""
        return ExecutionResult(
            status=self.status,
            sample=self.sample,
            err_message=self.err_message,
            err_category=self.err_category,
            extra_fields=self.diagnostics,
        )

    @classmethod
    def from_execution_result(cls, result: ExecutionResult) -> ContainerResult:
        """The file form of a backend result."""
        return cls(
            status=result.status,
            output=_projection(result.sample),
            sample=result.sample,
            err_message=result.err_message,
            err_category=result.err_category,
            diagnostics=result.extra_fields,
        )


@dataclass(frozen=True)
class ContainerPaths:
    """Where the runner reads and writes; the defaults are Harbor's container layout."""

    agent_logs_dir: Path = Path("/logs/agent")
    verifier_logs_dir: Path = Path("/logs/verifier")
    artifacts_dir: Path = Path("/logs/artifacts")
    tests_dir: Path = Path("/tests")

    @classmethod
    def from_env(cls) -> ContainerPaths:
        """The defaults, each overridable by its ``OSMOSIS_*_DIR`` variable."""
        default = cls()

        def pick(env: str, fallback: Path) -> Path:
            value = os.environ.get(env, "").strip()
            return Path(value) if value else fallback

        return cls(
            agent_logs_dir=pick(AGENT_LOGS_DIR_ENV, default.agent_logs_dir),
            verifier_logs_dir=pick(VERIFIER_LOGS_DIR_ENV, default.verifier_logs_dir),
            artifacts_dir=pick(ARTIFACTS_DIR_ENV, default.artifacts_dir),
            tests_dir=pick(TESTS_DIR_ENV, default.tests_dir),
        )


def _projection(sample: RolloutSample | None) -> AgentWorkflowOutput | None:
    if sample is None:
        return None
    metrics = {
        key: value
        for key, value in sample.metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    return AgentWorkflowOutput(messages=sample.messages, metrics=metrics)


async def _fixed_dir(artifacts_dir: Path) -> Path | None:
    """The artifacts dir the harness collects, created; ``None`` when it cannot be."""
    try:
        await asyncio.to_thread(artifacts_dir.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        logger.warning("artifacts dir unavailable (%s)", type(exc).__name__)
        return None
    return artifacts_dir


def _rollout_context(data: ContainerInput) -> RolloutContext:
    # Empty values fall back to the OSMOSIS_* environment variables.
    return RolloutContext(
        chat_completions_url=data.chat_completions_url,
        api_key=data.api_key,
        rollout_id=data.rollout_id,
    )


def _with_memory_note(result: ExecutionResult) -> ExecutionResult:
    limit = os.environ.get(MEMORY_LIMIT_ENV, "")
    diagnostics = result.extra_fields or {}
    if limit.isdigit() and diagnostics.get("exception_type") == "MemoryError":
        note = f"the rollout hit its memory cap of {int(limit) // 2**20} MiB"
        result.err_message = f"{result.err_message} ({note})" if result.err_message else note
        result.extra_fields = {**diagnostics, "memory_limit_bytes": int(limit)}
    return result


async def run_agent_phase(
    workflow: type[AgentWorkflow[Any]] | str,
    config: AgentWorkflowConfig | str | None,
    data: ContainerInput,
    *,
    artifacts_dir: Path,
) -> ContainerResult:
    """Run the workflow for ``data`` (label withheld) and return the phase's result.

    While it runs, the preview window of the workflow's sample source is written to
    ``data.preview_path`` (when given) whenever it changes, looked at every
    ``data.preview_interval_sec``.
    """
    spec = RolloutSpec.resolve(workflow=workflow, workflow_config=config)
    fixed_dir = await _fixed_dir(artifacts_dir)
    submitted_at = time.monotonic() - data.elapsed_sec
    with _rollout_context(data) as context:
        collector = None
        if data.preview_path:
            collector = asyncio.create_task(
                _collect_previews(context, Path(data.preview_path), data.preview_interval_sec)
            )
        try:
            result = await run_workflow_phase(
                spec,
                data.to_request(include_label=False),
                artifacts_dir=fixed_dir,
                submitted_at=submitted_at,
            )
        finally:
            if collector is not None:
                collector.cancel()
                await asyncio.gather(collector, return_exceptions=True)
    return ContainerResult.from_execution_result(_with_memory_note(result))


async def run_grader_phase(
    grader: type[Grader] | str,
    config: GraderConfig | str | None,
    data: ContainerInput,
    sample: RolloutSample | None,
    *,
    artifacts_dir: Path,
) -> ContainerResult:
    """Grade ``sample`` against ``data.label`` and return the phase's result."""
    spec = RolloutSpec.resolve(workflow=None, grader=grader, grader_config=config)
    fixed_dir = await _fixed_dir(artifacts_dir)
    with _rollout_context(data):
        result = await _grade(
            spec, data.to_request(include_label=True), sample, artifacts_dir=fixed_dir
        )
    return ContainerResult.from_execution_result(_with_memory_note(result))


async def _collect_previews(context: RolloutContext, path: Path, interval: float) -> None:
    """Write the source's preview window to ``path`` whenever it changes."""
    last: Hashable | None = None
    while True:
        await asyncio.sleep(interval)
        source = context.sample_source
        if source is None or not context.preview_enabled:
            continue
        try:
            revision = source.preview_revision()
            if revision is not None and revision == last:
                continue
            async with asyncio.timeout(1.0):
                window = await source.get_preview(_PREVIEW_MESSAGES)
            if window is None:
                continue
            data = window.model_dump_json(include={"trajectory_messages", "extra_fields"})
            await asyncio.to_thread(atomic_write_bytes, path, data.encode(), durable=False)
            last = revision
        except Exception as exc:  # previews never affect the rollout
            logger.debug("preview not written (%s)", type(exc).__name__)


# -- file I/O and the process entry points -------------------------------------------------


def read_input(*candidates: Path) -> ContainerInput:
    """The first existing input file of ``candidates``, validated.

    Raises:
        ConfigError: None exists, or the first one found is not a valid input.
    """
    for path in candidates:
        if path.is_file():
            try:
                return ContainerInput.model_validate_json(path.read_bytes())
            except ValidationError as exc:
                # Field names and reasons only: the input may hold the rollout's key.
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or '<document>'}: {e['msg']}"
                    for e in exc.errors(include_url=False, include_input=False)
                )
                raise ConfigError(f"{path} is not a valid {INPUT_FILE}: {problems}") from None
    raise ConfigError(f"no {INPUT_FILE} found (looked at {', '.join(map(str, candidates))})")


def read_result(path: Path) -> ContainerResult | None:
    """The result file at ``path``, or ``None`` when it is missing or unreadable."""
    try:
        return ContainerResult.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def write_result(path: Path, result: ContainerResult) -> None:
    """Write ``result`` atomically to ``path`` (creating its directory).

    Not flushed to disk: the harness reads it as soon as the process ends.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, result.model_dump_json().encode(), durable=False)


def _agent_sample(paths: ContainerPaths) -> RolloutSample | None:
    """The agent phase's sample: its result file, else a trajectory file it left."""
    result = read_result(paths.agent_logs_dir / RESULT_FILE)
    if result is not None:
        if result.sample is not None:
            return result.sample
        if result.output is not None and result.output.messages is not None:
            output = result.output
            return RolloutSample(
                messages=output.messages, metrics=output.metrics, turn_rewards=output.turn_rewards
            )
    from osmosis_ai.rollout.trajectory.convert import messages_from_trajectory

    for candidate in sorted(paths.agent_logs_dir.glob("*trajectory*.json")):
        try:
            document = json.loads(candidate.read_bytes())
            if isinstance(document, dict) and isinstance(document.get("messages"), list):
                return RolloutSample(messages=document["messages"])
            if isinstance(document, dict) and isinstance(document.get("steps"), list):
                return RolloutSample(messages=messages_from_trajectory(document))
        except (OSError, ValueError, TypeError):
            continue
    return None


def _write_trajectory(path: Path, data: ContainerInput, sample: RolloutSample | None) -> None:
    if sample is None or not sample.trajectory_messages:
        return
    from osmosis_ai.rollout.trajectory.convert import convert_sample_to_trajectory
    from osmosis_ai.rollout.trajectory.encode import encode_document

    try:
        trajectory = convert_sample_to_trajectory(
            sample, rollout_id=data.rollout_id, request_metadata=data.metadata
        )
        atomic_write_bytes(path, encode_document(trajectory))
    except (OSError, ValueError) as exc:
        print(f"trajectory not written: {type(exc).__name__}", file=sys.stderr)


def agent_main(
    workflow: type[AgentWorkflow[Any]] | str,
    config: AgentWorkflowConfig | str | None = None,
    *,
    paths: ContainerPaths | None = None,
    write_trajectory: bool = True,
) -> int:
    """Entry point of the agent phase; returns the process exit status (0 on success).

    Reads ``container_input.json`` from the agent logs dir, runs the workflow, and writes
    ``container_result.json`` and (unless ``write_trajectory`` is false) a best-effort ATIF
    ``trajectory.json`` there. Use as ``raise SystemExit(agent_main(MyWorkflow, config))``.
    """
    paths = paths or ContainerPaths.from_env()
    try:
        data = read_input(paths.agent_logs_dir / INPUT_FILE)
        result = asyncio.run(
            run_agent_phase(workflow, config, data, artifacts_dir=paths.artifacts_dir)
        )
    except (ConfigError, OSError) as exc:
        result = _runner_failure(exc)
    write_result(paths.agent_logs_dir / RESULT_FILE, result)
    if write_trajectory and result.sample is not None:
        _write_trajectory(paths.agent_logs_dir / TRAJECTORY_FILE, data, result.sample)
    print(f"Agent runner complete: status={result.status.value}")
    return 0 if result.status is RolloutStatus.SUCCESS else 1


def grader_main(
    grader: type[Grader] | str,
    config: GraderConfig | str | None = None,
    *,
    paths: ContainerPaths | None = None,
) -> int:
    """Entry point of the grader phase; returns the process exit status (0 on success).

    Reads the input (``/tests/container_input.json``, else the agent's), takes the agent
    phase's sample, grades it, and writes ``reward.json`` and ``container_result.json`` to
    the verifier logs dir. A rollout without a sample or a reward gets no reward file (the
    harness then reports why), never a made-up 0.
    """
    paths = paths or ContainerPaths.from_env()
    try:
        data = read_input(paths.tests_dir / INPUT_FILE, paths.agent_logs_dir / INPUT_FILE)
        sample = _agent_sample(paths)
        result = asyncio.run(
            run_grader_phase(grader, config, data, sample, artifacts_dir=paths.artifacts_dir)
        )
    except (ConfigError, OSError) as exc:
        result = _runner_failure(exc)
    write_result(paths.verifier_logs_dir / RESULT_FILE, result)
    reward = result.sample.reward if result.sample is not None else None
    if result.status is RolloutStatus.SUCCESS and reward is not None:
        reward_file = paths.verifier_logs_dir / REWARD_FILE
        atomic_write_bytes(reward_file, json.dumps({"reward": reward}).encode(), durable=False)
        print(f"Grading complete: reward={reward}")
    else:
        print(f"Grading failed: {result.err_message}", file=sys.stderr)
    return 0 if result.status is RolloutStatus.SUCCESS else 1


def _runner_failure(exc: BaseException) -> ContainerResult:
    category = (
        RolloutErrorCategory.VALIDATION_ERROR
        if isinstance(exc, ConfigError)
        else RolloutErrorCategory.INTERNAL_ERROR
    )
    return ContainerResult(
        status=RolloutStatus.FAILURE,
        err_message=f"container runner: {exc}",
        err_category=category,
        diagnostics={"phase": "setup", "exception_type": type(exc).__name__},
    )
