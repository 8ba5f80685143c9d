"""Optional dependencies fail with the extra to install, and the table matches pyproject."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from osmosis_ai._extras import EXTRA_DISTRIBUTIONS, import_optional
from osmosis_ai.errors import MissingExtraError, OsmosisError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
DECLARED_EXTRAS = {
    "server", "gateway", "litellm", "strands", "openai-agents", "langgraph", "pydantic-ai",
    "eval", "ray", "harbor", "viewer", "train", "track", "skyrl", "verl", "reasoning-gym",
    "openenv", "verifiers", "all", "dev",
}  # fmt: skip


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match is not None
    return match.group(0).lower()


def test_every_documented_extra_is_declared() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert set(extras) == DECLARED_EXTRAS


@pytest.mark.parametrize("extra", sorted(EXTRA_DISTRIBUTIONS))
def test_module_table_matches_pyproject(extra: str) -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    declared = {_requirement_name(req) for req in extras[extra] if not req.startswith("osmosis-ai")}
    assert {dist for dist, _ in EXTRA_DISTRIBUTIONS[extra]} == declared


def test_all_extra_covers_every_feature_extra() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (combined,) = extras["all"]
    included = set(combined.split("[", 1)[1].rstrip("]").split(","))
    # harbor needs Python 3.12 and is installed on its own; train pins the local CPU torch
    # build, which a plain `[all]` install elsewhere would fetch as the multi-GB CUDA one;
    # skyrl needs Python 3.12 and a GPU install of SkyRL, verl a GPU training stack: both
    # are installed on the training cluster; openenv pins mcp < 2 and verifiers openai < 3,
    # which the agent frameworks' extras do not take: each goes in an environment of its own.
    left_out = {"harbor", "train", "skyrl", "verl", "openenv", "verifiers"}
    assert included == set(EXTRA_DISTRIBUTIONS) - left_out


def test_missing_optional_module_names_the_extra_to_install() -> None:
    with pytest.raises(MissingExtraError) as info:
        import_optional("osmosis_nonexistent_framework", extra="strands", feature="Strands support")
    error = info.value
    assert isinstance(error, ModuleNotFoundError) and isinstance(error, OsmosisError)
    assert "pip install 'osmosis-ai[strands]'" in str(error)
    assert "Strands support" in str(error)
    assert error.extra == "strands"


def test_present_module_is_returned() -> None:
    module = import_optional("json", extra="server", feature="JSON")
    assert module.dumps([]) == "[]"


def test_missing_module_not_owned_by_the_extra_propagates_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "osmosis_probe_pkg.py").write_text("import osmosis_other_missing_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        import_optional("osmosis_probe_pkg", extra="server", feature="probe")
    assert not isinstance(info.value, MissingExtraError)
    assert info.value.name == "osmosis_other_missing_dep"
