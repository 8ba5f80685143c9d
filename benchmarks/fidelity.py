"""Fidelity of the trainer's sequences: how the calls of the bundled examples chain.

For each bundled example (the calculator, the Strands and the OpenAI Agents calculators) and
each engine (torch, and vLLM from ``.venv-vllm`` when it is there), ``osmosis train run`` makes
one step of rollouts (a real subprocess, the example's own workflow and grader). The rollouts'
call records are then read back from the run directory (each rollout's ATIF trajectory) and
chained by ``build_sequences``, as the trainer does: the table gives the calls, how many
continued a sequence (merges), how many broke it inside or right after the previous reply
(drift: re-tokenisation) or before it (new contexts), and the sequences per rollout.

Run with ``python benchmarks/fidelity.py`` (about 10 minutes with vLLM; ``--engines torch``
for the torch engine only, ``--examples calculator`` for one example, ``--rows`` and
``--group-size`` for the step's size).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
EXAMPLES = {
    "calculator": ("calculator", "data/arithmetic_train.jsonl"),
    "strands_calculator": ("strands_calculator", "data/arithmetic.jsonl"),
    "openai_agents_calculator": ("openai_agents_calculator", "data/arithmetic.jsonl"),
}
VLLM_TABLE = (
    '[engine.vllm]\npython = "{python}"\ndtype = "bfloat16"\nmax_model_len = 4096\n'
    'args = ["--enforce-eager"]\nenv = {{ VLLM_CPU_KVCACHE_SPACE = "2" }}\n'
)
RUN_LIMIT_SEC = 1_200


def _config(example: str, dataset: str, engine: str, rows: int, group_size: int) -> str:
    text = (
        f'[experiment]\nrollout = "{example}"\nentrypoint = "main.py"\nmodel = "embedded"\n'
        f'dataset = "{dataset}"\n'
        f"[training]\nsteps = 1\nprompts_per_step = {rows}\ngroup_size = {group_size}\n"
        "seed = 0\n[sampling]\ntemperature = 0.8\nmax_tokens = 96\n[eval]\nrows = 1\n"
    )
    return text + (VLLM_TABLE.format(python=VLLM_PYTHON) if engine == "vllm" else "")


def _rollouts(run_dir: Path) -> list[Any]:
    """The step's rollouts as the trainer saw them: result, group and call records."""
    from osmosis_ai.rollout.types import RolloutResultResponse
    from osmosis_ai.train.algorithm.sequences import RolloutRecords

    rollouts = []
    for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
        result = json.loads(line)
        if not result["rollout_id"].startswith("step-"):
            continue
        path = run_dir / "rollouts" / result["rollout_id"] / "trajectory.json"
        steps = json.loads(path.read_text())["steps"] if path.exists() else []
        calls = [
            {"index": index, **step["metrics"]}
            for index, step in enumerate(s for s in steps if s.get("source") == "agent")
            if "prompt_token_ids" in step.get("metrics", {})
        ]
        # Chaining does not depend on the reward: an ungraded rollout counts as 0.
        sample = {"reward": result["reward"] if result["reward"] is not None else 0.0}
        response = RolloutResultResponse(
            rollout_id=result["rollout_id"], status=result["status"], sample=sample
        )
        rollouts.append(RolloutRecords(response, f"row-{result['row']}", calls))
    return rollouts


def _measure(example: str, engine: str, rows: int, group_size: int) -> dict[str, Any]:
    from osmosis_ai.train.algorithm.sequences import build_sequences

    folder, dataset = EXAMPLES[example]
    with tempfile.TemporaryDirectory(prefix="osmosis-fidelity-") as temp:
        workspace = Path(temp) / folder
        shutil.copytree(
            ROOT / "examples" / folder, workspace, ignore=shutil.ignore_patterns(".osmosis")
        )
        config = workspace / "configs" / "training" / "fidelity.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(_config(example, dataset, engine, rows, group_size))
        done = subprocess.run(
            [OSMOSIS, "train", "run", str(config)],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT_SEC,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise SystemExit(f"{example} ({engine}): the run failed:\n" + "\n".join(tail))
        rollouts = _rollouts(workspace / ".osmosis" / "train" / "fidelity")
    sequences, stats = build_sequences(rollouts, drift="fork")
    used = max(stats.rollouts_used, 1)
    return {
        "example": example,
        "engine": engine,
        "rollouts": stats.rollouts_used,
        "calls": stats.calls - stats.failed_calls,
        "merges": stats.merges,
        "drift": stats.drift,
        "new contexts": stats.new_contexts,
        "sequences / rollout": len(sequences) / used,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="torch,vllm", help="comma-separated: torch, vllm")
    parser.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated names")
    parser.add_argument("--rows", type=int, default=4, help="dataset rows of the step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per row")
    args = parser.parse_args()
    engines = [engine for engine in args.engines.split(",") if engine]
    if "vllm" in engines and not VLLM_PYTHON.is_file():
        print("(vLLM left out: no .venv-vllm; `make install-vllm` builds it)")
        engines.remove("vllm")
    print(f"osmosis_ai fidelity — {args.rows} rows x {args.group_size} rollouts per example")
    columns = ["example", "engine", "rollouts", "calls", "merges", "drift", "new contexts",
               "sequences / rollout"]  # fmt: skip
    print("  ".join(f"{name:>24}" if i == 0 else f"{name:>12}" for i, name in enumerate(columns)))
    for example in [name for name in args.examples.split(",") if name]:
        for engine in engines:
            row = _measure(example, engine, args.rows, args.group_size)
            cells = [
                f"{row[name]:>24}" if i == 0 else
                f"{row[name]:>12.2f}" if isinstance(row[name], float) else f"{row[name]:>12}"
                for i, name in enumerate(columns)
            ]  # fmt: skip
            print("  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
