"""Experiment trackers (``[tracking] report_to``): TensorBoard, W&B, MLflow and Trackio.

Every metrics line and every held-out evaluation is logged against its step; the run's
settings are logged as its parameters. Where each tracker writes and who may read it come
from the tracker's own environment variables (``WANDB_MODE``, ``WANDB_PROJECT``,
``WANDB_API_KEY``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``TRACKIO_DIR``...):
no credential is read from the config or written to the run directory. The run directory
keeps ``trackers.json`` (the W&B and MLflow run ids, so that a resumed run continues the same
tracker run) and, for TensorBoard, ``tensorboard/``.

A tracker that fails to start stops the run before its first step (`TrackerError`); one that
fails later is reported once and dropped: ``metrics.jsonl`` stays the run's record.

Every call blocks (files, SQLite, the trackers' own services): the runner calls them in a
worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import OsmosisError

__all__ = [
    "TRACKERS",
    "TrackedRun",
    "TrackerError",
    "Trackers",
    "check_trackers",
    "flat_params",
    "open_trackers",
    "scalars",
]

#: The ``report_to`` choices, and the module each one needs (all in the ``track`` extra).
TRACKERS: dict[str, str] = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}
#: The project (W&B, Trackio) or experiment (MLflow) a run is logged under by default.
DEFAULT_PROJECT = "osmosis"
_IDS_FILE = "trackers.json"
_log = logging.getLogger(__name__)


class TrackerError(OsmosisError):
    """A tracker of ``report_to`` could not start; the message names it and the fix."""


@dataclass(frozen=True)
class TrackedRun:
    """What the trackers are told about the run."""

    run_dir: Path
    name: str
    params: Mapping[str, Any]
    """The run's settings (nested tables allowed): the trackers' config or parameters."""
    resumed_after: int = 0
    """The checkpoint step a resumed run starts after (0: a run from its start). Later steps
    run again, and are logged again."""
    mlflow_default_uri: str = ""
    """The MLflow store when ``MLFLOW_TRACKING_URI`` is not set."""


class _Tracker(Protocol):
    def log(self, values: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(line: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics line (nested tables as ``outer/inner``), without ``step``.

    ``None`` (a value the step did not have), text and booleans are left out.
    """
    values: dict[str, float] = {}
    for key, value in line.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            values.update(scalars(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and name != "step":
            values[name] = float(value)
    return values


def flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``params`` as ``outer.inner -> text`` (MLflow's parameters, TensorBoard's text)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


def check_trackers(names: tuple[str, ...], feature: str) -> None:
    """Import each tracker's module, so a missing one stops the run before anything starts.

    Raises:
        MissingExtraError: One is not installed; the message names the ``track`` extra.
    """
    for name in names:
        import_optional(TRACKERS[name], extra="track", feature=feature)


class Trackers:
    """The run's trackers: each value goes to all of them."""

    def __init__(self, trackers: Mapping[str, _Tracker], say: Callable[[str], None]) -> None:
        self._trackers = dict(trackers)
        self._say = say

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._trackers)

    def log(self, values: Mapping[str, float], step: int) -> None:
        """Log ``values`` at ``step``; a tracker that fails is reported once and dropped."""
        for name, tracker in list(self._trackers.items()):
            try:
                tracker.log(values, step)
            except Exception as exc:  # a tracker's own failure must not stop training
                del self._trackers[name]
                self._say(
                    f"report_to {name}: logging failed ({type(exc).__name__}: {exc}); it gets "
                    "nothing more from this run (metrics.jsonl has every step)"
                )
                _quietly(tracker.close)

    def close(self) -> None:
        for tracker in self._trackers.values():
            _quietly(tracker.close)
        self._trackers.clear()


def _quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:  # closing a tracker that already failed: nothing more to report
        _log.debug("closing a tracker failed", exc_info=True)


def open_trackers(names: tuple[str, ...], run: TrackedRun, say: Callable[[str], None]) -> Trackers:
    """Start the trackers ``names`` for ``run`` (continuing their runs when it resumes).

    Raises:
        TrackerError: One could not start (the ones already started are closed).
        MissingExtraError: One is not installed.
    """
    opened: dict[str, _Tracker] = {}
    try:
        for name in names:
            module = import_optional(TRACKERS[name], extra="track", feature=f"report_to {name}")
            try:
                opened[name] = _OPENERS[name](module, run)
            except Exception as exc:
                why = f"report_to {name}: could not start ({exc}); {_FIX[name]}"
                raise TrackerError(why) from None
    except BaseException:
        Trackers(opened, say).close()
        raise
    return Trackers(opened, say)


_FIX = {
    "tensorboard": "check that the run directory is writable",
    "wandb": "log in (wandb login, or WANDB_API_KEY), or set WANDB_MODE=offline to log locally",
    "mlflow": "check MLFLOW_TRACKING_URI (a tracking server's URL, or sqlite:///path/mlflow.db)",
    "trackio": "check TRACKIO_DIR (where Trackio keeps its runs)",
}


class _Ids:
    """``trackers.json``: the trackers' own run ids, kept so that a resume continues them."""

    def __init__(self, run_dir: Path) -> None:
        self._path = run_dir / _IDS_FILE

    def get(self, name: str) -> str | None:
        try:
            value = json.loads(self._path.read_text(encoding="utf-8")).get(name)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def set(self, name: str, value: str) -> None:
        try:
            ids = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            ids = {}
        ids[name] = value
        temp = self._path.with_name(f".{_IDS_FILE}.tmp")
        temp.write_text(json.dumps(ids, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(temp, self._path)


class _TensorBoard:
    def __init__(self, module: Any, run: TrackedRun) -> None:
        del module  # torch's writer, which the train extra installs, writes tensorboard's files
        from torch.utils.tensorboard import SummaryWriter

        # A resume drops the events of the steps it runs again (TensorBoard's purge_step).
        purge = run.resumed_after + 1 if run.resumed_after else None
        self._writer = SummaryWriter(str(run.run_dir / "tensorboard"), purge_step=purge)
        rows = "".join(f"| {k} | {v} |\n" for k, v in flat_params(run.params).items())
        text = f"| setting | value |\n|---|---|\n{rows}"
        self._writer.add_text("config", text, run.resumed_after)
        self._writer.flush()

    def log(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


#: W&B's x axis: W&B accepts no step twice, and a resume runs steps again.
_WANDB_STEP = "train/step"


class _Wandb:
    def __init__(self, module: Any, run: TrackedRun) -> None:
        ids = _Ids(run.run_dir)
        run_id = ids.get("wandb") or secrets.token_hex(8)
        self._run = module.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=run.name,
            id=run_id,
            resume="allow",
            dir=str(run.run_dir),
            config=dict(run.params),
            reinit="create_new",
        )
        self._run.config.update(dict(run.params), allow_val_change=True)
        self._run.define_metric(_WANDB_STEP)
        self._run.define_metric("*", step_metric=_WANDB_STEP)
        ids.set("wandb", run_id)

    def log(self, values: Mapping[str, float], step: int) -> None:
        self._run.log({**values, _WANDB_STEP: step})

    def close(self) -> None:
        self._run.finish()


class _Mlflow:
    def __init__(self, module: Any, run: TrackedRun) -> None:
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI") or run.mlflow_default_uri or None
        self._client = client = module.MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        ids = _Ids(run.run_dir)
        run_id = ids.get("mlflow")
        if run_id:
            client.update_run(run_id, status="RUNNING")
            known = client.get_run(run_id).data.params
        else:
            run_id = client.create_run(experiment_id, run_name=run.name).info.run_id
            known = {}
            ids.set("mlflow", run_id)
        self._run_id = run_id
        # MLflow's parameters cannot change: a resume adds the ones it did not have.
        params = [
            Param(key, value[:6000])
            for key, value in flat_params(run.params).items()
            if key not in known
        ]
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])

    def log(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class _Trackio:
    def __init__(self, module: Any, run: TrackedRun) -> None:
        self._module = module
        self._run = module.init(
            project=DEFAULT_PROJECT,
            name=run.name,
            config=dict(run.params),
            resume="allow",
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


_OPENERS: dict[str, Callable[[Any, TrackedRun], _Tracker]] = {
    "tensorboard": _TensorBoard,
    "wandb": _Wandb,
    "mlflow": _Mlflow,
    "trackio": _Trackio,
}
