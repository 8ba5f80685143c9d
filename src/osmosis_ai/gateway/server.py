"""``Gateway``: a policy, its call records and the HTTP server, started and stopped together."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from osmosis_ai._serving import ServedApp, new_token
from osmosis_ai.gateway.app import create_gateway_app
from osmosis_ai.gateway.judge import Judge
from osmosis_ai.gateway.policies.base import Policy
from osmosis_ai.gateway.records import CallRecords
from osmosis_ai.gateway.request import check_sampling

__all__ = ["Gateway"]


class Gateway(ServedApp):
    """Runs the gateway for ``policy`` on ``host:port`` (port 0 picks a free one).

    Use it as an async context manager; inside, ``base_url`` is the gateway's address and
    ``chat_completions_url(rollout_id)`` the URL a rollout is given. The bearer ``token`` is
    random per gateway unless one is passed. ``sampling`` fields (e.g. ``{"temperature": 0}``)
    replace the callers' own on every call, as a trainer imposes its sampling on rollouts.
    A ``judge`` is served on each rollout's ``judge/chat/completions`` route, unrecorded.

    Example:
        ```python
        async with Gateway(EmbeddedPolicy()) as gateway:
            url = gateway.chat_completions_url("r1")  # .../v1/rollouts/r1
        ```
    """

    def __init__(
        self,
        policy: Policy,
        *,
        token: str | None = None,
        records: CallRecords | None = None,
        secrets: Iterable[str] = (),
        sampling: Mapping[str, Any] | None = None,
        judge: Judge | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.policy = policy
        self.token = token or new_token()
        self.records = records if records is not None else CallRecords()
        self.judge = judge
        app = create_gateway_app(
            policy,
            token=self.token,
            records=self.records,
            secrets=secrets,
            sampling=sampling,
            judge=judge,
        )
        super().__init__(app, host=host, port=port)

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling fields imposed on every call (empty: the callers' own)."""
        return dict(self.app.state.gateway.sampling)

    @sampling.setter
    def sampling(self, sampling: Mapping[str, Any]) -> None:
        # Calls already inside the policy keep the values they were parsed with; a trainer
        # switches between phases (training rollouts, greedy held-out evaluation).
        self.app.state.gateway.sampling = check_sampling(sampling)

    def impose_sampling(self, rollout_id: str, sampling: Mapping[str, Any]) -> None:
        """Impose ``sampling`` on the calls of ``rollout_id`` instead of `sampling`, until its
        records are released: a trainer's held-out rollouts sample greedily while training
        rollouts run beside them.

        Raises:
            ConfigError: An unknown or invalid sampling field.
        """
        self.app.state.gateway.rollout_sampling[rollout_id] = check_sampling(sampling)

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running gateway."""
        return self.served_url

    def chat_completions_url(self, rollout_id: str) -> str:
        """The OpenAI base URL of one rollout (clients append ``/chat/completions``)."""
        return f"{self.base_url}/v1/rollouts/{quote(rollout_id, safe='')}"

    def trajectory_report_url(self, rollout_id: str) -> str:
        """Where a rollout server fetches the rollout's per-call metrics (same bearer)."""
        return f"{self.chat_completions_url(rollout_id)}/trajectory-report"
