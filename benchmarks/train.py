"""Training figures: learning on the calculator example, the machinery's share of a step,
`TorchPolicy` throughput and exactness, and peak memory (the targets of docs/train/measurements.md).

Run with ``python benchmarks/train.py`` on an otherwise idle machine (about 25 minutes;
``--minutes`` sets the training budget; ``--lora-rank 16 --learning-rate 5e-4`` trains a LoRA
adapter instead of every weight; ``--engine vllm`` generates with a vLLM server from
``.venv-vllm``, ``make install-vllm``, and skips the replay, which is the torch engine's).
Needs the ``train`` extra. torch's two threads work in lock step, so any other busy process
stretches every forward pass: the overhead figure is only meaningful on an idle machine.

1. `TorchPolicy` behind a real gateway over HTTP: completion tokens/s of 8 concurrent calls
   (and of one), and the recorded logprobs against a teacher-forced pass of the same weights
   in fp32 and under the trainer's bf16 autocast.
2. ``osmosis train run`` (a real subprocess) on a copy of ``examples/calculator`` with its
   training config and ``max_minutes``: the held-out pass rate before and after, the curve,
   the step-time split and the peak RSS of the trainer.
3. The same steps replayed without the machinery: the recorded calls generated again by the
   policy's decoder alone (same prompts, same lengths, as many at a time as the engine
   batches, ``max_batch_size``, turn after turn)
   and one forward+backward pass over each rollout's tokens under the same token budget.
   The step time over that sum is the machinery's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _logprobs import teacher_forced_deltas
from _report import Figure, print_table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calculator"
CONFIG = Path("configs") / "training" / "calculator.toml"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
#: ``make install-vllm``'s environment.
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CONCURRENT = 8
REPLAYED_STEPS = 3


def _load(model_dir: Path) -> tuple[Any, Any]:
    from osmosis_ai.gateway.policies.hf_dir import load_model_dir

    return load_model_dir(model_dir, feature="benchmarks/train.py")


async def _policy_figures(model_dir: Path) -> list[Figure]:
    """Tokens/s of 8 concurrent calls and of one, and logprob exactness, over HTTP."""
    import httpx2

    from osmosis_ai.gateway import Gateway, TorchPolicy

    policy = TorchPolicy(model_dir)
    async with Gateway(policy) as gateway:
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with httpx2.AsyncClient(
            base_url=gateway.base_url, headers=headers, timeout=600
        ) as http:

            async def call(index: int, tokens: int = 128) -> int:
                body = {
                    "messages": [{"role": "user", "content": f"Write a story about ship {index}."}],
                    "max_tokens": tokens,
                    "temperature": 1.0,
                    "seed": index,
                }
                url = f"/v1/rollouts/bench-{index}/chat/completions"
                response = await http.post(url, json=body)
                response.raise_for_status()
                return int(response.json()["usage"]["completion_tokens"])

            await call(99, 8)  # warm-up
            rates = []
            for _ in range(3):
                started = time.perf_counter()
                tokens = sum(await asyncio.gather(*(call(i) for i in range(CONCURRENT))))
                rates.append(tokens / (time.perf_counter() - started))
            started = time.perf_counter()
            single = await call(100) / (time.perf_counter() - started)
        records = [
            record for i in range(CONCURRENT) for record in gateway.records.calls(f"bench-{i}")
        ]
    model, _ = _load(model_dir)
    fp32, bf16 = teacher_forced_deltas(
        model,
        [
            (r.prompt_token_ids or (), r.completion_token_ids or (), r.logprobs or ())
            for r in records
        ],
    )
    return [
        Figure(
            f"{CONCURRENT} concurrent calls: completion tokens/s (median of 3)",
            statistics.median(rates),
            "tok/s",
            target=80,
            lower_is_better=False,
        ),
        Figure("one call alone: completion tokens/s", single, "tok/s"),
        Figure(
            "recorded vs teacher-forced logprobs, fp32: max |delta|", fp32 * 1e6, "e-6", target=1e3
        ),
        Figure(
            "recorded vs teacher-forced logprobs, bf16 autocast: max |delta|", bf16 * 1e3, "e-3"
        ),
    ]


def vllm_settings(python: Path | str) -> dict[str, str]:
    """The ``[engine.vllm]`` settings of the benchmarks' servers on this 2-core CPU."""
    return {
        "engine.vllm.python": f'"{python}"',
        "engine.vllm.dtype": '"bfloat16"',
        "engine.vllm.max_model_len": "4096",
        "engine.vllm.args": '["--enforce-eager"]',
        "engine.vllm.env": '{ VLLM_CPU_KVCACHE_SPACE = "2" }',
    }


def overrides(settings: dict[str, str]) -> list[str]:
    """``settings`` (``section.key`` to a TOML value) as the values of ``--set`` flags."""
    return [f"{key}={value}" for key, value in settings.items()]


def train_example(
    workspace: Path,
    settings: dict[str, str],
    prepare: Callable[[Path], None] | None = None,
    *,
    example: Path = EXAMPLE,
    config: Path = CONFIG,
) -> tuple[Path, float, float]:
    """``osmosis train run`` on a copy of ``example`` (the calculator's) with ``settings``
    (``section.key`` to a TOML value) given as ``--set`` flags over ``config`` (relative to
    the example), ``prepare(workspace)`` called on the copy first; returns the run dir, wall
    time, peak RSS."""
    shutil.copytree(example, workspace, ignore=shutil.ignore_patterns(".osmosis"))
    if prepare is not None:
        prepare(workspace)
    flags = [arg for override in overrides(settings) for arg in ("--set", override)]
    started = time.perf_counter()
    process = subprocess.Popen(
        [OSMOSIS, "train", "run", str(config), "--name", "bench", *flags],
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        print(f"    | {line.rstrip()}", flush=True)
    code = process.wait(timeout=3 * 3600)
    wall = time.perf_counter() - started
    if code:
        raise SystemExit(f"osmosis train run exited with {code}")
    # The trainer is the largest process of the run; ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 / 1024
    return workspace / ".osmosis" / "train" / "bench", wall, peak


def _engine_figures(metrics: list[dict[str, Any]]) -> list[Figure]:
    """Completion tokens/s of the steps' rollouts and the weight push's share of a step."""
    from osmosis_ai.train.loop.runner import step_seconds

    rates = [m["tokens_per_sec"] for m in metrics if m.get("tokens_per_sec")]
    applied = [m for m in metrics if m.get("loss") is not None]
    sync = sum(m.get("weight_sync_sec") or 0.0 for m in applied)
    mismatch = [m["engine_mismatch_kl"] for m in applied if m.get("engine_mismatch_kl") is not None]
    return [
        Figure("completion tokens/s in the rollout phase (median)", _median(rates), "tok/s"),
        Figure("weight sync per applied step (mean)", sync / max(1, len(applied)), "s"),
        Figure(
            "weight sync / step time (applied steps)",
            100 * sync / max(1e-9, sum(map(step_seconds, applied))),
            "%",
        ),
        Figure(
            "engine_mismatch_kl (mean)", statistics.fmean(mismatch) * 1e3 if mismatch else 0, "e-3"
        ),
    ]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _mean_update(metrics: list[dict[str, Any]]) -> float:
    applied = [m["update_sec"] for m in metrics if m.get("loss") is not None]
    return statistics.fmean(applied) if applied else 0.0


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _print_curve(metrics: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    print(
        "\n  step  reward  pass  loss     rollouts s  update s  zero-grad groups  peak RSS GB"
        "  held-out pass"
    )
    held_out = {e["step"]: e["pass_rate"] for e in evals}
    if 0 in held_out:
        print(f"  {0:>4}{'':>76}{held_out[0]:.2f}")
    for m in metrics:
        number = _formatter(m)
        point = held_out.get(m["step"])
        print(
            f"  {m['step']:>4}  {number('reward_mean', 2):>6}  {number('pass_rate', 2):>4}  "
            f"{number('loss', 4):>7}  {m['generation_sec']:>10.1f}  {m['update_sec']:>8.1f}  "
            f"{m['zero_gradient_groups']:>16}  {m['peak_rss_gb']:>11.2f}  "
            f"{'' if point is None else f'{point:.2f}'}"
        )


def _formatter(metrics: dict[str, Any]) -> Any:
    def number(key: str, digits: int) -> str:
        value = metrics.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    return number


def _step_rollouts(run_dir: Path, step: int) -> list[Any]:
    """``step``'s rollouts as the trainer saw them: result, group and call records (from
    each rollout's ATIF trajectory and ``rollouts.jsonl``)."""
    from osmosis_ai.rollout.types import RolloutResultResponse
    from osmosis_ai.train.algorithm.sequences import RolloutRecords

    results = {
        line["rollout_id"]: line
        for line in _lines(run_dir / "rollouts.jsonl")
        if line["rollout_id"].startswith(f"step-{step:04d}-")
    }
    rollouts = []
    for rollout_id, line in sorted(results.items()):
        path = run_dir / "rollouts" / rollout_id / "trajectory.json"
        steps = json.loads(path.read_text())["steps"] if path.exists() else []
        calls = [
            {"index": index, **s["metrics"]}
            for index, s in enumerate(x for x in steps if x.get("source") == "agent")
            if "prompt_token_ids" in s.get("metrics", {})
        ]
        result = RolloutResultResponse(
            rollout_id=rollout_id, status=line["status"], sample={"reward": line["reward"]}
        )
        rollouts.append(RolloutRecords(result, f"row-{line['row']}", calls))
    return rollouts


def _trained_sequences(rollouts: list[Any]) -> list[Any]:
    """The sequences the step trained: its groups whose rewards differ."""
    from osmosis_ai.train.algorithm.advantages import zero_gradient_groups
    from osmosis_ai.train.algorithm.sequences import build_sequences

    sequences, _ = build_sequences(rollouts, drift="fork")
    zero = zero_gradient_groups(sequences)
    return [sequence for sequence in sequences if sequence.group_id not in zero]


def _pure_generation(model: Any, tokenizer: Any, rollouts: list[Any]) -> float:
    """Seconds to generate the same calls again with the decoder alone: every rollout's
    k-th call after all (k-1)-th calls, as many at a time as the engine batches, each to its
    recorded length."""
    import torch

    from osmosis_ai.gateway.policies.engines import Sampling
    from osmosis_ai.gateway.policies.engines._decoder import Decoder, GenerationJob
    from osmosis_ai.gateway.policies.engines.torch import DEFAULT_MAX_BATCH_SIZE

    calls = [rollout.calls for rollout in rollouts]
    decoder = Decoder(
        torch,
        model,
        stop_token_ids=(),  # every job runs to its recorded length
        pad_id=tokenizer.eos_token_id,
        decode=tokenizer.decode,
    )
    started = time.perf_counter()
    for turn in range(max(map(len, calls), default=0)):
        waiting = [
            GenerationJob(
                list(c[turn]["prompt_token_ids"]),
                Sampling(temperature=1.0, max_tokens=len(c[turn]["completion_token_ids"])),
            )
            for c in calls
            if turn < len(c) and c[turn]["completion_token_ids"]
        ]
        while waiting or decoder.size:
            room = DEFAULT_MAX_BATCH_SIZE - decoder.size
            if waiting and room:
                decoder.admit(waiting[:room])
                del waiting[:room]
            if decoder.size:
                decoder.step()
    return time.perf_counter() - started


def _pure_update(model: Any, sequences: list[Any], budget: int) -> float:
    """Seconds of the forward+backward passes of the trainer over ``sequences`` (bf16
    autocast, the same micro-batches and loss masks), without the loss and optimiser."""
    import torch

    from osmosis_ai.train.algorithm.logprobs import policy_logprobs
    from osmosis_ai.train.algorithm.micro_batches import collate, pack_micro_batches

    model.train()
    started = time.perf_counter()
    for indices in pack_micro_batches([len(s) for s in sequences], budget):
        chosen = [sequences[i] for i in indices]
        batch = collate(chosen, [1.0] * len(chosen), [1.0] * len(chosen))
        torch.autograd.backward(policy_logprobs(model, batch, bf16=True).sum())
    model.zero_grad(set_to_none=True)
    model.eval()
    return time.perf_counter() - started


def _overhead(run_dir: Path, model_dir: Path, config: Any) -> list[Figure]:
    from osmosis_ai.train.loop.runner import step_seconds

    metrics = _lines(run_dir / "metrics.jsonl")
    trained = [m for m in metrics if m.get("loss") is not None]
    chosen = trained[:: max(1, len(trained) // REPLAYED_STEPS)][:REPLAYED_STEPS]
    model, tokenizer = _load(model_dir)
    learned = model
    lora = config.learner.lora
    if lora is not None:  # the same adapter layers as the run's, in both replays
        from peft import get_peft_model

        from osmosis_ai.gateway.policies.hf_dir import quiet_peft
        from osmosis_ai.train.learner.core import lora_config

        with quiet_peft():
            learned = get_peft_model(model, lora_config(lora))
    budget = config.learner.token_budget
    step_sec = pure_sec = 0.0
    for m in chosen:
        rollouts = _step_rollouts(run_dir, m["step"])
        generation = _pure_generation(model, tokenizer, rollouts)
        update = _pure_update(learned, _trained_sequences(rollouts), budget)
        step = step_seconds(m)
        print(
            f"  step {m['step']}: {step:.1f} s in the run (generation {m['generation_sec']:.1f} s,"
            f" of which the policy generated {m['policy_busy_sec']:.1f} s; update"
            f" {m['update_sec']:.1f} s); alone: generation {generation:.1f} s"
            f" + forward/backward {update:.1f} s = {step / (generation + update):.3f} x"
        )
        step_sec += step
        pure_sec += generation + update
    return [
        Figure(
            f"step time / (pure generation + forward/backward), {len(chosen)} steps",
            step_sec / pure_sec,
            "x",
            target=1.15,
            digits=3,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget (max_minutes)")
    parser.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter (0: full)")
    parser.add_argument("--learning-rate", type=float, help="instead of the config's")
    parser.add_argument(
        "--engine", choices=("torch", "vllm"), default="torch", help="what generates the rollouts"
    )
    parser.add_argument(
        "--vllm-python", default=str(VLLM_PYTHON), help="the interpreter with vLLM (--engine vllm)"
    )
    parser.add_argument("--tis-cap", type=float, help="truncated importance sampling cap")
    args = parser.parse_args()
    settings = {"training.max_minutes": f"{args.minutes}"}
    if args.engine == "vllm":
        settings.update(vllm_settings(args.vllm_python))
    if args.lora_rank:
        settings["learner.lora.rank"] = str(args.lora_rank)
    if args.learning_rate:
        settings["learner.learning_rate"] = f"{args.learning_rate}"
    if args.tis_cap:
        settings["algorithm.tis_cap"] = f"{args.tis_cap}"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from osmosis_ai.train.config import load_train_config
    from osmosis_ai.train.loop.runner import step_seconds
    from osmosis_ai.train.model import resolve_model

    print(
        f"osmosis_ai training benchmarks — python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    model_dir = resolve_model("embedded")
    print_table(
        "TorchPolicy behind the gateway (SmolLM2-135M, fp32, CPU)",
        asyncio.run(_policy_figures(model_dir)),
    )
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-train-") as tmp:
        changed = ", ".join(f"{key} = {value}" for key, value in settings.items())
        print(f"\nTraining examples/calculator ({CONFIG}, {changed}):")
        run_dir, wall, peak = train_example(Path(tmp) / "calculator", settings)
        metrics = _lines(run_dir / "metrics.jsonl")
        evals = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"]
        _print_curve(metrics, evals)
        config = load_train_config(Path(tmp) / "calculator" / CONFIG, overrides(settings))
        steps_min = sum(map(step_seconds, metrics)) / 60
        before, after = evals[0]["pass_rate"], evals[-1]["pass_rate"]
        print_table(
            "Learning (held-out rows, greedy)",
            [
                Figure("held-out pass rate before", before * 100, "%"),
                Figure("held-out pass rate after", after * 100, "%"),
                Figure("gain", (after - before) * 100, "points", target=25, lower_is_better=False),
                Figure("training time (steps only)", steps_min, "min", target=15),
                Figure("whole run (model load, evaluations, checkpoints)", wall / 60, "min"),
                Figure("steps", len(metrics), ""),
                Figure("update time per applied step (mean)", _mean_update(metrics), "s"),
                Figure("peak RSS of the trainer", peak, "GB", target=8),
            ],
        )
        print_table(f"Generation and weight sync ({args.engine} engine)", _engine_figures(metrics))
        if args.engine == "torch":  # the replay generates with the torch engine's decoder
            print("\nThe same steps without the machinery:")
            print_table("Machinery overhead", _overhead(run_dir, model_dir, config))


if __name__ == "__main__":
    main()
