"""GPU check: `osmosis train` on a CUDA device, full fine-tuning and LoRA, in one command.

For a maintainer with a GPU machine (the project's machines have none). It needs no network
and no model download: by default it trains a randomly initialised model of SmolLM2-135M's
shape (``--shape qwen2.5-1.5b`` or ``--config <config.json>`` for another shape, ``--model
<dir>`` for a real model directory) with the embedded model's tokenizer, or the tokenizer
directory given with ``--tokenizer`` (write one where the embedded model is installed with
``--save-tokenizer DIR``: a few MB to copy). It needs the ``train`` extra (torch,
transformers, peft, llguidance: the trainer checks for them before it starts) and this
project's pure-Python dependencies; no llama.cpp or vLLM.

Each mode (``full``, ``lora``) runs ``--steps`` steps of a built-in single-turn task
("write the numbers from 1 to N"; the reward is the reply's similarity to them) through the
real stack: the gateway serving the live weights, the rollout server as a child process,
the trainer on ``--device``. It prints, per mode: generation tokens/s (completion tokens
over the engine's busy time), update tokens/s (tokens forwarded and back-propagated over
the update time), the step time split, peak GPU memory (peak RSS on the CPU), and the
largest difference between the recorded behaviour logprobs and a teacher-forced pass of the
initial weights, in fp32 and under bf16 autocast.

    python benchmarks/gpu_check.py                       # cuda, SmolLM2-135M shape
    python benchmarks/gpu_check.py --shape qwen2.5-1.5b --steps 5
    python benchmarks/gpu_check.py --model ~/models/Qwen2.5-0.5B-Instruct
    python benchmarks/gpu_check.py --device cpu --set num_hidden_layers=2 --steps 1
    python benchmarks/gpu_check.py --engine vllm --vllm-python /opt/vllm/bin/python

The torch engine generates in fp32 (``--engine-precision fp32``), so the logprob check stays
exact; ``bf16`` (what ``auto`` picks where the learner updates in bf16) for its real speed.
``--engine vllm`` generates with a vLLM server (``--vllm-python``: the interpreter that has
it; ``--vllm-dtype float32`` by default, so the logprob check stays exact; ``bfloat16`` for
its real speed) and adds the weight sync to the step split.

It exits 1 when a mode fails or the fp32 logprobs differ by more than 1e-3 (with the torch
engine in fp32, or vLLM in float32).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _logprobs import teacher_forced_deltas
from _report import Figure, print_table

#: Recorded vs teacher-forced logprobs in fp32 must agree this closely.
FP32_TOLERANCE = 1e-3
_ROLLOUT = '''
"""gpu_check's task: one model call, graded by the reply's similarity to the expected text."""

import difflib
import os

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class Reply(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext):
        rollout = get_rollout_context()
        async with httpx2.AsyncClient(timeout=600) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": ctx.prompt},
                headers={"Authorization": f"Bearer {rollout.api_key}"},
            )
        response.raise_for_status()
        return [*ctx.prompt, response.json()["choices"][0]["message"]]


class Similarity(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        reply = (ctx.sample.messages[-1].get("content") or "").strip()
        ctx.set_reward(difflib.SequenceMatcher(None, reply, ctx.label).ratio())


app = create_rollout_server(backend=LocalBackend(workflow=Reply, grader=Similarity))

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
'''


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or mps")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--shape", default="smollm2-135m", help="a named model shape")
    model.add_argument("--config", type=Path, help="a HuggingFace config.json to shape it on")
    model.add_argument("--model", type=Path, help="a real model directory (save_pretrained)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory")
    parser.add_argument(
        "--set",
        action="append",
        type=_override,
        default=[],
        metavar="KEY=VALUE",
        help="override a config field of the random model (JSON value), e.g. num_hidden_layers=4",
    )
    parser.add_argument("--modes", default="full,lora", help="full, lora or both")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument(
        "--max-staleness", type=int, default=0, help="asynchronous training's bound (0: sync)"
    )
    parser.add_argument("--save-tokenizer", type=Path, help="only write the tokenizer there")
    parser.add_argument(
        "--engine", choices=("torch", "vllm"), default="torch", help="what generates the rollouts"
    )
    parser.add_argument(
        "--engine-precision",
        choices=("fp32", "bf16", "auto"),
        default="fp32",
        help="the torch engine's [engine] precision; fp32 keeps the logprob check exact, bf16 "
        "(what auto picks where the learner updates in bf16) is the fast one",
    )
    parser.add_argument(
        "--vllm-python", default=sys.executable, help="the interpreter with vLLM (--engine vllm)"
    )
    parser.add_argument(
        "--vllm-dtype",
        default="float32",
        help="vLLM's dtype; float32 keeps the logprob check exact, bfloat16 is the fast one",
    )
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="an extra vLLM server flag (repeatable)"
    )
    return parser.parse_args()


def _tokenizer_dir(args: argparse.Namespace, scratch: Path) -> Path:
    """The tokenizer to use: given, the real model's, or the embedded model's."""
    if args.tokenizer is not None:
        return Path(args.tokenizer)
    if args.model is not None:
        return Path(args.model)
    return _embedded_tokenizer(scratch / "tokenizer")


def _embedded_tokenizer(directory: Path) -> Path:
    """The embedded model's tokenizer (read from its GGUF file), saved into ``directory``."""
    from transformers import AutoTokenizer

    from osmosis_ai.gateway.policies.llama import embedded_model_path

    gguf = embedded_model_path()  # names the package to install when it is missing
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(str(directory))
    return directory


def _override(item: str) -> tuple[str, Any]:
    """A ``--set KEY=VALUE`` pair, its value parsed as JSON."""
    key, equals, value = item.partition("=")
    try:
        if not key or not equals:
            raise ValueError(item)
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{item!r} is not KEY=VALUE with a JSON value (e.g. num_hidden_layers=4)"
        ) from None


def _model_dir(args: argparse.Namespace, tokenizer_dir: Path, scratch: Path) -> Path:
    if args.model is not None:
        return Path(args.model)
    from osmosis_ai.gateway.policies.hf_dir import quiet_transformers
    from osmosis_ai.testing.model_shapes import write_random_model

    overrides = dict(args.set)
    shape = args.config if args.config is not None else args.shape
    with quiet_transformers():
        return write_random_model(scratch / "model", shape, tokenizer_dir, overrides=overrides)


def _workspace(root: Path, args: argparse.Namespace, model_dir: Path) -> Path:
    (root / "rollouts" / "count").mkdir(parents=True)
    (root / "rollouts" / "count" / "main.py").write_text(_ROLLOUT)
    (root / "data").mkdir()
    rows = [
        {
            "user_prompt": f"Write the numbers from 1 to {n}, separated by spaces.",
            "ground_truth": " ".join(str(i) for i in range(1, n + 1)),
        }
        for n in range(3, 3 + args.prompts * 4)
    ]
    (root / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "configs" / "training").mkdir(parents=True)
    for mode in ("full", "lora"):
        (root / "configs" / "training" / f"{mode}.toml").write_text(
            textwrap.dedent(f"""\
                [experiment]
                rollout = "count"
                entrypoint = "main.py"
                model = "{model_dir}"
                dataset = "data/rows.jsonl"
                [training]
                steps = {args.steps}
                prompts_per_step = {args.prompts}
                group_size = {args.group_size}
                max_staleness = {args.max_staleness}
                [sampling]
                max_tokens = {args.max_tokens}
                temperature = 1.0
                [engine]
                precision = "{args.engine_precision}"
                [learner]
                device = "{args.device}"
                learning_rate = {1e-4 if mode == "lora" else 1e-5}
                token_budget = 8192
                [eval]
                rows = {args.prompts}
                [checkpoints]
                every = {args.steps}
            """)
            + (f"[learner.lora]\nrank = {args.lora_rank}\n" if mode == "lora" else "")
            + (_vllm_table(args) if args.engine == "vllm" else "")
        )
    return root


def _vllm_table(args: argparse.Namespace) -> str:
    """The ``[engine.vllm]`` section: the server of ``--engine vllm`` (on the CPU the trainer
    sizes its KV cache)."""
    return (
        f"[engine.vllm]\npython = {json.dumps(args.vllm_python)}\n"
        f"dtype = {json.dumps(args.vllm_dtype)}\n"
        f"args = {json.dumps(args.vllm_arg)}\n"
    )


def _records(run_dir: Path) -> list[tuple[list[int], list[int], list[float]]]:
    """The calls the initial weights generated: the first held-out evaluation (greedy) and
    step 1 (temperature 1), from their ATIF trajectories."""
    calls = []
    for prefix in ("eval-0000-", "step-0001-"):
        for path in sorted((run_dir / "rollouts").glob(f"{prefix}*/trajectory.json")):
            for step in json.loads(path.read_text())["steps"]:
                metrics = step.get("metrics") or {}
                if step.get("source") == "agent" and metrics.get("completion_token_ids"):
                    calls.append(
                        (
                            metrics["prompt_token_ids"],
                            metrics["completion_token_ids"],
                            metrics["logprobs"],
                        )
                    )
    return calls


def _figures(
    metrics: list[dict[str, Any]],
    deltas: tuple[float, float],
    cuda: bool,
    exact: bool,
    overlapped: bool,
) -> list[Figure]:
    # The first step warms up (kernels, allocator): the figures leave it out when there are
    # more, unless steps overlap (asynchronous), when a step generates the next ones' rollouts.
    steady = metrics if overlapped else metrics[1:] or metrics

    def median(key: str) -> float:
        return statistics.median(float(m.get(key) or 0) for m in steady)

    def rate(tokens: str, seconds: str) -> float:
        total = sum(float(m.get(seconds) or 0) for m in steady)
        return sum(float(m.get(tokens) or 0) for m in steady) / total if total else 0.0

    memory = "peak_gpu_memory_gb" if cuda else "peak_rss_gb"
    memory_name = "GPU memory allocated" if cuda else "RSS (whole process)"
    return [
        # An engine that measured no busy time: the rate over the rollouts.
        Figure(
            "generation: completion tokens / engine busy s",
            rate("tokens_generated", "policy_busy_sec"),
            "tok/s",
        )
        if median("policy_busy_sec")
        else Figure(
            "generation: completion tokens / rollout s",
            rate("tokens_generated", "generation_sec"),
            "tok/s",
        ),
        Figure(
            "update: tokens forwarded / update s", rate("tokens_forwarded", "update_sec"), "tok/s"
        ),
        Figure("step time: rollouts (median)", median("generation_sec"), "s", digits=2),
        Figure(
            "step time: of which the engine generated", median("policy_busy_sec"), "s", digits=2
        ),
        Figure("step time: sequences", median("sequences_sec"), "s", digits=3),
        Figure("step time: update", median("update_sec"), "s", digits=2),
        Figure("step time: of which the weight sync", median("weight_sync_sec"), "s", digits=2),
        Figure(
            "engine_mismatch_kl (mean)",
            1e3 * statistics.fmean(float(m.get("engine_mismatch_kl") or 0) for m in steady),
            "e-3",
        ),  # fmt: skip
        Figure(f"peak {memory_name}", max(m[memory] for m in metrics), "GB", digits=2),
        Figure(
            "weight probe after each push: largest median |engine - learner| logprob",
            1e3 * max(float(m.get("probe_gap") or 0) for m in metrics),
            "e-3",
            digits=3,
        ),
        Figure(
            "staleness: largest (bound --max-staleness)",
            max(float(m.get("staleness_max") or 0) for m in metrics),
            "steps",
            digits=0,
        ),
        Figure(
            "recorded vs teacher-forced logprobs, fp32: max |delta|",
            deltas[0] * 1e6,
            "e-6",
            target=FP32_TOLERANCE * 1e6 if exact else None,
        ),
        Figure("the same, teacher-forced under bf16 autocast", deltas[1] * 1e3, "e-3"),
    ]


class _Progress:
    """Prints the run's messages and one line per step (`TrainHooks`)."""

    def message(self, text: str) -> None:
        print(f"  {text}", flush=True)

    def started(self, first_step: int, last_step: int) -> None:
        pass

    def step_done(self, metrics: Mapping[str, Any]) -> None:
        print(
            f"  step {metrics['step']}: reward {_number(metrics['reward_mean'])}, rollouts "
            f"{metrics['generation_sec']:.1f} s, update {metrics['update_sec']:.1f} s",
            flush=True,
        )

    def eval_done(self, point: Any) -> None:
        print(f"  held-out after step {point.step}: mean reward {point.mean_reward:.3f}")


def _number(value: float | None) -> str:
    """``value`` to three places; ``-`` when there is none (every rollout failed)."""
    return "-" if value is None else f"{value:.3f}"


async def _check(args: argparse.Namespace, scratch: Path) -> bool:
    import torch
    import transformers

    from osmosis_ai.gateway.policies.hf_dir import load_model_dir, quiet_transformers
    from osmosis_ai.gateway.policies.torch_device import resolve_device
    from osmosis_ai.train.loop.runner import TrainingStopped, TrainOptions, run_training

    device = resolve_device(args.device, key="--device")
    tokenizer_dir = _tokenizer_dir(args, scratch)
    model_dir = _model_dir(args, tokenizer_dir, scratch)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(
        f"osmosis_ai GPU check on {device} ({name}): torch {torch.__version__}, transformers "
        f"{transformers.__version__}, model {args.model or args.config or args.shape}"
    )
    workspace = _workspace(scratch / "ws", args, model_dir)
    runs: dict[str, Path] = {}
    for mode in args.modes.split(","):
        print(f"\n{mode}:")
        if device.type == "cuda":  # each mode's own peak, without the last mode's leftovers
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        config = workspace / "configs" / "training" / f"{mode}.toml"
        options = TrainOptions(config_path=config, name=mode, fresh=True)
        try:
            runs[mode] = (await run_training(options, _Progress())).run_dir
        except TrainingStopped as exc:
            print(f"  the run stopped: {exc}")
    # The initial weights, for teacher forcing, once the runs have freed the device.
    with quiet_transformers():
        model, _ = load_model_dir(model_dir, feature="benchmarks/gpu_check.py", device=device)
    print(f"\n{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    ok = len(runs) == len(args.modes.split(","))
    for mode, run_dir in runs.items():
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        metrics = [json.loads(line) for line in lines]
        deltas = await asyncio.to_thread(teacher_forced_deltas, model, _records(run_dir))
        title = f"{mode}: {len(metrics)} steps of {args.prompts} x {args.group_size} rollouts"
        # An engine in half precision samples from another distribution than the fp32 pass.
        if args.engine == "torch":
            exact = args.engine_precision == "fp32"
        else:
            exact = args.vllm_dtype == "float32"
        print_table(
            title, _figures(metrics, deltas, device.type == "cuda", exact, args.max_staleness > 0)
        )
        ok = ok and (deltas[0] <= FP32_TOLERANCE or not exact)
    return ok


def main() -> None:
    from osmosis_ai.errors import ConfigError

    args = _arguments()
    with tempfile.TemporaryDirectory(prefix="osmosis-gpu-check-") as tmp:
        try:
            if args.save_tokenizer is not None:
                print(f"tokenizer written to {_embedded_tokenizer(args.save_tokenizer)}")
                return
            ok = asyncio.run(_check(args, Path(tmp)))
        except ConfigError as exc:  # a device, shape or directory that is not there
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
