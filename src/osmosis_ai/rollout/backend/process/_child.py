"""The child side of `ProcessBackend`: one phase of one rollout, then exit.

Runs either in a process forked from the warm pool (`_pool`) or as a fresh interpreter
(``python -m osmosis_ai.rollout.backend.process._child SPEC PHASE``, used inside bubblewrap).
Everything it needs arrives in the environment and the rollout's private directory; the
phase itself is the in-container runner (`osmosis_ai.rollout.container`).
"""

from __future__ import annotations

import faulthandler
import os
import resource
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from osmosis_ai.rollout.backend.spec import load_spec
from osmosis_ai.rollout.container import MEMORY_LIMIT_ENV, ContainerPaths, agent_main, grader_main
from osmosis_ai.rollout.context import ENV_CHAT_COMPLETIONS_URL
from osmosis_ai.rollout.spec import RolloutSpec

__all__ = ["GATEWAY_SOCKET_ENV", "run_phase"]

#: Set when the sandbox has no network: the Unix socket that leads to the gateway.
GATEWAY_SOCKET_ENV = "OSMOSIS_GATEWAY_SOCKET"


def _limit_memory() -> None:
    limit = os.environ.get(MEMORY_LIMIT_ENV, "")
    if limit.isdigit():
        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))


def _route_through_relay() -> None:
    socket_path = os.environ.get(GATEWAY_SOCKET_ENV)
    url = os.environ.get(ENV_CHAT_COMPLETIONS_URL, "")
    if not socket_path or not url:
        return
    from osmosis_ai.rollout.backend._relay import start_loopback_relay

    port = start_loopback_relay(socket_path)
    parts = urlsplit(url)
    os.environ[ENV_CHAT_COMPLETIONS_URL] = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


def run_phase(spec: RolloutSpec, phase: str) -> int:
    """Run ``phase`` (``agent`` or ``grader``) with the paths and limits of the environment."""
    faulthandler.enable()  # a native crash leaves the Python stack in the output
    _route_through_relay()
    _limit_memory()
    paths = ContainerPaths.from_env()
    if phase == "agent":
        workflow = spec.require_workflow()
        return agent_main(workflow, spec.workflow_config, paths=paths, write_trajectory=False)
    assert spec.grader is not None
    return grader_main(spec.grader, spec.grader_config, paths=paths)


def main() -> None:
    spec_path, phase = sys.argv[1:3]
    code = run_phase(load_spec(Path(spec_path).read_bytes()), phase)
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
