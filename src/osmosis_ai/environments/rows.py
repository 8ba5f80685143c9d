"""An ``[environment]``'s rows: where they are kept, what the library checks first, and
writing them once (blocking: call it in a worker thread)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osmosis_ai.config.source import ConfigSource
from osmosis_ai.environments.config import EnvironmentConfig
from osmosis_ai.environments.served import library_env
from osmosis_ai.errors import ConfigError

__all__ = ["check_environment", "environment_rows", "make_rows", "rows_file"]

#: Bumped when the rows a file holds change for the same settings.
_ROWS_FORMAT = 1
#: How long the library may take to check a class or list its tasks (imports included).
_LIBRARY_TIMEOUT_SEC = 300


def rows_file(workspace: Path, environment: EnvironmentConfig) -> Path:
    """Where the rows of ``environment`` are kept: the same keys that make the rows, the
    same file (its caps and its Python make none of them)."""
    made_by = ("reasoning_gym", "openenv", "verifiers", "size", "seed", "prompt", "settings")
    recipe = {"format": _ROWS_FORMAT, **{key: getattr(environment, key) for key in made_by}}
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    named = environment.reasoning_gym or environment.verifiers or str(environment.openenv)
    name = named.rpartition(":")[2].rpartition(".")[2]
    return workspace / ".osmosis" / "environments" / f"{name}-{digest}.jsonl"


def check_environment(src: ConfigSource, environment: EnvironmentConfig) -> None:
    """What the environment's library says of the section, at its line, before a run.

    An OpenEnv class and a verifiers taskset are checked when the rows are made
    (`make_rows`): their library is in the environment's own Python, not in this one.
    """
    if environment.reasoning_gym is not None:
        from osmosis_ai.environments.reasoning_gym import check_task

        check_task(src, environment)


def environment_rows(environment: EnvironmentConfig, workspace: Path) -> Iterator[dict[str, Any]]:
    """The rows, in dataset form: reasoning-gym's questions, one row per OpenEnv episode
    (the seed its ``reset`` gets), or a verifiers taskset's first tasks."""
    if environment.reasoning_gym is not None:
        from osmosis_ai.environments.reasoning_gym import task_rows

        yield from task_rows(environment)
    elif environment.verifiers is not None:
        for line in _in_its_python(environment, workspace, "rows", str(environment.size)):
            try:
                yield json.loads(line)
            except ValueError:
                where = f"environment.verifiers {environment.verifiers!r}"
                raise ConfigError(f"{where}: its rows came back unreadable: {line[:200]}") from None
    else:
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
        _in_its_python(environment, workspace, "check")
    if path.is_file():
        return path
    rows = "".join(json.dumps(row) + "\n" for row in environment_rows(environment, workspace))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(rows)
    partial.replace(path)  # whole or absent: a run stopped midway never reads half a file
    return path


def _in_its_python(environment: EnvironmentConfig, workspace: Path, *args: str) -> list[str]:
    """The output lines of the library's module (``osmosis_ai.environments.<kind>``) run
    with ``args`` in the environment's Python, the workspace leading its import path.

    Raises:
        ConfigError: It failed; the message is its last line (the module prints one).
    """
    kind = environment.kind
    python = environment.python or sys.executable
    argv = [python, "-m", f"osmosis_ai.environments.{kind}", *args, str(getattr(environment, kind))]
    env = library_env(environment, workspace, {})
    where = f"environment.{kind} {getattr(environment, kind)!r}"
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_LIBRARY_TIMEOUT_SEC, check=False,
            cwd=workspace, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{where}: {python} took over {_LIBRARY_TIMEOUT_SEC} s") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot run {python}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"{python} exited with status {done.returncode}"
        raise ConfigError(f"{where}: {why}")
    return done.stdout.splitlines()
