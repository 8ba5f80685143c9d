"""Task selection, egress allowlists and key scrubbing: the pure parts of HarborBackend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.backend.harbor._archive import keep_trial_files, scrub_tree
from osmosis_ai.rollout.backend.harbor._tasks import (
    allowlist_hosts,
    is_loopback_url,
    materialize,
    select_task,
)
from tests.rollout.backend.harbor.conftest import write_task

URL = "http://gateway.internal:8080/v1/rollouts/r1"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[environment]\nnetwork_mode = "public"\n', (False, False)),
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', (True, True)),
        ('[environment]\nnetwork_mode = "no-network"\n', (False, False)),
        (
            '[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "allowlist"\n',
            (False, True),
        ),
        ("not toml [", (False, False)),
    ],
)
def test_the_endpoint_joins_allowlists_only(
    tmp_path: Path, toml: str, expected: tuple[bool, bool]
) -> None:
    (tmp_path / "task.toml").write_text(toml)
    assert allowlist_hosts(tmp_path, URL) == expected


def test_loopback_urls() -> None:
    for url in ("http://127.0.0.1:1/v1", "http://localhost/v1", "http://[::1]:9/v1",
                "http://[::ffff:127.0.0.1]:9/v1"):  # fmt: skip
        assert is_loopback_url(url), url
    assert not is_loopback_url("http://10.1.2.3:9/v1")


def test_task_selection(tmp_path: Path) -> None:
    write_task(tmp_path, "a")
    assert select_task(tmp_path / "a", "template", None) == tmp_path / "a"
    assert select_task(tmp_path, "dataset", {"harbor_task_id": "a"}) == tmp_path / "a"
    explicit = select_task(tmp_path / "nowhere", "template", {"harbor_task": str(tmp_path / "a")})
    assert explicit == tmp_path / "a"
    for metadata, match in (
        ({}, "harbor_task_id"),
        ({"harbor_task_id": "../a"}, "one task name"),
        ({"harbor_task_id": "missing"}, "not a Harbor task"),
        ({"harbor_task": "org/name@latest"}, "only local task paths"),
    ):
        with pytest.raises(ConfigError, match=match):
            select_task(tmp_path, "dataset", metadata)


def test_tasks_holding_links_are_refused(tmp_path: Path) -> None:
    task = write_task(tmp_path, "linked")
    (task / "environment" / "secrets").symlink_to("/etc")
    with pytest.raises(ConfigError, match="symlink"):
        materialize(task, tmp_path / "copy")


def test_scrubbing_replaces_the_key_and_removes_what_it_cannot_read(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    (trial / "agent" / "log.txt").write_text("calling with sk-canary-1234 now")
    (trial / "agent" / "link").symlink_to("/etc/hostname")
    os.mkfifo(trial / "agent" / "pipe")  # reading it would block forever
    (trial / "result.json").write_text('{"ok": true}')
    assert scrub_tree(trial, ["sk-canary-1234"]) is True
    assert (trial / "agent" / "log.txt").read_text() == "calling with [REDACTED] now"
    assert not (trial / "agent" / "link").exists() and not (trial / "agent" / "pipe").exists()
    rollout = tmp_path / "rollout"
    keep_trial_files(trial, rollout)
    assert (rollout / "logs" / "agent" / "log.txt").exists()
    assert (rollout / "logs" / "result.json").exists()
