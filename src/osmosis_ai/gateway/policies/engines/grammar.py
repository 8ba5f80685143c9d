"""Grammars that constrain generation: one text that every engine and the learner compile.

A request's grammar (a `JsonGrammar`, or a `LarkGrammar` such as `tagged_calls_grammar`
builds for a model's own tool-call format) is a Lark grammar in llguidance's dialect
(`grammar_text`, plain text built here without any library: JSON schemas are embedded with
``%json``). The torch engine compiles it with llguidance; vLLM receives the same text (its
default structured-output backend hands a grammar with ``%json`` to llguidance); the call
record keeps it; and the trainer replays it over the recorded tokens
(`GrammarCompiler.token_masks`), so that the learner scores each token under the mask the
engine sampled it under. Without that, a token the grammar made likely (``{`` where the
model would have written prose) looks to the learner like a token the engine drew from a
different policy, and the PPO ratio of every constrained token starts far from 1.

Masks are packed as llguidance (and xgrammar) pack them: int32 words, bit ``j`` of word
``w`` allowing token ``32 w + j``; `allowed_logits` applies them with plain torch, on any
device.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from osmosis_ai.errors import MissingExtraError, PolicyError
from osmosis_ai.gateway.policies.engines.base import Grammar, JsonGrammar, LarkGrammar
from osmosis_ai.gateway.policies.hf_dir import import_llguidance

__all__ = [
    "ALL_ALLOWED",
    "GrammarCompiler",
    "allowed_logits",
    "fill_masks",
    "grammar_text",
    "stop_token_ids",
    "tagged_calls_grammar",
]

_FEATURE = "A grammar (tool calls, response_format)"
#: A packed mask word with every bit set: the row of a position no grammar constrains.
ALL_ALLOWED = -1


def _llguidance() -> Any:
    """llguidance, or a `PolicyError` naming its install command (a call fails, not the server)."""
    try:
        return import_llguidance(_FEATURE)
    except MissingExtraError as exc:
        raise PolicyError(str(exc), status_code=500) from None


def grammar_text(grammar: Grammar) -> str:
    """The Lark text of ``grammar`` (pure: no library needed to write it)."""
    if isinstance(grammar, LarkGrammar):
        return grammar.text
    return f"start: {_json_rule(grammar)}\n"


@functools.lru_cache(maxsize=256)
def _json_rule(grammar: JsonGrammar) -> str:
    """``%json {schema}`` with llguidance's layout options: compact JSON (``", "`` and
    ``": "`` between items, as models write it on one line), or up to ``max_whitespace``
    whitespace characters between tokens."""
    if grammar.max_whitespace is None:
        layout: dict[str, Any] = {
            "whitespace_flexible": False,
            "item_separator": ", ",
            "key_separator": ": ",
        }
    else:
        layout = {
            "whitespace_flexible": True,
            "whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{grammar.max_whitespace}}}",
        }
    schema = _closed(json.loads(grammar.schema))
    return "%json " + json.dumps({**schema, "x-guidance": layout}, ensure_ascii=False)


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists its ``properties`` closed to others
    (``additionalProperties: false`` where unset, as xgrammar's strict mode reads a schema):
    a tool's arguments are what it declares, and a model cannot run on in keys of its own."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DATA_KEYWORDS:
            closed[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            closed[key] = {name: _closed(sub) for name, sub in value.items()}
        else:
            closed[key] = _closed(value)
    if isinstance(schema.get("properties"), dict):
        closed.setdefault("additionalProperties", False)
    return closed


#: Keywords whose value is data, not a schema.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
#: Keywords whose value maps names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


@functools.lru_cache(maxsize=256)
def tagged_calls_grammar(
    call: JsonGrammar, opening: str, closing: str, *, allow_answer: bool, max_calls: int
) -> LarkGrammar:
    """A reply that is a plain answer (with ``allow_answer``: any text that does not start
    with ``<``, so never a half-written call) or 1 to ``max_calls`` tool calls, each
    ``opening`` + a JSON object of ``call`` + ``closing``, separated by a newline."""
    rules = [
        f"start: {'answer | calls' if allow_answer else 'calls'}",
        # One call, then up to max_calls - 1 more (Lark refuses a {0,0} repeat).
        "calls: call" + (f' ("\\n" call){{0,{max_calls - 1}}}' if max_calls > 1 else ""),
        f"call: {_literal(opening)} arguments {_literal(closing)}",
        f"arguments: {_json_rule(call)}",
    ]
    if allow_answer:
        rules.append('answer: "" | /[^<][\\s\\S]*/')
    return LarkGrammar("\n".join(rules) + "\n")


def _literal(text: str) -> str:
    """``text`` as a Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a completion: the tokenizer's EOS and the generation config's."""
    config = getattr(model, "generation_config", None)
    stated = getattr(config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(stated if isinstance(stated, list | tuple) else [stated])}
    return frozenset(i for i in ids if isinstance(i, int))


def fill_masks(matchers: Sequence[tuple[int, Any]], masks: Any) -> None:
    """Write the next-token mask of each ``(row, matcher)`` into row ``row`` of ``masks``
    (packed int32, contiguous, on the CPU: ``[rows, ceil(vocab / 32)]``)."""
    # llguidance writes the row in place (llguidance.torch does the same, but importing it
    # compiles a kernel with torch.compile that is not used here).
    if not (masks.is_contiguous() and masks.device.type == "cpu" and masks.element_size() == 4):
        raise ValueError("grammar masks must be a contiguous int32 tensor on the CPU")
    for row, matcher in matchers:
        target = masks[row]
        matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)


def allowed_logits(logits: Any, packed: Any) -> Any:
    """``logits`` ``[N, V]`` with each row's disallowed tokens at ``-inf`` (``packed``:
    ``[N, W]`` int32 masks on the logits' device).

    Rows with every bit set are left as they are; the result keeps the gradient of the
    allowed logits (the learner differentiates through it).
    """
    import torch

    constrained = (packed != ALL_ALLOWED).any(dim=-1)
    if not bool(constrained.any()):
        return logits
    vocab = logits.shape[-1]
    if packed.shape[-1] * 32 < vocab:
        raise ValueError(
            f"grammar masks cover {packed.shape[-1] * 32} tokens, the logits {vocab}: the "
            "masks were made for another vocabulary"
        )
    # Bytes of the little-endian words, then their bits: 1 byte per token, not 4.
    as_bytes = packed.contiguous().view(torch.uint8)
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (as_bytes.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(packed.shape[0], -1)[:, :vocab].bool()
    return torch.where(allowed, logits, float("-inf"))


class GrammarCompiler:
    """Compiles grammar texts for one model's vocabulary (blocking; llguidance imported on the
    first compile, which also converts the tokenizer, about a second).

    Args:
        tokenizer: The model's Hugging Face tokenizer (a fast one).
        vocab_size: The model's vocabulary (its head's width, which may exceed the
            tokenizer's).
        stop_ids: The tokens that end a completion (allowed once the grammar is complete).
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_ids: Iterable[int]) -> None:
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(stop_ids)
        self._tokenizer = tokenizer
        self._converted: Any = None
        self._compiled = functools.lru_cache(maxsize=64)(self._compile)

    @classmethod
    def of_model(cls, model: Any, tokenizer: Any) -> GrammarCompiler:
        """The compiler of a transformers ``model`` (its vocabulary and stop tokens)."""
        return cls(
            tokenizer,
            vocab_size=model.config.vocab_size,
            stop_ids=stop_token_ids(model, tokenizer),
        )

    def matcher(self, text: str) -> Any:
        """A new matcher of the Lark ``text``, at the start of a completion.

        Raises:
            PolicyError: llguidance is not installed, or ``text`` is no valid grammar.
        """
        return self._compiled(text).deep_copy()

    def _compile(self, text: str) -> Any:
        llguidance = _llguidance()
        if self._converted is None:
            import llguidance.hf

            self._converted = llguidance.hf.from_tokenizer(
                self._tokenizer, n_vocab=self.vocab_size, eos_token=sorted(self.stop_ids)
            )
        matcher = llguidance.LLMatcher(self._converted, text, log_level=0)
        if matcher.is_error():
            raise PolicyError(f"invalid grammar: {matcher.get_error()}", status_code=400)
        return matcher

    def token_masks(self, text: str, token_ids: Sequence[int]) -> tuple[Any, int]:
        """The tokens the grammar allowed before each of ``token_ids``, replayed.

        Returns an int32 tensor ``[accepted, ceil(vocab_size / 32)]`` of packed masks (row
        ``i``: the tokens allowed where ``token_ids[i]`` was chosen) and how many tokens the
        grammar accepted, in order: all of them for a completion generated under it, fewer
        when a token breaks it (a grammar the engine did not enforce as written).
        """
        import torch

        matcher = self.matcher(text)
        words = (self.vocab_size + 31) // 32
        masks = torch.full((max(len(token_ids), 1), words), ALL_ALLOWED, dtype=torch.int32)
        accepted = 0
        for index, token in enumerate(token_ids):
            fill_masks([(index, matcher)], masks)
            if not matcher.consume_token(token):
                break
            accepted += 1
        return masks[:accepted], accepted
