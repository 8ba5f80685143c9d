"""The user's rollout server as a child process: started, health-checked, owned, stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import aiohttp

from osmosis_ai._child_process import ChildProcess
from osmosis_ai._serving import free_port
from osmosis_ai.errors import OsmosisError
from osmosis_ai.rollout.request_logs import REQUEST_LOGS_ENV

__all__ = ["RolloutServerError", "RolloutServerProcess"]

_HEALTH_INTERVAL_SEC = 0.2
#: Child starts tried when another process takes the picked port first.
_PORT_ATTEMPTS = 3
# Longer than the server's own drain (10 s), cancel grace (10 s) and delivery grace (5 s).
_STOP_GRACE_SEC = 30.0


class RolloutServerError(OsmosisError):
    """The rollout server did not start, is not ours, or died."""


def _withhold_credentials(
    env: Mapping[str, str], credentials: Iterable[str]
) -> tuple[dict[str, str], list[str]]:
    """``env`` without the variables whose value contains one of ``credentials``.

    Matching values rather than names catches a key under any name (``OPENAI_API_KEY``,
    ``OSMOSIS_POLICY_API_KEY``, a copy in ``MY_HEADER="Bearer ..."``). Returns the kept
    variables and the sorted names of those withheld.
    """
    needles = [credential for credential in credentials if credential]
    kept: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in env.items():
        if any(needle in value for needle in needles):
            withheld.append(name)
        else:
            kept[name] = value
    return kept, sorted(withheld)


class RolloutServerProcess:
    """Runs the rollout's entry point in its directory, as its own process group.

    The child is started through `osmosis_ai.eval._bootstrap`, which ends it when the
    runner dies.

    The child gets ``_OSMOSIS_ROLLOUT_PORT`` (a free port), ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``
    and a fresh ``_OSMOSIS_ROLLOUT_INSTANCE_ID``; the server counts as up only when its
    ``/health`` reports that instance id, so a foreign process on the port is never used.
    Its output goes line by line, through ``redact``, to ``log`` and to the tail quoted in
    errors. It inherits this process's environment plus ``env``, except every variable
    holding one of ``withheld`` (the policy's credentials: the gateway holds them, the
    workflow only needs its rollout key); their names are logged. Its per-request log lines
    (HTTP clients, access log) are off unless ``request_logs``. It runs under ``python``
    (an environment of its own, with this package installed), else this interpreter.
    """

    def __init__(
        self,
        *,
        rollout_dir: Path,
        entrypoint: str,
        env: Mapping[str, str],
        artifact_root: Path,
        log: Callable[[str], None],
        redact: Callable[[str], str] = str,
        withheld: Iterable[str] = (),
        request_logs: bool = False,
        python: str | None = None,
    ) -> None:
        self.rollout_dir = rollout_dir
        self.python = python or sys.executable
        self.entrypoint = entrypoint
        self.env = dict(env)
        self.artifact_root = artifact_root
        self.log = log
        self.redact = redact
        self.withheld = tuple(withheld)
        self.request_logs = request_logs
        self.instance_id = uuid.uuid4().hex
        self.url = ""
        self._child = ChildProcess(log=log, redact=redact)

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._child.pid

    async def start(self, *, timeout_sec: float = 90.0) -> str:
        """Start the child and wait until it is healthy; returns its base URL.

        Raises:
            RolloutServerError: The child exited, or was not healthy in time.
        """
        inherited = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        kept, withheld = _withhold_credentials({**inherited, **self.env}, self.withheld)
        if withheld:
            self.log(
                "not passed to the rollout server (they hold the policy's credentials): "
                + ", ".join(withheld)
            )
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                return await self._start_on_free_port(kept, timeout_sec)
            except RolloutServerError:
                # The port was free when picked, but another process can bind it before the
                # child does; only that race is worth another port.
                if attempt == _PORT_ATTEMPTS or not self._lost_port_race():
                    raise
                self.log(f"port taken before the rollout server bound it; retrying ({attempt})")
        raise AssertionError("unreachable")

    def _lost_port_race(self) -> bool:
        return self.exited and any("address already in use" in line for line in self._child.tail)

    async def _start_on_free_port(self, kept: Mapping[str, str], timeout_sec: float) -> str:
        port = free_port()
        env = {
            **kept,
            "_OSMOSIS_ROLLOUT_PORT": str(port),
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(self.artifact_root),
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": self.instance_id,
            REQUEST_LOGS_ENV: "1" if self.request_logs else "0",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [self.python, "-m", "osmosis_ai.eval._bootstrap", self.entrypoint]
        await self._child.spawn(argv, env=env, cwd=self.rollout_dir)
        self.url = f"http://127.0.0.1:{port}"
        await self._wait_healthy(timeout_sec)
        return self.url

    def _failure(self, why: str) -> RolloutServerError:
        tail = self._child.tail
        if not tail:
            return RolloutServerError(f"{why}; {self.entrypoint} printed nothing")
        lines = "\n".join(tail)
        return RolloutServerError(f"{why}; last output of {self.entrypoint}:\n{lines}")

    async def _wait_healthy(self, timeout_sec: float) -> None:
        deadline = time.monotonic() + timeout_sec
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while time.monotonic() < deadline:
                if self.exited:
                    await self._child.drain_output()
                    raise self._failure(self._exit_while_starting())
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with http.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            body = await response.json()
                            if (
                                not isinstance(body, dict)
                                or body.get("instance_id") != self.instance_id
                            ):
                                raise RolloutServerError(
                                    f"another process answers on {self.url}; refusing to use it"
                                )
                            return
                await asyncio.sleep(_HEALTH_INTERVAL_SEC)
        raise self._failure(f"the rollout server was not healthy within {timeout_sec:g}s")

    def _exit_while_starting(self) -> str:
        why = f"the rollout server exited with status {self.returncode} while starting"
        if self.returncode != 0:
            return why  # its own error is in the output quoted after this
        # A clean exit means the entry point returned without ever serving.
        return (
            f"{why}: {self.entrypoint} must serve the rollout app on the port in "
            '_OSMOSIS_ROLLOUT_PORT and keep running, e.g. under `if __name__ == "__main__":` '
            'call uvicorn.run(app, host="127.0.0.1", '
            'port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"])); see docs/eval.md'
        )

    @property
    def exited(self) -> bool:
        """Whether the child has exited."""
        return self._child.exited

    @property
    def returncode(self) -> int | None:
        """The child's exit status, once it exited."""
        return self._child.returncode

    async def wait(self) -> int:
        """Wait for the child to exit (used to notice a crash during a run)."""
        return await self._child.wait()

    async def stop(self, *, grace_sec: float = _STOP_GRACE_SEC) -> None:
        """Cancel its rollouts, SIGTERM its process group, SIGKILL after ``grace_sec``.

        Cancelling first lets the server publish ``cancelled`` results and save files at
        once instead of waiting out its drain period.
        """
        if self._child.pid is not None and not self._child.exited:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                timeout = aiohttp.ClientTimeout(total=5)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as http,
                    http.post(f"{self.url}/rollout/cancel", json={"all": True}),
                ):
                    pass
        await self._child.terminate(grace_sec)
