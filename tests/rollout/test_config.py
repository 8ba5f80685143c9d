"""Workflow and grader configs: extra fields allowed, assignments validated."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from osmosis_ai.rollout import AgentWorkflowConfig, BaseConfig, ConcurrencyConfig, GraderConfig


def test_extra_fields_are_kept() -> None:
    config = AgentWorkflowConfig(name="w", max_turns=3, tools=["search"])
    assert config.max_turns == 3  # type: ignore[attr-defined]
    assert config.model_extra == {"max_turns": 3, "tools": ["search"]}


def test_assignment_is_validated() -> None:
    class Config(AgentWorkflowConfig):
        name: str = "w"
        max_turns: int = 3

    config = Config()
    with pytest.raises(ValidationError):
        config.max_turns = "many"  # type: ignore[assignment]


def test_name_is_required_on_the_base() -> None:
    with pytest.raises(ValidationError, match="name"):
        BaseConfig()  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [0, -1])
def test_concurrency_cap_must_be_positive(bad: int) -> None:
    with pytest.raises(ValidationError):
        ConcurrencyConfig(max_concurrent=bad)


def test_default_concurrency_is_uncapped() -> None:
    assert AgentWorkflowConfig(name="w").concurrency.max_concurrent is None
    assert GraderConfig(name="g").concurrency.max_concurrent is None
