"""``osmosis view`` on the command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.eval.conftest import OSMOSIS


def test_view_command_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [OSMOSIS, "view", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert result.returncode == 2 and "is not a directory" in result.stderr
