"""Best-effort writing of ``trajectory.json`` and ``diagnostics.json`` under the artifact root."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from osmosis_ai._offload import run_blocking
from osmosis_ai.errors import InvalidIdError
from osmosis_ai.redact import Redactor, redact_value, scrub_secrets
from osmosis_ai.rollout.context import current_redactor
from osmosis_ai.rollout.ids import ensure_single_path_segment
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.storage import atomic_write_bytes, default_artifact_root
from osmosis_ai.rollout.trajectory.convert import convert_sample_to_trajectory
from osmosis_ai.rollout.trajectory.encode import encode_document
from osmosis_ai.rollout.trajectory.report import TrajectoryReport

__all__ = [
    "DIAGNOSTICS_FILENAME",
    "TRAJECTORY_FILENAME",
    "describe_storage_error",
    "save_diagnostics",
    "save_trajectory",
]

logger = logging.getLogger(__name__)

#: File name of the ATIF document inside ``<artifact_root>/<rollout_id>/``.
TRAJECTORY_FILENAME = "trajectory.json"
#: File name of the backend diagnostics inside ``<artifact_root>/<rollout_id>/``.
DIAGNOSTICS_FILENAME = "diagnostics.json"


def describe_storage_error(exc: OSError) -> str:
    """An OS error as its reason and path only (``OSError: No space left on device (path)``)."""
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{type(exc).__name__}: {exc.strerror or exc}{where}"


def _describe(exc: BaseException) -> str:
    # Never str(exc) in general: validation and encoding errors can quote message content.
    if isinstance(exc, InvalidIdError):
        return str(exc)
    if isinstance(exc, OSError):  # paths and OS reasons only
        return describe_storage_error(exc)
    if isinstance(exc, ValidationError):
        locations = ", ".join(
            ".".join(str(part) for part in error["loc"]) or "<document>"
            for error in exc.errors(include_url=False, include_context=False, include_input=False)
        )
        return f"invalid ATIF document at {locations[:300]}"
    return type(exc).__name__


def _write(
    root: str | os.PathLike[str] | None, rollout_id: str, name: str, data: bytes, durable: bool
) -> Path:
    directory = (Path(root) if root is not None else default_artifact_root()) / rollout_id
    path = directory / name
    try:
        atomic_write_bytes(path, data, durable=durable)
    except FileNotFoundError:
        # Made only when missing: a server's rollout made its folder with its artifacts
        # directory, and checking first costs two system calls per rollout.
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, durable=durable)
    return path


def _rollout_redactor(redactor: Redactor | None) -> Redactor:
    return redactor if redactor is not None else current_redactor()


def _without_secrets(data: bytes, secrets: tuple[str, ...]) -> bytes:
    # Scrub the encoded text: that covers every key and value at once. A secret appears
    # there either raw or JSON-escaped (quotes, backslashes, control characters).
    if not secrets:
        return data
    escaped = {json.dumps(secret, ensure_ascii=False)[1:-1] for secret in secrets}
    return scrub_secrets(data.decode("utf-8"), secrets=(*secrets, *escaped)).encode("utf-8")


def _convert_and_write(
    rollout_id: str,
    sample: RolloutSample,
    request_label: str | None,
    request_metadata: Mapping[str, Any] | None,
    request_extra_fields: Mapping[str, Any] | None,
    report: TrajectoryReport | None,
    artifact_root: str | os.PathLike[str] | None,
    secrets: tuple[str, ...],
    durable: bool,
) -> Path:
    trajectory = convert_sample_to_trajectory(
        sample,
        rollout_id=rollout_id,
        request_label=request_label,
        request_metadata=request_metadata,
        request_extra_fields=request_extra_fields,
        report=report,
    )
    data = _without_secrets(encode_document(trajectory), secrets)
    return _write(artifact_root, rollout_id, TRAJECTORY_FILENAME, data, durable)


async def save_trajectory(
    *,
    rollout_id: str,
    sample: RolloutSample | None,
    request_label: str | None = None,
    request_metadata: Mapping[str, Any] | None = None,
    request_extra_fields: Mapping[str, Any] | None = None,
    report: TrajectoryReport | None = None,
    artifact_root: str | os.PathLike[str] | None = None,
    redactor: Redactor | None = None,
    raise_storage_errors: bool = False,
    durable: bool = True,
) -> Path | None:
    """Write the sample's ATIF document to ``<artifact_root>/<rollout_id>/trajectory.json``.

    Conversion, encoding and the atomic write all run in one worker thread. The file is
    indented JSON with number arrays (token ids, logprobs) on one line, replaced atomically
    (never seen half-written) and, when ``durable``, fsynced with its directory.
    Best-effort: a failure is logged as a warning (without message content) and never
    raised, except storage failures when ``raise_storage_errors``.

    Args:
        rollout_id: The rollout; must be a single path segment.
        sample: The sample to archive; ``None`` writes nothing.
        request_label: Label recorded when the sample has none.
        request_metadata: Recorded under ``extra.osmosis.request_metadata``.
        request_extra_fields: Recorded under ``extra.osmosis.request_extra_fields``.
        report: Per-call metrics to merge into the steps.
        artifact_root: Root directory; defaults to ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``,
            else ``~/.osmosis``.
        redactor: Holds the values that must not appear in the file (the rollout's API key,
            configured secrets); every occurrence becomes ``[REDACTED]``, nothing else is
            altered. ``None``: the running rollout's (`RolloutContext.redactor`), if any.
        raise_storage_errors: Raise an `OSError` of the storage (disk full, read-only,
            permissions) instead of logging it, so the host can report the file as missing.
        durable: fsync the file and its directory, so that it survives a machine crash;
            ``False`` leaves the flush to the kernel (a process crash still loses nothing).

    Returns:
        The path written, or ``None`` when nothing was written (no sample, no
        trajectory messages, or an error).

    Raises:
        OSError: The file could not be stored, when ``raise_storage_errors``.
    """
    if sample is None:
        logger.info("rollout %r has no sample; no trajectory saved", rollout_id)
        return None
    if not sample.trajectory_messages:
        logger.info("rollout %r has no trajectory messages; no trajectory saved", rollout_id)
        return None
    try:
        ensure_single_path_segment(rollout_id, label="rollout_id")
        return await run_blocking(
            _convert_and_write,
            rollout_id,
            sample,
            request_label,
            request_metadata,
            request_extra_fields,
            report,
            artifact_root,
            _rollout_redactor(redactor).secrets,
            durable,
        )
    except OSError as exc:
        if raise_storage_errors:
            raise
        logger.warning("trajectory of rollout %r not saved: %s", rollout_id, _describe(exc))
        return None
    except Exception as exc:
        logger.warning("trajectory of rollout %r not saved: %s", rollout_id, _describe(exc))
        return None


def _encode_and_write(
    rollout_id: str,
    diagnostics: Mapping[str, Any],
    artifact_root: str | os.PathLike[str] | None,
    secrets: tuple[str, ...],
    durable: bool,
) -> Path:
    # default=str first, so objects are rendered as text the redaction rules then see.
    plain = json.loads(json.dumps(diagnostics, default=str))
    text = json.dumps(redact_value(plain, secrets=secrets), indent=2, sort_keys=True)
    data = (text + "\n").encode("utf-8")
    return _write(artifact_root, rollout_id, DIAGNOSTICS_FILENAME, data, durable)


async def save_diagnostics(
    *,
    rollout_id: str,
    diagnostics: Mapping[str, Any],
    artifact_root: str | os.PathLike[str] | None = None,
    redactor: Redactor | None = None,
    durable: bool = True,
) -> Path | None:
    """Write backend diagnostics to ``<artifact_root>/<rollout_id>/diagnostics.json``.

    The JSON is indented with sorted keys; values JSON cannot encode are written as
    ``str()``. Everything is redacted (credential keys, tokens, URL credentials and the
    redactor's secrets). Encoding and the atomic write run in a worker thread. Best-effort: a
    failure is logged as a warning and never raised.

    Args:
        rollout_id: The rollout; must be a single path segment.
        diagnostics: The diagnostics; an empty mapping writes nothing.
        artifact_root: Root directory; defaults as for `save_trajectory`.
        redactor: Holds the values that must not appear in the file; ``None``: the running
            rollout's (`RolloutContext.redactor`), if any.
        durable: As for `save_trajectory`.

    Returns:
        The path written, or ``None`` when nothing was written.
    """
    if not diagnostics:
        return None
    try:
        ensure_single_path_segment(rollout_id, label="rollout_id")
        # Copied on the loop so that later changes by the caller cannot race the encoding.
        snapshot = dict(diagnostics)
        return await run_blocking(
            _encode_and_write,
            rollout_id,
            snapshot,
            artifact_root,
            _rollout_redactor(redactor).secrets,
            durable,
        )
    except Exception as exc:
        logger.warning("diagnostics of rollout %r not saved: %s", rollout_id, _describe(exc))
        return None
