"""An OpenEnv environment: guess a number from 0 to 9 in three tries, told "higher" or
"lower" after each. Each step is rewarded by how close the guess was (1 when right), so a
model that reads the hints earns more on its later steps.

The config names it as ``guess_env:GuessEnvironment`` (the workspace leads the import path
of the Python that serves it); an environment of a package you installed is named the same
way, ``package.module:Class``.
"""

from __future__ import annotations

import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State

TRIES = 3


class Guess(Action):
    message: str = ""
    """The model's reply: its guess is the first number in it."""


class Hint(Observation):
    text: str = ""


class GuessEnvironment(Environment[Guess, Hint, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Hint:
        self._state = State(episode_id=episode_id)
        self._target = (seed or 0) * 7 % 10  # the episode's seed picks the number
        return Hint(
            text=f"I am thinking of a number from 0 to 9. You have {TRIES} tries: "
            "answer with the number only."
        )

    def step(self, action: Guess, timeout_s: float | None = None, **_: Any) -> Hint:
        self._state.step_count += 1
        found = re.search(r"\d+", action.message)
        guess = int(found.group()) if found else None
        last = self._state.step_count >= TRIES
        if guess == self._target:
            return Hint(text="Right!", reward=1.0, done=True)
        reward = 0.0 if guess is None else max(0.0, 1 - abs(guess - self._target) / 10) / 2
        if guess is None:
            hint = "a number, please"
        else:
            hint = "higher" if guess < self._target else "lower"
        return Hint(text=f"No: {hint}.", reward=reward, done=last)

    @property
    def state(self) -> State:
        return self._state
