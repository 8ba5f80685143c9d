"""The warm pool: a fork server that has already imported the user's code.

``python -m osmosis_ai.rollout.backend.process._pool SPEC`` loads the spec once, then
serves JSON lines on stdin/stdout:

* ``{"op": "run", "token", "phase", "env", "log"}`` forks a child that becomes its own
  session (process group), applies the environment, sends its output to ``log`` and runs
  the phase; answered by ``{"token", "pid"}``.
* ``{"op": "kill", "token"}`` kills the child's process group unless it already ended.
* When a child ends: ``{"token", "exit": <code>}`` or ``{"token", "signal": <number>}``.

Each rollout still gets a fresh process (forked from a server that never ran user code),
so isolation is that of a cold start at a fraction of the cost. The server is
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

from osmosis_ai.rollout.backend._spec import LoadedSpec, load_spec
from osmosis_ai.rollout.backend.process._child import run_phase

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux: if the pool dies, its children get SIGKILL instead of running on unowned.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(spec: LoadedSpec, request: dict[str, Any], closing: list[int]) -> None:
    code = 70
    try:
        os.setsid()
        _die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
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


def serve(spec: LoadedSpec) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pids: dict[str, int] = {}
    tokens: dict[int, str] = {}
    pending = b""

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            token = tokens.pop(pid, None)
            if token is None:
                continue
            pids.pop(token, None)
            if os.WIFSIGNALED(status):
                _send({"token": token, "signal": os.WTERMSIG(status)})
            else:
                _send({"token": token, "exit": os.waitstatus_to_exitcode(status)})

    def handle(request: dict[str, Any]) -> None:
        token = request["token"]
        if request["op"] == "run":
            pid = os.fork()
            if pid == 0:
                _child(spec, request, [wake_r, wake_w])
            pids[token] = pid
            tokens[pid] = token
            _send({"token": token, "pid": pid})
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
