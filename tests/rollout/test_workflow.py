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
    ExecutionRequest,
    LocalBackend,
    RolloutErrorCategory,
    RolloutStatus,
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


@pytest.mark.parametrize(
    "returned",
    [
        [{"role": "user", "content": "q"}, {"role": 5}],
        AgentWorkflowOutput(messages=[{"role": "user", "content": "q"}, {"role": None}]),
        [{"role": "user", "content": "q"}, {"role": ""}],
    ],
    ids=["list", "output", "empty-role"],
)
async def test_a_message_whose_role_is_no_string_fails_as_validation_error(returned: Any) -> None:
    class Bad(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> Any:
            return returned

    request = ExecutionRequest(id="r", prompt=[{"role": "user", "content": "q"}])
    result = (await LocalBackend(workflow=Bad).execute(request)).result
    assert result.status is RolloutStatus.FAILURE
    assert result.err_category is RolloutErrorCategory.VALIDATION_ERROR
    assert "message 1" in (result.err_message or "") and "'role'" in (result.err_message or "")


def test_native_items_without_a_role_are_kept() -> None:
    items = [{"type": "function_call", "name": "add", "arguments": "{}"}]
    assert normalize_output(items) == AgentWorkflowOutput(messages=items)
