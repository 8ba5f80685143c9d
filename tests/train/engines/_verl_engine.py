"""A real CPU inference engine behind verl's own server client, for the verl adapter tests.

verl's agent loops generate through ``LLMServerClient.generate`` (token-in/token-out), which
asks the ``GlobalRequestLoadBalancer`` actor for a server and calls that server actor's
``generate``. Both are verl's real classes here; only the server actor is ours, and it runs
the embedded model with llama.cpp: the prompt ids go in as they are, and the sampled ids and
their logprobs come out, as vLLM's server returns them (end-of-turn token included).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from osmosis_ai.gateway.policies.llama import LlamaEngine, embedded_model_path

__all__ = ["LlamaTokenServer", "VerlEngine", "Served", "start_engine"]

_DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True)
class Served:
    """One generation the server actor answered."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    sampling_params: dict[str, Any]


class LlamaTokenServer:
    """verl's server-actor method shape, answered by llama.cpp on the embedded model."""

    def __init__(self, *, n_threads: int = 2, context_size: int = 8192) -> None:
        self._engine = LlamaEngine(
            embedded_model_path(),
            n_parallel=4,
            n_threads=n_threads,
            context_size=context_size,
            model_name="verl-cpu",
        )
        self._served: list[Served] = []
        self._grammar: str | None = None
        self._grammar_calls = 0
        self._failure: str | None = None

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Generate from ``prompt_ids`` as ``vLLMHttpServer.generate`` does."""
        failure, self._failure = self._failure, None
        if failure == "raise":
            raise RuntimeError("the engine ran out of KV cache")
        if failure == "abort":  # vLLM's answer to a generation cut by a weight update
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted")
        max_tokens = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        body: dict[str, Any] = {
            "prompt": list(prompt_ids),
            "n_predict": int(max_tokens or _DEFAULT_MAX_TOKENS),
            "temperature": float(sampling_params.get("temperature", 1.0)),
            "top_p": float(sampling_params.get("top_p", 1.0)),
            "n_probs": 1,
            "cache_prompt": True,
        }
        if self._grammar_calls > 0 and self._grammar is not None:
            self._grammar_calls -= 1
            body["grammar"] = self._grammar
        # handle_completions blocks: run it off the actor's event loop.
        response = await asyncio.to_thread(self._engine._server.handle_completions, body)
        if "error" in response:
            raise RuntimeError(f"llama.cpp failed: {response['error']}")
        entries = response["choices"][0]["logprobs"]["content"]
        output = TokenOutput(
            token_ids=[entry["id"] for entry in entries],
            log_probs=[entry["logprob"] for entry in entries],
            stop_reason="completed",
        )
        self._served.append(
            Served(
                request_id=request_id,
                prompt_ids=list(prompt_ids),
                token_ids=list(output.token_ids),
                log_probs=list(output.log_probs or []),
                sampling_params=dict(sampling_params),
            )
        )
        return output

    def constrain(self, grammar: str, calls: int = 1) -> None:
        """Generate the next ``calls`` answers under a GBNF grammar (llama.cpp's own sampler)."""
        self._grammar, self._grammar_calls = grammar, calls

    def fail_next(self, how: str) -> None:
        """Make the next generation raise (``"raise"``) or be aborted (``"abort"``)."""
        self._failure = how

    def served(self) -> list[Served]:
        """Every generation so far, in order."""
        return list(self._served)

    def clear(self) -> None:
        """Forget the generations so far."""
        self._served.clear()


@dataclass(frozen=True)
class VerlEngine:
    """The server actor, verl's load balancer actor, and verl's client in front of them."""

    server: Any
    load_balancer: Any
    client: LLMServerClient
    config: Any


def start_engine(*, full_determinism: bool = True) -> VerlEngine:
    """Start the actors on the running Ray instance.

    With ``full_determinism`` verl's client passes the caller's request id through to the
    server (else a fresh id per turn), so the tests can see which rollout asked.
    """
    server = ray.remote(LlamaTokenServer).options(num_cpus=0, max_concurrency=8).remote()
    load_balancer = (
        ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"cpu0": server})
    )
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "full_determinism": full_determinism,
                    "prompt_length": 1024,
                    "response_length": 256,
                }
            },
            "data": {},
        }
    )
    client = LLMServerClient(config, load_balancer_handle=load_balancer)
    return VerlEngine(server=server, load_balancer=load_balancer, client=client, config=config)
