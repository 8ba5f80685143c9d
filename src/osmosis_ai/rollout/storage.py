"""Where per-rollout files live, and how they are written safely."""

from __future__ import annotations

import os
from pathlib import Path

from osmosis_ai._unique import token_hex
from osmosis_ai.errors import ConfigError

__all__ = [
    "ARTIFACT_ROOT_ENV",
    "DURABLE_FILES_ENV",
    "atomic_write_bytes",
    "default_artifact_root",
    "durable_files_from_env",
    "fsync_directory",
]

#: Environment variable naming the root of per-rollout directories (set by hosts).
ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
#: Set to ``1`` by hosts whose records promise per-rollout files that survive a machine
#: crash (``osmosis eval run``): the rollout server then fsyncs them (see
#: `durable_files_from_env`).
DURABLE_FILES_ENV = "_OSMOSIS_ROLLOUT_DURABLE_FILES"


def default_artifact_root() -> Path:
    """``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` when set and non-empty, else ``~/.osmosis``."""
    configured = os.environ.get(ARTIFACT_ROOT_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".osmosis"


def durable_files_from_env() -> bool:
    """Whether ``$_OSMOSIS_ROLLOUT_DURABLE_FILES`` asks for fsynced per-rollout files.

    Raises:
        ConfigError: The variable is set to something other than ``0`` or ``1``.
    """
    value = os.environ.get(DURABLE_FILES_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{DURABLE_FILES_ENV} must be 0 or 1 (or unset), got {value!r}")
    return value == "1"


def fsync_directory(directory: Path) -> None:
    """Flush ``directory``'s entries to disk, so a rename inside it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a mix.

    The one atomic write of the package; its policy:

    - The bytes go to a fresh temporary file in the same directory (``O_EXCL``,
      ``O_NOFOLLOW``, ``O_CLOEXEC``: never an existing file, never a link, never leaked to
      a child process) and replace ``path`` in one rename.
    - Durable by default: the file is fsynced before the rename and the directory after
      it, so a crash leaves the old or the new content. ``durable=False`` skips both, for
      files worthless after a crash (live previews, results read once).
    - A symlink at ``path`` is refused, neither followed nor replaced: a link where the
      package writes its own files means something else owns that name.

    Args:
        path: Destination file; its directory must exist.
        data: The complete new content.
        durable: Flush the file and the directory to disk.
        mode: Permission bits of a newly written file (before the umask).

    Raises:
        OSError: The directory is missing or unwritable, or ``path`` is a symlink.
    """
    if path.is_symlink():
        raise OSError(f"refusing to write through symlink {path}")
    tmp = path.with_name(f".{path.name}.{token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            remaining = memoryview(data)
            while remaining:
                remaining = remaining[os.write(fd, remaining) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        # A link swapped in after the check is replaced by the rename, never written through.
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)
