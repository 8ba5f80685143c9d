"""Where per-rollout files live, and how they are written safely."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ARTIFACT_ROOT_ENV", "atomic_write_bytes", "default_artifact_root"]

#: Environment variable naming the root of per-rollout directories (set by hosts).
ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"


def default_artifact_root() -> Path:
    """``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` when set and non-empty, else ``~/.osmosis``."""
    configured = os.environ.get(ARTIFACT_ROOT_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".osmosis"


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a mix.

    The bytes go to a temporary file in the same directory, are flushed to disk and
    replace ``path`` in one rename, which is flushed too (unless ``durable`` is false: for
    files worthless after a crash). Refuses to replace a symlink (it could point anywhere).

    Raises:
        OSError: The directory is missing or unwritable, or ``path`` is a symlink.
    """
    if path.is_symlink():
        raise OSError(f"refusing to write through symlink {path}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data):x}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        try:
            remaining = memoryview(data)
            while remaining:
                remaining = remaining[os.write(fd, remaining) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        # Until the directory is flushed, a crash can still lose the rename.
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
