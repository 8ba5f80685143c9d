"""Per-call metrics reported from outside the sample (e.g. by a model gateway), and their merge."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from osmosis_ai.rollout.sample import JSONObject
from osmosis_ai.rollout.trajectory.atif import FinalMetrics, Metrics

__all__ = ["LlmCallMetrics", "ReportMerge", "SampleReport", "TrajectoryReport", "apply_report"]

logger = logging.getLogger(__name__)

#: Raw JSON value, validated only when it is merged.
RawJSON = Any

# Per-step metric -> trajectory total.
_TOTALS = (
    ("prompt_tokens", "total_prompt_tokens"),
    ("completion_tokens", "total_completion_tokens"),
    ("cached_tokens", "total_cached_tokens"),
    ("cost_usd", "total_cost_usd"),
)
_EXPLICIT_TOTAL_KEYS = frozenset(total for _, total in _TOTALS) | {"extra"}


class _ReportModel(BaseModel):
    # Reports come from other programs and versions: tolerate keys we do not know.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, use_attribute_docstrings=True)


class LlmCallMetrics(Metrics):
    """Usage and token-level data of one LLM call: ATIF ``Metrics`` plus the serving model.

    Unlike ATIF documents, reports come from other programs: unknown keys are ignored.
    """

    model_config = ConfigDict(extra="ignore")

    model_name: str | None = None
    """Model that served the call; overrides the step's model name."""


class SampleReport(_ReportModel):
    """Per-call metrics and optional totals for the one sample of a rollout."""

    model_name: str | None = None
    """Model of the sample; becomes the document's ``agent.model_name``."""

    llm_call_metrics: list[LlmCallMetrics] = Field(default_factory=list)
    """One entry per LLM call, in call order (one per agent step)."""

    final_metrics: RawJSON = None
    """Explicit totals (ATIF ``FinalMetrics`` fields); win over summed per-call totals."""


class TrajectoryReport(_ReportModel):
    """Metrics about a rollout's LLM calls, gathered outside the sample.

    The one entry of ``samples`` is applied whatever its key; with several entries none
    is applied (they are kept under ``extra.osmosis.unmatched_sample_reports``).
    """

    model_name: str | None = None
    """Default model name when the sample entry names none."""

    samples: dict[str, SampleReport] = Field(default_factory=dict)
    """Sample reports by an arbitrary key; exactly one is expected."""


@dataclass(frozen=True)
class ReportMerge:
    """What applying a report (or none) adds to a trajectory besides step metrics."""

    model_name: str | None
    """``agent.model_name`` of the document."""

    final_metrics: JSONObject
    """The document's ``final_metrics``, with ``total_steps`` set."""

    unmatched: JSONObject
    """Report parts that could not be applied, for ``extra.osmosis``."""


def _dump(model: BaseModel) -> JSONObject:
    return model.model_dump(mode="json", exclude_none=True)


def _lay_call_metrics(steps: list[JSONObject], entries: list[LlmCallMetrics]) -> bool:
    agent_steps = [step for step in steps if step["source"] == "agent"]
    if len(agent_steps) != len(entries):
        return False
    for step, entry in zip(agent_steps, entries, strict=True):
        fields = entry.model_dump(exclude_none=True)
        model_name = fields.pop("model_name", None)
        extra = fields.pop("extra", None)
        metrics = dict(step.get("metrics") or {})
        metrics.update(fields)
        if extra:
            metrics["extra"] = {**(metrics.get("extra") or {}), **extra}
        if metrics:
            step["metrics"] = metrics
        if model_name is not None:
            step["model_name"] = model_name
        step["llm_call_count"] = 1
    return True


def _explicit_totals(raw: object) -> JSONObject:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        known = {key: value for key, value in raw.items() if key in _EXPLICIT_TOTAL_KEYS}
        try:
            return _dump(FinalMetrics.model_validate(known))
        except ValidationError:
            pass
    logger.warning(
        "trajectory report final_metrics is malformed; using totals summed over the steps"
    )
    return {}


def _summed_totals(steps: list[JSONObject]) -> JSONObject:
    totals: JSONObject = {}
    for field, total in _TOTALS:
        values = [
            metrics[field]
            for step in steps
            if (metrics := step.get("metrics")) and metrics.get(field) is not None
        ]
        if values:
            totals[total] = sum(values)
    return totals


def apply_report(
    steps: list[JSONObject],
    report: TrajectoryReport | None,
    *,
    default_model_name: str | None = None,
) -> ReportMerge:
    """Merge ``report`` into the ATIF step dicts ``steps`` (in place) and compute totals.

    Per-call entries are laid onto agent steps in order only when their counts are equal;
    report fields win over inline ones, field by field, and each such step gets
    ``llm_call_count = 1``. Explicit report totals win over summed per-step totals, field
    by field; ``total_steps`` is always ``len(steps)``.

    Args:
        steps: ATIF step dicts built from the sample's messages.
        report: The trajectory report, if any.
        default_model_name: ``agent.model_name`` when the report names no model.

    Returns:
        The agent model name, final metrics and unapplied report parts.
    """
    unmatched: JSONObject = {}
    sample_report: SampleReport | None = None
    if report is not None and len(report.samples) == 1:
        (sample_report,) = report.samples.values()
    elif report is not None and report.samples:
        logger.warning(
            "trajectory report has %d sample entries (expected one); none applied",
            len(report.samples),
        )
        unmatched["unmatched_sample_reports"] = {
            key: _dump(entry) for key, entry in report.samples.items()
        }

    explicit: JSONObject = {}
    if sample_report is not None:
        entries = sample_report.llm_call_metrics
        if entries and not _lay_call_metrics(steps, entries):
            logger.warning(
                "trajectory report has %d llm_call_metrics for %d agent steps; none applied",
                len(entries),
                sum(1 for step in steps if step["source"] == "agent"),
            )
            unmatched["unmatched_llm_call_metrics"] = [_dump(entry) for entry in entries]
        explicit = _explicit_totals(sample_report.final_metrics)

    final_metrics = {**_summed_totals(steps), **explicit, "total_steps": len(steps)}
    model_name = (
        (sample_report.model_name if sample_report is not None else None)
        or (report.model_name if report is not None else None)
        or default_model_name
    )
    return ReportMerge(model_name=model_name, final_metrics=final_metrics, unmatched=unmatched)
