"""OpenEnv environments: served on 127.0.0.1 from their package (no Docker), played through
``reset`` and ``step`` over OpenEnv's own client, the model's reply as the action and the
episode's return as the environment's reward (each step's as the reward of the call that
made it).

This module runs in the rollout server's process, in the Python that has ``openenv``
installed; ``python -m osmosis_ai.environments.openenv check module:Class`` is the check
the controller runs there before a run (`rows.make_rows`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import sys
import threading
import typing
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai._serving import running_server
from osmosis_ai.environments.served import (
    ENVIRONMENT_REWARD,
    missing_library,
    policy_client,
    served_environment,
)
from osmosis_ai.errors import MissingExtraError
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext
from osmosis_ai.rollout.sample import AgentWorkflowOutput

__all__ = ["OpenEnvClass", "OpenEnvWorkflow", "load_class"]

#: The metadata key of an episode row (its seed).
ROW_KEY = "openenv"
_START_TIMEOUT_SEC = 60.0
_CAPACITY_TRIES = 50


class OpenEnvClassError(Exception):
    """The class a config names is not an OpenEnv environment this adapter can play."""


@functools.cache
def _openenv() -> Any:
    return import_optional(
        "openenv.core.env_server", extra="openenv", feature="[environment] openenv"
    )


class OpenEnvClass:
    """An ``Environment`` subclass and the types it plays with: its action (whose one text
    field takes the model's reply) and its observation."""

    def __init__(self, path: str) -> None:
        server = _openenv()
        self.path = path
        self.env_cls = load_class(path)
        if not (isinstance(self.env_cls, type) and issubclass(self.env_cls, server.Environment)):
            raise OpenEnvClassError(f"{path} is not an openenv Environment subclass")
        action, observation = _type_arguments(self.env_cls, server.Environment)
        self.action_cls = action
        self.observation_cls = observation
        texts = [
            name
            for name, field in self.action_cls.model_fields.items()
            if name != "metadata" and field.annotation is str
        ]
        if len(texts) != 1:
            raise OpenEnvClassError(
                f"{path}: its action {self.action_cls.__name__} has "
                f"{len(texts)} text fields; the model's reply needs exactly one"
            )
        self.text_field: str = texts[0]
        self.concurrent = bool(getattr(self.env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False))


def load_class(path: str) -> Any:
    """The object ``module:Name`` names.

    Raises:
        OpenEnvClassError: The module cannot be imported or has no such name.
    """
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OpenEnvClassError(f"cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise OpenEnvClassError(f"module {module_name!r} has no {name!r}") from None


def _type_arguments(env_cls: type, base: type) -> tuple[Any, Any]:
    """The action and observation types ``env_cls`` gives ``Environment[Act, Obs, State]``."""
    for klass in env_cls.__mro__:
        for parent in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(parent)
            if isinstance(origin, type) and issubclass(origin, base):
                args = typing.get_args(parent)
                if len(args) >= 2 and all(isinstance(arg, type) for arg in args[:2]):
                    return args[0], args[1]
    raise OpenEnvClassError(
        f"{env_cls.__name__} does not say its types: subclass Environment[Action, "
        "Observation, State] with your own action and observation classes"
    )


class _EnvServer:
    """The environment's OpenEnv app (``create_app``) on 127.0.0.1, in a thread of its own:
    a step that blocks never stalls the rollout server's event loop."""

    def __init__(self, played: OpenEnvClass) -> None:
        self.played = played
        # One session at a time unless the class says it takes several at once.
        self.sessions = 64 if played.concurrent else 1
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        threading.Thread(target=self._serve, name="openenv-server", daemon=True).start()
        if not self._ready.wait(_START_TIMEOUT_SEC):
            raise RuntimeError(f"the OpenEnv server of {played.path} did not start")
        if self._error is not None:
            raise RuntimeError(f"the OpenEnv server of {played.path} failed: {self._error}")

    def _serve(self) -> None:
        async def serve() -> None:
            app = _openenv().create_app(
                self.played.env_cls,
                self.played.action_cls,
                self.played.observation_cls,
                max_concurrent_envs=self.sessions,
            )
            async with running_server(app) as server:
                self.url = server.base_url
                self._ready.set()
                await asyncio.Event().wait()  # until the process ends

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported to the rollouts, which fail with it
            self._error = exc
            self._ready.set()


_servers: dict[str, _EnvServer | RuntimeError] = {}
_servers_lock = threading.Lock()


def _env_server(path: str) -> _EnvServer:
    """The one server of ``path`` in this process (blocking: call it in a thread). A start
    that failed is not tried again: every rollout after fails with the same error."""
    with _servers_lock:
        if path not in _servers:
            try:
                _servers[path] = _EnvServer(OpenEnvClass(path))
            except (RuntimeError, OpenEnvClassError) as exc:
                _servers[path] = RuntimeError(str(exc))
        server = _servers[path]
    if isinstance(server, RuntimeError):
        raise server
    return server


async def _reset(env: Any, seed: Any, settings: dict[str, Any]) -> Any:
    """``reset``, waiting (a few seconds at most) for the session an episode before this one
    held to be let go: OpenEnv frees it after the connection closes, which may come after
    the next connection is made, and an environment of one session refuses the next."""
    for _ in range(_CAPACITY_TRIES - 1):
        try:
            return await env.reset(seed=seed, **settings)
        except RuntimeError as exc:
            if "CAPACITY" not in str(exc):
                raise
        await asyncio.sleep(0.1)
    return await env.reset(seed=seed, **settings)


@functools.cache
def _session_slots(sessions: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(sessions)


def _observation_text(observation: dict[str, Any]) -> str:
    """What the model reads of an observation: its one text field, else all of it as JSON."""
    fields = {k: v for k, v in observation.items() if k not in ("metadata", "reward", "done")}
    texts = [value for value in fields.values() if isinstance(value, str)]
    return texts[0] if len(texts) == 1 else json.dumps(fields, sort_keys=True)


class OpenEnvWorkflow(AgentWorkflow):
    """One episode: ``reset`` with the row's seed, then the model's reply as each step's
    action, until the environment says done or ``[environment] max_turns`` steps."""

    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        spec = served_environment()
        server = await asyncio.to_thread(_env_server, spec["openenv"])
        client_module = import_optional(
            "openenv.core.generic_client", extra="openenv", feature="[environment] openenv"
        )
        seed = (ctx.metadata or {}).get(ROW_KEY, {}).get("seed")
        messages: list[dict[str, Any]] = list(ctx.prompt)
        turn_rewards: dict[int, float] = {}
        done = False
        async with (
            _session_slots(server.sessions),
            client_module.GenericEnvClient(base_url=server.url) as env,
            policy_client() as policy,
        ):
            result = await _reset(env, seed, spec["settings"])
            messages.append({"role": "user", "content": _observation_text(result.observation)})
            for turn in range(spec["max_turns"]):
                reply = await policy.reply(messages)
                messages.append(reply)
                action = {server.played.text_field: str(reply.get("content") or "")}
                result = await env.step(action)
                if result.reward is not None:
                    turn_rewards[turn] = float(result.reward)
                done = bool(result.done)
                if done:
                    break
                observation = _observation_text(result.observation)
                messages.append({"role": "user", "content": observation})
        return AgentWorkflowOutput(
            messages=messages,
            turn_rewards=turn_rewards,
            metrics={
                ENVIRONMENT_REWARD: sum(turn_rewards.values()),
                "steps": float(turn + 1),
                "done": float(done),
            },
        )


def main(argv: list[str]) -> int:
    """``check module:Class``: exit 0 when the adapter can play it, else say why (one line
    on stderr, exit 2)."""
    try:
        OpenEnvClass(argv[-1])
    except OpenEnvClassError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except MissingExtraError as exc:
        print(missing_library(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
