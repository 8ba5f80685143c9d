"""The SkyRL entry point: its command line, its config check, and its generator hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("skyrl.train.entrypoints.main_base")

from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteInferenceClient,
)
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.generators.base import BatchMetadata, TrajectoryID
from skyrl.train.utils.trainer_utils import validate_generator_output

from osmosis_ai.errors import ConfigError
from osmosis_ai.testing import ChatStub
from osmosis_ai.train.engines.skyrl import OsmosisGenerator
from osmosis_ai.train.engines.skyrl_main import OsmosisPPOExp, _check_step_wise, split_arguments

STEP_WISE = ["generator.step_wise_trajectories=true", "generator.merge_stepwise_output=true"]
WORKFLOW = "tests.train.engines_core.workflows:Chat"


def test_osmosis_arguments_are_split_from_skyrls() -> None:
    options, rest = split_arguments(
        [f"osmosis.workflow={WORKFLOW}", "osmosis.backend=ray", "osmosis.agent_timeout_sec=30",
         "trainer.epochs=1", *STEP_WISE]
    )  # fmt: skip
    assert options == {"workflow": WORKFLOW, "backend": "ray", "agent_timeout_sec": 30.0}
    assert rest == ["trainer.epochs=1", *STEP_WISE]
    with pytest.raises(ConfigError, match="osmosis.workflow=module:Class"):
        split_arguments(["trainer.epochs=1"])
    with pytest.raises(ConfigError, match="unknown argument 'osmosis.bakend=ray'"):
        split_arguments([f"osmosis.workflow={WORKFLOW}", "osmosis.bakend=ray"])
    with pytest.raises(ConfigError, match="max_in_flight must be a number"):
        split_arguments([f"osmosis.workflow={WORKFLOW}", "osmosis.max_in_flight=many"])
    options, _ = split_arguments(
        [f"osmosis.workflow={WORKFLOW}", "osmosis.prompts=chat", "osmosis.tool_format=native"]
    )
    assert options == {"workflow": WORKFLOW, "prompts": "chat", "tool_format": "native"}
    with pytest.raises(ConfigError, match="osmosis.prompts=text: prompts must be one of tokens"):
        split_arguments([f"osmosis.workflow={WORKFLOW}", "osmosis.prompts=text"])


def test_the_config_must_ask_for_step_wise_rows() -> None:
    _check_step_wise(SkyRLTrainConfig.from_cli_overrides(STEP_WISE))
    with pytest.raises(ConfigError, match="generator.step_wise_trajectories=true"):
        _check_step_wise(SkyRLTrainConfig.from_cli_overrides(STEP_WISE[:1]))


async def test_the_experiment_runs_the_workflow_on_skyrls_inference_client(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    # The experiment's __init__ builds SkyRL's models and datasets (GPU): only the hook runs.
    experiment = OsmosisPPOExp.__new__(OsmosisPPOExp)
    experiment.osmosis_options = {"workflow": WORKFLOW, "artifact_root": tmp_path}
    async with ChatStub() as stub:
        client = RemoteInferenceClient(
            proxy_url=stub.served_url, server_urls=[stub.served_url], data_parallel_size=1,
            model_name="served-policy",
        )  # fmt: skip
        generator = experiment.get_generator(None, tokenizer, client)
        assert isinstance(generator, OsmosisGenerator)
        batch: Any = {
            "prompts": [[{"role": "user", "content": "hi"}]],
            "env_classes": ["osmosis"],
            "env_extras": [{"extra_info": {"turns": 1}}],
            "sampling_params": {"temperature": 0.0},
            "trajectory_ids": [TrajectoryID(instance_id="p", repetition_id=0)],
            "batch_metadata": BatchMetadata(global_step=1, training_phase="train"),
        }
        try:
            output = await generator.generate(batch)
        finally:
            await generator.aclose()
    validate_generator_output(1, output, step_wise=True)
    # Token-in: the prompt's ids went to the completions API, under SkyRL's model name.
    (request,) = stub.requests
    assert request["body"]["model"] == "served-policy"
    assert request["body"]["prompt"] == tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )  # fmt: skip
    # No grader: nothing to train, so the prompt keeps one zero-weight row.
    assert output["rollout_metrics"]["osmosis/excluded/no_reward"] == 1
    assert output["loss_masks"] == [[0]]
