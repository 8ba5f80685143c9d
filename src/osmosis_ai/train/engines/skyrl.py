"""SkyRL: an AgentWorkflow and its Grader as the generator of a SkyRL training run.

``OsmosisGenerator`` runs one rollout per input trajectory through ``AgentRollouts``, with the
gateway's policy on SkyRL's inference router (a sticky ``X-Session-ID`` per rollout). By
default the policy is our chat front on the router's token-in ``/v1/completions``
(``EnginePolicy(ChatFront, VllmEngine)``): prompts are rendered here, an agent's earlier
replies are replayed as the ids the model generated, and tools are called in the model's own
format when its template has one. ``prompts="chat"`` sends chat completions instead (the
engine renders the template: re-tokenised history). It returns SkyRL's step-wise rows: one
row per model call, exactly the engine's prompt and completion token ids and logprobs, the
rows of a trajectory contiguous and its last row marked ``is_last_step``. Run it with
``generator.step_wise_trajectories=true`` and ``generator.merge_stepwise_output=true`` (SkyRL
then merges the calls whose prompts chain: with token-in prompts, every turn of a
conversation).

Failures and removed samples: a rollout that failed, timed out, was removed by its grader
or gave nothing to train has **no rows** when another rollout of its prompt has some (so it
does not enter the group baseline with a made-up reward). A prompt none of whose rollouts
can be trained keeps one zero-weight row (loss mask all 0, reward 0, alone in its group:
no gradient), because SkyRL requires every prompt of the batch in the output. Both are
counted in ``rollout_metrics`` (``osmosis/excluded/<reason>``, ``osmosis/zero_weight_rows``).

Needs Python 3.12+ and SkyRL (``pip install 'osmosis-ai[skyrl]'`` on a GPU install of
SkyRL); the experiment entry point is ``osmosis_ai.train.engines.skyrl_main``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput
from skyrl.train.generators.utils import get_rollout_metrics

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.policies.chat_front import ChatFront
from osmosis_ai.gateway.policies.engine_policy import EnginePolicy
from osmosis_ai.gateway.policies.engines.vllm import SERVED_MODEL, VllmEngine
from osmosis_ai.gateway.policies.openai_compatible import OpenAICompatiblePolicy
from osmosis_ai.gateway.policies.tool_formats import ToolFormatSetting
from osmosis_ai.gateway.request import SAMPLING_FIELDS
from osmosis_ai.train.engines._core import AgentRollouts, EngineRollout, EngineTask, batch_metrics

__all__ = [
    "OsmosisGenerator",
    "rollout_id",
    "sampling_overrides",
    "task_for",
    "to_generator_output",
]

SESSION_HEADER = "X-Session-ID"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_ID = 200

#: ``(prompt ids, response ids)`` of a zero-weight row for a task (chat template of its prompt).
Placeholder = Callable[[EngineTask], tuple[list[int], list[int]]]


def rollout_id(trajectory_id: Any, batch: int, index: int) -> str:
    """A path-safe, batch-unique rollout id: ``b<batch>-<index>-<trajectory id>``."""
    safe = _UNSAFE.sub("_", trajectory_id.to_string())
    return f"b{batch}-{index}-{safe}"[:_MAX_ID]


def task_for(input_batch: GeneratorInput, index: int, batch: int) -> EngineTask:
    """The rollout of input trajectory ``index``.

    The label is ``env_extras["reward_spec"]["ground_truth"]`` (SkyRL's dataset convention)
    or ``env_extras["label"]``; the metadata is ``env_extras["extra_info"]``.

    Raises:
        ConfigError: The batch has no ``trajectory_ids`` (step-wise training needs them).
    """
    trajectory_ids = input_batch.get("trajectory_ids")
    if not trajectory_ids:
        raise ConfigError(
            "GeneratorInput.trajectory_ids is missing; OsmosisGenerator returns step-wise rows, "
            "which SkyRL groups by trajectory id: use SkyRL's trainer (it always sets them)"
        )
    trajectory = trajectory_ids[index]
    extras = (input_batch.get("env_extras") or [None] * (index + 1))[index] or {}
    reward_spec = extras.get("reward_spec")
    label = reward_spec.get("ground_truth") if isinstance(reward_spec, dict) else None
    label = extras.get("label") if label is None else label
    metadata = extras.get("extra_info")
    return EngineTask(
        rollout_id=rollout_id(trajectory, batch, index),
        group_id=str(trajectory.instance_id),
        prompt=[dict(message) for message in input_batch["prompts"][index]],
        label=None if label is None else str(label),
        metadata=dict(metadata) if isinstance(metadata, dict) else None,
    )


#: SkyRL's values that mean "off" (its defaults: ``top_k=-1``, ``min_p=0.0``).
_NEUTRAL = {"top_k": (-1, 0), "min_p": (0, 0.0), "presence_penalty": (0, 0.0),
            "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0)}  # fmt: skip


def sampling_overrides(params: dict[str, Any] | None) -> dict[str, Any]:
    """The engine's sampling parameters the gateway imposes on every call (SkyRL's
    ``max_generate_length`` is ``max_tokens``; values that mean "off" are left out)."""
    params = dict(params or {})
    if "max_tokens" not in params and params.get("max_generate_length") is not None:
        params["max_tokens"] = params["max_generate_length"]
    return {
        k: v
        for k, v in params.items()
        if k in SAMPLING_FIELDS and v is not None and v not in _NEUTRAL.get(k, ())
    }


def to_generator_output(
    rollouts: Sequence[EngineRollout],
    trajectory_ids: Sequence[Any],
    placeholder: Placeholder,
) -> GeneratorOutput:
    """SkyRL's step-wise rows of finished rollouts (pure; see the module docstring)."""
    usable_groups = {r.task.group_id for r in rollouts if r.excluded is None}
    placed: set[str] = set()
    rows: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons",
            "rollout_logprobs", "trajectory_ids", "is_last_step", "times",
        )
    }  # fmt: skip

    def add(
        prompt: list[int],
        response: list[int],
        mask: list[int],
        logprobs: list[float],
        stop: str,
        trajectory: Any,
        seconds: float,
    ) -> None:
        rows["prompt_token_ids"].append(prompt)
        rows["response_ids"].append(response)
        rows["loss_masks"].append(mask)
        rows["rollout_logprobs"].append(logprobs)
        rows["stop_reasons"].append(stop)
        rows["trajectory_ids"].append(trajectory)
        rows["rewards"].append([0.0] * len(response))
        rows["is_last_step"].append(False)
        rows["times"].append(seconds)

    zero_weight = 0
    for rollout, trajectory in zip(rollouts, trajectory_ids, strict=True):
        group = rollout.task.group_id
        if rollout.excluded is None:
            calls = [c for c in rollout.calls if c.status == "ok" and c.completion_token_ids]
            for call in calls:
                completion = list(call.completion_token_ids or ())
                add(
                    list(call.prompt_token_ids or ()),
                    completion,
                    [1] * len(completion),
                    list(call.logprobs or ()),
                    call.finish_reason or "stop",
                    trajectory,
                    rollout.seconds,
                )
            # Outcome reward on the trajectory's last token, as SkyRL's own step-wise rows.
            rows["rewards"][-1][-1] = float(rollout.reward or 0.0)
        elif group not in usable_groups and group not in placed:
            placed.add(group)
            zero_weight += 1
            prompt, response = placeholder(rollout.task)
            zeros = [0] * len(response)
            add(
                prompt,
                response,
                zeros,
                [0.0] * len(response),
                "excluded",
                trajectory,
                rollout.seconds,
            )
        else:
            continue
        rows["is_last_step"][-1] = True
    metrics = batch_metrics(rollouts)
    metrics["osmosis/zero_weight_rows"] = float(zero_weight)
    if rows["response_ids"]:
        metrics.update(
            get_rollout_metrics(
                rows["response_ids"], rows["rewards"], loss_masks=rows["loss_masks"]
            )
        )
    output: GeneratorOutput = {
        "prompt_token_ids": rows["prompt_token_ids"],
        "response_ids": rows["response_ids"],
        "rewards": rows["rewards"],
        "loss_masks": rows["loss_masks"],
        "stop_reasons": rows["stop_reasons"],
        "rollout_metrics": metrics,
        "rollout_logprobs": rows["rollout_logprobs"],
        "trajectory_ids": rows["trajectory_ids"],
        # One per row, as SkyRL's step-wise generator does (each row carries its trajectory's).
        "trajectory_generation_times": rows["times"],
        "trajectory_time_splits": None,
        "rollout_expert_indices": None,
        "rollout_sample_support": None,
        "is_last_step": rows["is_last_step"],
        "env_metrics": None,
        "pixel_values": None,
        "image_grid_thw": None,
    }
    return output


class OsmosisGenerator(GeneratorInterface):  # type: ignore[misc]  # untyped without skyrl
    """A SkyRL generator that runs ``workflow`` (graded by ``grader``) for each trajectory.

    Args:
        workflow: The ``AgentWorkflow`` class or ``"module:Class"`` path (None with
            ``server_url``: a rollout server runs the workflow).
        base_url: The engine's OpenAI base URL (``<proxy_url>/v1``).
        tokenizer: The policy's tokenizer (token-in prompts are rendered with its chat
            template; zero-weight rows use it too).
        model: The model name the engine serves.
        api_key: The engine's bearer key, if it has one.
        session_header: Header carrying the rollout id (SkyRL's router is sticky on it).
        policy_timeout_sec: Longest wait for the engine's next byte.
        prompts: ``"tokens"`` (default): the chat front renders each call and sends its ids
            to the engine's ``/v1/completions`` (vLLM's token-in API): exact history, the
            model's own tool format. ``"chat"``: chat completions, rendered by the engine.
        tool_format: With token-in prompts, ``"auto"`` (the model's own tool-call format
            when its template has a known one), ``"native"`` or ``"instruction"``.
        **options: `AgentRollouts` keywords (grader, configs, backend, server_url,
            agent_timeout_sec, drift, max_in_flight...).
    """

    def __init__(
        self,
        workflow: Any,
        *,
        base_url: str,
        tokenizer: Any,
        model: str | None = None,
        api_key: str | None = None,
        session_header: str = SESSION_HEADER,
        policy_timeout_sec: float = 600.0,
        prompts: Literal["tokens", "chat"] = "tokens",
        tool_format: ToolFormatSetting = "auto",
        **options: Any,
    ) -> None:
        self.tokenizer = tokenizer
        policy: Policy
        self._refused: tuple[str, ...] = ()
        if prompts == "tokens":
            engine = VllmEngine(
                base_url.rstrip("/").removesuffix("/v1"),
                api_key=api_key,
                session_header=session_header,
                read_timeout_sec=policy_timeout_sec,
                model=model or SERVED_MODEL,
            )
            front = ChatFront(tokenizer, tool_format=tool_format)
            policy = EnginePolicy(front, engine, name=engine.model_name)
            self._refused = engine.refused_sampling
        elif prompts == "chat":
            policy = OpenAICompatiblePolicy(
                base_url,
                model=model,
                api_key=api_key,
                timeout_sec=policy_timeout_sec,
                token_data=True,
                session_header=session_header,
            )
        else:
            raise ConfigError(f'OsmosisGenerator prompts={prompts!r}: use "tokens" or "chat"')
        self.rollouts = AgentRollouts(workflow, policy=policy, **options)
        self._batch = 0
        self._state = "new"  # -> "started" -> "closed"
        self._lock = asyncio.Lock()

    @classmethod
    def from_engine(
        cls, inference_engine_client: Any, tokenizer: Any, workflow: Any, **options: Any
    ) -> OsmosisGenerator:
        """A generator on SkyRL's inference client (its router URL and model name)."""
        base_url = inference_engine_client.get_endpoint_url().rstrip("/") + "/v1"
        return cls(
            workflow,
            base_url=base_url,
            tokenizer=tokenizer,
            model=inference_engine_client.model_name,
            **options,
        )

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run one rollout per input trajectory; return their step-wise rows."""
        async with self._lock:
            if self._state == "closed":
                raise ConfigError("OsmosisGenerator.generate called after aclose()")
            if self._state == "new":
                await self.rollouts.__aenter__()
                self._state = "started"
            self._batch += 1
            batch = self._batch
        tasks = [task_for(input_batch, i, batch) for i in range(len(input_batch["prompts"]))]
        # The trainer's sampling (train or eval phase) applies to every call of the batch.
        sampling = sampling_overrides(input_batch.get("sampling_params"))
        self._check_sampling(sampling)
        self.rollouts.gateway.sampling = sampling
        done = await self.rollouts.run(tasks)
        return to_generator_output(done, input_batch["trajectory_ids"], self._placeholder)

    async def aclose(self) -> None:
        """Stop the gateway and the backend (started by the first ``generate``)."""
        async with self._lock:
            if self._state == "started":
                await self.rollouts.__aexit__(None, None, None)
            self._state = "closed"

    def _check_sampling(self, sampling: dict[str, Any]) -> None:
        for name in self._refused:
            if name in sampling:
                raise ConfigError(
                    f"generator.sampling_params.{name} = {sampling[name]!r} is not supported "
                    'with token-in prompts; remove it, or set prompts="chat"'
                )

    def _placeholder(self, task: EngineTask) -> tuple[list[int], list[int]]:
        prompt = self.tokenizer.apply_chat_template(
            task.prompt, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        end = self.tokenizer.eos_token_id
        return list(prompt), [end if end is not None else 0]
