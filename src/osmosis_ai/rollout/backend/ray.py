"""``RayBackend``: run rollouts on executor actors of a Ray cluster.

Each executor actor hosts one event loop and runs up to ``actor_concurrency`` rollouts at
once with a `LocalBackend` inside it, under a `RolloutContext` rebuilt from the server's
(endpoint, key, id). The server-side backend admits by real capacity, sends each rollout
to the actor with the fewest in flight, forwards cancellation (``ray.cancel`` reaches the
actor's task), and brings the rollout's artifacts back to the server's artifact root.
An actor that dies fails only its rollouts, as ``internal_error`` naming its node, and is
replaced. Requires the ``ray`` extra.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any, Unpack

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.backend._once import StartOnce
from osmosis_ai.rollout.backend.base import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
)
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import RolloutContext, get_rollout_context
from osmosis_ai.rollout.spec import RolloutSpec, SpecKeywords, spec_argument
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.storage import default_artifact_root

__all__ = ["RayBackend"]

logger = logging.getLogger(__name__)

_PROBE_TIMEOUT_SEC = 5.0

# Marks a rollout directory whose artifacts stay on the node (over the bound).
_KEEP = ".osmosis-keep"

#: Default bound on the artifacts one rollout brings back from its node.
DEFAULT_MAX_ARTIFACT_BYTES = 64 * 1024 * 1024


def _ray() -> ModuleType:
    return import_optional("ray", extra="ray", feature="RayBackend")


@dataclass(frozen=True)
class _Spec:
    """What an executor actor needs to build its `LocalBackend`."""

    rollout: RolloutSpec
    max_artifact_bytes: int


@dataclass
class _Reply:
    outcome: ExecutionOutcome
    artifacts: dict[str, bytes] = field(default_factory=dict)
    left_at: str | None = None
    """Where the artifacts stayed on the node when they were over the bound."""


class _Executor:
    """The actor body (wrapped with ``ray.remote`` when the backend starts)."""

    def __init__(self, spec: _Spec) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="osmosis-ray-artifacts-"))
        self._spec = spec
        self._backend = LocalBackend(spec.rollout, artifact_root=self._root)

    def node(self) -> str:
        return str(_ray().get_runtime_context().get_node_id())

    async def execute(self, request: ExecutionRequest, url: str, key: str | None) -> _Reply:
        context = RolloutContext(chat_completions_url=url, api_key=key, rollout_id=request.id)
        try:
            with context:
                outcome = await self._backend.execute(request)
            return await asyncio.to_thread(self._collect, request.id, outcome)
        finally:
            # Whatever happened (cancelled too), nothing of the rollout stays on the node
            # unless _collect kept it on purpose.
            await asyncio.to_thread(self._discard, request.id)

    def _discard(self, rollout_id: str) -> None:
        directory = self._root / rollout_id
        if not (directory / _KEEP).exists():
            shutil.rmtree(directory, ignore_errors=True)

    def _collect(self, rollout_id: str, outcome: ExecutionOutcome) -> _Reply:
        """The rollout's artifacts as bytes; an unreadable file is reported, never fatal."""
        artifacts_dir = self._root / rollout_id / "artifacts"
        try:
            files = [p for p in sorted(artifacts_dir.rglob("*")) if p.is_file()]
            if sum(p.stat().st_size for p in files) > self._spec.max_artifact_bytes:
                (self._root / rollout_id / _KEEP).touch()
                return _Reply(outcome, left_at=str(artifacts_dir))
            artifacts = {p.relative_to(artifacts_dir).as_posix(): p.read_bytes() for p in files}
        except OSError as exc:
            _note(outcome, {"artifacts_error": f"reading artifacts failed ({type(exc).__name__})"})
            return _Reply(outcome)
        return _Reply(outcome, artifacts)


@dataclass
class _Slot:
    actor: Any
    node: str
    in_flight: int = 0


def _pickle_user_modules_by_value(ray: ModuleType, *objects: Any) -> None:
    # User code (a rollout directory, a test module) is not installed on the cluster's
    # workers; installed packages are, and stay pickled by reference.
    for obj in objects:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        path = getattr(module, "__file__", None) or ""
        if module is None or module.__name__ == "__main__" or "-packages" in path:
            continue
        ray.cloudpickle.register_pickle_by_value(module)


class RayBackend(ExecutionBackend):
    """Runs rollouts on ``num_actors`` Ray actors, each running many concurrently.

    Takes `LocalBackend`'s arguments (a `RolloutSpec`, or ``workflow=``... validated the
    same way, here, at construction) plus:

    Args:
        address: Ray cluster to join (``"auto"``, ``"ray://host:10001"``, a GCS address);
            ``None`` joins the one already initialised in this process or starts a local one.
        num_actors: Executor actors; each is replaced if it dies.
        actor_concurrency: Rollouts one actor runs at once.
        num_cpus_per_actor: CPUs Ray reserves for each actor.
        actor_resources: Custom Ray resources each actor needs (e.g. ``{"rollout_node": 1}``).
        runtime_env: Ray runtime environment for the actors (packages, env vars,
            working_dir); user modules not installed on the workers are shipped by value.
        max_artifact_bytes: Largest artifact total a rollout brings back to this server's
            artifact root; over it the files stay on their node, and the rollout's
            diagnostics say where.
        start_timeout_sec: How long the actors may take to start (be scheduled and
            answer); longer, and start fails with `ConfigError`.

    Ray is joined, and the actors started, on the first rollout (``start()`` does it
    earlier); an unreachable cluster then raises `ConfigError`.
    """

    def __init__(
        self,
        spec: RolloutSpec | None = None,
        *,
        artifact_root: Path | str | None = None,
        address: str | None = None,
        num_actors: int = 2,
        actor_concurrency: int = 64,
        num_cpus_per_actor: float = 1.0,
        actor_resources: dict[str, float] | None = None,
        runtime_env: dict[str, Any] | None = None,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        start_timeout_sec: float = 120.0,
        **refs: Unpack[SpecKeywords],
    ) -> None:
        if num_actors < 1 or actor_concurrency < 1:
            raise ConfigError("num_actors and actor_concurrency must be at least 1")
        self.spec = spec_argument(spec, require_workflow=True, **refs)
        self.artifact_root = (
            Path(artifact_root).expanduser() if artifact_root else default_artifact_root()
        )
        self.address = address
        self.num_actors = num_actors
        self.start_timeout_sec = start_timeout_sec
        self.actor_concurrency = actor_concurrency
        self._actor_options: dict[str, Any] = {
            "num_cpus": num_cpus_per_actor,
            "max_concurrency": actor_concurrency,
        }
        if actor_resources:
            self._actor_options["resources"] = dict(actor_resources)
        if runtime_env:
            self._actor_options["runtime_env"] = dict(runtime_env)
        self._spec = _Spec(self.spec, max_artifact_bytes)
        cap = self.spec.max_concurrent
        capacity = num_actors * actor_concurrency
        self._capacity = capacity if cap is None else min(capacity, cap)
        self._slots: list[_Slot] = []
        self._background: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._start_once = StartOnce(lambda: asyncio.to_thread(self._start_blocking))

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Join Ray and start the actors (once; concurrent callers share the start).

        Raises:
            ConfigError: The Ray cluster cannot be reached.
        """
        await self._start_once()

    def _start_blocking(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            _probe(self.address)
            try:
                ray.init(
                    address=self.address,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=True,
                )
            except Exception as exc:
                where = self.address or "a new local instance"
                raise ConfigError(
                    f"RayBackend cannot reach the Ray cluster at {where} "
                    f"({type(exc).__name__}: {exc}); start one with `ray start --head` and "
                    "pass its address (or address=None for a local instance)"
                ) from exc
        _pickle_user_modules_by_value(
            ray, self.spec.workflow, self.spec.grader, self.spec.workflow_config,
            self.spec.grader_config,
        )  # fmt: skip
        actors = [self._new_actor() for _ in range(self.num_actors)]
        try:
            nodes = ray.get(
                [actor.node.remote() for actor in actors], timeout=self.start_timeout_sec
            )
        except Exception as exc:
            for actor in actors:
                ray.kill(actor)
            raise ConfigError(
                f"RayBackend could not start {self.num_actors} executor actor(s) "
                f"({type(exc).__name__}); the cluster may lack the CPUs or resources asked "
                f"for ({self._actor_options.get('num_cpus')} CPU and "
                f"{self._actor_options.get('resources') or 'no custom resources'} each)"
            ) from exc
        self._slots = [_Slot(actor, str(node)) for actor, node in zip(actors, nodes, strict=True)]

    def _new_actor(self) -> Any:
        return _ray().remote(_Executor).options(**self._actor_options).remote(self._spec)

    async def shutdown(self) -> None:
        """Kill every executor actor."""
        if not self._slots:
            return
        ray = _ray()
        for slot in self._slots:
            ray.kill(slot.actor)
        self._slots = []
        self._start_once.reset()

    # -- ExecutionBackend ----------------------------------------------------------------

    def has_capacity(self) -> bool:
        """False when every actor slot (and the workflow's concurrency cap) is taken."""
        return self._in_flight < self._capacity

    def health(self) -> dict[str, Any]:
        """Capacity, in-flight rollouts and the actors with their nodes."""
        return {
            "status": "ok",
            "concurrency": {"max_concurrent": self._capacity, "running": self._in_flight},
            "ray": {
                "actors": [{"node": s.node, "in_flight": s.in_flight} for s in self._slots],
            },
        }

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the rollout on the least busy actor and bring back its artifacts."""
        await self.start()
        ambient = get_rollout_context()
        url = ambient.chat_completions_url if ambient else ""
        key = ambient.api_key if ambient else None
        slot = min(self._slots, key=lambda s: s.in_flight)
        slot.in_flight += 1
        self._in_flight += 1
        ray = _ray()
        ref = slot.actor.execute.remote(request, url, key)
        try:
            reply: _Reply = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # reaches the actor's asyncio task
            raise
        except ray.exceptions.RayActorError as exc:
            self._replace(slot)
            return _actor_failure(request, slot.node, exc)
        finally:
            slot.in_flight -= 1
            self._in_flight -= 1
        try:
            await asyncio.to_thread(self._store, request.id, reply.artifacts)
        except OSError as exc:  # artifacts never change a rollout's outcome
            _note(reply.outcome, {"artifacts_error": f"storing failed ({type(exc).__name__})"})
        if reply.left_at is not None:
            _note(
                reply.outcome,
                {"artifacts_left_on_node": slot.node, "artifacts_path": reply.left_at},
            )
            logger.warning(
                "rollout %s: artifacts over the bound stayed on node %s at %s",
                request.id, slot.node, reply.left_at,
            )  # fmt: skip
        return reply.outcome

    def _replace(self, dead: _Slot) -> None:
        if dead not in self._slots:
            return  # another rollout of the same actor already replaced it
        logger.warning("Ray executor actor on node %s died; starting a replacement", dead.node)
        replacement = _Slot(self._new_actor(), "starting")
        self._slots[self._slots.index(dead)] = replacement
        node_ref = replacement.actor.node.remote()

        async def learn_node() -> None:
            try:
                replacement.node = str(await node_ref)
            except Exception as exc:
                logger.warning("replacement Ray actor did not start: %s", type(exc).__name__)

        task = asyncio.get_running_loop().create_task(learn_node())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _store(self, rollout_id: str, artifacts: dict[str, bytes]) -> None:
        if not artifacts:
            return
        base = self.artifact_root / rollout_id / "artifacts"
        for relative, data in artifacts.items():
            parts = PurePosixPath(relative).parts
            if not parts or any(part in ("..", "") for part in parts) or relative.startswith("/"):
                logger.warning(
                    "rollout %s: artifact %r skipped (unsafe path)", rollout_id, relative
                )
                continue
            target = base.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def _probe(address: str | None) -> None:
    """Fail fast when a ``host:port`` address has no listener (Ray itself retries a minute)."""
    if not address or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port; let Ray interpret it
    try:
        socket.create_connection((host, int(port)), timeout=_PROBE_TIMEOUT_SEC).close()
    except OSError as exc:
        raise ConfigError(
            f"RayBackend cannot reach the Ray cluster at {address} ({exc.strerror or exc}); "
            "start one with `ray start --head` and pass its address (or address=None for a "
            "local instance)"
        ) from None


def _actor_failure(request: ExecutionRequest, node: str, exc: BaseException) -> ExecutionOutcome:
    message = (
        f"the Ray executor actor on node {node} died while running rollout {request.id} "
        f"({type(exc).__name__}); it was replaced, and other rollouts continue"
    )
    result = ExecutionResult(
        status=RolloutStatus.FAILURE,
        err_message=message,
        err_category=RolloutErrorCategory.INTERNAL_ERROR,
        extra_fields={"backend": "ray", "node": node, "exception_type": type(exc).__name__},
    )
    return ExecutionOutcome(workflow=result)


def _note(outcome: ExecutionOutcome, note: dict[str, Any]) -> None:
    """Add ``note`` to the rollout's diagnostics (``diagnostics.json``)."""
    result = outcome.result_to_save
    result.extra_fields = {**(result.extra_fields or {}), "backend": "ray", **note}
