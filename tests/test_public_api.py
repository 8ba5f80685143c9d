"""The public import paths and names are a compatibility contract."""

from __future__ import annotations

import json
import subprocess
import sys

import osmosis_ai.rollout
import osmosis_ai.rollout.backend

ROLLOUT_NAMES = {
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "BaseConfig",
    "ConcurrencyConfig",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "JudgeGrader",
    "JudgeGraderConfig",
    "LocalBackend",
    "RolloutContext",
    "RolloutErrorCategory",
    "RolloutSample",
    "RolloutSpec",
    "RolloutStatus",
    "SampleSource",
    "get_rollout_context",
}


def test_rollout_all_is_exactly_the_documented_public_names_sorted() -> None:
    exported = osmosis_ai.rollout.__all__
    assert set(exported) == ROLLOUT_NAMES
    assert exported == sorted(exported)
    for name in exported:
        assert getattr(osmosis_ai.rollout, name) is not None


def test_backend_package_reexports_the_same_objects() -> None:
    for name in osmosis_ai.rollout.backend.__all__:
        assert getattr(osmosis_ai.rollout.backend, name) is getattr(osmosis_ai.rollout, name)


def test_importing_rollout_loads_no_server_gateway_or_framework() -> None:
    code = "import json, sys; import osmosis_ai.rollout; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    loaded = set(json.loads(out))
    forbidden = {
        "starlette",
        "uvicorn",
        "httpx",
        "httpx2",
        "fastapi",
        "strands",
        "agents",
        "openai",
        "litellm",
        "ray",
        "harbor",
        "typer",
        "rich",
        "osmosis_ai.gateway",
        "osmosis_ai.eval",
        "osmosis_ai.cli",
        "osmosis_ai.rollout.server",
        "osmosis_ai.rollout.trajectory",
    }
    assert not forbidden & loaded, forbidden & loaded


def test_package_is_typed() -> None:
    from importlib.resources import files

    assert files("osmosis_ai").joinpath("py.typed").is_file()


def test_cancel_disposition_keeps_its_backend_import_path() -> None:
    # It moved to the contract layer (rollout/status.py); the backend path still works.
    from osmosis_ai.rollout.backend.base import CancelDisposition as from_backend
    from osmosis_ai.rollout.types import CancelDisposition as from_types

    assert from_backend is from_types
