"""The real SkyRL 0.4 and verl 0.9 interface types import in .venv-engines (make test-engines)."""

import dataclasses
import typing

import pytest

base = pytest.importorskip("skyrl.train.generators.base")
agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")


def test_skyrl_generator_types() -> None:
    from skyrl.train.entrypoints.main_base import BasePPOExp
    from skyrl.train.generators.utils import merge_stepwise_output

    input_keys = typing.get_type_hints(base.GeneratorInput).keys()
    assert {"prompts", "env_extras", "trajectory_ids"} <= input_keys
    output_keys = typing.get_type_hints(base.GeneratorOutput).keys()
    assert {"response_ids", "loss_masks", "rollout_logprobs", "is_last_step"} <= output_keys
    trajectory_fields = [f.name for f in dataclasses.fields(base.TrajectoryID)]
    assert trajectory_fields == ["instance_id", "repetition_id"]
    assert callable(merge_stepwise_output) and hasattr(BasePPOExp, "get_generator")


def test_verl_agent_loop_types() -> None:
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.workers.rollout.replica import TokenOutput

    output_fields = agent_loop.AgentLoopOutput.model_fields.keys()
    assert {"prompt_ids", "response_mask", "reward_score"} <= output_fields
    assert {"token_ids", "log_probs", "stop_reason"} <= TokenOutput.model_fields.keys()
    assert "hermes" in ToolParser._registry and callable(agent_loop.register)
