"""``ProcessBackend``: every rollout's workflow and grader in a fresh child process.

In-process execution cannot stop code that blocks or ignores cancellation, nor contain code
that crashes the interpreter or writes all over the host. Here each phase of each rollout
runs in its own process (its own process group) through the in-container runner contract
(`osmosis_ai.rollout.container`):

* **Hard deadlines**: when a phase's deadline passes (plus a short grace for the child's own
  clean timeout), the whole process group is killed and the rollout reports ``timeout``.
* **Crash isolation**: a segfault, ``os._exit`` or out-of-memory kill fails that rollout
  alone, naming the exit cause; its output is in the diagnostics (redacted).
* **Memory cap**: ``RLIMIT_AS`` per child.
* **Sandbox** (Linux, ``sandbox=True``): bubblewrap with a read-only host userland, a
  private ``/tmp``, only the rollout's artifacts dir writable, separate PID/IPC/UTS
  namespaces, and no network except a relay to the model gateway.

Without a sandbox, children are forked from a warm pool that has imported the workflow
already, so a rollout costs a ``fork()`` rather than an interpreter start; with one, each
phase starts a fresh interpreter inside its own sandbox. Live previews flow from the child
through a file in the rollout's private directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import urlsplit

from osmosis_ai.errors import ConfigError, RolloutFailure
from osmosis_ai.rollout._artifacts import create_artifacts_dir
from osmosis_ai.rollout._failures import user_code_error
from osmosis_ai.rollout.backend._file_preview import FilePreviewSource
from osmosis_ai.rollout.backend._limiter import ConcurrencyLimiter
from osmosis_ai.rollout.backend._once import StartOnce
from osmosis_ai.rollout.backend.base import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    backend_failure,
)
from osmosis_ai.rollout.backend.process._child import GATEWAY_SOCKET_ENV
from osmosis_ai.rollout.backend.process._launch import ColdLauncher, Exit, PoolLauncher
from osmosis_ai.rollout.backend.process._sandbox import Network, bwrap_command, check_bwrap
from osmosis_ai.rollout.backend.spec import dump_spec, source_paths
from osmosis_ai.rollout.container import (
    AGENT_LOGS_DIR_ENV,
    ARTIFACTS_DIR_ENV,
    INPUT_FILE,
    MEMORY_LIMIT_ENV,
    RESULT_FILE,
    TESTS_DIR_ENV,
    VERIFIER_LOGS_DIR_ENV,
    ContainerInput,
    read_result,
)
from osmosis_ai.rollout.context import (
    ENV_API_KEY,
    ENV_CHAT_COMPLETIONS_URL,
    ENV_ROLLOUT_ID,
    RolloutContext,
    current_redactor,
    get_rollout_context,
)
from osmosis_ai.rollout.spec import RolloutSpec, SpecKeywords, spec_argument
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.storage import default_artifact_root
from osmosis_ai.rollout.trajectory.preview import PREVIEW_INTERVAL_SEC

__all__ = ["ProcessBackend"]

logger = logging.getLogger(__name__)

_LOG_TAIL_CHARS = 4000
_REAP_TIMEOUT_SEC = 5.0
_PREVIEW_FILE = "preview.json"


class ProcessBackend(ExecutionBackend):
    """Runs each rollout's workflow and grader in fresh child processes.

    Takes `LocalBackend`'s arguments (a `RolloutSpec`, or ``workflow=``... validated the
    same way, at construction; classes must be defined at module level and configs must
    survive a JSON round trip) plus:

    Args:
        sandbox: Run each phase inside bubblewrap (Linux; needs the ``bwrap`` program).
        network: In the sandbox: ``"gateway"`` (default; only the rollout's model endpoint
            is reachable), ``"none"`` or ``"host"``.
        warm_pool: Fork children from a warm pool process (default: on without a sandbox;
            not available with one, since each sandbox must be built around a fresh process).
        memory_limit_mb: Address-space cap of each child (``RLIMIT_AS``); ``None`` = none.
        max_processes: Children alive at once; beyond it ``has_capacity()`` is false and
            the server answers 429. Default: the workflow config's ``max_concurrent``, else
            four per CPU.
        kill_grace_sec: After a phase's deadline, how long the child may take to report its
            own timeout before its process group is killed.
        preview_interval_sec: How often a child looks at its live preview window.
        python: Interpreter of the children (default: this one).
    """

    reports_progress = True

    def __init__(
        self,
        spec: RolloutSpec | None = None,
        *,
        artifact_root: Path | str | None = None,
        sandbox: bool = False,
        network: Network = "gateway",
        warm_pool: bool | None = None,
        memory_limit_mb: int | None = 4096,
        max_processes: int | None = None,
        kill_grace_sec: float = 0.5,
        preview_interval_sec: float = PREVIEW_INTERVAL_SEC,
        python: str | None = None,
        **refs: Unpack[SpecKeywords],
    ) -> None:
        self.spec = spec_argument(spec, require_workflow=True, **refs)
        self.artifact_root = (
            Path(artifact_root).expanduser() if artifact_root else default_artifact_root()
        )
        self._spec_json = dump_spec(self.spec)
        if network not in ("gateway", "none", "host"):
            raise ConfigError(f"network must be 'gateway', 'none' or 'host', got {network!r}")
        if warm_pool is None:
            warm_pool = not sandbox
        if warm_pool and sandbox:
            raise ConfigError(
                "warm_pool=True cannot be combined with sandbox=True: each sandbox is built "
                "around a fresh interpreter; drop one of them"
            )
        if memory_limit_mb is not None and memory_limit_mb < 64:
            raise ConfigError(f"memory_limit_mb must be at least 64 or None, got {memory_limit_mb}")
        if kill_grace_sec < 0:
            raise ConfigError(f"kill_grace_sec must not be negative, got {kill_grace_sec}")
        self.sandbox = sandbox
        self.network: Network = network
        self.warm_pool = warm_pool
        self.memory_limit_mb = memory_limit_mb
        self.kill_grace_sec = kill_grace_sec
        self.preview_interval_sec = preview_interval_sec
        self._python = python or sys.executable
        self._bwrap = check_bwrap() if sandbox else None
        limit = max_processes or self.spec.max_concurrent or 4 * (os.cpu_count() or 1)
        self._limiter = ConcurrencyLimiter(limit)
        self._root: Path | None = None
        self._launcher: PoolLauncher | ColdLauncher | None = None
        self._start_once = StartOnce(self._start)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Create the private working directory and, with ``warm_pool``, start the pool.

        Raises:
            RolloutFailure: The pool could not import the workflow.
        """
        await self._start_once()

    async def _start(self) -> None:
        if self._root is None:
            self._root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="osmosis-process-"))
            await asyncio.to_thread((self._root / "spec.json").write_bytes, self._spec_json)
            await asyncio.to_thread((self._root / "rollouts").mkdir)
        spec_path = self._root / "spec.json"
        if self.warm_pool:
            self._launcher = PoolLauncher(spec_path, self._python)
        else:
            self._launcher = ColdLauncher(spec_path, self._python, self._wrap)
        await self._launcher.start()

    async def shutdown(self) -> None:
        """Stop the pool (killing any child) and remove the private working directory."""
        launcher, self._launcher = self._launcher, None
        self._start_once.reset()
        if launcher is not None:
            await launcher.close()
        root, self._root = self._root, None
        if root is not None:
            await asyncio.to_thread(shutil.rmtree, root, True)

    def _wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        if self._bwrap is None:
            return argv
        assert self._root is not None
        # The interpreter and the code it imports stay visible even under the private /tmp.
        readable = [
            self._root / "spec.json",
            Path(sys.prefix),
            Path(sys.base_prefix),
            Path(self._python).parent,
            *source_paths(self._spec_json),
        ]
        writable = [Path(env[AGENT_LOGS_DIR_ENV]).parent, Path(env[ARTIFACTS_DIR_ENV])]
        return bwrap_command(
            self._bwrap, argv, writable=writable, readable=readable, network=self.network
        )

    # -- ExecutionBackend ----------------------------------------------------------------

    def has_capacity(self) -> bool:
        """False when ``max_processes`` children are running."""
        return self._limiter.has_free_slot()

    def health(self) -> dict[str, Any]:
        """Capacity, and how children start (pool or cold, sandboxed or not)."""
        launcher = self._launcher.health() if self._launcher else {"mode": "not started"}
        return {
            "status": "ok",
            "concurrency": self._limiter.snapshot(),
            "process": {**launcher, "sandbox": self.sandbox},
        }

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the workflow, then (when asked) the grader, each in a fresh child process."""
        submitted_at = time.monotonic()
        await self.start()
        await self._limiter.acquire()
        try:
            return await self._execute(request, submitted_at)
        finally:
            self._limiter.release()

    async def _execute(self, request: ExecutionRequest, submitted_at: float) -> ExecutionOutcome:
        context = get_rollout_context()
        run = await self._open_run(request, context)
        try:
            if context is not None:
                context.set_status(RolloutStatus.RUNNING)
                if context.sample_source is None:
                    context.set_sample_source(FilePreviewSource(run.dir / _PREVIEW_FILE))
            elapsed = time.monotonic() - submitted_at
            agent_input = ContainerInput.from_request(
                request,
                include_label=False,  # agents never see the ground truth
                preview_path=str(run.dir / _PREVIEW_FILE),
                preview_interval_sec=self.preview_interval_sec,
                elapsed_sec=elapsed,  # counts against the child's own deadline
            )
            limit = request.agent_timeout_sec
            budget = None if limit is None else max(limit - elapsed, 0.0)
            workflow = await self._phase(run, "agent", agent_input, limit, budget)
            _label(workflow, request)
            if not workflow.ok or not request.grade or self.spec.grader is None:
                return ExecutionOutcome(workflow=workflow)
            if context is not None:
                context.set_status(RolloutStatus.GRADING)
            limit = request.grader_timeout_sec
            grader_input = ContainerInput.from_request(request, include_label=True)
            grader = await self._phase(run, "grader", grader_input, limit, limit)
            _label(grader, request)
            return ExecutionOutcome(workflow=workflow, grader=grader)
        finally:
            await run.close()

    async def _open_run(self, request: ExecutionRequest, context: RolloutContext | None) -> _Run:
        assert self._root is not None
        directory = Path(
            await asyncio.to_thread(
                tempfile.mkdtemp, prefix=f"{request.id}-", dir=self._root / "rollouts"
            )
        )
        run = _Run(directory, request.id, context)
        try:
            artifacts = await create_artifacts_dir(self.artifact_root, request.id)
            run.artifacts_dir = artifacts or directory / "artifacts"
            await asyncio.to_thread(run.make_dirs)
            if self.sandbox and self.network == "gateway":
                await run.relay_gateway()
        except BaseException:
            await run.close()
            raise
        return run

    async def _phase(
        self,
        run: _Run,
        phase: str,
        data: ContainerInput,
        limit: float | None,
        budget: float | None,
    ) -> ExecutionResult:
        logs = run.dir / ("agent" if phase == "agent" else "verifier")
        input_dir = run.dir / ("agent" if phase == "agent" else "tests")
        await asyncio.to_thread(
            (input_dir / INPUT_FILE).write_bytes, data.model_dump_json().encode()
        )
        env = run.env()
        if self.memory_limit_mb is not None:
            env[MEMORY_LIMIT_ENV] = str(self.memory_limit_mb * 2**20)
        assert self._launcher is not None
        log = run.dir / f"{phase}.log"
        try:
            child = await self._launcher.launch(phase, env, log)
        except RolloutFailure as exc:
            return _failure(phase, str(exc), RolloutErrorCategory.INTERNAL_ERROR, {})
        try:
            if budget is None:
                ended = await child.wait()
            else:
                async with asyncio.timeout(budget + self.kill_grace_sec):
                    ended = await child.wait()
        except TimeoutError:
            await _kill_and_reap(child)
            return _failure(
                phase,
                f"{'workflow' if phase == 'agent' else 'grader'} exceeded its {limit:g}s "
                "deadline; its process did not stop and was killed",
                RolloutErrorCategory.TIMEOUT,
                {"killed": True},
            )
        except asyncio.CancelledError:
            await asyncio.shield(_kill_and_reap(child))
            raise
        except RolloutFailure as exc:  # the pool died under the child
            return _failure(phase, str(exc), RolloutErrorCategory.INTERNAL_ERROR, {})
        result = await asyncio.to_thread(read_result, logs / RESULT_FILE)
        if result is not None:
            return result.to_execution_result()
        return await self._crash(run, phase, ended, log)

    async def _crash(self, run: _Run, phase: str, ended: Exit, log: Path) -> ExecutionResult:
        tail = await asyncio.to_thread(_tail, log)
        redactor = current_redactor().with_secrets(*([run.api_key] if run.api_key else []))
        name = "workflow" if phase == "agent" else "grader"
        message = f"{name} process {ended.describe()} before writing its result"
        if ended.code is not None:
            message += " (os._exit(), or a crash in native code)"
        if self.memory_limit_mb is not None and "MemoryError" in tail:
            message += f"; it ran out of memory under its {self.memory_limit_mb} MiB cap"
        details: dict[str, Any] = {"exit_code": ended.code, "signal": ended.signal}
        details["output_tail"] = redactor.text(tail)
        return _failure(phase, message, user_code_error(name), details)


@dataclass
class _Run:
    """One rollout's private directory (0700) and what lives with it."""

    dir: Path
    rollout_id: str
    context: RolloutContext | None
    artifacts_dir: Path | None = None
    relay: asyncio.Server | None = None

    @property
    def api_key(self) -> str | None:
        return self.context.api_key if self.context is not None else None

    @property
    def url(self) -> str:
        return self.context.chat_completions_url if self.context is not None else ""

    def make_dirs(self) -> None:
        for name in ("agent", "verifier", "tests"):
            (self.dir / name).mkdir()
        assert self.artifacts_dir is not None
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)

    async def relay_gateway(self) -> None:
        from osmosis_ai.rollout.backend._relay import serve_gateway_socket

        parts = urlsplit(self.url)
        if not parts.hostname:
            return
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = str(self.dir / "gateway.sock")
        self.relay = await serve_gateway_socket(path, parts.hostname, port)

    def env(self) -> dict[str, str]:
        assert self.artifacts_dir is not None
        env = {
            ENV_CHAT_COMPLETIONS_URL: self.url,
            ENV_API_KEY: self.api_key or "",
            ENV_ROLLOUT_ID: self.rollout_id,
            AGENT_LOGS_DIR_ENV: str(self.dir / "agent"),
            VERIFIER_LOGS_DIR_ENV: str(self.dir / "verifier"),
            TESTS_DIR_ENV: str(self.dir / "tests"),
            ARTIFACTS_DIR_ENV: str(self.artifacts_dir),
        }
        if self.relay is not None:
            env[GATEWAY_SOCKET_ENV] = str(self.dir / "gateway.sock")
        return env

    async def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        await asyncio.to_thread(shutil.rmtree, self.dir, True)


def _label(result: ExecutionResult, request: ExecutionRequest) -> None:
    if result.sample is not None and result.sample.label is None:
        result.sample.label = request.label


async def _kill_and_reap(child: Any) -> None:
    await child.kill()
    with contextlib.suppress(TimeoutError, RolloutFailure):
        async with asyncio.timeout(_REAP_TIMEOUT_SEC):
            await child.wait()


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(path.stat().st_size - _LOG_TAIL_CHARS, 0))
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def _failure(
    phase: str, message: str, category: RolloutErrorCategory, details: dict[str, Any]
) -> ExecutionResult:
    logger.warning("%s", message)
    return backend_failure("process", phase, message, category, details)
