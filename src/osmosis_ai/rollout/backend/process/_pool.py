"""The warm pool: a fork server that has already imported the user's code.

``python -m osmosis_ai.rollout.backend.process._pool SPEC`` loads the spec once, then
serves JSON lines on stdin/stdout:

* ``{"op": "run", "token", "phase", "env", "log"}`` hands the request to the *spare*: a
  child forked in advance, already its own session (process group) and warmed up, which
  applies the environment, sends its output to ``log`` and runs the phase; answered by
  ``{"token", "pid"}``. A new spare is forked right after, off the rollout's path.
* ``{"op": "kill", "token"}`` kills the child's process group unless it already ended.
* When a child ends: ``{"token", "exit": <code>}`` or ``{"token", "signal": <number>}``.

Each rollout still gets a fresh process (forked from a server that never ran user code,
warmed up with our own code only), so isolation is that of a cold start at a fraction of
the cost. The server is
single-threaded, as forking requires. On end of input it kills every child and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.backend.process._child import run_phase
from osmosis_ai.rollout.backend.spec import load_spec
from osmosis_ai.rollout.context import AgentWorkflowContext
from osmosis_ai.rollout.spec import RolloutSpec
from osmosis_ai.rollout.workflow import AgentWorkflow

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux: if the pool dies, its children get SIGKILL instead of running on unowned.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _warm_up() -> None:
    """Run a no-op agent phase in memory, so the pages a rollout touches are this
    process's own before its request arrives (our code only, never the user's)."""
    import asyncio
    import tempfile

    from osmosis_ai.rollout.container import ContainerInput, run_agent_phase

    data = ContainerInput(rollout_id="warm-up", prompt=[{"role": "user", "content": "-"}])
    result = asyncio.run(
        run_agent_phase(_Idle, None, data, artifacts_dir=Path(tempfile.gettempdir()))
    )
    result.model_dump_json()


class _Idle(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "-"}]


def _spare(spec: RolloutSpec, requests: int, closing: list[int]) -> None:
    """A forked child waiting for its rollout: it runs one phase, then exits."""
    code = 70
    try:
        os.setsid()
        _die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # fd 1 was the pool's protocol pipe
        with contextlib.suppress(Exception):  # best effort: only a matter of speed
            _warm_up()
        data = b""
        while chunk := os.read(requests, 65536):
            data += chunk
        if not data:
            code = 0  # the pool is closing: never used
            return
        request = json.loads(data)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request["env"])
        code = run_phase(spec, request["phase"])
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def serve(spec: RolloutSpec) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pids: dict[str, int] = {}
    tokens: dict[int, str] = {}
    pending = b""

    def fork_spare() -> tuple[int, int]:
        requests, submit = os.pipe()
        pid = os.fork()
        if pid == 0:
            _spare(spec, requests, [wake_r, wake_w, submit])
        os.close(requests)
        return pid, submit

    spare = fork_spare()

    def reap() -> None:
        nonlocal spare
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == spare[0]:  # the spare died before it was used: replace it
                os.close(spare[1])
                spare = fork_spare()
                continue
            token = tokens.pop(pid, None)
            if token is None:
                continue
            pids.pop(token, None)
            if os.WIFSIGNALED(status):
                _send({"token": token, "signal": os.WTERMSIG(status)})
            else:
                _send({"token": token, "exit": os.waitstatus_to_exitcode(status)})

    def handle(request: dict[str, Any]) -> None:
        nonlocal spare
        token = request["token"]
        if request["op"] == "run":
            pid, submit = spare
            os.write(submit, json.dumps(request).encode())  # well under a pipe's buffer
            os.close(submit)
            pids[token] = pid
            tokens[pid] = token
            _send({"token": token, "pid": pid})
            spare = fork_spare()  # off the rollout's path: it is already running
        elif request["op"] == "kill" and token in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pids[token], signal.SIGKILL)

    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            reap()
        if 0 in readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    handle(json.loads(line))
    os.close(spare[1])  # the spare reads end of input and exits
    for pid in list(tokens):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _preload() -> None:
    """Import what every child would otherwise import lazily on its first rollout."""
    import asyncio
    import concurrent.futures.thread  # asyncio.to_thread's executor

    loop = asyncio.new_event_loop()  # warms asyncio's lazy imports; starts no thread
    loop.close()
    del concurrent


def main() -> None:
    spec = load_spec(Path(sys.argv[1]).read_bytes())
    _preload()
    # Children share the pool's memory copy-on-write; keep their garbage collector from
    # touching (and so copying) every object the pool imported.
    gc.collect()
    gc.freeze()
    # The protocol owns fd 1; anything the user's modules print goes to stderr.
    sys.stdout = sys.stderr
    _send({"ready": True})
    serve(spec)


if __name__ == "__main__":
    main()
