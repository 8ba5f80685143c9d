"""The torch token engine: a live transformers model, continuous batching on a worker thread."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import functools
import importlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies.engines._batch_budget import BatchBudget
from osmosis_ai.gateway.policies.engines._prefix_store import PrefixStore
from osmosis_ai.gateway.policies.engines.base import (
    Generation,
    GenerationRequest,
    Scores,
    TokenEngine,
)
from osmosis_ai.gateway.policies.engines.grammar import (
    GrammarCompiler,
    grammar_text,
    stop_token_ids,
)
from osmosis_ai.gateway.policies.torch_device import free_memory_bytes, is_out_of_memory

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "TorchEngine"]

#: Most calls generated together, unless their cache needs fewer.
DEFAULT_MAX_BATCH_SIZE = 64

T = TypeVar("T")


@dataclass
class _Pending:
    job: Any  # an engines._decoder.GenerationJob
    done: asyncio.Future[int]
    """Resolves to the weight version the job was generated with."""

    def settle(self, version: int | None, error: PolicyError | None = None) -> None:
        """Resolve ``done`` (on the event loop), unless the caller has gone away."""
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
        else:
            self.done.set_result(version)  # type: ignore[arg-type]


class _SharedWeights:
    """The engine's `WeightUpdate`: a trainer's model object is the engine's own, or its
    weights are copied in (into a bf16 copy's released parameters, new storage)."""

    def __init__(self, engine: TorchEngine) -> None:
        self._engine = engine

    async def push(self, model: Any) -> None:
        engine = self._engine
        if hasattr(model, "get_base_model"):  # a peft model: its base carries the adapter
            model = model.get_base_model()
        if model is engine.model:
            return  # trained in place: the engine already generates with it
        state = model.state_dict()
        if engine.released:
            await engine._run(functools.partial(_fill, engine.model, state))
            engine.released = False
        else:
            await engine._run(functools.partial(engine.model.load_state_dict, state))


class TorchEngine(TokenEngine):
    """Generates with a transformers causal LM on its device (CPU, CUDA or MPS).

    Calls are generated together with a KV cache on one worker thread, never on the event
    loop, by continuous batching: a call joins the running batch between two decoding steps
    and leaves it as soon as it is done. A batch takes as many calls as their cache has room
    for (`BatchBudget`: a quarter of the memory free at start, or ``cache_bytes``), and at
    most ``max_batch_size``. The first calls of an idle engine wait for others to start with
    them while more keep arriving (``batch_window_sec`` after the last one, at most
    ``max_wait_sec``), so the rollouts of a training step are prefilled together. Generation
    runs in the model's own dtype (fp32 master weights in training) with fp32 logits.

    With ``prefix_cache`` (on by default) a finished call's keys and values are kept
    (`PrefixStore`, within a quarter of the batch's cache budget) and a later call whose
    prompt begins the same way (an agent's next turn) is prefilled from where they end; the
    store is emptied whenever the weights change. Not for models with sliding-window or
    recurrent layers.

    With ``precision="bf16"`` it generates from a bf16 copy of the model (made when it
    starts, the weights copied in at every update): about half the memory traffic of fp32
    per decoding step, at the price of logprobs that differ from an fp32 learner's (recorded
    as the engine computed them, so the trainer's off-policy correction sees the gap). The
    copy's weights are released while an update runs, when nothing generates, so that the
    update's peak memory does not hold them, and the push fills them again: an update that
    pushes nothing leaves the engine without weights, and its calls fail saying so (a push
    that never arrived cannot go unnoticed); one that raises takes the model's weights back.

    Grammars are compiled with llguidance from their Lark text (`grammar_text`, which the
    answer records), imported when the first one arrives; without it only unconstrained
    calls work, and a constrained one fails naming the install.

    Args:
        model: The model to serve; a trainer passes the one it trains (shared, not copied).
        tokenizer: Its tokenizer (stop strings, grammar vocabulary).
        version: The initial weight version (training step).
        max_batch_size: Most calls generated together.
        cache_bytes: The KV cache one batch may take; by default a quarter of the memory
            free on the model's device when the engine starts.
        batch_window_sec: How long a batch waits for one more call before it starts.
        max_wait_sec: How long a batch waits for calls at most.
        prefix_cache: Keep finished calls' keys and values for later calls' prompts.
        precision: ``"fp32"``: generate with ``model`` as it is (a trainer's fp32 weights);
            ``"bf16"``: with a bf16 copy of it.
        thread: The one-worker executor to generate on; a trainer passes the thread its
            updates run on, so every torch op on the shared model runs on one thread (torch
            keeps an OpenMP thread team per calling thread, and teams on different threads
            stall each other on a small machine). By default the engine has its own.
    """

    kind = "torch"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        version: int = 0,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        cache_bytes: int | None = None,
        batch_window_sec: float = 0.01,
        max_wait_sec: float = 0.25,
        prefix_cache: bool = True,
        precision: Literal["fp32", "bf16"] = "fp32",
        thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self.model, self._tokenizer = model, tokenizer
        self.precision = precision
        self.version = version
        self.max_batch_size = max_batch_size
        self.cache_bytes = cache_bytes
        self.batch_window_sec = batch_window_sec
        self.max_wait_sec = max_wait_sec
        self.budget: BatchBudget | None = None
        """What a batch may hold (set when the engine starts)."""
        self.prefix_cache = prefix_cache
        self.released = False
        """Whether a bf16 copy's weights are released: while an update runs, and after one
        that pushed nothing."""
        self._source: Any = None  # the model a bf16 copy was made from
        self.prefixes: PrefixStore | None = None
        """Finished calls' keys and values (set when the engine starts, with
        ``prefix_cache`` on a model whose every layer is full attention)."""
        #: How many times each number of calls joined generation together (tests, metrics).
        self.batch_sizes: Counter[int] = Counter()
        #: The most calls that generated together.
        self.largest_batch = 0
        self.busy_sec = 0.0
        self._stop_ids = stop_token_ids(model, tokenizer)
        self._torch: Any = None
        self._compiler = GrammarCompiler(
            tokenizer, vocab_size=model.config.vocab_size, stop_ids=self._stop_ids
        )
        # Calls not yet generating; the worker thread takes them between decoding steps.
        self._inbox: collections.deque[_Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._weights = asyncio.Lock()
        # Updates and scorings waiting for the weights: the running batch takes no new calls.
        self._holds_waiting = 0
        self._closing = False
        self._own_thread = thread is None
        self._executor = thread or ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch")
        # Grammar compiling (the first one also converts the tokenizer, about a second) on
        # its own thread, so decoding does not wait for it.
        self._grammars = ThreadPoolExecutor(1, thread_name_prefix="osmosis-torch-grammar")
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Calls accepted but not yet generating."""
        return len(self._inbox)

    async def start(self) -> None:
        """Start the batching loop."""
        if self._dispatcher is not None:
            return
        self._torch = importlib.import_module("torch")  # loaded already: the model is torch's
        torch = self._torch
        if self.precision == "bf16" and next(self.model.parameters()).dtype != torch.bfloat16:
            self._source = self.model
            self.model = await self._run(functools.partial(_bf16_copy, self.model))
        self.budget = BatchBudget.of(
            self.model.config,
            next(self.model.parameters()).element_size(),
            max_calls=self.max_batch_size,
            cache_bytes=self.cache_bytes,
            free_bytes=free_memory_bytes(self.model.device) if self.cache_bytes is None else None,
        )
        if self.prefix_cache and _full_attention(self.model):
            self.prefixes = PrefixStore(self.budget.cache_bytes // 4)
        self._closing = False
        self._dispatcher = asyncio.create_task(self._dispatch(), name="osmosis-torch-batches")

    async def aclose(self) -> None:
        """Stop generating (calls waiting or generating fail with 503), free the threads (not
        a thread it was given)."""
        self._closing = True
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None:
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
        while self._inbox:
            self._inbox.popleft().settle(None, _stopped())
        await asyncio.to_thread(self._grammars.shutdown, wait=True)
        if self._own_thread:
            await asyncio.to_thread(self._executor.shutdown, wait=True)

    @contextlib.asynccontextmanager
    async def updating(self, version: int | None = None) -> AsyncIterator[_SharedWeights]:
        """Hold generation back while the weights change (see `TokenEngine.updating`).

        While an update waits, the running batch takes no new calls and ends.
        """
        async with self._held():
            if self.prefixes is not None:  # no batch runs: the worker thread is idle
                self.prefixes.clear()
            if self._source is not None and not self.released:
                await self._run(functools.partial(_release, self.model))
                self.released = True
            try:
                yield _SharedWeights(self)
            except (Exception, asyncio.CancelledError):
                if self.released:  # the failed update's weights are the model's own
                    source = self._source
                    await self._run(lambda: _fill(self.model, source.state_dict()))
                    self.released = False
                raise
            self.version = self.version + 1 if version is None else version

    @property
    def can_score(self) -> bool:
        return True

    async def score(self, prompt_ids: list[int], token_ids: list[int]) -> Scores:
        """One forward pass over ``prompt_ids + token_ids`` between two batches (the running
        one takes no new calls meanwhile), its logits in fp32 (see `TokenEngine.score`)."""
        if self._dispatcher is None:
            raise PolicyError("the torch engine is not started", status_code=503)
        async with self._held():
            if self.released:
                raise _unpushed()
            forward = functools.partial(_scored, self.model, prompt_ids, token_ids)
            return Scores(await self._run(forward), self.version)

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        """The weights to oneself: no batch runs until the block ends."""
        self._holds_waiting += 1
        try:
            async with self._weights:
                yield
        finally:
            self._holds_waiting -= 1
            if self._inbox:
                self._arrived.set()

    async def generate(self, request: GenerationRequest) -> Generation:
        """Generate ``request`` together with whatever else is waiting or running."""
        from osmosis_ai.gateway.policies.engines._decoder import GenerationJob

        if self._dispatcher is None:
            raise PolicyError("the torch engine is not started", status_code=503)
        loop = asyncio.get_running_loop()
        matcher, text = None, None
        if request.grammar is not None:
            text = grammar_text(request.grammar)
            matcher = await loop.run_in_executor(self._grammars, self._compiler.matcher, text)
        job = GenerationJob(list(request.prompt_ids), request.sampling, grammar=matcher)
        pending = _Pending(job, loop.create_future())
        self._inbox.append(pending)
        self._arrived.set()
        version = await pending.done
        return Generation(
            token_ids=job.token_ids,
            logprobs=job.logprobs,
            finish_reason="stop" if job.finish_reason == "stop" else "length",
            version=version,
            top_logprobs=job.top_logprobs,
            stop_at=job.stop_at,
            grammar=text,
        )

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            if not self._inbox:
                continue
            await self._gather()
            async with self._weights:
                if self.released:  # calls that waited through an update that pushed nothing
                    while self._inbox:
                        self._inbox.popleft().settle(None, _unpushed())
                    continue
                started = time.perf_counter()
                await self._run(functools.partial(self._serve, loop, self.version))
                self.busy_sec += time.perf_counter() - started
            if self._inbox:  # calls left waiting when a batch failed: serve them now
                self._arrived.set()

    async def _gather(self) -> None:
        """Let calls that start together arrive: wait while they keep coming (a window after
        the last one), until the batch is full or ``max_wait_sec`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_sec
        seen = 0
        while seen < len(self._inbox) < self.max_batch_size and loop.time() < deadline:
            seen = len(self._inbox)
            await asyncio.sleep(self.batch_window_sec)

    def _serve(self, loop: asyncio.AbstractEventLoop, version: int) -> None:
        """Generate until no call is running and none may join (worker thread).

        Calls join between decoding steps while no weight update waits; each is settled
        on the event loop as soon as it is done.
        """
        from osmosis_ai.gateway.policies.engines._decoder import Decoder

        decoder = Decoder(
            self._torch,
            self.model,
            stop_token_ids=self._stop_ids,
            pad_id=self._pad_id(),
            decode=self._decode,
            prefixes=self.prefixes,
        )
        running: dict[int, _Pending] = {}

        def settle(jobs: list[Any], error: PolicyError | None = None) -> None:
            for job in jobs:
                loop.call_soon_threadsafe(running.pop(id(job)).settle, version, error)

        try:
            while not self._closing:
                joining = self._take([_reach(row.job) for row in decoder.rows])
                if joining:
                    running.update((id(pending.job), pending) for pending in joining)
                    self.batch_sizes[len(joining)] += 1
                    self.largest_batch = max(self.largest_batch, decoder.size + len(joining))
                    settle(decoder.admit([pending.job for pending in joining]))
                if not decoder.size:
                    return
                settle(decoder.step())
            settle([pending.job for pending in running.values()], _stopped())
        except Exception as exc:
            self.out_of_memory = self.out_of_memory or is_out_of_memory(exc)
            error = PolicyError(
                f"the torch engine failed: {type(exc).__name__}: {exc}", status_code=500
            )
            settle([pending.job for pending in running.values()], error)

    def _take(self, running: list[int]) -> list[_Pending]:
        """The waiting calls, in order, that the batch has room for beside calls reaching
        ``running`` tokens; none while an update or a scoring waits (worker thread)."""
        assert self.budget is not None  # set by start(), before any call is served
        taken: list[_Pending] = []
        reaches = list(running)
        while self._inbox and not self._holds_waiting:
            reach = _reach(self._inbox[0].job)
            if reaches and not self.budget.fits([*reaches, reach]):
                break  # in order: a long call waits for room, it is not overtaken
            reaches.append(reach)
            taken.append(self._inbox.popleft())
        return taken

    def _pad_id(self) -> int:
        pad = self._tokenizer.pad_token_id
        return int(pad if pad is not None else min(self._stop_ids, default=0))

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    async def _run(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)


def _reach(job: Any) -> int:
    """The tokens a job's cache may grow to."""
    return len(job.prompt_ids) + int(job.sampling.max_tokens)


def _bf16_copy(model: Any) -> Any:
    """A copy of ``model`` with bf16 weights to generate with (no gradients). Only the
    parameters are cast: buffers such as the rotary embedding's frequencies stay fp32, as
    vLLM keeps them, so that positions are encoded as finely as the learner encodes them."""
    import torch

    copied = copy.deepcopy(model)
    for parameter in copied.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    copied.requires_grad_(False)
    return copied


def _scored(model: Any, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The logprobs of ``token_ids`` after ``prompt_ids`` under ``model`` (one forward
    pass, fp32 logits, temperature 1; worker thread)."""
    import torch

    ids = torch.tensor([[*prompt_ids, *token_ids]], device=model.device)
    with torch.inference_mode():
        logits = model(ids, use_cache=False).logits[0, len(prompt_ids) - 1 : -1].float()
        chosen = ids[0, len(prompt_ids) :].unsqueeze(1)
        return torch.log_softmax(logits, dim=-1).gather(1, chosen).squeeze(1).tolist()


def _release(model: Any) -> None:
    """Free the storage of ``model``'s parameters (a bf16 copy's, during an update)."""
    import torch

    for parameter in model.parameters():
        parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)


def _fill(model: Any, state: dict[str, Any]) -> None:
    """Give ``model``'s parameters their values in ``state`` (a state dict with the same
    names) in their own dtype, new storage."""
    for name, parameter in model.named_parameters():
        value = state[name].detach()
        parameter.data = value.to(device=parameter.device, dtype=parameter.dtype, copy=True)


def _full_attention(model: Any) -> bool:
    """Whether every layer of ``model`` attends to the whole sequence (no sliding window, no
    recurrent or linear-attention layer)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _stopped() -> PolicyError:
    return PolicyError("the torch engine stopped", status_code=503)


def _unpushed() -> PolicyError:
    return PolicyError(
        "the torch engine has no weights: an update released its bf16 copy's and pushed "
        "none (call push() inside updating())",
        status_code=500,
    )
