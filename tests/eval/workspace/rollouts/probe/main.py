"""A test rollout: one chat call through the rollout's endpoint, behaviour chosen per row."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    JudgeGrader,
    JudgeGraderConfig,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class Probe(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        what = (ctx.metadata or {}).get("do")
        if what == "kill_server":
            os._exit(3)
        if what == "print_long":
            print("x" * 300_000, flush=True)  # longer than any line buffer
            for index in range(2000):
                print(f"line {index}", flush=True)
        if what == "raise":
            raise RuntimeError("injected tool failure")
        if what == "hang":
            await asyncio.sleep(60)
        if what == "block":
            time.sleep(5)  # noqa: ASYNC251 -- blocks its process's loop on purpose
        if what == "fill_disk":
            await asyncio.to_thread(_fill_once, ctx.metadata or {})
        if what == "print_secret":
            print(f"the secret is {os.environ['PROBE_SECRET']}", flush=True)
        if what == "no_call":  # an agent that never reaches the model it is evaluated on
            return [*ctx.prompt, {"role": "assistant", "content": "I did not ask the model"}]
        rollout = get_rollout_context()
        assert rollout is not None
        if what == "leak":
            return await _leak(ctx, rollout.chat_completions_url, rollout.api_key or "")
        if what == "env":  # tells the test which variables the rollout server was given
            env_drop = (ctx.metadata or {})["env_drop"]
            await asyncio.to_thread(_append, env_drop, json.dumps(dict(os.environ)))
        async with httpx2.AsyncClient(timeout=60) as http:
            response = await http.post(
                f"{rollout.chat_completions_url}/chat/completions",
                json={"model": "policy", "messages": ctx.prompt},
                headers={"Authorization": f"Bearer {rollout.api_key}"},
            )
        response.raise_for_status()
        return [*ctx.prompt, response.json()["choices"][0]["message"]]


async def _leak(ctx: AgentWorkflowContext, url: str, key: str) -> list[dict[str, Any]]:
    """A careless agent: the rollout key and a configured secret end up everywhere."""
    meta = ctx.metadata or {}
    secret = os.environ["PROBE_SECRET"]
    # Tells the test the key, outside the output root.
    await asyncio.to_thread(_append, meta["key_drop"], key + "\n")
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{url}/chat/completions",
            json={"model": "policy", "messages": ctx.prompt},
            headers={"Authorization": f"Bearer {key}"},
        )
    if response.status_code != 200:
        raise RuntimeError(f"model call failed ({key}, {secret}): {response.text}")
    tool_call = {"id": "c1", "type": "function",
                 "function": {"name": "env", "arguments": f'{{"show": "{secret}"}}'}}  # fmt: skip
    messages = [
        *ctx.prompt,
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"OPENAI_API_KEY={key} SECRET={secret}"},
        response.json()["choices"][0]["message"],  # what the upstream answered
        {"role": "user", "content": f"my environment: {json.dumps(dict(os.environ))}"},
        {"role": "assistant", "content": f"fetched https://bot:{key}@example.com/x?token={secret}"},
    ]
    if ctx.artifacts_dir is not None:  # user files, copied into the run directory
        await asyncio.to_thread(_write_artifacts, ctx.artifacts_dir, f"{key} {secret}")
    print(f"debug {key} {secret} {dict(os.environ)}", flush=True)
    if meta.get("raise"):
        raise RuntimeError(f"tool failed with {key} and {secret}")
    return messages


def _fill_once(meta: dict[str, Any]) -> None:
    """Fill the filesystem of ``meta["path"]`` (the run's output), the first time only."""
    if os.path.exists(meta["marker"]):
        return
    open(meta["marker"], "w").close()
    with open(meta["path"], "wb", buffering=0) as file:
        try:
            for _ in range(1 << 16):  # bounded: 4 GiB, far beyond the test filesystem
                file.write(b"\0" * 65536)
        except OSError:
            pass  # full
    for index in range(100):  # server output the runner logs to the full disk
        print(f"filled the disk, line {index}", flush=True)


def _write_artifacts(directory: Any, text: str) -> None:
    (directory / "notes.txt").write_text(text)
    (directory / "nested").mkdir(exist_ok=True)
    (directory / "nested" / "more.log").write_bytes(b"\x00\xff binary " + text.encode())
    os.symlink("/etc/hostname", directory / "link.txt")
    os.mkfifo(directory / "pipe")


def _append(path: str, text: str) -> None:
    with open(path, "a") as file:
        file.write(text)


class Contains(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        what = (ctx.metadata or {}).get("do")
        if what == "crash_grader":
            raise RuntimeError("grader crashed")
        if what == "remove":
            ctx.sample.remove_sample = True
            return
        if "reward" in (ctx.metadata or {}):  # a reward chosen by the row
            ctx.set_reward(float((ctx.metadata or {})["reward"]))
            return
        answer = ctx.sample.messages[-1].get("content") or ""
        ctx.set_reward(1.0 if (ctx.label or "") in answer else 0.0)


if os.environ.get("PROBE_GRADER") == "judge":  # the run's [judge] grades
    rubric = "Does the final answer contain the reference answer?"
    backend = LocalBackend(
        workflow=Probe, grader=JudgeGrader, grader_config=JudgeGraderConfig(rubric=rubric)
    )
else:
    backend = LocalBackend(workflow=Probe, grader=Contains)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]), log_level="warning"
    )
