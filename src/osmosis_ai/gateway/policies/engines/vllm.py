"""The vLLM engine: a vLLM OpenAI server generating from the chat front's exact prompt ids.

Every call is one ``POST /v1/completions`` whose ``prompt`` is the token ids the chat front
rendered (no re-tokenisation), with ``return_token_ids`` and ``logprobs: 0``: the answer
carries the completion's ids and one behaviour logprob per token. With the server started
as ``--logprobs-mode processed_logprobs`` those are taken under the distribution sampled from
(after the grammar's mask, temperature, top-k and top-p), as the torch engine records them.
A tool plan's or a ``response_format``'s grammar is sent as ``structured_outputs`` in its
Lark text (``grammar_text``), the one the torch engine compiles and the learner replays;
vLLM's default backend (``auto``) hands a grammar with ``%json`` to llguidance.
vLLM batches the calls that arrive together.

New weights arrive between steps (`VllmEngine.updating`). Full weights: once the running
calls are done, ``push`` writes them into a directory (a tmpfs when there is room), has the
server reload them (``/collective_rpc`` ``reload_weights``, which needs
``VLLM_SERVER_DEV_MODE=1``) and resets the prefix cache; only then do the next calls start,
stamped with the new version. A LoRA adapter (``lora=True``) does not stop generation: each
version is loaded beside the others under its own name (``policy-lora-v<N>``), calls in
flight finish with the adapter they started with, new ones take the new adapter from the
moment it is loaded, and the newest ``keep_adapters`` stay loaded (prefix caches are kept per
adapter, so none is reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies._http1 import Upstream, UpstreamConnectionError
from osmosis_ai.gateway.policies.engines.base import (
    Generation,
    GenerationRequest,
    TokenEngine,
)
from osmosis_ai.gateway.policies.engines.grammar import grammar_text
from osmosis_ai.gateway.policies.hf_dir import quiet_peft, quiet_transformers

__all__ = ["VllmEngine", "VllmEngineError"]

T = TypeVar("T")
#: The name the managed server serves the base weights under.
SERVED_MODEL = "policy"
#: A LoRA run's adapters are loaded (and called) as ``<this>-v<version>``.
ADAPTER_NAME = "policy-lora"
_TOKEN_ID_PREFIX = "token_id:"


class VllmEngineError(PolicyError):
    """The vLLM server refused or failed a call, or a weight update."""


class _Reload:
    """The engine's `WeightUpdate`: write the weights, have the server load them."""

    def __init__(self, engine: VllmEngine, version: int) -> None:
        self._engine, self._version = engine, version

    async def push(self, model: Any) -> None:
        engine = self._engine
        directory = engine.weights_dir
        if directory is None:
            raise VllmEngineError(
                "this vLLM engine has no weights directory to push through (its server gets "
                "new weights another way)",
                status_code=500,
            )
        started = time.perf_counter()
        if hasattr(model, "peft_config"):  # LoRA: the adapter alone, beside the last ones
            name = f"{ADAPTER_NAME}-v{self._version}"
            await engine.run(_save_adapter, model, directory / name)
            load = {"lora_name": name, "lora_path": str(directory / name), "load_inplace": True}
            await engine.call("/v1/load_lora_adapter", load)
            for old in engine.serve_adapter(name, self._version):
                await engine.call("/v1/unload_lora_adapter", {"lora_name": old})
                await engine.run(shutil.rmtree, directory / old, True)
        else:
            await engine.run(_save_weights, model, directory, engine.weights_dtype)
            reload = {"weights_path": str(directory), "is_checkpoint_format": True}
            await engine.call("/collective_rpc", {"method": "reload_weights", "kwargs": reload})
            # Cached prefixes hold keys and values of the old weights.
            await engine.call("/reset_prefix_cache", None)
        engine.weight_sync_sec = time.perf_counter() - started


class VllmEngine(TokenEngine):
    """Generates with a running vLLM OpenAI-compatible server at ``url``.

    Args:
        url: The server's base URL (``http://127.0.0.1:PORT``).
        weights_dir: Where ``push`` writes new weights for the server to read (it must see
            the same path: the server runs on this machine); ``None`` for a server that gets
            its weights another way (SkyRL's, whose trainer syncs them).
        version: The weight version of the served weights.
        weights_dtype: The server's dtype name; full weights are written in it (bf16 halves
            the bytes to write and read), except ``auto``/``float32``.
        executor: Runs blocking torch work (saving weights) off the event loop: the
            learner's thread, so that its model is only ever touched from one thread
            (default: asyncio's).
        max_concurrency: Calls sent at once (vLLM batches them; more wait here).
        read_timeout_sec: How long a call may go without a byte of answer.
        api_key: Sent as a bearer token (a server started with ``--api-key``).
        session_header: A header naming each call's rollout (`GenerationRequest.session`),
            for a router that keeps a rollout on one server (SkyRL's ``X-Session-ID``).
        model: The name the server serves the model under.
        lora: Weights arrive as LoRA adapters: generation goes on while one loads.
        keep_adapters: LoRA adapters kept loaded, the newest first (at least 2: the calls
            in flight when a new one loads still use the last); a trainer with
            ``max_staleness = S`` keeps ``S + 1``.
    """

    kind = "vllm"

    def __init__(
        self,
        url: str,
        *,
        weights_dir: Path | None = None,
        version: int = 0,
        weights_dtype: str = "auto",
        executor: Executor | None = None,
        max_concurrency: int = 256,
        read_timeout_sec: float = 900.0,
        api_key: str | None = None,
        session_header: str | None = None,
        model: str = SERVED_MODEL,
        lora: bool = False,
        keep_adapters: int = 2,
    ) -> None:
        self.url = url.rstrip("/")
        self.lora = lora
        self.keep_adapters = max(2, keep_adapters)
        self._adapters: list[str] = []
        self.weights_dir = weights_dir
        self.version = version
        self.weights_dtype = weights_dtype
        self.model_name = model
        self.weight_sync_sec = 0.0
        """Seconds the last weight update took (write, reload, cache reset)."""
        self._executor = executor
        self._max_concurrency = max_concurrency
        self._read_timeout_sec = read_timeout_sec
        self._api_key = api_key
        self._session_header = session_header
        self._upstream: Upstream | None = None
        self._running = 0
        self._busy_since = 0.0
        self._idle = asyncio.Condition()
        self._open = asyncio.Event()
        self._open.set()
        self._updates_waiting = 0

    async def start(self) -> None:
        """Open the connection pool to the server."""
        if self._upstream is None:
            self._upstream = Upstream(
                self.url,
                max_connections=self._max_concurrency,
                connect_timeout_sec=10.0,
                read_timeout_sec=self._read_timeout_sec,
                headers={"Authorization": f"Bearer {self._api_key}"} if self._api_key else None,
            )

    async def aclose(self) -> None:
        """Close the connections (the server is stopped by whoever started it)."""
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            await upstream.aclose()

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the engine's executor (blocking torch work)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def secrets(self) -> tuple[str, ...]:
        """The API key, which never appears in an error or log."""
        return (self._api_key,) if self._api_key else ()

    async def call(
        self, path: str, body: dict[str, Any] | None, headers: dict[str, str] | None = None
    ) -> Any:
        """POST ``body`` to ``path`` of the server; its JSON answer (or its text).

        Raises:
            VllmEngineError: The server is unreachable or answered with an error.
        """
        if self._upstream is None:
            raise VllmEngineError("the vLLM engine is not started", status_code=503)
        payload = json.dumps(body if body is not None else {}).encode("utf-8")
        try:
            request = self._upstream.request(path, payload, headers)
            status, content = await self._upstream.post(request)
        except (UpstreamConnectionError, OSError, TimeoutError) as exc:
            raise VllmEngineError(
                f"the vLLM server at {self.url} did not answer {path}: {type(exc).__name__}: {exc}",
                status_code=503,
            ) from None
        if status != 200:
            raise VllmEngineError(
                f"the vLLM server answered {path} with {status}: {_error_text(content)}",
                status_code=502 if status >= 500 else 400,
            )
        try:
            return json.loads(content) if content else None
        except ValueError:  # /v1/load_lora_adapter answers in plain text
            return content.decode("utf-8", "replace")

    def serve_adapter(self, name: str, version: int) -> list[str]:
        """Call adapter ``name`` (loaded) from now on, as weight version ``version``; returns
        the adapters beyond the newest ``keep_adapters``, to unload."""
        # One step, nothing awaited between: a call never pairs one's name with another's version.
        self.model_name, self.version = name, version
        self._adapters.append(name)
        old, self._adapters = (
            self._adapters[: -self.keep_adapters],
            self._adapters[-self.keep_adapters :],
        )
        return old

    @contextlib.asynccontextmanager
    async def updating(self, version: int | None = None) -> AsyncIterator[_Reload]:
        """Full weights: hold new calls back, wait for the running ones, then let the weights
        change. LoRA: generation goes on (calls keep the adapter they started with)."""
        target = self.version + 1 if version is None else version
        if self.lora:
            yield _Reload(self, target)
            self.version = target
            return
        self._updates_waiting += 1
        self._open.clear()
        try:
            async with self._idle:
                await self._idle.wait_for(lambda: self._running == 0)
            yield _Reload(self, target)
            self.version = target
        finally:
            self._updates_waiting -= 1
            if not self._updates_waiting:
                self._open.set()

    async def generate(self, request: GenerationRequest) -> Generation:
        """One completion of ``request`` from the server (concurrent calls batch there)."""
        while not self._open.is_set():
            await self._open.wait()
        # The grammar's text, not its JSON schema: vLLM then enforces exactly the masks the
        # torch engine would and the learner replays (its own schema compile differs).
        grammar = None if request.grammar is None else grammar_text(request.grammar)
        self._running += 1
        if self._running == 1:  # busy: at least one call in flight at the server
            self._busy_since = time.perf_counter()
        version, body = self.version, self._body(request, grammar)
        try:
            headers = None
            if self._session_header and request.session:
                headers = {self._session_header: request.session}
            answer = await self.call("/v1/completions", body, headers)
        finally:
            self._running -= 1
            if not self._running:
                self.busy_sec += time.perf_counter() - self._busy_since
            async with self._idle:
                self._idle.notify_all()
        return _generation(answer, version, grammar)

    def _body(self, request: GenerationRequest, grammar: str | None) -> dict[str, Any]:
        sampling = request.sampling
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(request.prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": sampling.top_logprobs,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.top_logprobs:
            body["return_tokens_as_token_ids"] = True  # alternatives named by id, not text
        if grammar is not None:
            body["structured_outputs"] = {"grammar": grammar}
        return body


def _generation(answer: Any, version: int, grammar: str | None) -> Generation:
    """The `Generation` in a ``/v1/completions`` answer.

    Raises:
        VllmEngineError: The answer lacks the token ids or logprobs (a server started
            without ``return_token_ids`` support, or a vLLM older than 0.10).
    """
    try:
        choice = answer["choices"][0]
        token_ids = [int(token) for token in choice["token_ids"]]
        logprobs_block = choice["logprobs"]
        logprobs = [float(value) for value in logprobs_block["token_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise VllmEngineError(
            "the vLLM server's answer has no completion token ids and logprobs; it needs a vLLM "
            "that supports return_token_ids (0.10 or newer)",
            status_code=502,
        ) from None
    if len(logprobs) != len(token_ids):
        raise VllmEngineError(
            f"the vLLM server returned {len(token_ids)} token ids but {len(logprobs)} logprobs",
            status_code=502,
        )
    top = [_alternatives(entry) for entry in logprobs_block.get("top_logprobs") or []]
    stop_reason = choice.get("stop_reason")
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        version=version,
        top_logprobs=top if any(top) else [],
        # A stop string: vLLM's text ends before it (the ids include the tokens that made it).
        stop_at=len(choice.get("text") or "") if isinstance(stop_reason, str) else None,
        grammar=grammar,
    )


def _alternatives(entry: Any) -> list[tuple[int, float]]:
    """``{"token_id:ID": logprob, ...}`` as (id, logprob) pairs, most likely first."""
    if not isinstance(entry, dict):
        return []
    pairs = [
        (int(name.removeprefix(_TOKEN_ID_PREFIX)), float(value))
        for name, value in entry.items()
        if isinstance(name, str) and name.startswith(_TOKEN_ID_PREFIX)
    ]
    return sorted(pairs, key=lambda pair: -pair[1])


def _error_text(content: bytes) -> str:
    """The message of a vLLM error answer (``{"error": {"message": ...}}``), shortened."""
    try:
        body = json.loads(content)
        message = body.get("error", {}).get("message") or body.get("message") or body
    except (ValueError, AttributeError):
        message = content.decode("utf-8", "replace")
    return str(message)[:500]


def _save_weights(model: Any, directory: Path, dtype_name: str) -> None:
    """``model``'s weights as safetensors in ``directory``, in ``dtype_name`` when that is a
    half precision (blocking)."""
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}.get(
        dtype_name
    )
    state = None if dtype is None else {k: v.to(dtype) for k, v in model.state_dict().items()}
    directory.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(str(directory), state_dict=state)


def _save_adapter(model: Any, directory: Path) -> None:
    """The LoRA adapter of peft ``model`` in ``directory`` (blocking)."""
    directory.mkdir(parents=True, exist_ok=True)
    with quiet_transformers(), quiet_peft():
        model.save_pretrained(str(directory))
