"""Secret canaries: random values used as the rollout key, as a configured secret, as the
upstream's API key; echoed by a tool, put in a URL, in an upstream error and in raised
errors — then every file under the output root, the logs and every answer are scanned."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from osmosis_ai.testing import StubFailure, StubReply
from tests.eval.conftest import Workspace

UPSTREAM_KEY = "upstream-canary-" + secrets.token_hex(8)
CONFIGURED = "configured-canary-" + secrets.token_hex(8)


def _respond(body: dict[str, Any]) -> StubReply | StubFailure:
    last = (body.get("messages") or [{}])[-1].get("content") or ""
    if "upstream-fail" in last:
        return StubFailure(500, message=f"upstream broke; it was called with {UPSTREAM_KEY}")
    return StubReply(content=f"echo: {last}")


def _every_file(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


async def test_canaries_appear_nowhere(
    workspace: Workspace, tmp_path: Path, monkeypatch: Any
) -> None:
    workspace.stub._respond = _respond
    key_drop = tmp_path / "keys.txt"  # outside the workspace and its output
    workspace.write_rows(
        [
            {"user_prompt": "say hi", "ground_truth": "hi",
             "metadata": {"do": "leak", "key_drop": str(key_drop)}},
            {"user_prompt": "say hi", "ground_truth": "hi",
             "metadata": {"do": "leak", "raise": True, "key_drop": str(key_drop)}},
            {"user_prompt": "upstream-fail please", "ground_truth": "x",
             "metadata": {"do": "leak", "key_drop": str(key_drop)}},
        ]
    )  # fmt: skip
    workspace.config.write_text(
        workspace.config.read_text() + '[secrets]\nrequired = ["PROBE_SECRET"]\n'
    )
    monkeypatch.setenv("PROBE_SECRET", CONFIGURED)
    monkeypatch.setenv("OSMOSIS_POLICY_API_KEY", UPSTREAM_KEY)
    code, output = await workspace.run("--json")
    assert code == 0, output
    payload = json.loads(output[output.index("{") :])
    assert payload["dispatched"] == 3
    keys = set(key_drop.read_text().split())
    assert len(keys) == 1  # one run, one rollout key
    canaries = [*keys, CONFIGURED, UPSTREAM_KEY]
    # The canaries did reach the workflow and the stub, so finding none below means something.
    assert any(
        UPSTREAM_KEY in r["headers"].get("authorization", "") for r in workspace.stub.requests
    )
    files = _every_file(workspace.root / ".osmosis")
    assert len(files) > 10
    leaks = [(path, c) for path, data in files.items() for c in canaries if c.encode() in data]
    assert leaks == [], [(str(p.relative_to(workspace.root)), c[:14]) for p, c in leaks]
    assert [c for c in canaries if c in output] == []
    # The leaky content is still there, redacted rather than dropped.
    assert any(b"[REDACTED]" in data for data in files.values())
