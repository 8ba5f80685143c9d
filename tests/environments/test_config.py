"""``[environment]``: one library named, its keys checked at their line, its Python found."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_ai.environments.served import ENVIRONMENT_ENV, server_env
from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.config import load_eval_config


def _config(tmp_path: Path, environment: str) -> Path:
    path = tmp_path / "configs" / "eval" / "env.toml"
    path.parent.mkdir(parents=True)
    path.write_text(
        f'[experiment]\nrollout = "env"\nmodel_path = "embedded"\n[environment]\n{environment}\n'
    )
    return path


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        (
            'openenv = "a:B"\nverifiers = "c"',
            'line 6: [environment] names one environment: reasoning_gym = "<task>", openenv = '
            '"<module>:<Class>" or verifiers = "<taskset>", not openenv and verifiers',
        ),
        ('openenv = "a.B"', "line 5: environment.openenv 'a.B' must name a class as module:Class"),
        (
            'openenv = "a:B"\nprompt = "direct"',
            "line 6: environment.prompt names a reasoning-gym system prompt; remove it",
        ),
        (
            'verifiers = "t"\n[environment.settings]\nx = 1',
            "environment.settings: a verifiers taskset takes none here; remove the table",
        ),
        (
            'reasoning_gym = "chain_sum"\npython = "/usr/bin/python3"',
            "line 6: environment.python: reasoning-gym runs in this Python",
        ),
        (
            'openenv = "a:B"\n[environment.settings]\nseed = 3',
            "environment.settings: each episode's seed is [environment] seed + its row",
        ),
        (
            'openenv = "a:B"\n[environment.settings]\nwhen = 2026-12-06',
            "environment.settings: a date or time cannot be passed on; write it as a string",
        ),
        (
            'openenv = "a:B"\npython = ".venv-x/bin/python"',
            "line 6: environment.python '.venv-x/bin/python': there is no file",
        ),
    ],
    ids=["two", "class", "prompt", "settings", "gym-python", "seed", "date", "python"],
)
def test_a_bad_section_is_one_line_at_its_key(
    tmp_path: Path, environment: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_eval_config(_config(tmp_path, environment))
    message = str(caught.value)
    assert expected in message and "\n" not in message, message


def test_the_python_is_the_workspaces_and_leads_the_servers_path(tmp_path: Path) -> None:
    python = tmp_path / ".venv-x" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    config = load_eval_config(
        _config(tmp_path, 'openenv = "guess:Env"\npython = ".venv-x/bin/python"')
    )
    assert config.environment is not None and config.environment.python == str(python)
    env = server_env(config.environment, tmp_path, {"PYTHONPATH": "/mine"}, max_tokens=5)
    assert env["PATH"].split(":")[0] == str(python.parent), "its venv's commands first"
    # The workspace's modules import, and an [env] PYTHONPATH is kept after it.
    assert env["PYTHONPATH"] == f"{tmp_path}:/mine"
    assert '"max_tokens": 5' in env[ENVIRONMENT_ENV]
