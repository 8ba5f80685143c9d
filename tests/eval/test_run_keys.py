"""``osmosis eval run`` and the policy's credentials: the rollout server never gets them,
and no output shows them (real CLI process, rollout server, gateway, stub model)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.eval.conftest import Workspace

POLICY_KEY = "policy-key-" + secrets.token_hex(8)
URL_PASSWORD = "url-pass-" + secrets.token_hex(8)


def _every_file(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_the_rollout_server_never_gets_the_policy_credentials(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_drop = tmp_path / "env.json"  # what the workflow saw, written outside the output
    workspace.write_rows(
        [{"user_prompt": "say hi", "ground_truth": "hi",
          "metadata": {"do": "env", "env_drop": str(env_drop)}}]
    )  # fmt: skip
    monkeypatch.setenv("OSMOSIS_POLICY_API_KEY", POLICY_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", POLICY_KEY)  # a provider variable with the same key
    monkeypatch.setenv("MY_COPY", f"Bearer {POLICY_KEY}")  # any name, containing the key
    monkeypatch.setenv("UNRELATED_TOKEN", "kept")
    code, out = await workspace.run()
    assert code == 0, out
    seen = json.loads(env_drop.read_text())
    assert [value for value in seen.values() if POLICY_KEY in value] == []
    assert not {"OSMOSIS_POLICY_API_KEY", "OPENAI_API_KEY", "MY_COPY"} & set(seen)
    assert seen["UNRELATED_TOKEN"] == "kept"  # the rest of the environment is inherited
    # The gateway still used the key.
    assert workspace.stub.requests[-1]["headers"]["authorization"] == f"Bearer {POLICY_KEY}"
    (run_dir,) = workspace.run_dirs()
    log = (run_dir / "logs.txt").read_text()
    assert "MY_COPY" in log and "OPENAI_API_KEY" in log  # named as withheld, never shown


async def test_a_provider_variable_of_a_litellm_policy_is_withheld(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_drop = tmp_path / "env.json"
    workspace.write_rows(
        [{"user_prompt": "say hi", "ground_truth": "hi",
          "metadata": {"do": "env", "env_drop": str(env_drop)}}]
    )  # fmt: skip
    workspace.write_config(model="openai/stub-model")
    monkeypatch.setenv("OPENAI_API_KEY", POLICY_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", workspace.stub.base_url)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    code, out = await workspace.run()
    assert code == 0, out
    seen = json.loads(env_drop.read_text())
    assert "OPENAI_API_KEY" not in seen
    assert seen["OPENAI_BASE_URL"] == workspace.stub.base_url  # not a credential
    assert workspace.stub.requests[-1]["headers"]["authorization"] == f"Bearer {POLICY_KEY}"


@pytest.mark.parametrize("section", ["secrets", "env"])
async def test_a_config_entry_holding_the_policy_key_is_refused(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, section: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", POLICY_KEY)
    extra = (
        '[secrets]\nrequired = ["OPENAI_API_KEY"]\n'
        if section == "secrets"
        else f'[env]\nOPENAI_API_KEY = "{POLICY_KEY}"\n'
    )
    workspace.config.write_text(workspace.config.read_text() + extra)
    code, out = await workspace.run("--policy-api-key", POLICY_KEY)
    assert code == 2, out
    assert POLICY_KEY not in out
    (line,) = out.strip().splitlines()
    assert f"{section}." in line and "OPENAI_API_KEY" in line and "policy's key" in line
    assert workspace.stub.requests == []


async def test_policy_url_credentials_are_hidden_in_every_output(workspace: Workspace) -> None:
    url = workspace.stub.base_url.replace("http://", f"http://probe:{URL_PASSWORD}@")
    workspace.write_config(model=f"openai-compatible:{url}:stub-model")
    code, out = await workspace.run()
    assert code == 0, out
    assert URL_PASSWORD not in out
    hidden = workspace.stub.base_url.replace("http://", "http://[REDACTED]@")
    assert f"openai-compatible:{hidden}:stub-model" in out
    files = _every_file(workspace.root / ".osmosis")
    assert [p for p, data in files.items() if URL_PASSWORD.encode() in data] == []
    (run_dir,) = workspace.run_dirs()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["inputs"]["model_path"].startswith("openai-compatible:http://[REDACTED]@")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["model_name"] == manifest["inputs"]["model_path"]
    # The upstream was called with the URL's credentials.
    assert workspace.stub.requests[-1]["headers"]["authorization"].startswith("Basic ")


async def test_policy_url_credentials_with_a_policy_key_is_one_clear_error(
    workspace: Workspace,
) -> None:
    url = workspace.stub.base_url.replace("http://", f"http://probe:{URL_PASSWORD}@")
    workspace.write_config(model=f"openai-compatible:{url}:stub-model")
    code, out = await workspace.run("--policy-api-key", POLICY_KEY)
    assert code == 2, out
    (line,) = out.strip().splitlines()
    assert "--policy-api-key" in line and "URL" in line
    assert URL_PASSWORD not in out and POLICY_KEY not in out
    assert "Traceback" not in out
