"""Atomic projection writes and safe artifact copies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from osmosis_ai.eval.files import copy_artifacts, write_json_atomic, write_jsonl_atomic


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty directory (``tmp_path`` also holds the isolated HOME)."""
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


def test_json_is_two_space_indented_with_a_trailing_newline(work: Path) -> None:
    path = work / "progress.json"
    write_json_atomic(path, {"total_runs": 4, "nested": {"a": [1, 2]}})
    assert path.read_text() == (
        '{\n  "total_runs": 4,\n  "nested": {\n    "a": [\n      1,\n      2\n    ]\n  }\n}\n'
    )


def test_atomic_write_replaces_and_leaves_no_temp_files(work: Path) -> None:
    path = work / "metrics.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert os.listdir(work) == ["metrics.json"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_and_nothing_is_written(work: Path, value: float) -> None:
    path = work / "metrics.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"v": value})
    with pytest.raises(ValueError):
        write_jsonl_atomic(work / "index.jsonl", [{"reward": value}])
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(work) == ["metrics.json"]


def test_failed_replace_removes_the_temp_file(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(work / "metrics.json", {})
    assert os.listdir(work) == []


def test_atomic_write_refuses_a_symlink_instead_of_writing_through(work: Path) -> None:
    # The package's one atomic-write policy (rollout._storage): a link is neither followed
    # nor replaced.
    target = work / "target.json"
    target.write_text("keep")
    link = work / "metrics.json"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symlink"):
        write_json_atomic(link, [])
    assert link.is_symlink() and target.read_text() == "keep"
    assert sorted(os.listdir(work)) == ["metrics.json", "target.json"]


def test_jsonl_rows_keep_key_order_one_per_line(work: Path) -> None:
    path = work / "index.jsonl"
    write_jsonl_atomic(path, [{"row_index": 1, "a": None}, {"z": 1, "b": "x"}])
    assert path.read_text() == '{"row_index": 1, "a": null}\n{"z": 1, "b": "x"}\n'
    write_jsonl_atomic(path, [])
    assert path.read_bytes() == b""
    assert os.listdir(work) == ["index.jsonl"]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_copy_artifacts_copies_regular_files_and_skips_the_rest(work: Path) -> None:
    src = work / "trial" / "artifacts"
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "out.txt").write_bytes(b"out")
    (src / "sub" / "deep" / "data.bin").write_bytes(b"\x00\x01")
    (src / "manifest.json").write_text("{}")  # reserved at the top level
    (src / "sub" / "manifest.json").write_text("{}")  # allowed below it
    secret = work / "secret.txt"
    secret.write_text("secret")
    (src / "link.txt").symlink_to(secret)
    (src / "linkdir").symlink_to(work, target_is_directory=True)
    os.mkfifo(src / "pipe")

    dst = work / "run" / "artifacts" / "row_0_run_0"
    copied = copy_artifacts(src, dst)

    assert copied == ["out.txt", "sub/deep/data.bin", "sub/manifest.json"]
    assert _tree(dst) == {
        "out.txt": b"out",
        "sub/deep/data.bin": b"\x00\x01",
        "sub/manifest.json": b"{}",
    }
    assert not any(path.is_symlink() for path in dst.rglob("*"))
    assert sorted(os.listdir(dst.parent)) == ["row_0_run_0"]


def test_copy_artifacts_refuses_a_symlinked_root(work: Path) -> None:
    real = work / "real"
    real.mkdir()
    (real / "a.txt").write_text("a")
    link = work / "artifacts"
    link.symlink_to(real, target_is_directory=True)
    dst = work / "dst"
    with pytest.raises(OSError, match="symlink"):
        copy_artifacts(link, dst)
    assert not dst.exists()


def test_copy_artifacts_replaces_an_earlier_copy(work: Path) -> None:
    src = work / "src"
    src.mkdir()
    (src / "new.txt").write_text("new")
    dst = work / "dst"
    dst.mkdir()
    (dst / "stale.txt").write_text("stale")
    assert copy_artifacts(src, dst) == ["new.txt"]
    assert _tree(dst) == {"new.txt": b"new"}
    assert sorted(os.listdir(work)) == ["dst", "src"]


def test_copy_artifacts_removes_the_projection_when_nothing_is_copied(work: Path) -> None:
    dst = work / "dst"
    dst.mkdir()
    (dst / "stale.txt").write_text("stale")
    assert copy_artifacts(work / "missing", dst) == []
    assert not dst.exists()

    src = work / "src"
    src.mkdir()
    (src / "manifest.json").write_text("{}")
    dst.mkdir()
    assert copy_artifacts(src, dst) == []
    assert not dst.exists()
    assert sorted(os.listdir(work)) == ["src"]


def test_copy_artifacts_refuses_a_file_as_root(work: Path) -> None:
    src = work / "artifacts"
    src.write_text("not a dir")
    with pytest.raises(OSError, match="not a directory"):
        copy_artifacts(src, work / "dst")
