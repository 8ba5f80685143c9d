"""The torch engine's grammar library: generation speed under a tool-call grammar, and the
calculator's pass rate, with whatever library the code under test uses.

Run with ``python benchmarks/grammar.py`` on an otherwise idle machine (about 6 minutes).
``--src DIR`` runs another checkout's ``src`` (e.g. a ``git worktree`` of an earlier
commit) in this environment, so two libraries compare on the same machine, model and
prompts. Needs the ``train`` extra and the embedded model.

1. `TorchPolicy` behind a real gateway over HTTP: completion tokens/s of 8 concurrent
   calculator requests with the tool (every reply generated under the tool-call grammar:
   an answer or a call), of the same 8 without tools (no grammar), and the share of the
   constrained calls that made a call.
2. ``osmosis eval run`` of ``examples/calculator``'s eval config (24 questions, greedy,
   multi-turn with the calculator tool) on the embedded model under the torch policy: the
   pass rate and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calculator"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
CONCURRENT = 8
ROUNDS = 3
EVAL_LIMIT_SEC = 1800


def _calculator_tool() -> dict[str, Any]:
    """The example's calculator tool, as its workflow offers it."""
    path = EXAMPLE / "rollouts" / "calculator" / "main.py"
    spec = importlib.util.spec_from_file_location("calculator_rollout", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.CALCULATOR)


async def _speed(model_dir: Path) -> dict[str, float]:
    import httpx2

    from osmosis_ai.gateway import Gateway, TorchPolicy

    tool = _calculator_tool()
    async with Gateway(TorchPolicy(model_dir)) as gateway:
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with httpx2.AsyncClient(
            base_url=gateway.base_url, headers=headers, timeout=600
        ) as http:

            async def call(index: int, tools: bool) -> tuple[int, bool]:
                body: dict[str, Any] = {
                    "messages": [
                        {"role": "system", "content": "Use the calculator tool for arithmetic."},
                        {"role": "user", "content": f"What is {17 + index} * {23 + index}?"},
                    ],
                    "max_tokens": 96,
                    "temperature": 1.0,
                    "seed": index,
                }
                if tools:
                    body["tools"] = [tool]
                url = f"/v1/rollouts/grammar-{index}-{tools}/chat/completions"
                response = await http.post(url, json=body)
                response.raise_for_status()
                answer = response.json()
                called = answer["choices"][0]["finish_reason"] == "tool_calls"
                return int(answer["usage"]["completion_tokens"]), called

            await call(99, True)  # warm-up: the first grammar also converts the tokenizer
            figures: dict[str, float] = {}
            for tools in (True, False):
                rates, calls = [], []
                for round_ in range(ROUNDS):
                    started = time.perf_counter()
                    done = await asyncio.gather(
                        *(call(round_ * CONCURRENT + i, tools) for i in range(CONCURRENT))
                    )
                    rates.append(sum(t for t, _ in done) / (time.perf_counter() - started))
                    calls += [called for _, called in done]
                label = "with the tool" if tools else "without tools"
                figures[f"{CONCURRENT} concurrent, {label}: tok/s (median of {ROUNDS})"] = (
                    statistics.median(rates)
                )
                if tools:
                    figures["constrained replies that made a call"] = sum(calls) / len(calls)
    return figures


def _calculator_eval(model_dir: Path, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-grammar-") as tmp:
        workspace = Path(tmp) / "calculator"
        shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns(".osmosis"))
        command = [
            OSMOSIS, "eval", "run", "configs/eval/calculator.toml",
            "--model", f"torch:{model_dir}", "--name", "grammar",
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=workspace, env=env, capture_output=True, text=True,
            timeout=EVAL_LIMIT_SEC,
        )  # fmt: skip
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the eval failed:\n{done.stdout}\n{done.stderr}")
        metrics = json.loads(
            (workspace / ".osmosis" / "evals" / "grammar" / "metrics.json").read_text()
        )
        summary = metrics["summary"]
        return {
            "calculator eval: pass rate (24 questions, greedy)": summary["pass_rate"],
            "calculator eval: wall time (s)": wall,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="another checkout's src directory to run")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.src:
        sys.path.insert(0, str(args.src.resolve()))
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(args.src.resolve()), env.get("PYTHONPATH")])
        )
    from osmosis_ai.gateway.policies.engines import grammar
    from osmosis_ai.train.model import resolve_model

    library = "llguidance" if "llguidance" in (grammar.__doc__ or "") else "xgrammar"
    print(f"grammar benchmark — {library} ({grammar.__file__}), {os.cpu_count()} cores")
    model_dir = resolve_model("embedded")
    figures = asyncio.run(_speed(model_dir))
    figures.update(_calculator_eval(model_dir, env))
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"  {name:<{width}}  {value:,.3f}")


if __name__ == "__main__":
    main()
