"""The rollout-server child: a port taken between picking it and binding it is picked again."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx2

from osmosis_ai.eval.server_process import RolloutServerProcess

# Loses the race once (as uvicorn reports it), then serves a real rollout server.
_ENTRYPOINT = textwrap.dedent(
    """
    import os
    import sys
    from pathlib import Path

    import uvicorn

    from osmosis_ai.rollout import AgentWorkflow, LocalBackend
    from osmosis_ai.rollout.server import create_rollout_server

    class Noop(AgentWorkflow):
        async def run(self, ctx):
            return None

    marker = Path("lost-once")
    if not marker.exists():
        marker.touch()
        print("ERROR:    [Errno 98] error while attempting to bind on address: "
              "address already in use", flush=True)
        sys.exit(3)
    app = create_rollout_server(backend=LocalBackend(workflow=Noop))
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))
    """
)


async def test_a_port_taken_before_the_child_binds_it_is_picked_again(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(_ENTRYPOINT)
    lines: list[str] = []
    server = RolloutServerProcess(
        rollout_dir=tmp_path,
        entrypoint="main.py",
        env={},
        artifact_root=tmp_path / "trials",
        log=lines.append,
    )
    try:
        url = await server.start(timeout_sec=60)
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"{url}/health")).status_code == 200
    finally:
        await server.stop()
    assert (tmp_path / "lost-once").exists()
    assert any("port taken before the rollout server bound it" in line for line in lines)
