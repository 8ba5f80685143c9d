"""Scrubbing known secrets from files and JSON data: exact bytes only, failing closed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from osmosis_ai.rollout.scrub import scrub_files, scrub_json

SECRET = 'sk-"quoted"-7f3a'


def test_every_file_is_scrubbed_and_everything_else_kept(tmp_path: Path) -> None:
    root = tmp_path / "trial"
    (root / "deep").mkdir(parents=True)
    (root / "notes.txt").write_text(f"key={SECRET}; again {SECRET}")
    (root / "deep" / "doc.json").write_text(json.dumps({"seen": SECRET}))
    (root / "deep" / "blob.bin").write_bytes(b"\x00\xff" + SECRET.encode() + b"\xfe")
    (root / "private.log").write_text(SECRET)
    (root / "private.log").chmod(0o600)
    (root / "clean.txt").write_text("nothing here")
    clean_inode = (root / "clean.txt").stat().st_ino
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    (root / "link.txt").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    os.mkfifo(root / "pipe")

    assert scrub_files(root, [SECRET]) == []

    assert (root / "notes.txt").read_text() == "key=[REDACTED]; again [REDACTED]"
    assert json.loads((root / "deep" / "doc.json").read_text()) == {"seen": "[REDACTED]"}
    assert (root / "deep" / "blob.bin").read_bytes() == b"\x00\xff[REDACTED]\xfe"
    assert (root / "private.log").stat().st_mode & 0o777 == 0o600
    assert (root / "clean.txt").stat().st_ino == clean_inode  # untouched
    # Links and FIFOs are gone unread; what they pointed to is untouched.
    assert sorted(p.name for p in root.iterdir()) == [
        "clean.txt",
        "deep",
        "notes.txt",
        "private.log",
    ]
    assert outside.read_text() == SECRET


def test_json_data_is_scrubbed_wherever_the_secret_is(tmp_path: Path) -> None:
    answer = {"choices": [{"message": {"content": f"echo {SECRET}"}}], SECRET: 1}
    assert scrub_json(answer, [SECRET]) == {
        "choices": [{"message": {"content": "echo [REDACTED]"}}],
        "[REDACTED]": 1,
    }
    clean = {"a": ["b"]}
    assert scrub_json(clean, [SECRET]) is clean
    assert scrub_json(answer, []) is answer
