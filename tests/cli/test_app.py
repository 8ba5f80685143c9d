"""The installed ``osmosis`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from osmosis_ai import __version__

OSMOSIS = Path(sys.executable).with_name("osmosis")


def test_version_prints_the_package_version() -> None:
    out = subprocess.run([OSMOSIS, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"osmosis-ai {__version__}"


def test_help_describes_the_command() -> None:
    out = subprocess.run([OSMOSIS, "--help"], capture_output=True, text=True, check=True)
    assert "Usage: osmosis" in out.stdout
    assert "--version" in out.stdout


def test_unknown_command_fails_with_usage() -> None:
    out = subprocess.run([OSMOSIS, "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "No such command" in out.stderr


def test_flags_read_as_flags_in_help() -> None:
    for command in (["train", "run"], ["eval", "run"], []):
        out = subprocess.run(
            [OSMOSIS, *command, "--help"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert "--help" in out.stdout and "<bool>" not in out.stdout, out.stdout
        if command:  # a run takes config overrides
            assert "--set" in out.stdout and "SECTION.KEY=VALUE" in out.stdout
