"""RolloutSpec: one resolution of workflow, grader and configs for every backend, and the
JSON form another process loads it from."""

from __future__ import annotations

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import LocalBackend, RolloutSpec
from osmosis_ai.rollout.backend.process import ProcessBackend
from osmosis_ai.rollout.backend.spec import dump_spec, load_spec
from tests.rollout.backend.process_workflows import Behave, Match, Settings


def test_resolve_accepts_import_paths_and_keeps_the_objects() -> None:
    spec = RolloutSpec.resolve(
        workflow="tests.rollout.backend.process_workflows:Behave",
        grader="tests.rollout.backend.process_workflows:Match",
    )
    assert spec == RolloutSpec(workflow=Behave, grader=Match)


def test_resolve_names_the_argument_of_a_wrong_kind() -> None:
    with pytest.raises(ConfigError, match="agent must be a subclass of AgentWorkflow"):
        RolloutSpec.resolve(workflow=Match, workflow_label="agent")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="grader_config must be a GraderConfig instance"):
        RolloutSpec.resolve(workflow=Behave, grader_config=Settings(name="x"))  # type: ignore[arg-type]


def test_a_backend_takes_the_spec_or_its_keywords_but_not_both() -> None:
    spec = RolloutSpec.resolve(workflow=Behave, workflow_config=Settings(name="s"))
    assert LocalBackend(spec).spec is spec
    assert LocalBackend(workflow=Behave, workflow_config=spec.workflow_config).spec == spec
    with pytest.raises(ConfigError, match="either spec= or workflow="):
        LocalBackend(spec, workflow=Behave)


def test_a_spec_without_a_workflow_cannot_run_rollouts() -> None:
    grading_only = RolloutSpec.resolve(workflow=None, grader=Match)
    with pytest.raises(ConfigError, match="workflow is required"):
        LocalBackend(grading_only)
    with pytest.raises(ConfigError, match="workflow is required"):
        ProcessBackend(grading_only)


def test_the_json_form_round_trips_with_or_without_a_workflow() -> None:
    full = RolloutSpec.resolve(
        workflow=Behave, workflow_config=Settings(name="calc", answer="7"), grader=Match
    )
    assert load_spec(dump_spec(full)) == full
    grading_only = RolloutSpec(workflow=None, grader=Match)
    assert load_spec(dump_spec(grading_only)) == grading_only
