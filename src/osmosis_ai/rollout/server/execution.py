"""Running one admitted rollout to its final, published result."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from osmosis_ai._extras import import_optional
from osmosis_ai.rollout._failures import describe
from osmosis_ai.rollout.backend.base import ExecutionOutcome, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.server._registry import Entry
from osmosis_ai.rollout.server._state import ServerState
from osmosis_ai.rollout.server.results import failure, internal_failure
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.trajectory import TrajectoryReport, save_diagnostics, save_trajectory
from osmosis_ai.rollout.trajectory.preview import preview_id_allowed
from osmosis_ai.rollout.trajectory.save import TRAJECTORY_FILENAME, describe_storage_error
from osmosis_ai.rollout.types import RolloutInitRequest

__all__ = ["REPORT_URL_FIELD", "cancelled_result", "lease_expired_result", "run_rollout"]

logger = logging.getLogger(__name__)

#: ``extra_fields`` key naming where the trajectory report of a rollout can be fetched.
REPORT_URL_FIELD = "trajectory_report_url"
_REPORT_TIMEOUT_SEC = 5.0


def cancelled_result(state: ServerState) -> ExecutionResult:
    """The result of a rollout cancelled by a request or by shutdown."""
    message = "cancelled: the rollout server is shutting down" if state.draining else "cancelled"
    return ExecutionResult(RolloutStatus.CANCELLED, err_message=message)


def lease_expired_result(state: ServerState) -> ExecutionResult:
    """The result of a rollout whose controller stopped polling."""
    return failure(
        f"polling lease expired: no result poll for {state.registry.lease_timeout_sec:g}s, "
        "so the rollout was cancelled; poll GET /rollout/{id}/result at least that often",
        RolloutErrorCategory.LEASE_EXPIRED,
    )


async def run_rollout(state: ServerState, entry: Entry, request: RolloutInitRequest) -> None:
    """Execute ``entry`` (admitted with ``request``) on the backend, save its files, then
    publish its final result."""
    if not state.backend.reports_progress:
        entry.progress.set_status(RolloutStatus.RUNNING)
    outcome: ExecutionOutcome | None = None
    context = RolloutContext(
        chat_completions_url=request.chat_completions_url,
        api_key=request.llm_api_key,
        rollout_id=request.rollout_id,
        progress=entry.progress,
        redactor=entry.redactor,
        model_pool=state.model_pool,
    )
    _start_previews(state, entry, context)
    try:
        with context:
            outcome = await state.backend.execute(ExecutionRequest.from_init(request))
        result = outcome.result
    except asyncio.CancelledError:
        state.registry.finish(entry, cancelled_result(state))
        raise
    except Exception as exc:
        # The backend broke its contract (user failures are results, not exceptions).
        result = internal_failure(exc, phase="the execution backend", redactor=entry.redactor)
        logger.error("rollout %s: %s", entry.rollout_id, result.err_message)
    try:
        unsaved = await _save(state, entry, request, outcome, result)
        if unsaved is not None and result.ok:
            # Status and reward stand; the message tells a controller that keeps files
            # (``osmosis eval run``) that this rollout's trajectory is missing.
            result = dataclasses.replace(result, err_message=unsaved)
    finally:
        try:
            if entry.preview is not None and state.preview_hub is not None:
                # Before the result: whoever reads the result finds the final preview.
                await state.preview_hub.finish(entry.preview, result.status.value)
        finally:
            state.registry.finish(entry, result)


def _start_previews(state: ServerState, entry: Entry, context: RolloutContext) -> None:
    if state.preview_hub is not None and preview_id_allowed(entry.rollout_id):
        entry.preview = state.preview_hub.add(entry.rollout_id, context, entry.progress)


async def _save(
    state: ServerState,
    entry: Entry,
    request: RolloutInitRequest,
    outcome: ExecutionOutcome | None,
    result: ExecutionResult,
) -> str | None:
    """Write ``trajectory.json`` and ``diagnostics.json``; never raises.

    Returns why the trajectory could not be stored (disk full...), if it could not.
    """
    saved = outcome.result_to_save if outcome is not None else result
    unsaved = None
    if saved.sample is not None:
        try:
            await save_trajectory(
                rollout_id=entry.rollout_id,
                sample=saved.sample,
                request_label=request.label,
                request_metadata=request.metadata,
                request_extra_fields=request.extra_fields,
                report=await _report(state, entry, request),
                artifact_root=state.artifact_root,
                redactor=entry.redactor,
                raise_storage_errors=True,
                durable=state.durable_files,
            )
        except OSError as exc:
            unsaved = f"{TRAJECTORY_FILENAME} not saved: {describe_storage_error(exc)}"
            logger.warning("rollout %s: %s", entry.rollout_id, unsaved)
    diagnostics = saved.extra_fields or result.extra_fields
    if diagnostics:
        await save_diagnostics(
            rollout_id=entry.rollout_id,
            diagnostics=diagnostics,
            artifact_root=state.artifact_root,
            redactor=entry.redactor,
            durable=state.durable_files,
        )
    return unsaved


async def _report(
    state: ServerState, entry: Entry, request: RolloutInitRequest
) -> TrajectoryReport | None:
    try:
        if state.report_provider is not None:
            return await state.report_provider(request)
        url = (request.extra_fields or {}).get(REPORT_URL_FIELD)
        if isinstance(url, str) and url:
            return await _fetch_report(state, url, request.llm_api_key)
    except Exception as exc:
        logger.warning(
            "rollout %s: no per-call metrics for its trajectory (%s)",
            entry.rollout_id,
            entry.redactor.text(describe(exc, phase="the report source")),
        )
    return None


async def _fetch_report(state: ServerState, url: str, key: str | None) -> TrajectoryReport | None:
    aiohttp = import_optional("aiohttp", extra="server", feature="The rollout server")
    if state.http_session is None:
        state.http_session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_REPORT_TIMEOUT_SEC)
        )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with state.http_session.get(url, headers=headers, allow_redirects=False) as response:
        if response.status == 404:
            return None
        response.raise_for_status()
        return TrajectoryReport.model_validate(await response.json())
