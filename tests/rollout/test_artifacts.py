"""Per-rollout artifacts directories: created off-loop, retried when transient, else None."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from osmosis_ai.errors import InvalidIdError
from osmosis_ai.rollout import _artifacts
from osmosis_ai.rollout._artifacts import (
    artifacts_dir_path,
    create_artifacts_dir,
    remove_if_empty,
)


async def test_directory_is_created_under_a_missing_root(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "root"
    created = await create_artifacts_dir(root, "r1")
    assert created == root / "r1" / "artifacts" and created.is_dir()
    assert await create_artifacts_dir(root, "r1") == created  # idempotent


async def test_creation_runs_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    real = _artifacts._provision

    def recording(root: Path, rollout_id: str) -> Path:
        threads.append(threading.get_ident())
        return real(root, rollout_id)

    monkeypatch.setattr(_artifacts, "_provision", recording)
    await create_artifacts_dir(tmp_path, "r1")
    assert threads and threads[0] != threading.get_ident()


async def test_transient_errors_are_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = 0
    real = _artifacts._provision

    def flaky(root: Path, rollout_id: str) -> Path:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError(errno.EIO, "I/O error")
        return real(root, rollout_id)

    monkeypatch.setattr(_artifacts, "_RETRY_DELAYS_SEC", (0.01, 0.01))
    monkeypatch.setattr(_artifacts, "_provision", flaky)
    assert await create_artifacts_dir(tmp_path, "r1") == tmp_path / "r1" / "artifacts"
    assert attempts == 2


async def test_persistent_transient_errors_give_none_after_the_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = 0

    def broken(root: Path, rollout_id: str) -> Path:
        nonlocal attempts
        attempts += 1
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(_artifacts, "_RETRY_DELAYS_SEC", (0.01, 0.01))
    monkeypatch.setattr(_artifacts, "_provision", broken)
    assert await create_artifacts_dir(tmp_path, "r1") is None
    assert attempts == 3


async def test_a_file_in_the_way_gives_none_without_retrying(tmp_path: Path) -> None:
    (tmp_path / "r1").write_text("not a directory")
    assert await create_artifacts_dir(tmp_path, "r1") is None


def test_paths_refuse_ids_that_leave_the_root(tmp_path: Path) -> None:
    with pytest.raises(InvalidIdError):
        artifacts_dir_path(tmp_path, "../escape")


async def test_an_empty_directory_is_removed_and_a_written_one_kept(tmp_path: Path) -> None:
    empty = await create_artifacts_dir(tmp_path, "empty")
    written = await create_artifacts_dir(tmp_path, "written")
    assert empty is not None and written is not None
    (written / "trace.log").write_text("kept")
    await remove_if_empty(empty)
    await remove_if_empty(written)
    await remove_if_empty(None)  # no directory was provisioned: nothing to do
    await remove_if_empty(empty)  # already gone: no error
    assert not empty.exists() and empty.parent.is_dir()
    assert (written / "trace.log").read_text() == "kept"
