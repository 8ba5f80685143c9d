"""The contexts a workflow and a grader receive, and the ambient rollout context."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from osmosis_ai._context_exit import UnconditionalExit
from osmosis_ai._secret_registry import registered_redactor
from osmosis_ai.errors import ConfigError
from osmosis_ai.rollout.config import AgentWorkflowConfig
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import TERMINAL_STATUSES, RolloutStatus

if TYPE_CHECKING:
    from osmosis_ai.redact import Redactor
    from osmosis_ai.rollout.model_pool import ModelConnectionPool

__all__ = [
    "AgentWorkflowContext",
    "GraderContext",
    "RolloutContext",
    "RolloutProgress",
    "SampleSource",
    "current_redactor",
    "get_rollout_context",
]

#: Environment variables a rollout context falls back to (custom container runners).
ENV_CHAT_COMPLETIONS_URL = "OSMOSIS_CHAT_COMPLETIONS_URL"
ENV_API_KEY = "OSMOSIS_API_KEY"
ENV_ROLLOUT_ID = "OSMOSIS_ROLLOUT_ID"

TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig, default=AgentWorkflowConfig)

logger = logging.getLogger(__name__)

#: How long the cleanups of one rollout may take together before the rest are skipped.
CLEANUP_TIMEOUT_SEC = 10.0

_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar(
    "osmosis_rollout_context", default=None
)


def get_rollout_context() -> RolloutContext | None:
    """The ``RolloutContext`` of the rollout running in this task, or ``None``."""
    return _current.get()


def current_redactor() -> Redactor:
    """The running rollout's redactor; outside a rollout, the process's registered secrets."""
    context = _current.get()
    return context.redactor if context is not None else registered_redactor()


class SampleSource(ABC):
    """Something that can produce the rollout's sample after ``run()`` returns ``None``.

    Agent integrations register one on the active ``RolloutContext``; a custom source is
    registered with ``get_rollout_context().set_sample_source(source)``. Each rollout accepts
    exactly one source.
    """

    @abstractmethod
    async def get_sample(self) -> RolloutSample:
        """Return the final sample of the rollout."""

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """Return a bounded, isolated snapshot of recent history for live previews.

        The default publishes no preview. Implementations return a copy holding at most
        ``max_messages`` recent messages (``None`` when ``max_messages <= 0``), must not call
        ``get_sample()`` and must not mutate the history that graders read.
        """
        return None

    def preview_revision(self) -> Hashable | None:
        """A cheap value that changes whenever ``get_preview`` would return something new.

        The preview collector skips ``get_preview`` (and its copying) while this stays
        equal. ``None``, the default, means unknown: ``get_preview`` is asked every time.
        """
        return None


class RolloutProgress:
    """The observable status of one rollout: ``queued`` → ``running`` → ``grading`` → terminal.

    No-op changes and any change after a terminal status are ignored, so a late report
    cannot resurrect a finished rollout. Waiting costs one future per waiter and nothing
    otherwise: a server holds one of these per in-flight rollout.
    """

    __slots__ = ("_status", "_waiters")

    def __init__(self, status: RolloutStatus = RolloutStatus.QUEUED) -> None:
        self._status = status
        self._waiters: list[asyncio.Future[None]] | None = None

    @property
    def status(self) -> RolloutStatus:
        """The current status."""
        return self._status

    @property
    def terminal(self) -> bool:
        """Whether the status is final."""
        return self._status in TERMINAL_STATUSES

    def set_status(self, status: RolloutStatus) -> bool:
        """Move to ``status`` and wake every waiter; returns whether anything changed."""
        if status == self._status or self.terminal:
            return False
        self._status = status
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            _wake(waiter)
        return True

    async def wait_for_change(self, max_wait_sec: float) -> RolloutStatus:
        """Wait up to ``max_wait_sec`` seconds for a status change; return the status then."""
        if self.terminal:
            return self._status
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        timer = loop.call_later(max_wait_sec, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return self._status


async def _run_all(pending: list[Callable[[], Awaitable[object]]]) -> None:
    try:
        async with asyncio.timeout(CLEANUP_TIMEOUT_SEC):
            while pending:
                try:
                    await pending.pop()()
                except Exception as exc:
                    # The type only: a message could quote a URL or a credential.
                    logger.warning("a rollout cleanup failed (%s)", type(exc).__name__)
    except TimeoutError:
        logger.warning(
            "rollout cleanups took over %.0f s; %d skipped", CLEANUP_TIMEOUT_SEC, len(pending)
        )


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(eq=False, slots=True)
class RolloutContext(UnconditionalExit):
    """The ambient state of one rollout, installed by the execution backend.

    It carries the rollout-scoped model endpoint every LLM call must use, and the one
    ``SampleSource`` that produces the sample when ``run()`` returns ``None``. Use it as a
    context manager; on exit the previously active context is restored, so nesting works.
    Empty fields fall back to ``OSMOSIS_CHAT_COMPLETIONS_URL``, ``OSMOSIS_API_KEY`` and
    ``OSMOSIS_ROLLOUT_ID``.
    """

    chat_completions_url: str = ""
    """OpenAI-compatible base URL of this rollout; clients append ``/chat/completions``."""

    api_key: str | None = field(default=None, repr=False)
    """Bearer token for the model endpoint. Never logged or shown in ``repr``."""

    rollout_id: str = ""
    """Id of the rollout."""

    sample_source: SampleSource | None = None
    """The registered sample source, if any."""

    progress: RolloutProgress | None = field(default=None, repr=False)
    """Status observer installed by a rollout server."""

    preview_path: Path | None = None
    """Where the live-preview collector writes snapshots, when previews are on."""

    preview_enabled: bool = True
    """Set to ``False`` at the start of ``run()`` to keep this rollout out of live previews."""

    redactor: Redactor = field(default_factory=registered_redactor, repr=False)
    """The one redactor of this rollout: the host's secrets (a server's configured ones, by
    default the process's registered ones) plus ``api_key``, which is always added. Logs,
    previews, trajectories, diagnostics and error messages of the rollout all use it."""

    model_pool: ModelConnectionPool | None = field(default=None, repr=False)
    """Connections to the model endpoint that the host's rollouts share (a rollout server
    keeps one pool for all of them); integration clients send through it instead of opening
    a connection per rollout. ``None``: each client opens and closes its own."""

    _tokens: list[contextvars.Token[RolloutContext | None]] = field(
        default_factory=list, init=False, repr=False
    )
    _cleanups: list[Callable[[], Awaitable[object]]] = field(
        default_factory=list, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.chat_completions_url = self.chat_completions_url or os.environ.get(
            ENV_CHAT_COMPLETIONS_URL, ""
        )
        self.api_key = self.api_key or os.environ.get(ENV_API_KEY) or None
        self.rollout_id = self.rollout_id or os.environ.get(ENV_ROLLOUT_ID, "")
        if self.api_key:
            self.redactor = self.redactor.with_secrets(self.api_key)

    def __enter__(self) -> RolloutContext:
        self._tokens.append(_current.set(self))
        return self

    def _exit(self) -> None:
        _current.reset(self._tokens.pop())

    def set_sample_source(self, source: SampleSource) -> None:
        """Register the rollout's sample source.

        Raises:
            ConfigError: A source is already registered; each rollout has exactly one.
        """
        if self.sample_source is not None and self.sample_source is not source:
            raise ConfigError(
                f"rollout {self.rollout_id or '<unnamed>'} already has a sample source "
                f"({type(self.sample_source).__name__}); each rollout produces one sample, so "
                "construct one Osmosis agent or session per run() call"
            )
        self.sample_source = source

    async def get_sample(self) -> RolloutSample | None:
        """The registered source's sample, or ``None`` when no source is registered."""
        if self.sample_source is None:
            return None
        return await self.sample_source.get_sample()

    def add_cleanup(self, cleanup: Callable[[], Awaitable[object]]) -> None:
        """Have ``await cleanup()`` run when the rollout's workflow phase ends.

        Integrations use this to close the model client they opened for the rollout. The
        backend runs cleanups after the sample has been taken and again after grading,
        newest first, whether the phase succeeded, failed or was cancelled.
        """
        self._cleanups.append(cleanup)

    async def run_cleanups(self) -> None:
        """Run and forget the registered cleanups, newest first.

        A failing cleanup is logged and the rest still run; none of them can fail the
        rollout. Together they get ``CLEANUP_TIMEOUT_SEC``; a cancellation arriving
        meanwhile does not stop them (clients still get closed), it is raised afterwards.
        """
        pending, self._cleanups = self._cleanups, []
        if pending:
            await asyncio.shield(asyncio.ensure_future(_run_all(pending)))

    def set_status(self, status: RolloutStatus) -> None:
        """Report ``running`` or ``grading`` to the server observing this rollout, if any.

        Raises:
            ConfigError: ``status`` is terminal; the server publishes terminal statuses
                together with the result, so pollers never see one without it.
        """
        if status in TERMINAL_STATUSES:
            raise ConfigError(
                f"set_status({status.value!r}): terminal statuses are published by the "
                "rollout server with the result; return from run() instead"
            )
        if self.progress is not None:
            self.progress.set_status(status)


@dataclass(slots=True)
class AgentWorkflowContext(Generic[TConfig]):
    """What ``AgentWorkflow.run()`` receives for one dataset row.

    The row's label (ground truth) is deliberately absent: only the grader sees it.
    """

    # list[Any], not list[JSONObject]: lists are invariant, and agent frameworks type their
    # message parameters as lists of TypedDicts, which should accept ctx.prompt as it is.
    prompt: list[Any]
    """Input messages of the dataset row (OpenAI chat-shaped dicts)."""

    config: TConfig | None = None
    """The workflow config instance (a private deep copy), if one was provided."""

    metadata: dict[str, Any] | None = None
    """Per-row metadata; ``None`` when the row has none."""

    artifacts_dir: Path | None = None
    """Per-rollout directory for files; ``None`` when none could be provisioned."""


@dataclass(slots=True)
class GraderContext:
    """What ``Grader.grade()`` receives: the workflow's sample and the row's label.

    Every field defaults to ``None``, so a grader's unit test can build one from what it
    needs: ``GraderContext(sample=RolloutSample(messages=[...]), label="42")``.
    """

    label: str | None = None
    """Ground truth of the dataset row, if any."""

    sample: RolloutSample | None = None
    """The sample the workflow produced; the grader rewards it with ``set_reward``."""

    metadata: dict[str, Any] | None = None
    """Per-row metadata, the same object the workflow saw."""

    artifacts_dir: Path | None = None
    """The rollout's artifacts directory, shared with the workflow; may be ``None``."""

    def set_reward(self, reward: float) -> None:
        """Set the sample's reward.

        Raises:
            ConfigError: There is no sample to reward (a ``ValueError``, as in the reference
                SDK). A backend never grades without a sample, so this means the context
                was built by hand without one.
            pydantic.ValidationError: ``reward`` is not a finite number.
        """
        if self.sample is None:
            raise ConfigError(
                "GraderContext has no sample to reward: build it with "
                "sample=RolloutSample(messages=[...])"
            )
        self.sample.reward = reward

    def set_turn_reward(self, turn: int, reward: float) -> None:
        """Reward one turn of the sample: its model call ``turn`` (0-based; in a
        chat-completions history, the ``turn + 1``-th assistant message). The sample's
        ``reward`` stays the outcome; see ``RolloutSample.turn_rewards``.

        Raises:
            ConfigError: There is no sample (as `set_reward`).
            pydantic.ValidationError: ``turn`` is not an integer of at least 0, or ``reward``
                is not a finite number.
        """
        if self.sample is None:
            raise ConfigError(
                "GraderContext has no sample to reward: build it with "
                "sample=RolloutSample(messages=[...])"
            )
        self.sample.turn_rewards = {**self.sample.turn_rewards, turn: reward}
