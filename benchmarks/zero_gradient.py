"""What ``resample_zero_gradient`` costs and gains: the figures behind its default.

Trains two tasks with ``resample_zero_gradient`` = 0, 1 and 2 (everything else equal, the
same seed) and prints, for each: the held-out pass rate and mean reward before and after,
the steps that applied an update, the groups still all-equal and the ones run again, the
rollouts and policy tokens generated (the cost, independent of what else the machine runs)
and the steps' time.

- ``calculator``: ``examples/calculator`` (tool calls, exact answers; 8 steps).
- ``terse``: a format task written here, single-turn: answer an addition with the bare
  number (half the reward for the format, a bare number, with part of it for a short reply;
  half for the first number being the sum; a pass is both), with its own held-out file
  (``eval_dataset``); the model learns the format quickly and the sums slowly (14 steps).

Run with ``python benchmarks/zero_gradient.py`` (``--tasks terse`` for one task, ``--values
0 2`` for fewer settings); about 40 minutes for both tasks and three settings on 2 cores.
Needs the ``train`` extra and the embedded model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
RUN_LIMIT_SEC = 3600

TERSE_ROLLOUT = '''"""Terse answers: the bare number, nothing else."""

import os
import re

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow, AgentWorkflowConfig, Grader, LocalBackend, get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class TerseWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx):
        rollout = get_rollout_context()
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages = list(ctx.prompt)
        async with httpx2.AsyncClient(timeout=300) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": messages, "max_tokens": 24},
                headers=headers,
            )
            response.raise_for_status()
        messages.append(response.json()["choices"][0]["message"])
        return messages


class TerseGrader(Grader):
    """Half for the format (a bare number; a short reply gets part of it), half for the
    first number being the sum."""

    async def grade(self, ctx):
        reply = (ctx.sample.messages[-1].get("content") or "").strip()
        bare = re.fullmatch(r"-?[0-9]+", reply) is not None
        form = 1.0 if bare else max(0.0, 0.6 - len(reply) / 100)
        numbers = re.findall(r"-?[0-9]+", reply)
        right = bool(numbers) and numbers[0] == str(ctx.label)
        ctx.set_reward(round(0.5 * form + 0.5 * right, 3))


backend = LocalBackend(workflow=TerseWorkflow, grader=TerseGrader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
'''

TERSE_CONFIG = """[experiment]
rollout = "terse"
entrypoint = "main.py"
model = "embedded"
dataset = "data/train.jsonl"

[training]
steps = 14
prompts_per_step = 4
group_size = 8
seed = 0

[sampling]
temperature = 1.0
max_tokens = 24

[learner]
learning_rate = 5e-5

[eval]
dataset = "data/heldout.jsonl"
every = 7

[checkpoints]
every = 14
"""


def _terse_rows(count: int, seed: int) -> list[dict[str, str]]:
    chooser = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = chooser.randint(10, 99), chooser.randint(10, 99)
        rows.append(
            {
                "system_prompt": "Reply with the number only.",
                "user_prompt": f"What is {a} + {b}?",
                "ground_truth": str(a + b),
            }
        )
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _terse_workspace(root: Path) -> Path:
    (root / "rollouts" / "terse").mkdir(parents=True)
    (root / "rollouts" / "terse" / "main.py").write_text(TERSE_ROLLOUT)
    _write_jsonl(root / "data" / "train.jsonl", _terse_rows(120, seed=1))
    _write_jsonl(root / "data" / "heldout.jsonl", _terse_rows(30, seed=2))
    config = root / "configs" / "training" / "terse.toml"
    config.parent.mkdir(parents=True)
    config.write_text(TERSE_CONFIG)
    return config


def _calculator_workspace(root: Path) -> Path:
    shutil.copytree(
        ROOT / "examples" / "calculator", root, ignore=shutil.ignore_patterns(".osmosis")
    )
    return root / "configs" / "training" / "calculator.toml"


TASKS = {
    "calculator": (_calculator_workspace, ["training.steps=8", "training.max_minutes=0"]),
    "terse": (_terse_workspace, []),
}


@dataclass(frozen=True)
class Result:
    task: str
    resample: int
    before: dict[str, Any]
    after: dict[str, Any]
    applied: int
    steps: int
    zero_groups: int
    resampled: int
    rollouts: int
    tokens: int
    steps_sec: float


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(task: str, resample: int, tmp: Path) -> Result:
    make, overrides = TASKS[task]
    workspace = tmp / f"{task}-{resample}"
    config = make(workspace)
    sets = [*overrides, f"algorithm.resample_zero_gradient={resample}"]
    command = [OSMOSIS, "train", "run", str(config), "--name", "bench"]
    for value in sets:
        command += ["--set", value]
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=workspace, capture_output=True, text=True, timeout=RUN_LIMIT_SEC
    )
    if done.returncode != 0:
        raise SystemExit(f"{task} resample={resample} failed:\n{done.stdout}\n{done.stderr}")
    print(f"  {task}, resample_zero_gradient = {resample}: {time.perf_counter() - started:.0f} s")
    run_dir = workspace / ".osmosis" / "train" / "bench"
    metrics = _lines(run_dir / "metrics.jsonl")
    evals = [e for e in _lines(run_dir / "events.jsonl") if e["event"] == "eval"]
    rollouts = [
        r for r in _lines(run_dir / "rollouts.jsonl") if r["rollout_id"].startswith("step-")
    ]
    return Result(
        task=task,
        resample=resample,
        before=evals[0],
        after=evals[-1],
        applied=sum(1 for m in metrics if m["tokens_trained"]),
        steps=len(metrics),
        zero_groups=sum(m["zero_gradient_groups"] for m in metrics),
        resampled=sum(m["resampled_groups"] for m in metrics),
        rollouts=len(rollouts),
        tokens=sum(m["tokens_generated"] for m in metrics),
        steps_sec=sum(m["generation_sec"] + m["sequences_sec"] + m["update_sec"] for m in metrics),
    )


def _print(results: list[Result]) -> None:
    header = (
        f"{'task':<11}{'resample':>9}{'held-out pass':>16}{'held-out reward':>18}"
        f"{'applied':>9}{'all-equal':>10}{'rerun':>7}{'rollouts':>10}{'tokens':>9}{'steps s':>9}"
    )
    print("\n" + header)
    for r in results:
        passed = f"{r.before['pass_rate']:.2f}->{r.after['pass_rate']:.2f}"
        reward = f"{r.before['mean_reward']:.3f}->{r.after['mean_reward']:.3f}"
        print(
            f"{r.task:<11}{r.resample:>9}{passed:>16}{reward:>18}{f'{r.applied}/{r.steps}':>9}"
            f"{r.zero_groups:>10}{r.resampled:>7}{r.rollouts:>10}{r.tokens:>9}{r.steps_sec:>9.0f}"
        )
    print(
        "\napplied: steps with an update / steps; all-equal: groups left out after resampling; "
        "rerun: groups run again; rollouts and tokens: training rollouts and policy tokens "
        "generated (the cost); steps s: the steps' own time (rollouts, sequences, update)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--values", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"resample_zero_gradient — python {sys.version.split()[0]}, {os.cpu_count()} cores")
    results = []
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-zero-") as tmp:
        for task in args.tasks:
            for value in args.values:
                results.append(_run(task, value, Path(tmp)))
    _print(results)


if __name__ == "__main__":
    main()
