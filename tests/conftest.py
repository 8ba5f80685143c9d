"""Test-wide fixtures: every test gets an isolated environment and storage root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_ISOLATED_PREFIXES = ("OSMOSIS_", "_OSMOSIS_")


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Clear osmosis variables, point HOME and the artifact root into ``tmp_path``."""
    for name in list(os.environ):
        if name.startswith(_ISOLATED_PREFIXES):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "artifact-root"
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    yield root


@pytest.fixture
def artifact_root(isolated_environment: Path) -> Path:
    """The per-test artifact root (``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``)."""
    return isolated_environment
