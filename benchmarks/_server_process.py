"""Starting ``_rollout_server.py`` as a child process, and waiting until it answers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from osmosis_ai._serving import bind_socket
from osmosis_ai.rollout.client import RolloutClient

__all__ = ["rollout_server", "wait_ready"]

HERE = Path(__file__).resolve().parent


@contextmanager
def rollout_server(
    kind: str, artifact_root: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``_rollout_server.py KIND`` child on a free port: ``(process, base_url)``."""
    probe = bind_socket()
    port = probe.getsockname()[1]
    probe.close()
    child_env = {**os.environ, "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": artifact_root, **(env or {})}
    process = subprocess.Popen(
        [sys.executable, str(HERE / "_rollout_server.py"), str(port), kind], env=child_env
    )
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


#: A server starting on a machine busy with other work can take a minute to import.
READY_TIMEOUT_SEC = 180.0


async def wait_ready(client: RolloutClient) -> None:
    """Return once the server answers ``/health`` (within `READY_TIMEOUT_SEC`)."""
    async with asyncio.timeout(READY_TIMEOUT_SEC):
        while True:
            try:
                await client.health()
                return
            except Exception:
                await asyncio.sleep(0.1)
