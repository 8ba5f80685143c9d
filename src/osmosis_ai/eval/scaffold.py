"""``osmosis rollout init``/``validate``: a runnable rollout skeleton, and an import check.

``init`` writes the rollout, an eval config, a training config and a 10-row dataset.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.server_process import RolloutServerError, RolloutServerProcess
from osmosis_ai.rollout.ids import ensure_single_path_segment

__all__ = ["scaffold_rollout", "validate_entrypoint"]

_MAIN = '''"""{name}: one chat call per row; the grader checks the answer contains the label."""

from __future__ import annotations

import os
from typing import Any

import httpx

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class {cls}Workflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None
        # Every LLM call goes to the rollout's own endpoint: that is what gets trained.
        async with httpx.AsyncClient(timeout=300) as http:
            response = await http.post(
                f"{{rollout.chat_completions_url}}/chat/completions",
                json={{"model": "policy", "messages": ctx.prompt, "max_tokens": 64}},
                headers={{"Authorization": f"Bearer {{rollout.api_key}}"}},
            )
        response.raise_for_status()
        return [*ctx.prompt, response.json()["choices"][0]["message"]]


class {cls}Grader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = str(ctx.sample.messages[-1].get("content") or "")
        label = (ctx.label or "").strip().lower()
        # An empty label is contained in every answer: it matches nothing instead.
        ctx.set_reward(1.0 if label and label in answer.lower() else 0.0)


backend = LocalBackend(workflow={cls}Workflow, grader={cls}Grader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
'''

_CONFIG = """# Local evaluation: osmosis eval run configs/eval/{name}.toml
[experiment]
rollout = "{name}"
entrypoint = "main.py"
model_path = "embedded"          # or openai:<base_url>[:<model>], or a LiteLLM id provider/model
dataset = "data/{name}.jsonl"

[evaluation]
n = 1
pass_threshold = 1.0
agent_workflow_timeout_s = 300
grader_timeout_s = 30
"""

_TRAINING = """# Training (GRPO, CPU or GPU): osmosis train run configs/training/{name}.toml
# See docs/train.md. A small run: raise steps, prompts_per_step and group_size to learn more.
# Commented keys are optional; uncomment one to set it.
[experiment]
rollout = "{name}"
entrypoint = "main.py"
model = "embedded"               # SmolLM2-135M-Instruct, or a local HuggingFace-format model dir
dataset = "data/{name}.jsonl"

[training]
steps = 4                        # optimiser steps; each runs rollouts, grades them, updates once
prompts_per_step = 2             # dataset rows per step
group_size = 4                   # rollouts per row; each is scored against its row's others
learning_rate = 1e-5             # AdamW, after a linear warm-up over a tenth of the steps
clip_low = 0.2                   # the policy ratio is clipped to [1 - clip_low, 1 + clip_high]
clip_high = 0.28                 # a higher upper bound lets rare good tokens grow (DAPO)
normalisation = "token"          # loss averaged over all tokens ("token") or per "sequence"
advantage_scale = "std"          # divide by the row's reward std ("std") or not ("none")
kl_beta = 0.0                    # KL penalty to the initial model (> 0 loads a second copy)
eval_rows = 2                    # held-out rows (not trained on), evaluated at start and end
# eval_dataset = "data/heldout.jsonl"  # or a held-out file of its own (instead of eval_rows)
eval_every = 0                   # also evaluate every N steps (0: only at start and end)
checkpoint_every = 2             # checkpoint every N steps and at the end; a rerun resumes there
max_tokens = 64                  # token limit of every model call
temperature = 1.0                # sampling temperature of every training rollout's model call
eval_temperature = 0.0           # sampling temperature of the held-out evaluations (0: greedy)
max_minutes = 0                  # stop once the steps took this many minutes (0: no limit)
pass_threshold = 1.0             # a rollout passes when its reward is at least this
device = "auto"                  # "auto" (a GPU when torch sees one, else the CPU), "cpu", "cuda:N"
precision = "auto"               # the update: "bf16" autocast, "fp32", or bf16 where it is native
token_budget = 2048              # tokens per micro-batch of the update; lower it on out of memory
resample_zero_gradient = 0       # rerun a row whose rollouts all got one reward, up to N times
lora_rank = 0                    # 0: train every weight; r > 0: train a LoRA adapter of rank r
# lora_alpha = 32                # with lora_rank: the adapter's scale is alpha / rank (2 x rank)
# lora_dropout = 0.0             # with lora_rank: dropout on the adapter's input in the update
# lora_target_modules = "all-linear"  # with lora_rank: the layers it wraps, or a list of names
keep_checkpoints = 1             # how many of the newest checkpoints stay on disk
engine = "torch"                 # what generates: the learner's model, or "vllm" (a [vllm] table)
tis_cap = 0.0                    # > 0 (e.g. 2.0): weight tokens by the learner/engine ratio, capped
tool_format = "auto"             # tool calls: the model's own syntax ("native"), or "instruction"
seed = 0                         # picks the held-out rows and each step's rows
"""

_CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Peru", "Lima"),
    ("Kenya", "Nairobi"), ("Norway", "Oslo"),
]  # fmt: skip


def scaffold_rollout(workspace: Path, name: str, *, force: bool = False) -> list[Path]:
    """Write a runnable rollout ``name`` into ``workspace``; returns the files written.

    Raises:
        ConfigError: ``name`` is not a simple identifier-like segment, or files exist
            (without ``force``).
    """
    ensure_single_path_segment(name, label="rollout name")
    if not name.replace("-", "_").isidentifier():
        raise ConfigError(f"rollout name {name!r} must be letters, digits, '_' or '-'")
    cls = "".join(part.capitalize() for part in name.replace("-", "_").split("_"))
    rows = [
        {"user_prompt": f"What is the capital of {country}?", "ground_truth": capital}
        for country, capital in _CAPITALS
    ]
    files = {
        workspace / "rollouts" / name / "main.py": _MAIN.format(name=name, cls=cls),
        workspace / "configs" / "eval" / f"{name}.toml": _CONFIG.format(name=name),
        workspace / "configs" / "training" / f"{name}.toml": _TRAINING.format(name=name),
        workspace / "data" / f"{name}.jsonl": "".join(json.dumps(row) + "\n" for row in rows),
    }
    existing = [path for path in files if path.exists()]
    if existing and not force:
        raise ConfigError(
            f"{existing[0]} already exists; pass --force to overwrite the scaffold files"
        )
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


def validate_entrypoint(
    rollout_dir: Path, entrypoint: str = "main.py", *, timeout_sec: float = 90.0
) -> tuple[bool, str]:
    """Start the entry point once, as ``osmosis eval run`` does, and stop it once it serves.

    It runs as ``__main__`` with ``_OSMOSIS_ROLLOUT_PORT`` set and must answer ``/health``
    there: an import error, an entry point that never starts a server, and one that exits
    at import all fail. Returns whether it served, and what went wrong (with its output).
    Call it outside a running event loop.
    """
    rollout_dir = rollout_dir.resolve()
    path = rollout_dir / entrypoint
    if not path.is_file():
        return False, f"{path} does not exist"
    with tempfile.TemporaryDirectory(prefix="osmosis-validate-") as artifacts:
        return asyncio.run(_serve_once(rollout_dir, entrypoint, Path(artifacts), timeout_sec))


async def _serve_once(
    rollout_dir: Path, entrypoint: str, artifact_root: Path, timeout_sec: float
) -> tuple[bool, str]:
    server = RolloutServerProcess(
        rollout_dir=rollout_dir,
        entrypoint=entrypoint,
        env={},
        artifact_root=artifact_root,
        log=lambda line: None,  # the failure quotes the output's tail
    )
    try:
        await server.start(timeout_sec=timeout_sec)
    except RolloutServerError as exc:
        return False, str(exc)
    finally:
        await server.stop()
    return True, ""
