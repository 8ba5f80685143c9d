"""AgentWorkflow is generic over its config, and run()'s return is normalised."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_ai.errors import OutputShapeError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
)
from osmosis_ai.rollout.workflow import normalize_output


class Config(AgentWorkflowConfig):
    name: str = "cfg"


class Typed(AgentWorkflow[Config]):
    async def run(self, ctx: AgentWorkflowContext[Config]) -> None:
        return None


def test_workflow_is_generic_over_its_config_on_this_python() -> None:
    assert Typed(Config()).config == Config()
    assert Typed().config is None
    assert AgentWorkflowContext[Config](prompt=[]).config is None


def test_abstract_run_must_be_implemented() -> None:
    class Incomplete(AgentWorkflow):
        pass

    with pytest.raises(TypeError):
        Incomplete()  # type: ignore[abstract]


def test_none_means_use_the_sample_source() -> None:
    assert normalize_output(None) is None


def test_message_list_is_wrapped() -> None:
    output = normalize_output([{"role": "assistant", "content": "x"}])
    assert output == AgentWorkflowOutput(messages=[{"role": "assistant", "content": "x"}])


def test_output_instance_is_revalidated_not_copied_blindly() -> None:
    original = AgentWorkflowOutput(messages=[], metrics={"steps": 1})
    assert normalize_output(original) == original


@pytest.mark.parametrize("bad", ["text", {"messages": []}, 42, ({"role": "user"},)])
def test_other_shapes_raise_a_type_error_naming_the_three_shapes(bad: Any) -> None:
    with pytest.raises(OutputShapeError) as info:
        normalize_output(bad)
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert "AgentWorkflowOutput" in message and "list of message dicts" in message
    assert "None" in message and type(bad).__name__ in message
