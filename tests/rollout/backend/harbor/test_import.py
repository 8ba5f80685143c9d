"""Importing the Harbor backend has no side effects on the importer's process."""

from __future__ import annotations

import os
import subprocess
import sys

_COST_MAP = "LITELLM_LOCAL_MODEL_COST_MAP"


def test_importing_the_backend_leaves_the_environment_alone() -> None:
    code = f"import os, osmosis_ai.rollout.backend.harbor; print(os.environ.get({_COST_MAP!r}))"
    env = {k: v for k, v in os.environ.items() if k != _COST_MAP}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
