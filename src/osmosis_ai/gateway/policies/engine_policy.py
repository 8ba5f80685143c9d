"""A policy made of two parts: a chat front and a token engine.

The gateway talks to the policy (chat in, chat out); the front turns each call into prompt
ids, sampling and a grammar, the engine generates, and the front builds the answer with the
exact ids and logprobs. A trainer keeps the engine to push new weights after each step.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies.base import Policy, chunks_of
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engines.base import TokenEngine
from osmosis_ai.gateway.request import ChatRequest

__all__ = ["EnginePolicy"]


class EnginePolicy(Policy):
    """Answers chat completions with ``front`` and ``engine``.

    The front's work (templating, tokenising, parsing) runs on one thread of its own, never
    on the event loop. Answers are whole: a stream is the answer's chunks once it is
    generated.

    A subclass that loads its model in `start` passes neither part here and gives both to
    ``_attach`` before calling ``EnginePolicy.start``.
    """

    def __init__(
        self,
        front: ChatFront | None = None,
        engine: TokenEngine | None = None,
        *,
        name: str,
    ) -> None:
        self._name = name
        self._parts: tuple[ChatFront, TokenEngine] | None = None
        if front is not None and engine is not None:
            self._attach(front, engine)
        self._prep = ThreadPoolExecutor(1, thread_name_prefix="osmosis-chat-front")
        self._started = False

    def _attach(self, front: ChatFront, engine: TokenEngine) -> None:
        self._parts = (front, engine)
        self.kind = engine.kind

    @property
    def model(self) -> str:
        """The served model's name."""
        return self._name

    @property
    def front(self) -> ChatFront:
        """The chat front (templating, tools, answers)."""
        return self._loaded()[0]

    @property
    def engine(self) -> TokenEngine:
        """The token engine (generation, weight updates)."""
        return self._loaded()[1]

    def _loaded(self) -> tuple[ChatFront, TokenEngine]:
        if self._parts is None:
            raise self._not_started()
        return self._parts

    def _not_started(self) -> PolicyError:
        return PolicyError(f"the {self.kind or 'engine'} policy is not started", status_code=503)

    async def start(self) -> None:
        """Start the engine."""
        await self.engine.start()
        self._started = True

    async def aclose(self) -> None:
        """Stop the engine (calls still waiting fail with 503) and the front's thread."""
        self._started = False
        if self._parts is not None:
            await self.engine.aclose()
        await asyncio.to_thread(self._prep.shutdown, wait=True)

    def secrets(self) -> tuple[str, ...]:
        """The engine's (its server's API key)."""
        return self._parts[1].secrets() if self._parts is not None else ()

    def forget(self, rollout_id: str) -> None:
        """Drop the rollout's answered calls from the front's history."""
        if self._parts is not None:
            self._parts[0].history.forget(rollout_id)

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One ``chat.completion`` with token ids, logprobs and the weight version."""
        if not self._started:
            raise self._not_started()
        front, engine = self._loaded()
        loop = asyncio.get_running_loop()
        call = await loop.run_in_executor(
            self._prep, front.prepare, request, engine.refused_sampling
        )
        generation = await engine.generate(call.generation)
        answer = functools.partial(front.answer, call, generation, model=self.model)
        return await loop.run_in_executor(self._prep, answer)

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The whole answer as chunks, once generated (engines answer a call at once)."""
        for chunk in chunks_of(await self.complete(request)):
            yield chunk
