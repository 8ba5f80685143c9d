"""strands-agents and openai-agents are installed together, at the versions pyproject pins.

Strands' own [openai]/[litellm] extras pin openai<3 while openai-agents needs openai>=3; pip
resolves such a conflict by silently installing an older version of one framework. These
checks fail if that ever happens in the environment the tests run in.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[4] / "pyproject.toml"
EXTRAS = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]


def _satisfied(requirement: Requirement) -> bool:
    return requirement.specifier.contains(version(requirement.name), prereleases=True)


@pytest.mark.parametrize("extra", ["strands", "openai-agents"])
def test_installed_versions_are_the_pinned_ones(extra: str) -> None:
    pins = [Requirement(raw) for raw in EXTRAS[extra]]
    assert pins
    for pin in pins:
        assert _satisfied(pin), f"{pin.name} {version(pin.name)} is outside {pin}"


@pytest.mark.parametrize("distribution", ["strands-agents", "openai-agents"])
def test_each_framework_has_what_it_requires(distribution: str) -> None:
    for raw in requires(distribution) or []:
        requirement = Requirement(raw)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra of the framework, which we do not install
        assert _satisfied(requirement), (
            f"{distribution} needs {requirement}, found {version(requirement.name)}"
        )


def test_our_extras_never_use_the_frameworks_conflicting_extras() -> None:
    for extra in ("strands", "openai-agents", "all", "dev"):
        for raw in EXTRAS[extra]:
            assert "strands-agents[" not in raw.replace(" ", ""), raw
