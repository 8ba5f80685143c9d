"""Starting, waiting for and killing one child process: from the warm pool or cold.

Both kinds answer the same three questions — which process, how did it end, kill it now —
so the backend does not care which one ran a phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from osmosis_ai.errors import RolloutFailure

__all__ = ["ColdLauncher", "Exit", "Launched", "PoolLauncher"]

logger = logging.getLogger(__name__)

_POOL_START_TIMEOUT_SEC = 60.0


@dataclass(frozen=True)
class Exit:
    """How a child ended: an exit code, or the signal that killed it."""

    code: int | None = None
    signal: int | None = None

    def describe(self) -> str:
        """``exited with status 3`` / ``was killed by SIGSEGV (segmentation fault)``."""
        if self.signal is None:
            return f"exited with status {self.code}"
        try:
            sig = signal.Signals(self.signal)
        except ValueError:
            return f"was killed by signal {self.signal}"
        return f"was killed by {sig.name}{_SIGNAL_NOTES.get(sig, '')}"


_SIGNAL_NOTES = {
    signal.SIGSEGV: " (segmentation fault)",
    signal.SIGBUS: " (bus error)",
    signal.SIGABRT: " (aborted)",
    signal.SIGFPE: " (arithmetic fault)",
    signal.SIGKILL: " (not by osmosis: the kernel's out-of-memory killer, or another process)",
}


class Launched(Protocol):
    """A running child."""

    pid: int

    async def wait(self) -> Exit:
        """Wait until the child ended."""

    async def kill(self) -> None:
        """Kill the child's whole process group (idempotent)."""


class _ColdChild:
    def __init__(self, process: asyncio.subprocess.Process, wrapped: bool) -> None:
        self._process = process
        self._wrapped = wrapped
        self.pid = process.pid

    async def wait(self) -> Exit:
        code = await self._process.wait()
        if code < 0:
            return Exit(signal=-code)
        # A wrapper (bubblewrap) reports its child's death by signal N as status 128 + N.
        if self._wrapped and code > 128 and code - 128 in signal.valid_signals():
            return Exit(signal=code - 128)
        return Exit(code=code)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


class ColdLauncher:
    """A fresh interpreter per phase, optionally wrapped (e.g. in bubblewrap)."""

    def __init__(
        self,
        spec_path: Path,
        python: str,
        wrap: Callable[[list[str], dict[str, str]], list[str]] | None = None,
    ) -> None:
        self._spec_path = spec_path
        self._python = python
        self._wrap = wrap
        """``wrap(argv, env) -> argv``: prefix the command (a sandbox)."""

    async def start(self) -> None:
        return None

    async def launch(self, phase: str, env: dict[str, str], log: Path) -> Launched:
        argv = [self._python, "-m", "osmosis_ai.rollout.backend.process._child"]
        argv += [str(self._spec_path), phase]
        if self._wrap is not None:
            argv = self._wrap(argv, env)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env={**os.environ, **env},
                start_new_session=True,
            )
        finally:
            os.close(fd)
        return _ColdChild(process, wrapped=self._wrap is not None)

    async def close(self) -> None:
        return None

    def health(self) -> dict[str, Any]:
        return {"mode": "cold"}


class _PoolChild:
    def __init__(self, pool: PoolLauncher, token: str, pid: int) -> None:
        self._pool = pool
        self._token = token
        self.pid = pid

    async def wait(self) -> Exit:
        return await asyncio.shield(self._pool._exits[self._token])

    async def kill(self) -> None:
        await self._pool._send({"op": "kill", "token": self._token})


class PoolLauncher:
    """Children forked from a warm pool process that has imported the user's code."""

    def __init__(self, spec_path: Path, python: str) -> None:
        self._spec_path = spec_path
        self._python = python
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._pids: dict[str, asyncio.Future[int]] = {}
        self._exits: dict[str, asyncio.Future[Exit]] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the pool process (once; again after it died)."""
        if self._process is not None and self._process.returncode is None:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        env = {**os.environ}
        env.pop("OSMOSIS_ROLLOUT_BACKEND", None)  # the pool must not build a pool of its own
        process = await asyncio.create_subprocess_exec(
            self._python, "-m", "osmosis_ai.rollout.backend.process._pool", str(self._spec_path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )  # fmt: skip
        assert process.stdout is not None
        try:
            async with asyncio.timeout(_POOL_START_TIMEOUT_SEC):
                line = await process.stdout.readline()
        except TimeoutError:
            line = b""
        if not line.startswith(b'{"ready"'):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise RolloutFailure(
                "the process pool did not start: importing the workflow in a child process "
                "failed (its error is on the server's stderr above)"
            )
        self._process = process
        self._reader = asyncio.get_running_loop().create_task(self._read(process))

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            message = json.loads(line)
            token = message["token"]
            if "pid" in message:
                pid_future = self._pids.pop(token, None)
                if pid_future is not None and not pid_future.done():
                    pid_future.set_result(message["pid"])
            else:
                exit_future = self._exits.get(token)
                if exit_future is not None and not exit_future.done():
                    exit_future.set_result(Exit(message.get("exit"), message.get("signal")))
        # The pool died: every child it had is gone with it (they die with their parent).
        await process.wait()
        if self._process is process:  # not closed by us
            logger.warning("the process pool exited (%s); restarting it", process.returncode)
        failure = RolloutFailure("the process pool died while this phase ran")
        futures: list[asyncio.Future[Any]] = [*self._pids.values(), *self._exits.values()]
        for future in futures:
            if not future.done():
                future.set_exception(failure)

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        async with self._lock:
            process.stdin.write((json.dumps(message) + "\n").encode())
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()

    async def launch(self, phase: str, env: dict[str, str], log: Path) -> Launched:
        await self.start()
        token = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        pid_future: asyncio.Future[int] = loop.create_future()
        self._pids[token] = pid_future
        exit_future: asyncio.Future[Exit] = loop.create_future()
        exit_future.add_done_callback(lambda _: self._exits.pop(token, None))
        self._exits[token] = exit_future
        await self._send({"op": "run", "token": token, "phase": phase, "env": env, "log": str(log)})
        return _PoolChild(self, token, await pid_future)

    async def close(self) -> None:
        """Stop the pool; its children are killed."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    def health(self) -> dict[str, Any]:
        process = self._process
        alive = process is not None and process.returncode is None
        return {"mode": "pool", "pool_pid": process.pid if alive and process else None}
