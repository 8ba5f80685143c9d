"""Task selection and per-rollout task copies for `HarborBackend` (no Harbor imports).

Template mode runs every rollout on ``tasks_dir`` with the prompt as its instruction;
dataset mode runs ``tasks_dir/<metadata["harbor_task_id"]>`` with the task's own
instruction. ``metadata["harbor_task"]`` (a local path) overrides both.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.bundle import Bundle
from osmosis_ai.rollout.container import INPUT_FILE

__all__ = [
    "TaskMode",
    "allowlist_hosts",
    "is_loopback_url",
    "materialize",
    "select_task",
    "write_grader_tests",
]

TaskMode = Literal["template", "dataset"]

_GRADER_WHEEL = "osmosis-bundle.whl"


def select_task(tasks_dir: Path, mode: TaskMode, metadata: dict[str, Any] | None) -> Path:
    """The task directory of one rollout.

    Raises:
        ConfigError: The metadata names no task (dataset mode), a task id escapes
            ``tasks_dir``, or the directory does not exist.
    """
    metadata = metadata or {}
    explicit = metadata.get("harbor_task")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.startswith(("/", "./", "~")):
            raise ConfigError(
                f'metadata["harbor_task"] = {explicit!r}: only local task paths ("/...", '
                '"./...", "~/...") are supported; registry and git tasks need network access'
            )
        task = Path(explicit).expanduser()
    elif mode == "dataset":
        task_id = metadata.get("harbor_task_id")
        if not isinstance(task_id, str) or not task_id:
            raise ConfigError(
                'dataset mode needs metadata["harbor_task_id"] naming a directory of tasks_dir'
            )
        parts = Path(task_id).parts
        if Path(task_id).is_absolute() or ".." in parts or len(parts) != 1:
            raise ConfigError(f'metadata["harbor_task_id"] = {task_id!r} must be one task name')
        task = tasks_dir / task_id
    else:
        task = tasks_dir
    if not (task / "task.toml").is_file():
        raise ConfigError(f"{task} is not a Harbor task (no task.toml)")
    return task


def materialize(task: Path, destination: Path) -> Path:
    """Copy ``task`` into ``destination`` (refusing symlinks anywhere in it); the copy.

    Raises:
        ConfigError: The task holds a symlink (it could expose host files to the sandbox).
    """
    for path in task.rglob("*"):
        if path.is_symlink():
            raise ConfigError(
                f"task {task} contains the symlink {path.relative_to(task)}; tasks must not "
                "hold links (they could expose host files to the sandbox)"
            )
    copy = destination / task.name
    shutil.copytree(task, copy)
    return copy


def write_instruction(task: Path, prompt: list[dict[str, Any]]) -> None:
    """Template mode: the rollout's prompt messages become the task's instruction."""
    (task / "instruction.md").write_text(json.dumps(prompt, ensure_ascii=False, indent=2))


def has_own_tests(task: Path) -> bool:
    """Whether the task brings its reward source (``tests/test.sh``), which wins."""
    return (task / "tests" / "test.sh").is_file()


def write_grader_tests(task: Path, bundle: Bundle, grader_input: bytes, python: str) -> None:
    """Give ``task`` a ``tests/test.sh`` that runs the bundle's grader phase."""
    tests = task / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copyfile(bundle.wheel, tests / _GRADER_WHEEL)
    (tests / INPUT_FILE).write_bytes(grader_input)
    script = (
        "#!/bin/bash\n"
        "# Written by osmosis: runs the rollout's Grader on the agent phase's sample.\n"
        "set -e\n"
        f"{shlex.quote(python)} -m zipfile -e /tests/{_GRADER_WHEEL} /tmp/osmosis-grader\n"
        f"PYTHONPATH=/tmp/osmosis-grader {bundle.command('grade', shlex.quote(python))}\n"
    )
    (tests / "test.sh").write_text(script)
    (tests / "test.sh").chmod(0o755)


def _phase_mode(section: Any) -> str | None:
    if isinstance(section, dict):
        mode = section.get("network_mode")
        if isinstance(mode, str):
            return mode
        if section.get("allow_internet") is False:
            return "no-network"
    return None


def allowlist_hosts(task: Path, url: str) -> tuple[bool, bool]:
    """Whether the chat endpoint's host must join the environment's and the agent's
    allowlists: only where the task's policy is ``allowlist`` (``no-network`` is never
    widened; an unreadable ``task.toml`` widens nothing)."""
    if not urlsplit(url).hostname:
        return False, False
    try:
        config = tomllib.loads((task / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False, False
    environment = _phase_mode(config.get("environment")) or "public"
    agent = _phase_mode(config.get("agent")) or environment
    return environment == "allowlist", agent == "allowlist"


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` points at this machine's loopback (``localhost``, 127/8, ``::1``)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
