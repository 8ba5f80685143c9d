"""verl adapter figures: OsmosisAgentLoop's overhead per rollout and per call, and drift.

Run in the engines environment (Python 3.12, verl installed)::

    PYTHONPATH=src .venv-engines/bin/python benchmarks/engines_verl.py

Overhead: one workflow making ``k`` chat calls, run (a) on ``LocalBackend`` directly behind
a gateway whose policy answers instantly with fixed token ids, and (b) through
``OsmosisAgentLoop.run`` (built per sample, as verl does) whose ``VerlServerPolicy`` gets
the same ids from an instant in-process server manager. Sequential medians for k = 1 and
k = 5; the per-call cost is the slope, the per-rollout cost the rest. Drift: the calculator
example through the verl path on the embedded model (llama.cpp, token-in/token-out).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# The calculator example, the repository (tests.train.engines: the llama.cpp token server),
# and the benchmark helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples/calculator/rollouts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import hydra
from omegaconf import OmegaConf
from tests.train.engines._verl_engine import LlamaTokenServer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.workers.rollout.replica import TokenOutput

from _report import Figure, print_table
from osmosis_ai.gateway import Gateway
from osmosis_ai.gateway.policies._llama import embedded_model_path
from osmosis_ai.gateway.policies.base import Policy, chunks_of
from osmosis_ai.gateway.request import ChatRequest
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.train.engines.verl import close_shared_rollouts

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = 200
WARMUP = 20
DRIFT_ROWS = 8
ANSWER_IDS = [504, 3365, 314, 216, 34, 30, 2]  # "The answer is 4." and <|im_end|> (SmolLM2)


class Calls(AgentWorkflow):
    """``metadata["calls"]`` chat calls, each followed by a user turn."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None
        messages = list(ctx.prompt)
        headers = {"Authorization": f"Bearer {rollout.api_key}"}
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(int((ctx.metadata or {})["calls"])):
                response = await http.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    json={"messages": messages, "max_tokens": 16},
                    headers=headers,
                )
                messages.append(response.json()["choices"][0]["message"])
                messages.append({"role": "user", "content": "And then?"})
        return messages


class Instant(Policy):
    """The baseline's model: the same ids, no chat template, no parsing."""

    kind = "instant"

    @property
    def model(self) -> str:
        return "instant"

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        return {
            "id": "chatcmpl-instant",
            "object": "chat.completion",
            "created": 0,
            "model": "instant",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The answer is 4."},
                    "finish_reason": "stop",
                    "token_ids": ANSWER_IDS,
                    "logprobs": {"content": [{"id": i, "logprob": -0.1} for i in ANSWER_IDS]},
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(ANSWER_IDS)},
        }

    async def stream(self, request: ChatRequest) -> Any:
        for chunk in chunks_of(await self.complete(request)):
            yield chunk


class InstantServer:
    """verl's server manager answering at once with the same ids."""

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        return TokenOutput(
            token_ids=ANSWER_IDS, log_probs=[-0.1] * len(ANSWER_IDS), stop_reason="completed"
        )


def _config(response_length: int = 1024) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": 4096, "response_length": response_length}
            },
            "data": {},
        }
    )


def _loop(entry: dict[str, Any], server: Any, tokenizer: Any, config: Any) -> Any:
    item = OmegaConf.create(
        [{"name": "osmosis", "_target_": "osmosis_ai.train.engines.verl.OsmosisAgentLoop", **entry}]
    )[0]
    return hydra.utils.instantiate(
        config=item,
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def _row(index: int, calls: int) -> dict[str, Any]:
    return {
        "raw_prompt": [{"role": "user", "content": "What is 2+2?"}],
        "reward_model": {"ground_truth": "4"},
        "extra_info": {"calls": calls},
        "uid": f"b{index}",
    }


def _median_ms(durations: list[float]) -> float:
    return statistics.median(durations[WARMUP:]) * 1000


async def _baseline(calls: int) -> float:
    backend = LocalBackend(workflow=Calls)
    durations = []
    async with Gateway(Instant()) as gateway:
        for index in range(ROLLOUTS):
            rollout_id = f"base-{calls}-{index}"
            context = RolloutContext(
                chat_completions_url=gateway.chat_completions_url(rollout_id),
                api_key=gateway.token,
                rollout_id=rollout_id,
            )
            started = time.perf_counter()
            with context:
                outcome = await backend.execute(
                    ExecutionRequest(
                        id=rollout_id,
                        prompt=[{"role": "user", "content": "What is 2+2?"}],
                        metadata={"calls": calls},
                    )
                )
            gateway.records.release(rollout_id)
            durations.append(time.perf_counter() - started)
            assert outcome.result.ok, outcome.result.err_message
    return _median_ms(durations)


async def _adapter(calls: int, tokenizer: Any) -> float:
    server, config = InstantServer(), _config()
    entry = {"workflow": f"{__name__}:Calls"}
    durations = []
    for index in range(ROLLOUTS):
        started = time.perf_counter()
        output = await _loop(entry, server, tokenizer, config).run(
            {"temperature": 1.0}, **_row(index, calls)
        )
        durations.append(time.perf_counter() - started)
        assert output.extra_fields["osmosis_status"] == "success", output.extra_fields
    return _median_ms(durations)


async def _drift(tokenizer: Any) -> dict[str, float]:
    rows = [
        json.loads(line)
        for line in (ROOT / "examples/calculator/data/arithmetic.jsonl").read_text().splitlines()
    ][:DRIFT_ROWS]
    server = LlamaTokenServer(n_threads=2, context_size=8192)
    entry = {
        "workflow": "calculator.main:CalculatorWorkflow",
        "grader": "calculator.main:ExactAnswer",
    }
    outputs = await asyncio.gather(
        *(
            _loop(entry, server, tokenizer, _config()).run(
                {"temperature": 1.0, "top_p": 1.0},
                raw_prompt=[
                    {"role": "system", "content": row["system_prompt"]},
                    {"role": "user", "content": row["user_prompt"]},
                ],
                reward_model={"ground_truth": row["ground_truth"]},
                extra_info={},
                uid=f"calc-{index}",
            )
            for index, row in enumerate(rows)
        )
    )
    fields = [output.extra_fields for output in outputs]
    transitions = sum(max(0, f["osmosis_calls"] - 1) for f in fields)
    trained = sum(sum(output.response_mask) for output in outputs)
    dropped = sum(f["osmosis_dropped_tokens"] for f in fields)
    return {
        "calls": float(sum(f["osmosis_calls"] for f in fields)),
        "drift_per_transition": sum(f["osmosis_drift"] for f in fields) / max(1, transitions),
        "dropped_share": dropped / max(1, dropped + trained),
        "reward_mean": statistics.fmean(float(o.reward_score or 0.0) for o in outputs),
        "excluded": float(sum(1 for f in fields if f["osmosis_excluded"])),
    }


async def main() -> None:
    from transformers import AutoTokenizer

    gguf = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    figures: list[Figure] = []
    overheads: dict[int, float] = {}
    for calls in (1, 5):
        base = await _baseline(calls)
        adapted = await _adapter(calls, tokenizer)
        overheads[calls] = adapted - base
        figures.append(Figure(f"LocalBackend directly, {calls} call(s), per rollout", base, "ms"))
        figures.append(Figure(f"OsmosisAgentLoop.run, {calls} call(s), per rollout", adapted, "ms"))
    per_call = (overheads[5] - overheads[1]) / 4
    figures.append(Figure("adapter overhead per rollout", overheads[1] - per_call, "ms", 2.0))
    figures.append(Figure("adapter overhead per LLM call", per_call, "ms", 0.5))
    drift = await _drift(tokenizer)
    await close_shared_rollouts()
    figures += [
        Figure("calculator via verl: model calls", drift["calls"], "calls"),
        Figure(
            "calculator via verl: drift per chained call", drift["drift_per_transition"] * 100, "%"
        ),
        Figure("calculator via verl: sampled tokens dropped", drift["dropped_share"] * 100, "%"),
        Figure("calculator via verl: mean reward", drift["reward_mean"], ""),
        Figure("calculator via verl: excluded rollouts", drift["excluded"], "rollouts"),
    ]
    print_table("verl adapter (OsmosisAgentLoop)", figures)


if __name__ == "__main__":
    asyncio.run(main())
