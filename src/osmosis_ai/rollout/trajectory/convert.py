"""Conversion between OpenAI chat messages and ATIF trajectory documents."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from osmosis_ai import __version__
from osmosis_ai.rollout.sample import JSONObject, RolloutSample
from osmosis_ai.rollout.trajectory._content import compact_json, flatten_content
from osmosis_ai.rollout.trajectory._message_fields import (
    message_metrics,
    message_model_name,
    message_timestamp,
    parse_tool_calls,
    reasoning_text,
)
from osmosis_ai.rollout.trajectory.atif import Trajectory
from osmosis_ai.rollout.trajectory.report import TrajectoryReport, apply_report

__all__ = [
    "AGENT_NAME",
    "chat_messages_to_steps",
    "convert_sample_to_trajectory",
    "messages_from_trajectory",
]

#: ``agent.name`` of every document the SDK writes.
AGENT_NAME = "osmosis-rollout-sdk"

_SOURCE_BY_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "agent"}
_TOOL_ROLES = frozenset({"tool", "function"})
_ROLE_BY_SOURCE = {"agent": "assistant", "user": "user", "system": "system"}


def _agent_fields(step: JSONObject, message: Mapping[str, Any]) -> None:
    model_name = message_model_name(message)
    if model_name is not None:
        step["model_name"] = model_name
    reasoning = reasoning_text(message.get("reasoning_content"))
    if reasoning is not None:
        step["reasoning_content"] = reasoning
    tool_calls = parse_tool_calls(message.get("tool_calls"))
    if tool_calls:
        step["tool_calls"] = tool_calls
    metrics = message_metrics(message)
    if metrics is not None:
        step["metrics"] = metrics
        step["llm_call_count"] = 1


def _step_from_message(message: Mapping[str, Any], role: object, step_id: int) -> JSONObject:
    step: JSONObject = {"step_id": step_id}
    timestamp = message_timestamp(message)
    if timestamp is not None:
        step["timestamp"] = timestamp
    extra: JSONObject = {}
    source = _SOURCE_BY_ROLE.get(role) if isinstance(role, str) else None
    if source is None:
        source = "user"
        extra["original_role"] = role if isinstance(role, str) else compact_json(role)
    step["source"] = source
    step["message"] = flatten_content(message.get("content"))
    if source == "agent":
        _agent_fields(step, message)
    else:
        # Only agent steps may carry these; keeping them in extra keeps the document valid.
        tool_calls = parse_tool_calls(message.get("tool_calls"))
        if tool_calls:
            extra["tool_calls"] = tool_calls
        reasoning = reasoning_text(message.get("reasoning_content"))
        if reasoning is not None:
            extra["reasoning_content"] = reasoning
    if extra:
        step["extra"] = extra
    return step


def _fold_tool_result(
    steps: list[JSONObject],
    steps_by_call_id: Mapping[str, JSONObject],
    message: Mapping[str, Any],
    role: str,
) -> None:
    call_id = message.get("tool_call_id")
    call_id = call_id if isinstance(call_id, str) and call_id else None
    result: JSONObject = {"content": flatten_content(message.get("content"))}
    target = steps_by_call_id.get(call_id) if call_id is not None else None
    if target is not None:
        result["source_call_id"] = call_id
    elif steps and steps[-1]["source"] == "agent":
        target = steps[-1]
        if call_id is not None:
            result["extra"] = {"tool_call_id": call_id}
    else:
        # A result with no agent step to belong to becomes its own (empty) system step.
        target = {"step_id": len(steps) + 1}
        timestamp = message_timestamp(message)
        if timestamp is not None:
            target["timestamp"] = timestamp
        target.update(source="system", message="", extra={"original_role": role})
        if call_id is not None:
            result["extra"] = {"tool_call_id": call_id}
        steps.append(target)
    target.setdefault("observation", {"results": []})["results"].append(result)


def chat_messages_to_steps(messages: Sequence[object]) -> list[JSONObject]:
    """ATIF step dicts from OpenAI chat messages (see `convert_sample_to_trajectory`)."""
    steps: list[JSONObject] = []
    # Latest agent step per tool_call_id: a result folds into the step that made the call.
    steps_by_call_id: dict[str, JSONObject] = {}
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if isinstance(role, str) and role in _TOOL_ROLES:
            _fold_tool_result(steps, steps_by_call_id, message, role)
            continue
        step = _step_from_message(message, role, len(steps) + 1)
        steps.append(step)
        for call in step.get("tool_calls", ()):
            steps_by_call_id[call["tool_call_id"]] = step
    return steps


def _mark_turn_rewards(steps: list[JSONObject], turn_rewards: Mapping[int, float]) -> None:
    """Put each turn reward on its agent step (turn ``i``: the ``i + 1``-th agent step, the
    model call that wrote it) as ``extra.osmosis.turn_reward``; the document keeps them all
    in ``extra.osmosis.turn_rewards`` whether or not a step matched."""
    agent_steps = [step for step in steps if step["source"] == "agent"]
    for turn, reward in turn_rewards.items():
        if turn < len(agent_steps):
            extra = agent_steps[turn].setdefault("extra", {})
            extra.setdefault("osmosis", {})["turn_reward"] = reward


def _osmosis_extra(
    sample: RolloutSample,
    rollout_id: str,
    request_label: str | None,
    request_metadata: Mapping[str, Any] | None,
    request_extra_fields: Mapping[str, Any] | None,
    unmatched: JSONObject,
) -> JSONObject:
    safe = sample.json_safe_copy()
    label = sample.label if sample.label is not None else request_label
    candidates: JSONObject = {
        "rollout_id": rollout_id,
        "label": label,
        "reward": sample.reward,
        "turn_rewards": {str(t): r for t, r in sample.turn_rewards.items()} or None,
        "sample_metrics": safe.metrics,
        "sample_extra_fields": safe.extra_fields or None,
        "request_metadata": dict(request_metadata) if request_metadata is not None else None,
        "request_extra_fields": (
            dict(request_extra_fields) if request_extra_fields is not None else None
        ),
        **unmatched,
    }
    return {key: value for key, value in candidates.items() if value is not None}


def convert_sample_to_trajectory(
    sample: RolloutSample,
    *,
    rollout_id: str,
    request_label: str | None = None,
    request_metadata: Mapping[str, Any] | None = None,
    request_extra_fields: Mapping[str, Any] | None = None,
    report: TrajectoryReport | None = None,
    default_model_name: str | None = None,
) -> Trajectory:
    """Build the ATIF document of a sample from its ``trajectory_messages``.

    Each chat message becomes a step (``system``/``developer`` -> system, ``user`` -> user,
    ``assistant`` -> agent, other roles -> user with ``extra.original_role``); tool results
    fold into the agent step that made the call. Assistant messages contribute model name,
    reasoning, tool calls and metrics (``usage`` plus per-call ``prompt_token_ids``,
    ``completion_token_ids``/``token_ids`` and ``logprobs``). A report's per-call metrics
    are then merged in and final totals computed.

    Args:
        sample: The sample; its ``trajectory_messages`` are converted.
        rollout_id: Becomes ``session_id``, ``trajectory_id`` and ``extra.osmosis.rollout_id``.
        request_label: Label used when the sample has none.
        request_metadata: Copied to ``extra.osmosis.request_metadata``.
        request_extra_fields: Copied to ``extra.osmosis.request_extra_fields``.
        report: Per-call metrics gathered outside the sample (e.g. by a model gateway).
        default_model_name: ``agent.model_name`` when the report names no model.

    Returns:
        The validated trajectory.

    Raises:
        ValueError: ``trajectory_messages`` is ``None`` or holds no message, or the
            result is not a valid ATIF document.
    """
    messages = sample.trajectory_messages
    if messages is None:
        raise ValueError(
            "sample has no trajectory-compatible messages (trajectory_messages is None); "
            "set RolloutSample.trajectory_messages to OpenAI chat messages to save one"
        )
    steps = chat_messages_to_steps(messages)
    if not steps:
        raise ValueError(
            "sample.trajectory_messages holds no message; an ATIF trajectory needs at least "
            "one step"
        )
    merge = apply_report(steps, report, default_model_name=default_model_name)
    _mark_turn_rewards(steps, sample.turn_rewards)
    agent: JSONObject = {"name": AGENT_NAME, "version": __version__}
    if merge.model_name is not None:
        agent["model_name"] = merge.model_name
    document: JSONObject = {
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": merge.final_metrics,
        "extra": {
            "osmosis": _osmosis_extra(
                sample,
                rollout_id,
                request_label,
                request_metadata,
                request_extra_fields,
                merge.unmatched,
            )
        },
    }
    return Trajectory.model_validate(document)


def _chat_content(content: object) -> object:
    # ATIF content parts back to OpenAI parts; text stays text.
    if not isinstance(content, list):
        return "" if content is None else content
    parts: list[JSONObject] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image":
            source = part.get("source")
            url = source.get("path") if isinstance(source, Mapping) else None
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif isinstance(part, Mapping):
            parts.append({"type": "text", "text": part.get("text")})
    return parts


def _chat_tool_calls(calls: Sequence[object]) -> list[JSONObject]:
    return [
        {
            "id": call.get("tool_call_id"),
            "type": "function",
            "function": {
                "name": call.get("function_name"),
                "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
            },
        }
        for call in calls
        if isinstance(call, Mapping)
    ]


def _tool_messages(observation: object) -> list[JSONObject]:
    results = observation.get("results") if isinstance(observation, Mapping) else None
    messages: list[JSONObject] = []
    for result in results if isinstance(results, list) else ():
        if not isinstance(result, Mapping):
            continue
        message: JSONObject = {"role": "tool"}
        call_id = result.get("source_call_id")
        extra = result.get("extra")
        if call_id is None and isinstance(extra, Mapping):
            call_id = extra.get("tool_call_id")  # where the converter keeps unmatched ids
        if call_id is not None:
            message["tool_call_id"] = call_id
        message["content"] = _chat_content(result.get("content"))
        messages.append(message)
    return messages


def messages_from_trajectory(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OpenAI chat messages from an ATIF document (or a ``{"messages": [...]}`` document).

    A document with a top-level ``messages`` list is returned as that list. Otherwise each
    step becomes a message (``agent`` -> ``assistant``, ``user``, ``system``, anything else
    -> ``tool``) with tool calls in OpenAI shape (``arguments`` as JSON text) and
    ``reasoning_content`` kept, followed by one ``tool`` message per observation result.
    A system step the converter made for an orphan tool result yields only its results.

    Args:
        document: A parsed trajectory document.

    Returns:
        The messages, in step order.
    """
    raw_messages = document.get("messages")
    if isinstance(raw_messages, list):
        return list(raw_messages)
    steps = document.get("steps")
    messages: list[dict[str, Any]] = []
    for step in steps if isinstance(steps, list) else ():
        if not isinstance(step, Mapping):
            continue
        extra = step.get("extra")
        original_role = extra.get("original_role") if isinstance(extra, Mapping) else None
        orphan_result = (
            step.get("source") == "system"
            and original_role in _TOOL_ROLES
            and step.get("message") == ""
        )
        if not orphan_result:
            source = step.get("source")
            message: JSONObject = {
                "role": _ROLE_BY_SOURCE.get(source, "tool") if isinstance(source, str) else "tool",
                "content": _chat_content(step.get("message")),
            }
            tool_calls = step.get("tool_calls")
            if isinstance(tool_calls, list) and tool_calls:
                message["tool_calls"] = _chat_tool_calls(tool_calls)
            if step.get("reasoning_content") is not None:
                message["reasoning_content"] = step["reasoning_content"]
            messages.append(message)
        messages.extend(_tool_messages(step.get("observation")))
    return messages
