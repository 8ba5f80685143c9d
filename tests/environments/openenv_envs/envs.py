"""OpenEnv environments of the tests (imported by the rollout server's Python, which has
``openenv``, from this folder on ``PYTHONPATH``)."""

from __future__ import annotations

import zlib
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State


class Say(Action):
    message: str = ""


class Heard(Observation):
    text: str = ""


class GuessEnvironment(Environment[Say, Heard, State]):
    """Guess the number ``seed % 10`` in three tries: 1 for the right one, else 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Heard:
        self._state = State(episode_id=episode_id)
        self._target = (seed or 0) % 10
        return Heard(text="Guess my number, 0 to 9: say only the number.")

    def step(self, action: Say, timeout_s: float | None = None, **_: Any) -> Heard:
        self._state.step_count += 1
        right = action.message.strip() == str(self._target)
        done = right or self._state.step_count >= 3
        return Heard(text="right" if right else "wrong, again", reward=float(right), done=done)

    @property
    def state(self) -> State:
        return self._state


class SplitEnvironment(Environment[Say, Heard, State]):
    """Two steps whose rewards always add up to 1: the first step's is a number in [0, 1]
    drawn from the reply's text (a checksum, so two different replies all but never tie),
    the second's the rest. Every episode's return is equal; only the steps' rewards tell the
    replies apart."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._first = 0.0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Heard:
        self._state = State(episode_id=episode_id)
        return Heard(text="Say something.")

    def step(self, action: Say, timeout_s: float | None = None, **_: Any) -> Heard:
        self._state.step_count += 1
        if self._state.step_count == 1:
            self._first = (zlib.crc32(action.message.encode()) % 1001) / 1000
            return Heard(text="And again.", reward=self._first)
        return Heard(text="done", reward=1.0 - self._first, done=True)

    @property
    def state(self) -> State:
        return self._state


class Pair(Action):
    left: str = ""
    right: str = ""


class TwoTextsEnvironment(Environment[Pair, Heard, State]):
    """An action with two text fields: no single place for the model's reply."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Heard:
        return Heard()

    def step(self, action: Pair, timeout_s: float | None = None, **_: Any) -> Heard:
        return Heard(done=True)

    @property
    def state(self) -> State:
        return State()


class NotAnEnvironment:
    """A class, but no OpenEnv environment."""


class BrokenEnvironment(GuessEnvironment):
    """Its step raises: an environment's own failure."""

    def step(self, action: Say, timeout_s: float | None = None, **_: Any) -> Heard:
        raise RuntimeError("the environment broke")
