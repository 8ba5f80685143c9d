"""Child processes the tests start: waited for within a limit, never left running."""

from __future__ import annotations

import asyncio

__all__ = ["communicate_within"]


async def communicate_within(
    process: asyncio.subprocess.Process, limit_sec: float
) -> tuple[bytes, bytes | None]:
    """The process's output once it exits. Past ``limit_sec`` (or when the test is
    cancelled) it is killed and reaped before the error propagates, so no later test
    inherits it, its pipes or their ResourceWarnings."""
    try:
        async with asyncio.timeout(limit_sec):
            out, err = await process.communicate()
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.communicate()
        raise
    return out, err
