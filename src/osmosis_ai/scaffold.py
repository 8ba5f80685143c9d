"""``osmosis rollout init``/``validate``: a runnable rollout skeleton, and an import check.

``init`` writes the rollout, an eval config, a training config and a 10-row dataset. The
configs are written from the keys' declarations (`osmosis_ai.config.schema`): every key,
with its comment, the optional ones commented out.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from osmosis_ai.config.schema import Section, scaffold_toml
from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.config import EVAL_EXPERIMENT, EVALUATION
from osmosis_ai.eval.server_process import RolloutServerError, RolloutServerProcess
from osmosis_ai.rollout.ids import ensure_single_path_segment
from osmosis_ai.train.config import TRAIN_EXPERIMENT, TRAIN_SECTIONS

__all__ = ["scaffold_rollout", "validate_entrypoint"]

_MAIN = '''"""{name}: one chat call per row; the grader checks the answer contains the label.

The workflow calls the rollout's OpenAI-compatible endpoint with plain HTTP: nothing to
install beyond osmosis-ai, and the request is exactly what the gateway records and the
trainer trains on. An agent written with Strands or the OpenAI Agents SDK runs here
unchanged through its wrapper classes instead (docs/integrations.md).
"""

from __future__ import annotations

import os
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.server import create_rollout_server


class {cls}Workflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None
        # Every LLM call goes to the rollout's own endpoint: that is what gets trained.
        # The process's one TLS context: a client that builds its own spends ~50 ms of CPU.
        async with httpx2.AsyncClient(timeout=300, verify=tls_context()) as http:
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

#: The last header line of both configs, above their generated tables.
_OPTIONAL = "# Commented keys are optional; uncomment one to set it.\n"

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
        workspace / "configs" / "eval" / f"{name}.toml": _eval_toml(name),
        workspace / "configs" / "training" / f"{name}.toml": _training_toml(name),
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


def _eval_toml(name: str) -> str:
    return (
        f"# Local evaluation: osmosis eval run configs/eval/{name}.toml\n{_OPTIONAL}"
        + _experiment_toml(EVAL_EXPERIMENT, name)
        + scaffold_toml(EVALUATION)
    )


def _training_toml(name: str) -> str:
    return (
        f"# Training (GRPO, CPU or GPU): osmosis train run configs/training/{name}.toml\n"
        "# See docs/train/README.md. A small run: raise steps, prompts_per_step and group_size to "
        f"learn more.\n{_OPTIONAL}"
        + _experiment_toml(TRAIN_EXPERIMENT, name)
        + "\n".join(scaffold_toml(section) for section in TRAIN_SECTIONS)
    )


def _experiment_toml(experiment: Section, name: str) -> str:
    return scaffold_toml(experiment, {"rollout": name, "dataset": f"data/{name}.jsonl"}) + "\n"


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
