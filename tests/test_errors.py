"""The error tree: every class declares its wire category and mixes in the right builtin."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import osmosis_ai.errors as errors
from osmosis_ai.rollout import AgentWorkflowOutput, RolloutErrorCategory, RolloutSample
from osmosis_ai.rollout._failures import categorize, describe


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_derives_from_osmosis_error_with_a_valid_category(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.OsmosisError)
    RolloutErrorCategory(cls.category)


def test_builtin_mixins_let_callers_catch_familiar_types() -> None:
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.MissingExtraError, ModuleNotFoundError)
    assert issubclass(errors.DeadlineExceeded, TimeoutError)
    assert issubclass(errors.OutputShapeError, TypeError)


def test_dataset_row_error_names_row_and_column() -> None:
    error = errors.DatasetRowError("is empty", row=3, column="user_prompt")
    assert str(error) == "dataset row 3, column 'user_prompt': is empty"
    assert (error.row, error.column) == (3, "user_prompt")


def _validation_error(model: type[AgentWorkflowOutput] | type[RolloutSample]) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        model(unknown=1)  # type: ignore[call-arg]
    return info.value


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (errors.DeadlineExceeded("late"), RolloutErrorCategory.TIMEOUT),
        (errors.GradingError("no reward"), RolloutErrorCategory.VALIDATION_ERROR),
        (errors.OutputShapeError("bad"), RolloutErrorCategory.VALIDATION_ERROR),
        (TimeoutError("upstream"), RolloutErrorCategory.TIMEOUT),
        (ValueError("user bug"), RolloutErrorCategory.AGENT_ERROR),
        (TypeError("user bug"), RolloutErrorCategory.AGENT_ERROR),
        (RuntimeError("user bug"), RolloutErrorCategory.AGENT_ERROR),
    ],
)
def test_categorize_is_a_lookup_not_a_guess(exc: BaseException, category: str) -> None:
    assert categorize(exc, phase="workflow") == category


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (KeyError("answer"), RolloutErrorCategory.GRADER_ERROR),
        (TimeoutError("judge"), RolloutErrorCategory.TIMEOUT),
        (errors.GradingError("no reward"), RolloutErrorCategory.VALIDATION_ERROR),
    ],
)
def test_user_code_that_raises_in_the_grader_is_a_grader_error(
    exc: BaseException, category: str
) -> None:
    assert categorize(exc, phase="grader") == category


def test_validation_errors_of_contract_models_are_validation_errors() -> None:
    assert (
        categorize(_validation_error(AgentWorkflowOutput), phase="workflow") == "validation_error"
    )
    assert categorize(_validation_error(RolloutSample), phase="grader") == "validation_error"


def test_validation_error_of_a_user_model_is_an_agent_error() -> None:
    from pydantic import BaseModel

    class ToolArgs(BaseModel):
        x: int

    with pytest.raises(ValidationError) as info:
        ToolArgs.model_validate({"x": "nope"})
    assert categorize(info.value, phase="workflow") == "agent_error"


def test_describe_is_one_line_and_capped() -> None:
    message = describe(RuntimeError("line one\nline two " + "x" * 5000), phase="workflow")
    assert "\n" not in message
    assert message.startswith("workflow raised RuntimeError: line one line two")
    assert message.endswith("[truncated]") and len(message) < 2100
    assert describe(KeyboardInterrupt(), phase="grader") == "grader raised KeyboardInterrupt"
