"""The controller's check of an ``[environment] openenv`` class, run in the Python that
will serve it (its own venv, where the controller may not have ``openenv``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from osmosis_ai.environments.config import EnvironmentConfig
from osmosis_ai.environments.served import workspace_path
from osmosis_ai.errors import ConfigError

__all__ = ["check_class"]

_CHECK_TIMEOUT_SEC = 120


def check_class(environment: EnvironmentConfig, workspace: Path) -> None:
    """Refuse, in one line, a class that cannot be imported or played (blocking).

    Raises:
        ConfigError: The class's module does not import, the name is not an OpenEnv
            environment, its action has no single text field, or ``openenv`` is missing.
    """
    python = environment.python or sys.executable
    argv = [python, "-m", "osmosis_ai.environments.openenv", str(environment.openenv)]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_CHECK_TIMEOUT_SEC,
            check=False,
            cwd=workspace,
            env={**os.environ, "PYTHONPATH": workspace_path(workspace)},
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"environment.openenv {environment.openenv!r}: importing it took over "
            f"{_CHECK_TIMEOUT_SEC} s in {python}"
        ) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"{python} exited with status {done.returncode}"
        raise ConfigError(f"environment.openenv {environment.openenv!r}: {why}")
