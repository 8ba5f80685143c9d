"""Engine adapter figures: overhead per rollout and per call over LocalBackend, and drift.

Run in the engines environment (Python 3.12, SkyRL and verl installed)::

    PYTHONPATH=src .venv-engines/bin/python benchmarks/engines.py

SkyRL overhead: one workflow making ``k`` chat calls to an instant OpenAI-compatible upstream
(``ChatStub``, token ids included), run (a) on ``LocalBackend`` directly with the upstream as
its endpoint, and (b) through ``OsmosisGenerator.generate`` (one trajectory per batch: gateway,
call records, sequences, step-wise rows). Sequential medians for k = 1 and k = 5; the
per-call cost is the slope, the per-rollout cost the rest. Drift: the calculator example
through the SkyRL path on the embedded model (llama.cpp returns token ids and logprobs), and
what SkyRL's ``merge_stepwise_output`` makes of the rows.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from skyrl.train.generators.base import BatchMetadata, TrajectoryID
from skyrl.train.generators.utils import merge_stepwise_output

from _report import Figure, print_table
from osmosis_ai.gateway import EmbeddedPolicy, Gateway
from osmosis_ai.gateway.policies._llama import embedded_model_path
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.testing import ChatStub
from osmosis_ai.train.engines.skyrl import OsmosisGenerator

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = 200
WARMUP = 20
DRIFT_ROWS = 8
PROMPT = [{"role": "user", "content": "What is 2+2?"}]


class Calls(AgentWorkflow):
    """``metadata["calls"]`` chat calls, each followed by a user turn."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None
        messages = list(ctx.prompt)
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(int((ctx.metadata or {})["calls"])):
                response = await http.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    json={"model": "m", "messages": messages, "max_tokens": 16},
                    headers=headers,
                )
                messages.append(response.json()["choices"][0]["message"])
                messages.append({"role": "user", "content": "And then?"})
        return messages


class Done(Grader):
    """Every rollout earns 1.0 (the figures time the plumbing, not the grading)."""

    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


def _median_ms(durations: list[float]) -> float:
    return statistics.median(durations[WARMUP:]) * 1000


def _batch(rows: list[dict[str, Any]], prompts: list[list[dict[str, Any]]]) -> Any:
    return {
        "prompts": prompts,
        "env_classes": ["osmosis"] * len(rows),
        "env_extras": rows,
        "sampling_params": {"temperature": 1.0, "max_tokens": 96},
        "trajectory_ids": [
            TrajectoryID(instance_id=f"p{i}", repetition_id=0) for i in range(len(rows))
        ],
        "batch_metadata": BatchMetadata(global_step=1, training_phase="train"),
    }


async def _baseline(stub: ChatStub, calls: int) -> float:
    backend = LocalBackend(workflow=Calls, grader=Done)
    durations = []
    for index in range(ROLLOUTS):
        rollout_id = f"base-{calls}-{index}"
        context = RolloutContext(chat_completions_url=stub.base_url, rollout_id=rollout_id)
        started = time.perf_counter()
        with context:
            outcome = await backend.execute(
                ExecutionRequest(id=rollout_id, prompt=PROMPT, label="4", metadata={"calls": calls})
            )
        durations.append(time.perf_counter() - started)
        assert outcome.result.ok, outcome.result.err_message
    return _median_ms(durations)


async def _skyrl_adapter(stub: ChatStub, calls: int, tokenizer: Any) -> float:
    generator = OsmosisGenerator(Calls, grader=Done, base_url=stub.base_url, tokenizer=tokenizer)
    durations = []
    try:
        for _ in range(ROLLOUTS):
            batch = _batch([{"label": "4", "extra_info": {"calls": calls}}], [PROMPT])
            started = time.perf_counter()
            output = await generator.generate(batch)
            durations.append(time.perf_counter() - started)
            assert len(output["response_ids"]) == calls  # one step-wise row per call
    finally:
        await generator.aclose()
    return _median_ms(durations)


async def _skyrl_drift(tokenizer: Any) -> dict[str, float]:
    lines = (ROOT / "examples/calculator/data/arithmetic.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines][:DRIFT_ROWS]
    prompts = [
        [
            {"role": "system", "content": row["system_prompt"]},
            {"role": "user", "content": row["user_prompt"]},
        ]
        for row in rows
    ]
    extras = [{"reward_spec": {"ground_truth": row["ground_truth"]}} for row in rows]
    async with Gateway(EmbeddedPolicy(n_parallel=4)) as engine:
        generator = OsmosisGenerator(
            "calculator.main:CalculatorWorkflow",
            grader="calculator.main:ExactAnswer",
            base_url=engine.chat_completions_url("engine"),
            api_key=engine.token,
            tokenizer=tokenizer,
        )
        try:
            output = await generator.generate(_batch(extras, prompts))
        finally:
            await generator.aclose()
    metrics = output["rollout_metrics"]
    calls = metrics["osmosis/calls_per_rollout"] * metrics["osmosis/rollouts"]
    transitions = max(1.0, calls - metrics["osmosis/rollouts"])
    merged = merge_stepwise_output(output)
    return {
        "calls": calls,
        "drift_per_transition": metrics["osmosis/drift"] / transitions,
        "rows": float(len(output["response_ids"])),
        "merged_rows": float(len(merged["response_ids"])),
        "reward_mean": metrics["osmosis/reward_mean"],
        "excluded": sum(v for k, v in metrics.items() if k.startswith("osmosis/excluded/")),
    }


async def skyrl_figures(tokenizer: Any) -> None:
    """The SkyRL adapter's table."""
    figures: list[Figure] = []
    overheads: dict[int, float] = {}
    async with ChatStub() as stub:
        for calls in (1, 5):
            base = await _baseline(stub, calls)
            adapted = await _skyrl_adapter(stub, calls, tokenizer)
            overheads[calls] = adapted - base
            figures.append(
                Figure(f"LocalBackend directly, {calls} call(s), per rollout", base, "ms")
            )
            figures.append(Figure(f"OsmosisGenerator, {calls} call(s), per rollout", adapted, "ms"))
    per_call = (overheads[5] - overheads[1]) / 4
    figures.append(Figure("adapter overhead per rollout", overheads[1] - per_call, "ms", 2.0))
    figures.append(Figure("adapter overhead per LLM call", per_call, "ms", 0.5))
    drift = await _skyrl_drift(tokenizer)
    figures += [
        Figure("calculator via SkyRL: model calls", drift["calls"], "calls"),
        Figure(
            "calculator via SkyRL: drift per chained call", drift["drift_per_transition"] * 100, "%"
        ),
        Figure("calculator via SkyRL: step-wise rows", drift["rows"], "rows"),
        Figure(
            "calculator via SkyRL: rows after merge_stepwise_output", drift["merged_rows"], "rows"
        ),
        Figure("calculator via SkyRL: mean reward", drift["reward_mean"], ""),
        Figure("calculator via SkyRL: excluded rollouts", drift["excluded"], "rollouts"),
    ]
    print_table("SkyRL adapter (OsmosisGenerator)", figures)


#: One entry per engine adapter, each printing its own table.
#: verl: add its figures function here (it takes the tokenizer, like ``skyrl_figures``).
ENGINES: list[Callable[[Any], Awaitable[None]]] = [skyrl_figures]


async def main() -> None:
    from transformers import AutoTokenizer

    # The calculator example's workflow is imported by name ("calculator.main:...").
    sys.path.insert(0, str(ROOT / "examples/calculator/rollouts"))
    gguf = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    for figures in ENGINES:
        await figures(tokenizer)


if __name__ == "__main__":
    asyncio.run(main())
