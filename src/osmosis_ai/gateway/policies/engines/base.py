"""The token engine interface: prompt ids and sampling in, completion ids and logprobs out.

A `TokenEngine` knows nothing of chat: the chat front (``chat_front.py``) turns a
chat-completions request into a `GenerationRequest` (exact prompt ids, `Sampling`, an
optional `JsonGrammar`) and the engine's `Generation` back into an answer. Engines differ in
where the tokens come from (the torch loop here, a vLLM server) and in how new weights reach
them (`TokenEngine.updating` and `WeightUpdate.push`). An engine may also score given tokens
(`TokenEngine.score`, where `TokenEngine.can_score`): the trainer's weight probe compares
that with the learner.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from osmosis_ai.errors import PolicyError

__all__ = [
    "LarkGrammar",
    "Generation",
    "GenerationRequest",
    "Grammar",
    "JsonGrammar",
    "Sampling",
    "Scores",
    "TokenEngine",
    "WeightUpdate",
]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one request samples."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 1024
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0


@dataclass(frozen=True, slots=True)
class JsonGrammar:
    """Generation constrained to JSON that matches a schema.

    The schema is JSON text, so equal grammars compare (and cache) equal.
    """

    schema: str
    max_whitespace: int | None = None
    """Most whitespace characters between two JSON tokens; ``None``: none at all (compact)."""


@dataclass(frozen=True, slots=True)
class LarkGrammar:
    """Generation constrained by a Lark grammar in llguidance's dialect (a model's own
    tool-call format: an answer, or calls between its tags)."""

    text: str


#: What may constrain a generation.
Grammar = JsonGrammar | LarkGrammar


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One completion to generate from exact prompt ids."""

    prompt_ids: list[int]
    sampling: Sampling
    grammar: Grammar | None = None
    session: str | None = None
    """The rollout the call belongs to: an engine in front of several servers sends a
    rollout's calls to one of them (its prefix cache holds the conversation)."""


@dataclass(frozen=True, slots=True)
class Generation:
    """What an engine generated for one `GenerationRequest`."""

    token_ids: list[int]
    logprobs: list[float]
    """The logprob of each token under the distribution it was sampled from (after the
    grammar mask, temperature, top-k and top-p; at temperature 0, the unscaled one)."""
    finish_reason: Literal["stop", "length"]
    version: int
    """The weight version (training step) that generated it."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per token, the ``Sampling.top_logprobs`` most likely alternatives (id, logprob)."""
    stop_at: int | None = None
    """Character offset, in the decoded text, of the stop string that ended it."""
    grammar: str | None = None
    """The Lark text of the grammar the engine constrained it with (``grammar_text`` of the
    request's), ``None`` when it did not: the learner replays it to score the same masks."""


@dataclass(frozen=True, slots=True)
class Scores:
    """What `TokenEngine.score` answers."""

    logprobs: list[float]
    """Each scored token's logprob after the tokens before it (temperature 1, no cut)."""
    version: int
    """The weight version (training step) that scored them."""


class WeightUpdate(Protocol):
    """The handle `TokenEngine.updating` yields while generation is held back."""

    async def push(self, model: Any) -> None:
        """Make the engine generate with ``model``'s current weights from now on.

        ``model`` is what the trainer trained: a transformers model, or a peft model whose
        adapter is the trained part (an engine may then load the adapter alone).
        """


class TokenEngine(ABC):
    """Generates completions from token ids; receives new weights between training steps.

    ``generate`` may be called concurrently: an engine batches what arrives together.
    """

    #: Short name, reported as the gateway's policy kind.
    kind: ClassVar[str] = ""
    #: Request fields the engine cannot honour; the chat front refuses them by name. Those
    #: `Sampling` does not carry, by default: the learner scores tokens with the temperature
    #: alone, so a penalty or a logit bias would make behaviour and learner disagree.
    refused_sampling: ClassVar[tuple[str, ...]] = (
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
    )

    version: int = 0
    """The weight version new generations get."""
    busy_sec: float = 0.0
    """Seconds spent generating so far (a server's engine: with a call in flight)."""
    out_of_memory: bool = False
    """Set once generating ran out of device memory (those calls failed with a 500)."""
    unreachable: str | None = None
    """Why the engine's server stopped answering, once it did (those calls failed)."""

    async def start(self) -> None:  # noqa: B027 -- optional hook, nothing to do by default
        """Acquire what generating needs (threads, a server)."""

    def secrets(self) -> tuple[str, ...]:
        """Values (an API key) that must never appear in answers, errors or logs."""
        return ()

    async def aclose(self) -> None:  # noqa: B027 -- optional hook, nothing to do by default
        """Stop generating; calls still waiting fail."""

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> Generation:
        """Generate one completion.

        Raises:
            PolicyError: The engine failed or stopped.
        """

    @property
    def can_score(self) -> bool:
        """Whether `score` works. Not a vLLM server's: its ``prompt_logprobs`` would do, but
        a server with LoRA enabled (vLLM 0.32) dies when such a call shares a batch with
        others, and an engine cannot tell whether the server it attached to has it on."""
        return False

    async def score(self, prompt_ids: list[int], token_ids: list[int]) -> Scores:
        """The logprobs of ``token_ids`` after ``prompt_ids``, from one prefill with the
        current weights (temperature 1): what the trainer's weight probe compares with the
        learner's, far cheaper than generating the tokens again (`can_score`).

        Raises:
            PolicyError: The engine failed, or cannot score (501; the default).
        """
        raise PolicyError(
            f"the {self.kind or 'token'} engine does not score tokens", status_code=501
        )

    @abstractmethod
    def updating(self, version: int | None = None) -> AbstractAsyncContextManager[WeightUpdate]:
        """Hold generation back while the weights change.

        Calls that arrive meanwhile wait; no call sees half-changed weights. On a normal exit
        the version becomes ``version`` (or the next integer).
        """
