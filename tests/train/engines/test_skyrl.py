"""OsmosisGenerator on SkyRL's real types, against a real engine: the embedded llama.cpp model
behind our own gateway (token ids and logprobs out), checked with SkyRL's own validators."""

from __future__ import annotations

import json
from collections import Counter
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
from osmosis_ai.gateway import EmbeddedPolicy, Gateway
from osmosis_ai.testing import ChatStub
from osmosis_ai.train.engines.skyrl import OsmosisGenerator, rollout_id, task_for
from tests.train.engines_core.workflows import Chat, Judge

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINE = "engine"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Gateway]:
    """The "inference engine": the embedded model behind a gateway (token ids + logprobs)."""
    async with Gateway(EmbeddedPolicy(n_parallel=2, context_size=2048)) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def _generator(
    base_url: str, api_key: str | None, tokenizer: Any, tmp_path: Path, **options: Any
) -> OsmosisGenerator:
    return OsmosisGenerator(
        Chat,
        base_url=base_url,
        api_key=api_key,
        tokenizer=tokenizer,
        grader=Judge,
        artifact_root=tmp_path,
        **options,
    )


def _on(engine: Gateway, tokenizer: Any, tmp_path: Path, **options: Any) -> OsmosisGenerator:
    """A generator whose inference engine is ``engine`` (chat completions: the engine renders
    prompts; token-in prompts on a real vLLM are ``test_skyrl_vllm``'s)."""
    url = engine.chat_completions_url(ENGINE)
    return _generator(url, engine.token, tokenizer, tmp_path, prompts="chat", **options)


def _input(rows: list[tuple[str, dict[str, Any]]]) -> GeneratorInput:
    """One trajectory per ``(instance id, extra_info)``; repetitions numbered per instance."""
    seen: Counter[str] = Counter()
    ids = []
    for instance, _ in rows:
        ids.append(TrajectoryID(instance_id=instance, repetition_id=seen[instance]))
        seen[instance] += 1
    return {
        "prompts": [
            [{"role": "user", "content": f"Name a color ({i})."}] for i in range(len(rows))
        ],
        "env_classes": ["osmosis"] * len(rows),
        "env_extras": [{"reward_spec": {"ground_truth": "x"}, "extra_info": e} for _, e in rows],
        "sampling_params": {"temperature": 0.0, "max_tokens": 10, "logprobs": 1},
        "trajectory_ids": ids,
        "batch_metadata": BatchMetadata(global_step=1, training_phase="train"),
    }


def _key(prompt: Any, completion: Any, logprobs: Any) -> str:
    return json.dumps([list(prompt), list(completion), [round(x, 6) for x in logprobs]])


@pytest.mark.slow
@pytest.mark.timeout(300)  # loads the model and a tokenizer: minutes on a loaded 2-core machine
async def test_rows_are_the_engines_tokens_and_pass_skyrls_checks(
    engine: Gateway, tokenizer: Any, tmp_path: Path
) -> None:
    rewards = [0.25, 0.5, 0.75, 1.0]
    rows = [(g, {"turns": 2, "reward": r}) for g, r in zip("ppqq", rewards, strict=True)]
    batch = _input(rows)
    generator = _on(engine, tokenizer, tmp_path)
    engine.records.release(ENGINE)
    try:
        output = await generator.generate(batch)
    finally:
        await generator.aclose()
    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    # Exactly the engine's tokens and logprobs: the rows are its records, one per call.
    produced = [
        _key(c.prompt_token_ids, c.completion_token_ids, c.logprobs)
        for c in engine.records.calls(ENGINE)
    ]
    got = [
        _key(p, r, lp)
        for p, r, lp in zip(
            output["prompt_token_ids"],
            output["response_ids"],
            output["rollout_logprobs"],
            strict=True,
        )
    ]
    assert Counter(got) == Counter(produced) and len(got) == 8
    assert all(
        mask == [1] * len(ids)
        for mask, ids in zip(output["loss_masks"], output["response_ids"], strict=True)
    )
    # Two contiguous rows per trajectory, in input order, the second one last.
    assert output["trajectory_ids"] == [t for t in batch["trajectory_ids"] for _ in range(2)]
    assert output["is_last_step"] == [False, True] * 4
    # The grader's reward on each trajectory's last token, nothing anywhere else.
    last_rewards = [
        r[-1] for r, last in zip(output["rewards"], output["is_last_step"], strict=True) if last
    ]
    assert last_rewards == rewards
    assert sum(map(sum, output["rewards"])) == sum(rewards)
    metrics = output["rollout_metrics"]
    assert metrics["osmosis/reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert metrics["osmosis/calls_per_rollout"] == 2 and metrics["osmosis/zero_weight_rows"] == 0
    assert "generate/avg_num_tokens" in metrics
    # SkyRL's own merge chains the calls whose prompts continue the previous row.
    merged = merge_stepwise_output(output)
    validate_generator_output(len(batch["prompts"]), merged, step_wise=True)
    assert 4 <= len(merged["response_ids"]) <= 8
    trained = sum(sum(mask) for mask in merged["loss_masks"])
    assert trained == sum(len(ids) for ids in output["response_ids"])
    assert sorted({t.instance_id for t in merged["trajectory_ids"]}) == ["p", "q"]


async def test_failed_timed_out_and_removed_rollouts_carry_no_made_up_reward(
    tokenizer: Any, tmp_path: Path
) -> None:
    # The engine here is ChatStub (token ids out, instantly): the deadlines then only
    # catch the rollouts meant to time out, even on a busy machine.
    rows: list[tuple[str, dict[str, Any]]] = [
        ("ok", {"turns": 1, "reward": 1.0}),
        ("ok", {"kind": "raise"}),  # dropped: its group has a trainable rollout
        ("slow", {"kind": "sleep"}),
        ("slow", {"kind": "sleep"}),
        ("gone", {"kind": "remove", "turns": 1}),
    ]
    batch = _input(rows)
    async with ChatStub() as stub:
        generator = _generator(stub.base_url, None, tokenizer, tmp_path, agent_timeout_sec=5.0)
        try:
            output = await generator.generate(batch)
        finally:
            await generator.aclose()
    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    ids = batch["trajectory_ids"]
    # ok_0 trains; ok_1 has no row; slow and gone keep one zero-weight row each.
    assert output["trajectory_ids"] == [ids[0], ids[2], ids[4]]
    assert output["is_last_step"] == [True, True, True]
    assert sum(output["loss_masks"][0]) == len(output["response_ids"][0]) > 0
    for row in (1, 2):
        assert set(output["loss_masks"][row]) == {0} and set(output["rewards"][row]) == {0.0}
        assert output["stop_reasons"][row] == "excluded"
    assert output["rewards"][0][-1] == 1.0
    metrics = output["rollout_metrics"]
    assert metrics["osmosis/zero_weight_rows"] == 2
    assert metrics["osmosis/failed/agent_error"] == 1 and metrics["osmosis/failed/timeout"] == 2
    assert metrics["osmosis/excluded/failed"] == 3 and metrics["osmosis/excluded/removed"] == 1
    merged = merge_stepwise_output(output)
    validate_generator_output(len(batch["prompts"]), merged, step_wise=True)


@pytest.mark.slow
async def test_a_batch_runs_on_ray_actors(ray_cluster: str, tokenizer: Any, tmp_path: Path) -> None:
    batch = _input([(g, {"turns": 1, "reward": 0.5}) for g in "abab"])
    async with ChatStub() as stub:
        generator = _generator(stub.base_url, None, tokenizer, tmp_path, backend="ray")
        try:
            output = await generator.generate(batch)
        finally:
            await generator.aclose()
    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    assert output["trajectory_ids"] == batch["trajectory_ids"], output["rollout_metrics"]
    assert [r[-1] for r in output["rewards"]] == [0.5] * 4
    assert all(sum(mask) > 0 for mask in output["loss_masks"])
    assert {h["x-session-id"] for h in (r["headers"] for r in stub.requests)} == {
        task_for(batch, i, batch=1).rollout_id for i in range(4)
    }


async def test_tasks_take_label_metadata_and_a_path_safe_id() -> None:
    batch = _input([("inst/1 x", {"reward": 1})])
    task = task_for(batch, 0, batch=3)
    assert task.rollout_id == "b3-0-inst_1_x_0" == rollout_id(batch["trajectory_ids"][0], 3, 0)
    assert task.group_id == "inst/1 x" and task.label == "x" and task.metadata == {"reward": 1}
    with pytest.raises(ConfigError, match="GeneratorInput.trajectory_ids"):
        task_for({**batch, "trajectory_ids": None}, 0, batch=1)
