"""Exact history: a call that continues an earlier call of its rollout reuses that call's ids.

An agent sends the model's earlier replies back as messages, and rendering them again through
the chat template and the tokenizer may give other ids than the model produced: a different
split at a boundary, a tool call laid out otherwise than the model wrote it, an answer the
front unwrapped from its JSON. A trained sequence then breaks where the re-rendered history
leaves the generated tokens (drift). So the chat front remembers each call of a rollout
(`Turn`: its messages and reply by meaning, its rendered prompt, its prompt and completion
ids), and a call whose messages are an earlier call's messages, then that call's reply, then
more, is prompted with the earlier prompt ids + completion ids + the ids of the text the
template renders after the reply's end-of-turn token (`ChatFront` does the splice).

Messages are compared by meaning (`message_meaning`): role, text, and tool calls as names and
parsed arguments; not ids, key order or whitespace of a JSON serialisation.
"""

from __future__ import annotations

import contextlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai.gateway.policies._tool_prompt import message_text

__all__ = ["History", "Turn", "message_meaning"]

#: Rollouts whose calls are kept (least recently used dropped first), and calls per rollout
#: (the latest): a dropped call is only a missed splice, rendered as before.
MAX_ROLLOUTS = 1_024
MAX_TURNS = 8


def message_meaning(message: dict[str, Any]) -> Hashable:
    """What a message says, comparable across serialisations: role (``developer`` is
    ``system``), text (``None`` and ``""`` alike, content parts joined), and tool calls as
    (name, arguments) with the arguments' JSON parsed when it parses."""
    role = message.get("role")
    calls = tuple(_call_meaning(call) for call in message.get("tool_calls") or ())
    return ("system" if role == "developer" else role, message_text(message.get("content")), calls)


def _call_meaning(call: Any) -> Hashable:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return repr(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return (function.get("name"), json.dumps(arguments, sort_keys=True, ensure_ascii=False))


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered call of a rollout, as the next call may continue it."""

    messages: tuple[Hashable, ...]
    """The meanings of the call's messages."""
    reply: Hashable
    """The meaning of the message the call answered with."""
    prompt_text: str
    """The chat template's text the prompt ids stand for."""
    prompt_ids: array[int]
    completion_ids: array[int]


class History:
    """The latest answered calls of recent rollouts (bounded; thread-safe)."""

    def __init__(self, *, max_rollouts: int = MAX_ROLLOUTS, max_turns: int = MAX_TURNS) -> None:
        self._max_rollouts = max_rollouts
        self._max_turns = max_turns
        self._rollouts: OrderedDict[str, list[Turn]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, rollout_id: str, turn: Turn) -> None:
        """Keep ``turn`` as the latest call of ``rollout_id``."""
        with self._lock:
            turns = self._rollouts.setdefault(rollout_id, [])
            self._rollouts.move_to_end(rollout_id)
            turns.append(turn)
            del turns[: -self._max_turns]
            while len(self._rollouts) > self._max_rollouts:  # ends: one dropped a pass
                self._rollouts.popitem(last=False)

    def continued(self, rollout_id: str, messages: Sequence[Hashable]) -> Turn | None:
        """The latest call of ``rollout_id`` that ``messages`` continue: its messages, then its
        reply, then at least one more message."""
        with self._lock:
            turns = list(self._rollouts.get(rollout_id, ()))
        for turn in reversed(turns):
            length = len(turn.messages)
            if (
                len(messages) > length + 1
                and tuple(messages[:length]) == turn.messages
                and messages[length] == turn.reply
            ):
                return turn
        return None

    def forget(self, rollout_id: str) -> None:
        """Drop the calls of a finished rollout."""
        with self._lock:
            self._rollouts.pop(rollout_id, None)
