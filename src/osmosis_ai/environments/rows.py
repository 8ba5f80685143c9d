"""An ``[environment]``'s rows: where they are kept, what the library checks first, and
writing them once (blocking: call it in a worker thread)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osmosis_ai.config.source import ConfigSource
from osmosis_ai.environments.config import EnvironmentConfig

__all__ = ["check_environment", "environment_rows", "make_rows", "rows_file"]

#: Bumped when the rows a file holds change for the same settings.
_ROWS_FORMAT = 1


def rows_file(workspace: Path, environment: EnvironmentConfig) -> Path:
    """Where the rows of ``environment`` are kept: the same section, the same file."""
    recipe = {"format": _ROWS_FORMAT, **dataclasses.asdict(environment)}
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    name = environment.reasoning_gym or str(environment.openenv).rpartition(":")[2]
    return workspace / ".osmosis" / "environments" / f"{name}-{digest}.jsonl"


def check_environment(src: ConfigSource, environment: EnvironmentConfig) -> None:
    """What the environment's library says of the section, at its line, before a run.

    An OpenEnv class is checked when its rows are made (`make_rows`): its library is in
    the environment's own Python, not necessarily in this one.
    """
    if environment.reasoning_gym is not None:
        from osmosis_ai.environments.reasoning_gym import check_task

        check_task(src, environment)


def environment_rows(environment: EnvironmentConfig) -> Iterator[dict[str, Any]]:
    """The rows, in dataset form: reasoning-gym's questions, or one row per OpenEnv episode
    (the seed its ``reset`` gets)."""
    if environment.reasoning_gym is not None:
        from osmosis_ai.environments.reasoning_gym import task_rows

        yield from task_rows(environment)
        return
    for index in range(environment.size):
        yield {"metadata": {"openenv": {"seed": environment.seed + index}}}


def make_rows(environment: EnvironmentConfig, path: Path, workspace: Path) -> Path:
    """Make the rows file ``path`` unless it is there; an OpenEnv class is checked first,
    in the Python that will serve it (``workspace`` leading its import path).

    Raises:
        ConfigError: One line: a task or class the library does not have, a task that
            cannot make that many rows.
    """
    if environment.openenv is not None:
        from osmosis_ai.environments.openenv_check import check_class

        check_class(environment, workspace)
    if path.is_file():
        return path
    rows = "".join(json.dumps(row) + "\n" for row in environment_rows(environment))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(rows)
    partial.replace(path)  # whole or absent: a run stopped midway never reads half a file
    return path
