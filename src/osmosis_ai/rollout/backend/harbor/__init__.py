"""``HarborBackend``: each rollout as a Harbor trial (task sandbox, agent, verifier).

Requires the ``harbor`` extra (Python 3.12+). Two tracks:

* **Workflow track** (``agent=`` an ``AgentWorkflow`` class or ``"module:Class"``): the
  project is bundled as a content-addressed wheel (`osmosis_ai.rollout.bundle`) and run in
  the sandbox by `OsmosisHarnessAgent` through the in-container runner, so validation and
  failure categories match in-process execution.
* **Native track** (``agent="mini-swe-agent"``, ``"terminus-2"``, ``"opencode"``,
  ``"oracle"``): Harbor's own agent, pointed at the rollout's model endpoint. ``oracle`` runs
  the task's reference solution and is not trainable (its samples say so).

Reward: a task's own ``tests/test.sh`` wins; otherwise ``grader=`` is bundled into a
generated ``tests/test.sh``; a task with neither has no reward source. After each trial the
rollout key is scrubbed from every file (fail closed), logs go to
``<artifact_root>/<rollout_id>/logs/`` and the sandbox's ``/logs/artifacts`` to
``.../artifacts/``. For Linux machines without Docker, `bubblewrap.BubblewrapEnvironment`
runs trials in bubblewrap sandboxes over the host's userland.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, CredentialScrubError
from osmosis_ai.rollout.backend._file_preview import FilePreviewSource
from osmosis_ai.rollout.backend._once import StartOnce
from osmosis_ai.rollout.backend._relay import serve_tcp_forward
from osmosis_ai.rollout.backend.base import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    backend_failure,
)
from osmosis_ai.rollout.backend.harbor import _docker, _tasks
from osmosis_ai.rollout.backend.harbor._archive import keep_trial_files, scrub_tree
from osmosis_ai.rollout.backend.spec import project_root
from osmosis_ai.rollout.bundle import Bundle, build_bundle
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.container import (
    INPUT_FILE,
    RESULT_FILE,
    ContainerInput,
    read_result,
)
from osmosis_ai.rollout.context import RolloutContext, current_redactor, get_rollout_context
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.spec import GraderRef, RolloutSpec, WorkflowRef, spec_argument
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus

import_optional("harbor", extra="harbor", feature="HarborBackend")

from harbor import TrialEvent, TrialQueue  # noqa: E402
from harbor.models.trial.config import (  # noqa: E402
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)

from osmosis_ai.rollout.backend.harbor.harness import AGENT_LOG, HARNESS_AGENT  # noqa: E402

__all__ = ["HarborBackend", "NativeAgent", "TaskMode"]

logger = logging.getLogger(__name__)

NativeAgent = Literal["terminus-2", "mini-swe-agent", "opencode", "oracle"]
TaskMode = _tasks.TaskMode
_NATIVE: frozenset[str] = frozenset({"terminus-2", "mini-swe-agent", "opencode", "oracle"})
_HOST_AGENTS = {
    "mini-swe-agent": "osmosis_ai.rollout.backend.harbor.bubblewrap:HostMiniSweAgent",
}
_BUBBLEWRAP = "osmosis_ai.rollout.backend.harbor.bubblewrap:BubblewrapEnvironment"
_PREVIEW_FILES = {
    None: "osmosis-preview.json",  # the workflow track's in-container runner
    "mini-swe-agent": "mini-swe-agent.trajectory.json",
}
_TAIL_CHARS = 2000


@dataclass
class _Rollout:
    """What the queue's hooks need to find for a trial."""

    context: RolloutContext | None
    started: bool = False


@dataclass
class _Paths:
    staging: Path
    trial: Path
    input_file: Path = field(init=False)
    verified: bool = False
    """Whether the trial runs a verifier (the task's tests or the bundled grader)."""

    def __post_init__(self) -> None:
        self.input_file = self.staging / INPUT_FILE


class HarborBackend(ExecutionBackend):
    """Runs each rollout as a Harbor trial (see the module).

    Args:
        tasks_dir: The template task (template mode) or a directory of tasks (dataset mode).
        spec: The workflow track's workflow, grader and configs as a `RolloutSpec` (instead
            of ``agent=``, ``grader=`` and the configs); with a native ``agent``, a spec
            without a workflow carries its grader.
        agent: An ``AgentWorkflow`` class or ``"module:Class"`` (workflow track), or a
            native agent name (``mini-swe-agent``, ``terminus-2``, ``opencode``, ``oracle``).
        grader: A ``Grader`` class or import path, run by the verifier when the task has no
            ``tests/test.sh`` of its own.
        workflow_config: Config of the workflow (bundled as JSON).
        grader_config: Config of the grader (bundled as JSON).
        native_agent_kwargs: Harbor kwargs of a native agent (refused for workflows).
        task_mode: ``template`` (prompt becomes the instruction) or ``dataset``
            (``metadata["harbor_task_id"]`` picks a task, which keeps its instruction).
        model_name: Model id given to native agents (``metadata["harbor_model"]`` overrides).
        environment_config: Harbor ``EnvironmentConfig`` (deep-copied per trial); default
            Harbor's Docker environment.
        orchestrator: A Harbor ``TrialQueue``; default one with ``n_concurrent`` slots.
        n_concurrent: Trials at once when this backend builds the queue.
        trials_dir: Harbor's trial output; default a directory under the system temp dir.
        cleanup_successful_trials: Delete a clean trial's directory once archived.
        max_queue_depth: Rollouts waiting for a trial slot before ``has_capacity()`` is
            false (the server then answers 429); ``None`` = unbounded.
        code_dir: The project to bundle; default the directory the workflow (or grader)
            is imported from.
        container_python: The interpreter with ``osmosis-ai`` inside the sandbox.
        artifact_root: Root of per-rollout directories (default as for `LocalBackend`).
        preview_interval_sec: How often the in-container runner writes its preview window.
        docker_bridge: With Harbor's Docker environment on Linux, the bridge through which a
            loopback chat endpoint is forwarded to containers.

    Raises:
        ConfigError: Bad arguments (named in the message).
    """

    reports_progress = True

    def __init__(
        self,
        *,
        tasks_dir: Path | str,
        spec: RolloutSpec | None = None,
        agent: WorkflowRef | None = None,
        grader: GraderRef | None = None,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader_config: GraderConfig | str | None = None,
        native_agent_kwargs: dict[str, Any] | None = None,
        task_mode: TaskMode = "template",
        model_name: str = "openai/osmosis-rollout",
        environment_config: EnvironmentConfig | None = None,
        orchestrator: TrialQueue | None = None,
        n_concurrent: int = 4,
        trials_dir: Path | str | None = None,
        cleanup_successful_trials: bool = True,
        max_queue_depth: int | None = None,
        code_dir: Path | str | None = None,
        container_python: str = "python3",
        artifact_root: Path | str | None = None,
        preview_interval_sec: float = 3.0,
        docker_bridge: str = "docker0",
    ) -> None:
        self.tasks_dir = Path(tasks_dir).expanduser().resolve()
        if not self.tasks_dir.is_dir():
            raise ConfigError(f"tasks_dir {self.tasks_dir} is not a directory")
        if task_mode not in ("template", "dataset"):
            raise ConfigError(f"task_mode must be 'template' or 'dataset', got {task_mode!r}")
        if max_queue_depth is not None and max_queue_depth < 1:
            raise ConfigError(f"max_queue_depth must be at least 1 or None, got {max_queue_depth}")
        self.native: str | None = agent if isinstance(agent, str) and agent in _NATIVE else None
        if self.native is None and native_agent_kwargs:
            raise ConfigError(
                "native_agent_kwargs applies to native agents only "
                f"({', '.join(sorted(_NATIVE))}); configure a workflow with workflow_config"
            )
        self.spec = spec_argument(
            spec,
            workflow=None if self.native else agent,
            workflow_config=workflow_config,
            grader=grader,
            grader_config=grader_config,
            workflow_label="agent",
            require_workflow=self.native is None,
        )
        if self.native is not None and self.spec.workflow is not None:
            raise ConfigError(
                f"agent={self.native!r} is a native agent; the spec must not name a workflow"
            )
        if self.native == "oracle":
            logger.warning(
                "agent='oracle' runs the task's reference solution: its samples are not "
                "trainable (no model calls); use it to check tasks and graders"
            )
        self.native_agent_kwargs = dict(native_agent_kwargs or {})
        self.task_mode: TaskMode = task_mode
        self.model_name = model_name
        self.environment_config = environment_config or EnvironmentConfig()
        self.cleanup_successful_trials = cleanup_successful_trials
        self.max_queue_depth = max_queue_depth
        self.container_python = container_python
        self.preview_interval_sec = preview_interval_sec
        self.docker_bridge = docker_bridge
        self._forwards: dict[tuple[str, int], asyncio.Server] = {}
        self._code_dir = Path(code_dir).resolve() if code_dir else None
        self._trials_dir = Path(trials_dir) if trials_dir else None
        self._artifact_root = artifact_root
        self._queue = orchestrator or TrialQueue(n_concurrent=n_concurrent)
        self._queue.add_hook(TrialEvent.START, self._on_start)
        self._queue.add_hook(TrialEvent.VERIFICATION_START, self._on_verification)
        self._rollouts: dict[str, _Rollout] = {}
        self._bundle: Bundle | None = None
        self._start_once = StartOnce(lambda: asyncio.to_thread(self._start_blocking))

    @property
    def artifact_root(self) -> Path:
        from osmosis_ai.rollout.storage import default_artifact_root

        root = self._artifact_root
        return Path(root).expanduser() if root else default_artifact_root()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Build the bundle (workflow track, or a grader) and the trials directory."""
        await self._start_once()

    def _start_blocking(self) -> None:
        if self._trials_dir is None:
            self._trials_dir = Path(
                tempfile.mkdtemp(prefix=f"osmosis-harbor-{self.tasks_dir.name}-")
            )
        (self._trials_dir / "rollouts").mkdir(parents=True, exist_ok=True)
        if self.native is not None:
            # Native agents run in this process and import LiteLLM when a trial builds
            # them; without this it fetches its cost map from the internet.
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        owner = self.spec.workflow or self.spec.grader
        if owner is not None:
            self._bundle = build_bundle(self.spec, project=self._code_dir or project_root(owner))

    async def shutdown(self) -> None:
        """Stop the loopback forwarders (Docker on Linux)."""
        forwards, self._forwards = self._forwards, {}
        for server in forwards.values():
            server.close()

    def _uses_docker_on_linux(self) -> bool:
        config = self.environment_config
        kind = getattr(config.type, "value", config.type)
        return sys.platform == "linux" and config.import_path is None and kind in (None, "docker")

    async def _reachable_url(self, url: str) -> str:
        """The chat URL as the sandbox must use it (a loopback gateway forwarded to Docker)."""
        if not (url and _tasks.is_loopback_url(url) and self._uses_docker_on_linux()):
            return url
        parts = urlsplit(url)
        target = (parts.hostname or "127.0.0.1", parts.port or 80)
        server = self._forwards.get(target)
        if server is None:
            listen = await asyncio.to_thread(_docker.bridge_address, self.docker_bridge)
            server = await serve_tcp_forward(listen, *target)
            self._forwards[target] = server
        return _docker.container_url(url, server.sockets[0].getsockname()[1])

    # -- ExecutionBackend ----------------------------------------------------------------

    def has_capacity(self) -> bool:
        """False when ``max_queue_depth`` rollouts wait for a trial slot."""
        if self.max_queue_depth is None:
            return True
        return self._queued() < self.max_queue_depth

    def _queued(self) -> int:
        return sum(1 for r in self._rollouts.values() if not r.started)

    def health(self) -> dict[str, Any]:
        running = len(self._rollouts) - self._queued()
        return {
            "status": "ok",
            "harbor": {
                "queued": self._queued(),
                "running": running,
                "max_queue_depth": self.max_queue_depth,
                "agent": self.native or "workflow",
            },
        }

    async def _on_start(self, event: Any) -> None:
        rollout = self._rollouts.get(event.trial_name)
        if rollout is not None:
            rollout.started = True
            if rollout.context is not None:
                rollout.context.set_status(RolloutStatus.RUNNING)

    async def _on_verification(self, event: Any) -> None:
        rollout = self._rollouts.get(event.trial_name)
        if rollout is not None and rollout.context is not None:
            rollout.context.set_status(RolloutStatus.GRADING)

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the rollout as a trial and turn its result into both phases' results."""
        submitted_at = time.monotonic()
        await self.start()
        assert self._trials_dir is not None
        context = get_rollout_context()
        trial_name = f"trial-{request.id}"
        paths = _Paths(
            staging=Path(
                await asyncio.to_thread(
                    tempfile.mkdtemp, prefix=f"{request.id}-", dir=self._trials_dir / "rollouts"
                )
            ),
            trial=self._trials_dir / trial_name,
        )
        self._rollouts[trial_name] = _Rollout(context)
        key = context.api_key if context is not None else None
        try:
            try:
                url = await self._reachable_url(context.chat_completions_url if context else "")
                config = await asyncio.to_thread(
                    self._trial_config, request, url, key, paths, submitted_at
                )
            except ConfigError as exc:
                return ExecutionOutcome(workflow=_failure("setup", str(exc), _VALIDATION))
            preview = _PREVIEW_FILES.get(self.native)
            if context is not None and preview is not None and context.sample_source is None:
                context.set_sample_source(FilePreviewSource(paths.trial / "agent" / preview))
            result = await self._queue.submit(config)
        finally:
            self._rollouts.pop(trial_name, None)
            # Also on cancellation: the staging copy goes, the key leaves the trial's files.
            scrubbed = asyncio.ensure_future(asyncio.to_thread(self._tidy, paths, key))
            try:
                await asyncio.shield(scrubbed)
            except CredentialScrubError as exc:
                scrub_error: CredentialScrubError | None = exc
            else:
                scrub_error = None
        if scrub_error is not None:
            return ExecutionOutcome(workflow=_failure("archive", str(scrub_error), _INTERNAL))
        outcome = await asyncio.to_thread(self._outcome, request, result, paths)
        _redact(outcome, key)
        await asyncio.shield(asyncio.to_thread(self._archive, request.id, paths, outcome))
        return outcome

    # -- before the trial ----------------------------------------------------------------

    def _trial_config(
        self,
        request: ExecutionRequest,
        url: str,
        key: str | None,
        paths: _Paths,
        submitted_at: float,
    ) -> Any:
        key = key or "dummy"
        if not url and self.native != "oracle":
            raise ConfigError("this rollout has no chat_completions_url; the agent needs one")
        task = _tasks.materialize(
            _tasks.select_task(self.tasks_dir, self.task_mode, request.metadata), paths.staging
        )
        if self.task_mode == "template" and "harbor_task" not in (request.metadata or {}):
            _tasks.write_instruction(task, request.prompt)
        if request.grade and self.spec.grader is not None and not _tasks.has_own_tests(task):
            assert self._bundle is not None
            grader_input = ContainerInput.from_request(request, include_label=True)
            _tasks.write_grader_tests(
                task, self._bundle, grader_input.model_dump_json().encode(), self.container_python
            )
        paths.verified = request.grade and _tasks.has_own_tests(task)
        environment = copy.deepcopy(self.environment_config)
        if _hostname(url) == "host.docker.internal" and self._uses_docker_on_linux():
            overlay = paths.staging / "osmosis-host-gateway.yaml"
            overlay.write_text(_docker.COMPOSE_OVERLAY)
            environment.extra_docker_compose.append(overlay)
        agent = self._agent_config(request, url, key, paths)
        elapsed = time.monotonic() - submitted_at
        if request.agent_timeout_sec is not None:
            agent.override_timeout_sec = max(request.agent_timeout_sec - elapsed, 0.001)
        to_environment, to_agent = _tasks.allowlist_hosts(task, url)
        host = _hostname(url)
        if to_environment and host not in environment.extra_allowed_hosts:
            environment.extra_allowed_hosts.append(host)
        if to_agent and host not in agent.extra_allowed_hosts:
            agent.extra_allowed_hosts.append(host)
        return TrialConfig(
            task=TaskConfig(path=task),
            trial_name=paths.trial.name,
            trials_dir=paths.trial.parent,
            agent=agent,
            environment=environment,
            verifier=VerifierConfig(
                disable=not paths.verified, override_timeout_sec=request.grader_timeout_sec
            ),
        )

    def _agent_config(self, request: ExecutionRequest, url: str, key: str, paths: _Paths) -> Any:
        metadata = request.metadata or {}
        model = str(metadata.get("harbor_model") or self.model_name)
        if self.native is None:
            assert self._bundle is not None
            # The key reaches the sandbox through the agent's environment, never a file.
            data = ContainerInput.from_request(
                request,
                include_label=False,  # agents never see the ground truth
                preview_path=f"/logs/agent/{_PREVIEW_FILES[None]}",
                preview_interval_sec=self.preview_interval_sec,
            )
            paths.input_file.write_bytes(data.model_dump_json().encode())
            return AgentConfig(
                import_path=HARNESS_AGENT,
                kwargs={
                    "bundle_wheel": str(self._bundle.wheel),
                    "bundle_package": self._bundle.package,
                    "input_file": str(paths.input_file),
                    "python": self.container_python,
                },
                env=_endpoint_env(url, key, request.id),
            )
        if self.native == "oracle":
            return AgentConfig(name="oracle")
        kwargs = copy.deepcopy(self.native_agent_kwargs)
        env: dict[str, str] = {}
        if self.native == "terminus-2":
            llm_kwargs = {**kwargs.get("llm_kwargs", {}), "api_key": key}
            kwargs.update(api_base=url, llm_kwargs=llm_kwargs)  # the endpoint wins
        else:  # mini-swe-agent and opencode read OpenAI-style variables
            env = {
                "OPENAI_API_BASE": url,
                "OPENAI_BASE_URL": url,
                "OPENAI_API_KEY": key,
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network at import
            }
        host_agent = (
            _HOST_AGENTS.get(self.native)
            if self.environment_config.import_path == _BUBBLEWRAP
            else None
        )
        return AgentConfig(
            name=None if host_agent else self.native,
            import_path=host_agent,
            model_name=model,
            kwargs=kwargs,
            env=env,
        )

    # -- after the trial -----------------------------------------------------------------

    def _outcome(self, request: ExecutionRequest, result: Any, paths: _Paths) -> ExecutionOutcome:
        diagnostics = _diagnostics(result)
        workflow = self._workflow_result(request, result, paths, diagnostics)
        if workflow.sample is not None:
            _add_trial_metrics(workflow.sample, result)
            if workflow.sample.label is None:
                workflow.sample.label = request.label
        if not workflow.ok or not request.grade:
            return ExecutionOutcome(workflow=workflow)
        return ExecutionOutcome(
            workflow=workflow, grader=_grader_result(result, paths, workflow, diagnostics)
        )

    def _workflow_result(
        self, request: ExecutionRequest, result: Any, paths: _Paths, diagnostics: dict[str, Any]
    ) -> ExecutionResult:
        error = result.exception_info
        agent_dir = paths.trial / "agent"
        if error is not None and _before_verifier(result):
            category = _TIMEOUT if error.exception_type == "AgentTimeoutError" else _AGENT
            message = f"agent phase failed in Harbor: {error.exception_type}: "
            message += error.exception_message.strip()[:_TAIL_CHARS]
            failure = _failure("agent", message, category, diagnostics)
            failure.sample = self._native_sample(agent_dir) if self.native else None
            return failure
        if self.native is not None:
            sample = self._native_sample(agent_dir)
            if sample is None:
                return _failure(
                    "agent", "the native agent left no trajectory.json", _AGENT, diagnostics
                )
            return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)
        container = read_result(agent_dir / RESULT_FILE)
        if container is None:
            tail = _tail(agent_dir / AGENT_LOG)
            return _failure(
                "agent",
                "the workflow's container runner wrote no result (it crashed, or the image "
                f"lacks {self.container_python} with osmosis-ai)",
                _AGENT,
                {**diagnostics, "output_tail": tail},
            )
        phase = container.to_execution_result()
        phase.extra_fields = {**diagnostics, **(phase.extra_fields or {})}
        return phase

    def _native_sample(self, agent_dir: Path) -> RolloutSample | None:
        if self.native == "oracle":
            return RolloutSample(trajectory_messages=None, extra_fields={"trainable": False})
        from osmosis_ai.rollout.trajectory.convert import messages_from_trajectory

        try:
            document = _read_json(agent_dir / "trajectory.json")
            messages = messages_from_trajectory(document)
        except (OSError, ValueError, TypeError, KeyError):
            return None
        return RolloutSample(messages=messages)

    def _tidy(self, paths: _Paths, key: str | None) -> None:
        """Remove the staging copy; scrub the key from the trial (also when cancelled)."""
        shutil.rmtree(paths.staging, ignore_errors=True)
        if key:
            scrub_tree(paths.trial, [key])

    def _archive(self, rollout_id: str, paths: _Paths, outcome: ExecutionOutcome) -> None:
        if not paths.trial.exists():
            return
        rollout_dir = self.artifact_root / rollout_id
        rollout_dir.mkdir(parents=True, exist_ok=True)
        keep_trial_files(paths.trial, rollout_dir)
        if self.cleanup_successful_trials and outcome.result.ok:
            shutil.rmtree(paths.trial, ignore_errors=True)


_AGENT = RolloutErrorCategory.AGENT_ERROR
_TIMEOUT = RolloutErrorCategory.TIMEOUT
_VALIDATION = RolloutErrorCategory.VALIDATION_ERROR
_INTERNAL = RolloutErrorCategory.INTERNAL_ERROR


def _endpoint_env(url: str, key: str, rollout_id: str) -> dict[str, str]:
    return {
        "OSMOSIS_CHAT_COMPLETIONS_URL": url,
        "OSMOSIS_API_KEY": key,
        "OSMOSIS_ROLLOUT_ID": rollout_id,
    }


def _hostname(url: str) -> str:
    return urlsplit(url).hostname or ""


def _before_verifier(result: Any) -> bool:
    """Whether the trial's exception happened before its verifier started."""
    error = result.exception_info
    verifier = result.verifier
    if verifier is None or verifier.started_at is None:
        return True
    return bool(error.occurred_at < verifier.started_at)


def _grader_result(
    result: Any, paths: _Paths, workflow: ExecutionResult, diagnostics: dict[str, Any]
) -> ExecutionResult:
    sample = workflow.sample
    rewards = result.verifier_result.rewards if result.verifier_result is not None else None
    error = result.exception_info
    if rewards is None or "reward" not in (rewards or {}):
        if not paths.verified:
            failure = _failure(
                "grading",
                "the task has no reward source: it has no tests/test.sh and the backend no "
                "grader (pass grader=..., add tests/test.sh, or send grade=false)",
                _VALIDATION,
                diagnostics,
            )
        elif error is not None and error.exception_type == "VerifierTimeoutError":
            failure = _failure("verifier", "grader exceeded its deadline", _TIMEOUT, diagnostics)
        else:
            graded = read_result(paths.trial / "verifier" / RESULT_FILE)
            message = (
                graded.err_message
                if graded is not None and graded.err_message
                else "the verifier wrote no reward (reward.json or reward.txt)"
            )
            tail = _tail(paths.trial / "verifier" / "test-stdout.txt")
            category = graded.err_category if graded and graded.err_category else _VALIDATION
            failure = _failure("grading", message, category, {**diagnostics, "output_tail": tail})
        failure.sample = sample
        return failure
    graded = read_result(paths.trial / "verifier" / RESULT_FILE)
    if graded is not None and graded.sample is not None:
        graded.sample.metrics = {**(sample.metrics if sample else {}), **graded.sample.metrics}
        graded.sample.label = graded.sample.label or (sample.label if sample else None)
        sample = graded.sample
    if sample is None:
        sample = RolloutSample(trajectory_messages=None)
    try:
        sample.reward = float(rewards["reward"])
    except (TypeError, ValueError):
        return _failure("grading", "the verifier's reward is not a number", _VALIDATION)
    return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)


def _redact(outcome: ExecutionOutcome, key: str | None) -> None:
    """Messages and output tails come from inside the sandbox: scrub them like files."""
    redactor = current_redactor().with_secrets(*([key] if key else []))
    for phase in (outcome.workflow, outcome.grader):
        if phase is None:
            continue
        if phase.err_message:
            phase.err_message = redactor.text(phase.err_message)
        extra = phase.extra_fields or {}
        if isinstance(extra.get("output_tail"), str):
            extra["output_tail"] = redactor.text(extra["output_tail"])


def _add_trial_metrics(sample: RolloutSample, result: Any) -> None:
    context = result.agent_result
    if context is None:
        return
    for name, value in (
        ("input_tokens", context.n_input_tokens),
        ("cached_tokens", context.n_cache_tokens),
        ("output_tokens", context.n_output_tokens),
        ("cost_usd", context.cost_usd),
    ):
        if value is not None:
            sample.metrics.setdefault(name, value)


def _diagnostics(result: Any) -> dict[str, Any]:
    timings: dict[str, float] = {}
    for name in ("environment_setup", "agent_setup", "agent_execution", "verifier"):
        span = getattr(result, name, None)
        if span is not None and span.started_at and span.finished_at:
            timings[name] = round((span.finished_at - span.started_at).total_seconds(), 2)
    diagnostics: dict[str, Any] = {"backend": "harbor", "timings_sec": timings}
    if result.exception_info is not None:
        diagnostics["harbor_exception_type"] = result.exception_info.exception_type
    return diagnostics


def _failure(
    phase: str,
    message: str,
    category: RolloutErrorCategory,
    diagnostics: dict[str, Any] | None = None,
) -> ExecutionResult:
    logger.warning("%s", message)
    return backend_failure("harbor", phase, message, category, diagnostics)


def _read_json(path: Path) -> Any:
    import json

    return json.loads(path.read_bytes())


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-_TAIL_CHARS:].decode(errors="replace")
    return ""
