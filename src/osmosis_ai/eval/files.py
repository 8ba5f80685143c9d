"""Atomic, durable writes of an eval run's projections, and safe copies of rollout artifacts."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from osmosis_ai._unique import token_hex
from osmosis_ai.rollout.storage import atomic_write_bytes, fsync_directory

__all__ = ["RESERVED_ARTIFACT_NAMES", "copy_artifacts", "write_json_atomic", "write_jsonl_atomic"]

#: Top-level artifact names that are never copied (reserved for the run's own files).
RESERVED_ARTIFACT_NAMES: Final[frozenset[str]] = frozenset({"manifest.json"})

_COPY_CHUNK: Final = 1 << 20


def _temp_sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{token_hex(8)}.{suffix}")


def write_json_atomic(path: Path | str, data: Any, *, mode: int = 0o644) -> None:
    """Write ``data`` as JSON so readers see the old file or the new one, never a mix.

    The text is 2-space indented with a trailing newline, written durably by
    `osmosis_ai.rollout.storage.atomic_write_bytes` (which refuses a symlinked ``path``).

    Args:
        path: Destination file; its directory must exist.
        data: A JSON-serialisable value (raw JSON).
        mode: Permission bits of a newly written file (before the umask).

    Raises:
        ValueError: ``data`` holds NaN or an infinity (nothing is written).
        TypeError: ``data`` is not JSON-serialisable (nothing is written).
        OSError: The directory is missing or unwritable, or ``path`` is a symlink.
    """
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    atomic_write_bytes(Path(path), text.encode("utf-8"), mode=mode)


def write_jsonl_atomic(
    path: Path | str, rows: Iterable[Mapping[str, Any]], *, mode: int = 0o644
) -> None:
    """Write one JSON object per line, atomically and durably (see `write_json_atomic`).

    Keys keep their order; every line, including the last, ends with a newline, and no rows
    give an empty file.

    Args:
        path: Destination file; its directory must exist.
        rows: JSON objects, one per line.
        mode: Permission bits of a newly written file (before the umask).

    Raises:
        ValueError: A row holds NaN or an infinity (nothing is written).
        TypeError: A row is not JSON-serialisable (nothing is written).
        OSError: The directory is missing or unwritable.
    """
    text = "".join(json.dumps(dict(row), allow_nan=False) + "\n" for row in rows)
    atomic_write_bytes(Path(path), text.encode("utf-8"), mode=mode)


def _copy_regular_file(source: Path, target: Path) -> bool:
    # O_NOFOLLOW + fstat close the gap between listing an entry and opening it: a file
    # swapped for a symlink or a FIFO meanwhile is skipped, never followed or blocked on.
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            while chunk := os.read(fd, _COPY_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            os.fsync(out)
        finally:
            os.close(out)
        return True
    finally:
        os.close(fd)


def _copy_tree(root: Path, real_root: str, staging: Path) -> list[str]:
    copied: list[str] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    while stack:
        directory, parts = stack.pop()
        with os.scandir(directory) as entries:
            listing = sorted(entries, key=lambda entry: entry.name)
        for entry in listing:
            if not parts and entry.name in RESERVED_ARTIFACT_NAMES:
                continue
            if entry.is_symlink() or entry.name in ("", ".", ".."):
                continue
            # Never follows links, so this only trips if an ancestor was swapped meanwhile.
            real = os.path.realpath(entry.path)
            if os.path.commonpath([real, real_root]) != real_root:
                continue
            relative = (*parts, entry.name)
            if entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), relative))
            elif entry.is_file(follow_symlinks=False) and _copy_regular_file(
                Path(entry.path), staging.joinpath(*relative)
            ):
                copied.append("/".join(relative))
    return sorted(copied)


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def copy_artifacts(src_dir: Path | str, dst_dir: Path | str) -> list[str]:
    """Replace ``dst_dir`` with a safe copy of a rollout's artifacts tree ``src_dir``.

    Only regular files are copied. Symlinks (to files or directories), special files
    (FIFOs, sockets, devices), anything resolving outside ``src_dir`` and a top-level
    ``manifest.json`` (reserved) are skipped. The copy is staged next to ``dst_dir`` and
    swapped in, so a reader never sees a half-copied tree, and files from an earlier copy
    never linger. When nothing is copied (``src_dir`` missing, or only skipped entries),
    ``dst_dir`` is removed.

    Args:
        src_dir: The rollout's artifacts directory.
        dst_dir: Where the projection goes; its parent is created when missing.

    Returns:
        The copied files as sorted POSIX paths relative to ``dst_dir``.

    Raises:
        OSError: ``src_dir`` is a symlink or not a directory (refused), or a filesystem
            operation failed.
    """
    src = Path(src_dir)
    dst = Path(dst_dir)
    if src.is_symlink():
        raise OSError(f"refusing to copy artifacts from symlinked directory {src}")
    if not src.exists():
        _remove(dst)
        return []
    if not src.is_dir():
        raise OSError(f"artifacts path {src} is not a directory")
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = _temp_sibling(dst, "staging")
    staging.mkdir()
    try:
        copied = _copy_tree(src, os.path.realpath(src), staging)
        if not copied:
            shutil.rmtree(staging)
            _remove(dst)
            return []
        if dst.exists() or dst.is_symlink():
            retired = _temp_sibling(dst, "old")
            os.replace(dst, retired)
            os.replace(staging, dst)
            _remove(retired)
        else:
            os.replace(staging, dst)
    except BaseException:
        if staging.exists():
            shutil.rmtree(staging)
        raise
    fsync_directory(dst.parent)
    return copied
