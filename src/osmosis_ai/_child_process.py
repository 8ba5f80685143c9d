"""A server this process starts and owns: its own session, its output pumped line by line
through a redactor to a log and a short tail (quoted in errors), stopped by signalling its
process group (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["BOOTSTRAP", "ChildProcess"]

#: ``python BOOTSTRAP -m module ...`` runs ``module`` in a child that the kernel ends when this
#: process dies. A file path, not ``-m osmosis_ai...``: the interpreter may be another
#: environment's, without this package (it only needs the standard library).
BOOTSTRAP = str(Path(__file__).resolve().parent / "eval" / "_bootstrap.py")
_READ_CHUNK = 65536
_MAX_LINE = 65536


class ChildProcess:
    """One child process and its output.

    Args:
        log: Receives each line of output, redacted.
        redact: Applied to every line before it is logged or kept.
        tail_lines: How many of the last lines are kept for error messages.
    """

    def __init__(
        self,
        *,
        log: Callable[[str], None],
        redact: Callable[[str], str] = str,
        tail_lines: int = 30,
    ) -> None:
        self.log = log
        self.redact = redact
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._process: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None
    ) -> None:
        """Start ``argv`` in a new session, stdout and stderr merged into the log.

        Raises:
            OSError: The program could not be started.
        """
        self._tail.clear()
        self._process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._pump = asyncio.get_running_loop().create_task(self._read_output())

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self._process.pid if self._process else None

    @property
    def exited(self) -> bool:
        """Whether the child has exited."""
        return self._process is not None and self._process.returncode is not None

    @property
    def returncode(self) -> int | None:
        """The child's exit status, once it exited."""
        return self._process.returncode if self._process else None

    @property
    def tail(self) -> list[str]:
        """The last lines of output (redacted)."""
        return list(self._tail)

    async def wait(self) -> int:
        """Wait for the child to exit."""
        assert self._process is not None
        return await self._process.wait()

    async def drain_output(self, timeout_sec: float = 2.0) -> None:
        """Let the output of an exited child reach the log."""
        if self._pump is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), timeout_sec)

    async def terminate(self, grace_sec: float) -> None:
        """SIGTERM the child's process group; SIGKILL it after ``grace_sec``."""
        process = self._process
        if process is None or process.returncode is not None:
            await self.drain_output()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_sec)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        await self.drain_output()

    async def _read_output(self) -> None:
        # Read chunks, not lines: a line longer than the stream's limit would otherwise end
        # the reader, the pipe would fill, and the child would block on its next print.
        assert self._process is not None and self._process.stdout is not None
        pending = b""
        while chunk := await self._process.stdout.read(_READ_CHUNK):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > _MAX_LINE:
                lines.append(pending[:_MAX_LINE] + b" [line truncated]")
                pending = b""
            for raw in lines:
                self._emit(raw)
        if pending:
            self._emit(pending)

    def _emit(self, raw: bytes) -> None:
        line = self.redact(raw.decode("utf-8", "replace").rstrip())
        self._tail.append(line)
        self.log(line)
