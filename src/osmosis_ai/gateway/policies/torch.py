"""The torch policy: a live transformers model served through the gateway, batched, exact."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from osmosis_ai.errors import ChatRequestError, ConfigError, PolicyError
from osmosis_ai.gateway.policies._hf_dir import (
    check_model_dir,
    import_torch_stack,
    import_xgrammar,
    load_model_dir,
)
from osmosis_ai.gateway.policies._tool_prompt import (
    ToolPlan,
    plan_tools,
    render_messages,
    reply_message,
)
from osmosis_ai.gateway.policies.base import Policy, chunks_of, requested_max_tokens
from osmosis_ai.gateway.request import ChatRequest

__all__ = ["TorchPolicy", "bounded_strings"]

T = TypeVar("T")
_FEATURE = "The torch policy"
_DEFAULT_MAX_TOKENS = 1_024
# JSON replies may lay themselves out as the model likes (it was trained on indented JSON;
# a forced one-line layout pushes it off its own tokens), bounded so it cannot run on.
_MAX_WHITESPACE = 12
# Sampling fields this policy cannot honour: refused rather than silently ignored.
_UNSUPPORTED = (
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)


def bounded_strings(schema: Any, max_length: int) -> Any:
    """``schema`` with a ``maxLength`` on every string that has no bound of its own.

    A small model writing an unbounded JSON string can run on until ``max_tokens``;
    strings with ``maxLength``, ``pattern``, ``enum``, ``const`` or ``format`` are kept.
    """
    if isinstance(schema, list):
        return [bounded_strings(item, max_length) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: bounded_strings(value, max_length) for key, value in schema.items()}
    if schema.get("type") == "string" and not {
        "maxLength",
        "pattern",
        "enum",
        "const",
        "format",
    } & set(schema):
        bounded["maxLength"] = max_length
    return bounded


@dataclass
class _Pending:
    job: Any  # a _torch_generate.GenerationJob
    done: asyncio.Future[int]
    """Resolves to the policy version the job was generated with."""

    def settle(self, version: int | None, error: PolicyError | None = None) -> None:
        """Resolve ``done`` (on the event loop), unless the caller has gone away."""
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
        else:
            self.done.set_result(version)  # type: ignore[arg-type]


class TorchPolicy(Policy):
    """Serves a transformers causal LM from live torch weights, on the CPU.

    Calls are generated together with a KV cache on one worker thread, never on the event
    loop, by continuous batching: up to ``max_batch_size`` at once, a call joins the running
    batch between two decoding steps and leaves it as soon as it is done. The first calls of
    an idle policy wait ``batch_window_sec`` for others to start with them.

    Every answer carries the exact prompt and completion token ids, the logprob of each
    sampled token under the distribution it was sampled from (after the grammar mask,
    temperature, top-k and top-p), and the policy ``version`` that generated it.

    Tool calls follow the embedded policy's contract (``tool_choice`` auto, required, a
    named function or none; an answer right after a tool result), generated under a JSON
    schema grammar (xgrammar). Free strings in tool arguments get ``max_string_length``.

    Weights change only inside ``async with policy.updating():``, which waits for the
    running batch and holds new ones back, so no call sees half-updated weights; leaving it
    increments ``version`` (or sets the step given).

    Args:
        model_dir: A directory written by ``save_pretrained`` (weights and tokenizer).
        model: A live model to serve instead (the trainer's); needs ``tokenizer``.
        tokenizer: The live model's tokenizer.
        name: The model name reported; defaults to the directory's name.
        version: The initial policy version (training step).
        max_batch_size: Most calls generated together.
        batch_window_sec: How long a batch waits for more calls before it starts.
        default_max_tokens: Completion cap when a request sets none; by default the
            checkpoint's ``generation_config.max_new_tokens``, else 1,024.
        max_string_length: ``maxLength`` given to unbounded strings in tool arguments.
        answer_after_tool_result: Constrain an ``auto`` turn right after a tool result to
            an answer, as the embedded policy does.

    Raises:
        ConfigError: Neither or both of a directory and a live model are given, or the
            directory lacks its config, weights or tokenizer.
    """

    kind = "torch"

    def __init__(
        self,
        model_dir: Path | str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        version: int = 0,
        max_batch_size: int = 8,
        batch_window_sec: float = 0.01,
        default_max_tokens: int | None = None,
        max_string_length: int = 64,
        answer_after_tool_result: bool = True,
    ) -> None:
        if (model is None) == (model_dir is None) or (model is None) != (tokenizer is None):
            raise ConfigError(
                "TorchPolicy serves either a checkpoint directory (model_dir) or a live model "
                "(model and tokenizer together); give one of the two"
            )
        self.model_dir = check_model_dir(Path(model_dir)) if model_dir is not None else None
        self._name = name or (self.model_dir.name if self.model_dir else "torch-policy")
        self.version = version
        self.max_batch_size = max_batch_size
        self.batch_window_sec = batch_window_sec
        self.default_max_tokens = default_max_tokens
        self._max_tokens_cap = default_max_tokens or _DEFAULT_MAX_TOKENS
        self.max_string_length = max_string_length
        self.answer_after_tool_result = answer_after_tool_result
        #: How many times each number of calls joined generation together (tests, metrics).
        self.batch_sizes: Counter[int] = Counter()
        #: Seconds spent generating batches so far (the worker thread's busy time, metrics).
        self.busy_sec = 0.0
        self._model, self._tokenizer = model, tokenizer
        self._torch: Any = None
        self._xgrammar: Any = None
        self._compiler: Any = None
        self._stop_ids: frozenset[int] = frozenset()
        # Calls not yet generating; the worker thread takes them between decoding steps.
        self._inbox: collections.deque[_Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._weights = asyncio.Lock()
        self._updates_waiting = 0
        self._closing = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch")
        # Tokenising, grammar compiling and answer building: one thread, so the tokenizer is
        # never used by two threads at once and never on the event loop.
        self._prep = ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch-prep")
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def model(self) -> str:
        """The served model's name."""
        return self._name

    @property
    def waiting(self) -> int:
        """Calls accepted but not yet generating."""
        return len(self._inbox)

    async def start(self) -> None:
        """Load the model (from ``model_dir``) and the grammar compiler on a worker thread."""
        if self._dispatcher is not None:
            return
        await self._run(self._load)
        self._closing = False
        self._dispatcher = asyncio.create_task(self._dispatch(), name="osmosis-torch-batches")

    def _load(self) -> None:
        self._torch, _ = import_torch_stack(_FEATURE)
        self._xgrammar = import_xgrammar(_FEATURE)
        if self._model is None:
            assert self.model_dir is not None
            self._model, self._tokenizer = load_model_dir(self.model_dir, feature=_FEATURE)
        stop_ids = {
            self._tokenizer.eos_token_id,
            *_as_list(getattr(self._model.generation_config, "eos_token_id", None)),
        }
        self._stop_ids = frozenset(i for i in stop_ids if isinstance(i, int))
        info = self._xgrammar.TokenizerInfo.from_huggingface(
            self._tokenizer,
            vocab_size=self._model.config.vocab_size,
            stop_token_ids=sorted(self._stop_ids),
        )
        self._compiler = self._xgrammar.GrammarCompiler(info, max_threads=1)
        # A checkpoint may state its own cap (generation_config.max_new_tokens).
        stated = getattr(self._model.generation_config, "max_new_tokens", None)
        self._max_tokens_cap = self.default_max_tokens or stated or _DEFAULT_MAX_TOKENS

    async def aclose(self) -> None:
        """Stop generating (calls waiting or generating fail with 503), free the threads."""
        self._closing = True
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None:
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
        while self._inbox:
            self._inbox.popleft().settle(None, _stopped())
        for executor in (self._executor, self._prep):
            await asyncio.to_thread(executor.shutdown, wait=True)

    @contextlib.asynccontextmanager
    async def updating(self, version: int | None = None) -> AsyncIterator[Any]:
        """Hold generation back while the weights change; yields the live model.

        On a normal exit the policy version becomes ``version``, or the next integer.
        """
        self._updates_waiting += 1  # the running batch takes no new calls and ends
        try:
            async with self._weights:
                yield self._model
                self.version = self.version + 1 if version is None else version
        finally:
            self._updates_waiting -= 1
            if self._inbox:
                self._arrived.set()

    async def load_state_dict(self, state: dict[str, Any], version: int | None = None) -> None:
        """Replace the weights between batches (see `updating`)."""
        async with self.updating(version) as model:
            await self._run(lambda: model.load_state_dict(state))

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One ``chat.completion`` with token ids, logprobs and the policy version."""
        if self._dispatcher is None:
            raise PolicyError("the torch policy is not started", status_code=503)
        for field in _UNSUPPORTED:
            if request.body.get(field) is not None:
                raise ChatRequestError(
                    f"the torch policy does not support {field!r}; remove it (it samples with "
                    "temperature, top_p, top_k, max_tokens, seed and stop)",
                    param=field,
                )
        plan = plan_tools(request, answer_after_tool_result=self.answer_after_tool_result)
        loop = asyncio.get_running_loop()
        job = await loop.run_in_executor(self._prep, self._job, request, plan)
        pending = _Pending(job, loop.create_future())
        self._inbox.append(pending)
        self._arrived.set()
        version = await pending.done
        return await loop.run_in_executor(self._prep, self._response, job, plan, version)

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The whole answer as chunks, once generated (batched generation is not streamed)."""
        for chunk in chunks_of(await self.complete(request)):
            yield chunk

    def _job(self, request: ChatRequest, plan: Any) -> Any:
        from osmosis_ai.gateway.policies._torch_generate import GenerationJob, Sampling

        body = request.body
        messages = render_messages(request.messages, plan)
        prompt = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = list(self._tokenizer.encode(prompt, add_special_tokens=False))
        max_tokens = requested_max_tokens(request, self._max_tokens_cap)
        context = getattr(self._model.config, "max_position_embeddings", None)
        if context is not None and len(prompt_ids) + max_tokens > context:
            raise ChatRequestError(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceed "
                f"the model's context of {context} tokens; shorten the messages or lower "
                "max_tokens",
                param="messages",
            )
        sampling = Sampling(
            temperature=float(_field(body, "temperature", 1.0)),
            top_p=float(_field(body, "top_p", 1.0)),
            top_k=_field(body, "top_k", 0, integer=True),
            max_tokens=max_tokens,
            seed=_field(body, "seed", None, integer=True),
            stop=_stops(body.get("stop")),
            top_logprobs=_field(body, "top_logprobs", 0, integer=True),
        )
        return GenerationJob(prompt_ids, sampling, grammar=self._grammar(body, plan))

    def _grammar(self, body: dict[str, Any], plan: Any) -> Any:
        if plan is not None:
            # Only tool arguments are bounded: an answer may be as long as max_tokens allows.
            tools = [_bounded_tool(tool, self.max_string_length) for tool in plan.tools]
            schema = ToolPlan(tools, allow_answer=plan.allow_answer).schema()
            return self._compiler.compile_json_schema(schema, max_whitespace_cnt=_MAX_WHITESPACE)
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_object":  # OpenAI: any JSON object
            return self._compiler.compile_json_schema({"type": "object"}, any_whitespace=False)
        if response_format.get("type") == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema") or {}
            return self._compiler.compile_json_schema(schema, max_whitespace_cnt=_MAX_WHITESPACE)
        return None

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            if not self._inbox:
                continue
            if len(self._inbox) < self.max_batch_size:
                await asyncio.sleep(self.batch_window_sec)  # let concurrent calls join
            async with self._weights:
                started = time.perf_counter()
                await self._run(functools.partial(self._serve, loop, self.version))
                self.busy_sec += time.perf_counter() - started

    def _serve(self, loop: asyncio.AbstractEventLoop, version: int) -> None:
        """Generate until no call is running and none may join (worker thread).

        Calls join between decoding steps while no weight update waits; each is settled
        on the event loop as soon as it is done.
        """
        from osmosis_ai.gateway.policies._torch_generate import Decoder

        decoder = Decoder(
            self._torch,
            self._xgrammar,
            self._model,
            stop_token_ids=self._stop_ids,
            pad_id=self._pad_id(),
            decode=self._decode,
        )
        running: dict[int, _Pending] = {}

        def settle(jobs: list[Any], error: PolicyError | None = None) -> None:
            for job in jobs:
                loop.call_soon_threadsafe(running.pop(id(job)).settle, version, error)

        try:
            while not self._closing:
                joining = self._take(self.max_batch_size - decoder.size)
                if joining:
                    running.update((id(pending.job), pending) for pending in joining)
                    self.batch_sizes[len(joining)] += 1
                    settle(decoder.admit([pending.job for pending in joining]))
                if not decoder.size:
                    return
                settle(decoder.step())
            settle([pending.job for pending in running.values()], _stopped())
        except Exception as exc:
            error = PolicyError(
                f"the torch policy failed: {type(exc).__name__}: {exc}", status_code=500
            )
            settle([pending.job for pending in running.values()], error)

    def _take(self, room: int) -> list[_Pending]:
        """Up to ``room`` waiting calls, none while a weight update waits (worker thread)."""
        taken: list[_Pending] = []
        while len(taken) < room and self._inbox and not self._updates_waiting:
            taken.append(self._inbox.popleft())
        return taken

    def _pad_id(self) -> int:
        pad = self._tokenizer.pad_token_id
        return int(pad if pad is not None else min(self._stop_ids, default=0))

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def _response(self, job: Any, plan: Any, version: int) -> dict[str, Any]:
        text = self._decode(job.token_ids)
        if job.stop_at is not None:
            text = text[: job.stop_at]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish_reason = job.finish_reason
        if plan is not None:
            message, tool_finish = reply_message(text)
            finish_reason = tool_finish or finish_reason
        entries = [
            {
                "token": self._tokenizer.decode([token]),
                "id": token,
                "logprob": logprob,
                "top_logprobs": [
                    {"token": self._tokenizer.decode([alt]), "id": alt, "logprob": value}
                    for alt, value in alternatives
                ],
            }
            for token, logprob, alternatives in zip(
                job.token_ids, job.logprobs, job.top_logprobs, strict=True
            )
        ]
        prompt_tokens, completion_tokens = len(job.prompt_ids), len(job.token_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "prompt_token_ids": job.prompt_ids,
            "policy_version": version,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason,
                    "token_ids": job.token_ids,
                    "logprobs": {"content": entries},
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    async def _run(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _field(body: dict[str, Any], name: str, default: Any, *, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return default
    wrong_type = not isinstance(value, int | float) or (integer and not isinstance(value, int))
    if isinstance(value, bool) or wrong_type or value < 0:
        kind = "an integer" if integer else "a number"
        raise ChatRequestError(f"{name!r} must be {kind} of at least 0", param=name)
    return value


def _stops(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return tuple(stop)
    raise ChatRequestError("'stop' must be a string or a list of strings", param="stop")


def _stopped() -> PolicyError:
    return PolicyError("the torch policy stopped", status_code=503)


def _bounded_tool(tool: dict[str, Any], max_length: int) -> dict[str, Any]:
    function = tool["function"]
    parameters = bounded_strings(function.get("parameters") or {"type": "object"}, max_length)
    return {**tool, "function": {**function, "parameters": parameters}}
