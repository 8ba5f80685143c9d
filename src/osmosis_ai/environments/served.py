"""What the environment's own rollout server is told (its section, through one environment
variable) and how its workflows reach the policy: the rollout's gateway endpoint."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2

from osmosis_ai.environments.config import EnvironmentConfig
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout import Grader, GraderContext, get_rollout_context
from osmosis_ai.rollout.model_pool import tls_context

__all__ = [
    "ENVIRONMENT_ENV",
    "ENVIRONMENT_REWARD",
    "EnvironmentRewardGrader",
    "Policy",
    "library_env",
    "missing_library",
    "policy_client",
    "served_environment",
    "server_env",
]

#: The variable that gives the rollout server its ``[environment]`` (as JSON).
ENVIRONMENT_ENV = "OSMOSIS_ENVIRONMENT"
#: The sample metric holding the environment's own reward (an OpenEnv episode's return, a
#: verifiers rubric's weighted sum), which `EnvironmentRewardGrader` makes the reward.
ENVIRONMENT_REWARD = "environment_reward"


def server_env(
    environment: EnvironmentConfig,
    workspace: Path,
    env: Mapping[str, str],
    *,
    max_tokens: int | None,
) -> dict[str, str]:
    """The rollout server's variables for ``environment``, over ``env`` (the config's
    ``[env]``): each reply asks for at most ``max_tokens`` (``None``: the policy decides, as
    the trainer's `[sampling]` does)."""
    served = {**dataclasses.asdict(environment), "max_tokens": max_tokens}
    paths = library_env(environment, workspace, env)
    changed: dict[str, str] = {k: paths[k] for k in ("PYTHONPATH", "PATH") if k in paths}
    return {**changed, ENVIRONMENT_ENV: json.dumps(served)}


def library_env(
    environment: EnvironmentConfig, workspace: Path, env: Mapping[str, str]
) -> dict[str, str]:
    """``env`` (over this process's variables) as the library's Python needs it: the
    workspace leading the import path (an OpenEnv class or a taskset may be a module of it),
    its venv's commands first (verifiers runs ``uv``), no other venv's ``VIRTUAL_ENV``."""
    merged = {k: v for k, v in {**os.environ, **env}.items() if k != "VIRTUAL_ENV"}
    first = {"PYTHONPATH": str(workspace)}
    if environment.python is not None:
        first["PATH"] = os.path.dirname(environment.python)
    for name, value in first.items():
        merged[name] = os.pathsep.join(p for p in (value, merged.get(name, "")) if p)
    return merged


@functools.cache
def served_environment() -> dict[str, Any]:
    """The section the rollout server was started for (in the server's process).

    Raises:
        ConfigError: The server was not started for an ``[environment]``.
    """
    if ENVIRONMENT_ENV not in os.environ:
        raise ConfigError(
            "the environments' workflows run in a rollout server started for an "
            "[environment] (osmosis eval run or train run with that section)"
        )
    return dict(json.loads(os.environ[ENVIRONMENT_ENV]))


class Policy:
    """The model of the current rollout, one chat completion at a time."""

    def __init__(self, http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
        self._http, self._url, self._headers = http, url, headers

    async def reply(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The assistant message the policy answers ``messages`` with."""
        body: dict[str, Any] = {"model": "policy", "messages": messages}
        if tools:
            body["tools"] = tools
        max_tokens = served_environment().get("max_tokens")
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        response = await self._http.post(self._url, json=body, headers=self._headers)
        response.raise_for_status()
        message: dict[str, Any] = response.json()["choices"][0]["message"]
        return message


@asynccontextmanager
async def policy_client() -> AsyncIterator[Policy]:
    """The rollout's `Policy` (inside a rollout: its gateway endpoint and key)."""
    rollout = get_rollout_context()
    assert rollout is not None, "a workflow's run() is called inside a rollout context"
    headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
    url = f"{rollout.chat_completions_url}/chat/completions"
    # A call waits as long as the policy needs: the backend's deadline bounds the rollout.
    async with httpx2.AsyncClient(timeout=None, verify=tls_context()) as http:
        yield Policy(http, url, headers)


class EnvironmentRewardGrader(Grader):
    """The reward the environment gave (the sample's ``environment_reward`` metric, which
    the workflow set) as the sample's reward."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(float(ctx.sample.metrics[ENVIRONMENT_REWARD]))


def missing_library(exc: Exception) -> str:
    """The one line a library's module prints when its library is missing from the Python
    it runs in."""
    return f"{exc} (in an environment of its own: set [environment] python)"
