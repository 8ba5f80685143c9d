"""Live previews: small, clipped, redacted ATIF snapshots of a rollout while it runs.

Pure functions only; the server's publisher (``osmosis_ai.rollout.server._previews``) does
the collecting, timing and writing. A preview is diagnostic: it never feeds grading or the
saved ``trajectory.json``. The shape and limits follow the reference SDK (0.3.6+).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai import __version__
from osmosis_ai.redact import redact_value
from osmosis_ai.rollout.sample import JSONObject, RolloutSample
from osmosis_ai.rollout.trajectory.convert import AGENT_NAME, chat_messages_to_steps

__all__ = [
    "MAX_PREVIEW_BYTES",
    "MAX_PREVIEW_MESSAGES",
    "PREVIEW_FILENAME",
    "PREVIEW_INTERVAL_SEC",
    "PREVIEW_ROOT_ENV",
    "Snapshot",
    "StepCache",
    "encode_preview",
    "preview_id_allowed",
    "preview_root_from_env",
    "snapshot_of",
]

logger = logging.getLogger(__name__)

#: Environment variable naming the directory previews are published under (off when unset).
PREVIEW_ROOT_ENV = "_OSMOSIS_ROLLOUT_PREVIEW_ROOT"
#: File name of a rollout's preview: ``<root>/<rollout_id>/preview.json``.
PREVIEW_FILENAME = "preview.json"
#: Seconds between two looks at a rollout's sample source.
PREVIEW_INTERVAL_SEC = 3.0
#: Most recent messages asked of a source, and most recent steps published.
MAX_PREVIEW_MESSAGES = 100
#: Largest published preview file.
MAX_PREVIEW_BYTES = 900 * 1024

_MAX_STRING = 16_384
_MAX_ENTRIES = 1_000
_MAX_DEPTH = 20
_CLIPPED = " [preview truncated]"
_TOO_DEEP = "[preview truncated]"
_TOKEN_KEYS = frozenset({"prompt_token_ids", "completion_token_ids", "logprobs"})
_KEPT_STEP_FIELDS = (
    "timestamp",
    "source",
    "model_name",
    "message",
    "reasoning_content",
    "reasoning_effort",
    "llm_call_count",
    "is_copied_context",
)
_ENVELOPE_ROOM = 256
_OVERSIZED_STEP = "This turn exceeds the live preview size limit."
_PREVIEW_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")
_MAX_TURN = 1_000_000


def preview_root_from_env() -> Path | None:
    """The preview root named by ``_OSMOSIS_ROLLOUT_PREVIEW_ROOT``, or ``None`` (off).

    The path must be absolute with no symlink in it or its parents (a link could send the
    files anywhere); otherwise previews stay off and a warning says why.
    """
    raw = os.environ.get(PREVIEW_ROOT_ENV, "")
    if not raw:
        return None
    path = Path(raw)
    if not path.is_absolute():
        logger.warning("%s=%r is not an absolute path; previews are off", PREVIEW_ROOT_ENV, raw)
        return None
    for part in (path, *path.parents):
        if part.is_symlink():
            logger.warning("%s passes the symlink %s; previews are off", PREVIEW_ROOT_ENV, part)
            return None
    return path


def preview_id_allowed(rollout_id: str) -> bool:
    """Whether ``rollout_id`` may name a preview directory (no separators, dots or spaces)."""
    return _PREVIEW_ID.fullmatch(rollout_id) is not None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One collected preview: its steps (clipped and redacted) and what the source said."""

    fingerprint: str
    """Digest of what the source returned (``""`` when not computed); an unchanged
    fingerprint needs no new snapshot."""
    steps: list[JSONObject]
    truncated: bool
    turn: int | None


def _fingerprint(sample: RolloutSample) -> str:
    digest = hashlib.sha256()
    hints = {k: v for k, v in sample.extra_fields.items() if k.startswith("_preview_")}
    digest.update(json.dumps(hints, sort_keys=True, default=str).encode())
    digest.update(json.dumps(sample.trajectory_messages, default=str).encode())
    return digest.hexdigest()


def _clip(value: Any, depth: int, flag: list[bool]) -> Any:
    if isinstance(value, str):
        if len(value) > _MAX_STRING:
            flag[0] = True
            return value[:_MAX_STRING] + _CLIPPED
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _MAX_DEPTH:
        flag[0] = True
        return _TOO_DEEP
    if isinstance(value, dict):
        items = list(value.items())
        if len(items) > _MAX_ENTRIES:
            flag[0] = True
        clipped: JSONObject = {}
        for key, item in items[:_MAX_ENTRIES]:
            if key in _TOKEN_KEYS:
                flag[0] = True
                continue
            clipped[str(key)] = _clip(item, depth + 1, flag)
        return clipped
    if isinstance(value, list | tuple):
        if len(value) > _MAX_ENTRIES:
            flag[0] = True
        return [_clip(item, depth + 1, flag) for item in value[:_MAX_ENTRIES]]
    return _clip(str(value), depth, flag)


def _reduced(step: JSONObject) -> JSONObject:
    """A step with only what a preview shows: no ids, metrics, extras or request data."""
    out: JSONObject = {key: step[key] for key in _KEPT_STEP_FIELDS if key in step}
    calls = [
        {
            "tool_call_id": call.get("tool_call_id"),
            "function_name": call.get("function_name"),
            "arguments": call.get("arguments"),
        }
        for call in step.get("tool_calls") or ()
    ]
    if calls:
        out["tool_calls"] = calls
    call_ids = {call["tool_call_id"] for call in calls}
    results = []
    for result in (step.get("observation") or {}).get("results") or ():
        kept: JSONObject = {"content": result.get("content")}
        if result.get("source_call_id") in call_ids:
            kept["source_call_id"] = result["source_call_id"]
        results.append(kept)
    if results:
        out["observation"] = {"results": results}
    return out


#: Clipped and redacted step contents by their ``repr`` (cheap, and equal for equal JSON-like
#: data), reused across snapshots of one rollout: a growing history re-sends its old steps.
StepCache = dict[str, tuple[JSONObject, bool]]


def _safe_content(
    step: JSONObject, secrets: tuple[str, ...], cache: StepCache, used: StepCache
) -> tuple[JSONObject, bool]:
    content = _reduced(step)
    key = repr(content)
    hit = cache.get(key)
    if hit is None:
        flag = [False]
        hit = (redact_value(_clip(content, 1, flag), secrets=secrets), flag[0])
    used[key] = hit
    return hit


def _turn(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return min(max(value, 0), _MAX_TURN)


def snapshot_of(
    sample: RolloutSample,
    *,
    secrets: tuple[str, ...],
    previous: str | None = None,
    fingerprint: bool = True,
    cache: StepCache | None = None,
) -> Snapshot | None:
    """The snapshot of a source's preview sample, or ``None`` when there is nothing new.

    ``None`` also when the sample has no chat-shaped messages or converts to no step.
    Keeps the last ``MAX_PREVIEW_MESSAGES`` steps, renumbered from 1; clips long strings,
    big containers and deep nesting, drops token ids and logprobs, and redacts credentials
    and ``secrets`` everywhere. ``fingerprint=False`` skips the digest used to detect an
    unchanged sample (when the source's revision already said it changed); ``cache`` (one
    per rollout, updated in place) spares redacting steps seen before. CPU-bound: call it
    off the event loop.
    """
    messages = sample.trajectory_messages
    if not messages:
        return None
    digest = _fingerprint(sample) if fingerprint else ""
    if digest and digest == previous:
        return None
    hints = sample.extra_fields
    truncated_hint = hints.get("_preview_truncated")
    steps = chat_messages_to_steps(messages)
    if not steps:
        return None
    # Only a window the source called complete has step numbers that match the final file.
    ids_known = truncated_hint is False
    truncated = truncated_hint if isinstance(truncated_hint, bool) else len(messages) >= 100
    window = steps[-MAX_PREVIEW_MESSAGES:]
    truncated = truncated or len(steps) > len(window)
    known: StepCache = cache if cache is not None else {}
    used: StepCache = {}
    safe_steps = []
    for index, step in enumerate(window, start=1):
        content, clipped = _safe_content(step, secrets, known, used)
        truncated = truncated or clipped
        original = step["step_id"] if ids_known else None
        safe_steps.append(
            {"step_id": index, **content, "extra": {"osmosis": {"original_step_id": original}}}
        )
    if cache is not None:
        cache.clear()
        cache.update(used)  # only what this window holds: bounded by its size
    if "_preview_turn" in hints:
        turn = _turn(hints["_preview_turn"])
    else:
        turn = sum(1 for step in steps if step.get("source") == "agent")
    return Snapshot(fingerprint=digest, steps=safe_steps, truncated=truncated, turn=turn)


def _document(rollout_id: str, steps: list[JSONObject], osmosis: JSONObject) -> JSONObject:
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": {"name": AGENT_NAME, "version": __version__},
        "steps": steps,
        "extra": {"osmosis": osmosis},
    }


def _renumbered(steps: list[JSONObject]) -> list[JSONObject]:
    return [{**step, "step_id": index} for index, step in enumerate(steps, start=1)]


def encode_preview(
    rollout_id: str,
    snapshot: Snapshot,
    *,
    status: str,
    version: int,
    updated_at: str,
) -> bytes:
    """The ``preview.json`` bytes of ``snapshot``, stamped, within ``MAX_PREVIEW_BYTES``.

    When the document is too big the oldest steps are left out (``truncated`` set); when
    not even the newest step fits, a single placeholder step stands in for it.
    """
    osmosis: JSONObject = {
        "rollout_id": rollout_id,
        "preview": True,
        "turn": snapshot.turn,
        "truncated": snapshot.truncated,
        "status": status,
        "preview_version": version,
        "updated_at": updated_at,
    }

    def encode(steps: list[JSONObject], truncated: bool) -> bytes:
        meta = {**osmosis, "truncated": truncated}
        return json.dumps(_document(rollout_id, steps, meta), ensure_ascii=True).encode()

    limit = MAX_PREVIEW_BYTES - _ENVELOPE_ROOM
    data = encode(snapshot.steps, snapshot.truncated)
    if len(data) <= limit:
        return data
    # Binary search for the most recent steps that fit.
    low, high = 0, len(snapshot.steps)
    while low < high:
        middle = (low + high + 1) // 2
        if len(encode(_renumbered(snapshot.steps[-middle:]), True)) <= limit:
            low = middle
        else:
            high = middle - 1
    if low == 0:
        placeholder = {"step_id": 1, "source": "agent", "message": _OVERSIZED_STEP}
        return encode([placeholder], True)
    return encode(_renumbered(snapshot.steps[-low:]), True)
