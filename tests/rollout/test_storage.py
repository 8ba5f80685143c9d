"""The package's one atomic write and its policy."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from osmosis_ai.rollout.storage import atomic_write_bytes


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty directory (``tmp_path`` also holds the isolated HOME)."""
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "not-durable"])
def test_replaces_the_content_and_leaves_no_temporary_file(work: Path, durable: bool) -> None:
    path = work / "file.json"
    atomic_write_bytes(path, b"old", durable=durable)
    atomic_write_bytes(path, b"new", durable=durable)
    assert path.read_bytes() == b"new"
    assert os.listdir(work) == ["file.json"]


def test_a_new_file_gets_the_requested_mode(work: Path) -> None:
    path = work / "secret.json"
    atomic_write_bytes(path, b"{}", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_symlinked_target_is_refused_and_left_alone(work: Path) -> None:
    outside = work / "outside"
    outside.write_bytes(b"keep")
    link = work / "link"
    link.symlink_to(outside)
    with pytest.raises(OSError, match="refusing to write through symlink"):
        atomic_write_bytes(link, b"new")
    assert link.is_symlink() and outside.read_bytes() == b"keep"
    assert sorted(os.listdir(work)) == ["link", "outside"]


def test_a_missing_directory_raises_without_leaving_anything(work: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write_bytes(work / "missing" / "file", b"x")
    assert os.listdir(work) == []


def test_the_descriptor_is_not_inherited_by_child_processes(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # O_CLOEXEC: a subprocess started while the write is in flight must not hold the file.
    flags: list[int] = []
    real_open = os.open

    def recording_open(path: object, flag: int, *args: int) -> int:
        fd = real_open(path, flag, *args)  # type: ignore[arg-type]
        flags.append(flag)
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    atomic_write_bytes(work / "file", b"x")
    assert flags and all(flag & os.O_CLOEXEC for flag in flags)
