"""Secret canaries: random values used as the rollout key, as a configured secret, as the
policy's key (given with ``--policy-api-key``, ``OSMOSIS_POLICY_API_KEY`` or a provider
variable), as a credential of the user's environment the run does not pass on; echoed by a
tool, an upstream, the workflow's environment and its artifacts, put in a URL, in an upstream
error and in raised errors — then every file under the output root, the logs and the CLI
output are scanned."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing import StubFailure, StubReply
from tests.eval.conftest import Workspace

pytestmark = pytest.mark.slow  # left out of make test-fast

UPSTREAM_KEY = "upstream-canary-" + secrets.token_hex(8)
CONFIGURED = "configured-canary-" + secrets.token_hex(8)
#: A credential of the user's shell that the run never passes on by name: the workflow still
#: sees it in its environment and writes that out.
SHELL_CREDENTIAL = "shell-canary-" + secrets.token_hex(8)


def _echoing(workspace: Workspace) -> Any:
    """An upstream that answers with the key it was called with."""

    def respond(body: dict[str, Any]) -> StubReply | StubFailure:
        last = (body.get("messages") or [{}])[-1].get("content") or ""
        called_with = workspace.stub.requests[-1]["headers"].get("authorization", "")
        if "upstream-fail" in last:
            return StubFailure(500, message=f"upstream broke; it was called with {called_with}")
        return StubReply(content=f"echo: {last} (you sent {called_with})")

    return respond


def _every_file(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("key_source", ["flag", "env", "provider"])
async def test_canaries_appear_nowhere(
    workspace: Workspace, tmp_path: Path, monkeypatch: Any, key_source: str
) -> None:
    workspace.stub._respond = _echoing(workspace)
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
    args = ["--json"]
    if key_source == "flag":
        args += ["--policy-api-key", UPSTREAM_KEY]
        monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)  # the same key, exported too
    elif key_source == "env":
        monkeypatch.setenv("OSMOSIS_POLICY_API_KEY", UPSTREAM_KEY)
    else:  # LiteLLM reads its provider's variables
        workspace.write_config(model="openai/stub-model")
        monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", workspace.stub.base_url)
        monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    workspace.config.write_text(
        workspace.config.read_text() + '[secrets]\nrequired = ["PROBE_SECRET"]\n'
    )
    monkeypatch.setenv("PROBE_SECRET", CONFIGURED)
    monkeypatch.setenv("OTHER_SERVICE_API_KEY", SHELL_CREDENTIAL)
    code, output = await workspace.run(*args)
    assert code == 0, output
    payload = json.loads(output[output.index("{") :])
    assert payload["dispatched"] == 3
    keys = set(key_drop.read_text().split())
    assert len(keys) == 1  # one run, one rollout key
    canaries = [*keys, CONFIGURED, UPSTREAM_KEY, SHELL_CREDENTIAL]
    # The canaries did reach the workflow and the stub, so finding none below means something.
    assert all(
        UPSTREAM_KEY in r["headers"].get("authorization", "") for r in workspace.stub.requests
    )
    files = _every_file(workspace.root / ".osmosis")
    assert len(files) > 10
    # The workflow wrote its environment out, the shell's credential with it.
    assert any(b"OTHER_SERVICE_API_KEY" in data for data in files.values())
    leaks = [(path, c) for path, data in files.items() for c in canaries if c.encode() in data]
    assert leaks == [], [(str(p.relative_to(workspace.root)), c[:14]) for p, c in leaks]
    assert [c for c in canaries if c in output] == []
    # The leaky content is still there, redacted rather than dropped.
    assert any(b"[REDACTED]" in data for data in files.values())
    (run_dir,) = workspace.run_dirs()
    copied = _every_file(run_dir / "artifacts")
    assert sorted(p.name for p in copied) == ["more.log", "more.log", "notes.txt", "notes.txt"]
    assert all(b"[REDACTED]" in data for data in copied.values())
    # What could not be checked byte for byte is gone: links and FIFOs are never kept.
    trials = run_dir / "rollout_trials"
    assert [p for p in trials.rglob("*") if p.is_symlink() or p.is_fifo()] == []
