"""Provisioning the per-rollout artifacts directory, best-effort and off the event loop, and
removing it again when the rollout left it empty."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from pathlib import Path

from osmosis_ai._offload import run_blocking
from osmosis_ai.rollout.ids import ensure_single_path_segment

__all__ = ["artifacts_dir_path", "create_artifacts_dir", "remove_if_empty"]

logger = logging.getLogger(__name__)

# Errors that another attempt cannot fix; anything else (EIO, ESTALE on network mounts,
# EAGAIN...) is retried.
_PERMANENT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG}
)
_RETRY_DELAYS_SEC = (0.5, 1.0)


def artifacts_dir_path(root: Path, rollout_id: str) -> Path:
    """``<root>/<rollout_id>/artifacts`` (no filesystem access)."""
    return root / ensure_single_path_segment(rollout_id, label="rollout_id") / "artifacts"


def _mkdir(path: Path) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        if not path.is_dir():
            raise


def _provision(root: Path, rollout_id: str) -> Path:
    # Two plain mkdir calls in the common case; the root is created on first use only.
    artifacts = artifacts_dir_path(root, rollout_id)
    try:
        _mkdir(artifacts.parent)
    except FileNotFoundError:
        root.mkdir(parents=True, exist_ok=True)
        _mkdir(artifacts.parent)
    _mkdir(artifacts)
    return artifacts


async def create_artifacts_dir(root: Path, rollout_id: str) -> Path | None:
    """Create ``<root>/<rollout_id>/artifacts/`` and return it, or ``None`` if impossible.

    Runs on a worker thread (`run_blocking`): the root may be a slow network mount.
    Transient errors are retried twice, 0.5 s and then 1 s later; permanent ones (read-only,
    permission, a file in the way) give ``None`` at once. Never raises for filesystem
    problems: artifacts never change a rollout's outcome.
    """
    delays = iter(_RETRY_DELAYS_SEC)
    while True:
        try:
            return await run_blocking(_provision, root, rollout_id)
        except OSError as exc:
            delay = next(delays, None)
            if exc.errno in _PERMANENT_ERRNOS or delay is None:
                logger.warning(
                    "rollout %s: no artifacts directory under %s (%s); ctx.artifacts_dir is None",
                    rollout_id,
                    root,
                    exc.strerror or type(exc).__name__,
                )
                return None
            await asyncio.sleep(delay)


def _rmdir(directory: Path) -> None:
    # Not empty (the rollout wrote files), already gone, or not ours to remove: it stays.
    with contextlib.suppress(OSError):
        os.rmdir(directory)


async def remove_if_empty(directory: Path | None) -> None:
    """Remove ``directory`` if it is empty, on a worker thread; never raises.

    A rollout that wrote no artifacts then leaves no empty folder behind (a directory costs
    an inode and a 4 KiB block on most filesystems, a third of a no-op rollout's files).
    """
    if directory is not None:
        await run_blocking(_rmdir, directory)
