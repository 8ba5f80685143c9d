"""``osmosis gateway``: run the model gateway on its own."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import typer

from osmosis_ai.cli._asyncio import run, wait_for_stop_signal
from osmosis_ai.cli._logging import configure_logging
from osmosis_ai.cli._options import upstream_timeout_option
from osmosis_ai.cli._output import bind_failure, error_exit

__all__ = ["gateway_command"]


def gateway_command(
    policy: str = typer.Option(
        "embedded",
        "--policy",
        help="embedded | openai:<base_url>[:<model>] | litellm:<provider/model> | torch:<dir>",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(0, "--port", help="Port to bind; 0 picks a free one."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="OSMOSIS_GATEWAY_TOKEN",
        help="Bearer token callers must send; random when omitted.",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="OSMOSIS_POLICY_API_KEY",
        help="Key for the upstream policy (openai/litellm).",
    ),
    sampling: list[str] = typer.Option(
        [],
        "--sampling",
        help="KEY=VALUE imposed on every call, e.g. temperature=0.7 (repeatable; JSON values).",
    ),
    upstream_timeout: float | None = upstream_timeout_option(),
) -> None:
    """Serve rollout-scoped chat completions until interrupted, printing the URL and token."""
    configure_logging()
    imposed = _sampling(sampling)
    with contextlib.suppress(KeyboardInterrupt):
        run(_serve(policy, host, port, token, api_key, imposed, upstream_timeout))


def _sampling(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict; a value is JSON when it parses (``0.7``, ``[".."]``)."""
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.gateway.request import check_sampling

    sampling: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--sampling")
        try:
            sampling[key] = json.loads(raw)
        except ValueError:
            sampling[key] = raw
    try:
        return check_sampling(sampling)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--sampling") from exc


async def _serve(
    spec: str,
    host: str,
    port: int,
    token: str | None,
    api_key: str | None,
    sampling: dict[str, Any],
    upstream_timeout: float | None,
) -> None:
    from osmosis_ai.errors import OsmosisError
    from osmosis_ai.gateway import Gateway, build_policy

    try:
        policy = build_policy(spec, api_key=api_key, timeout_sec=upstream_timeout)
    except OsmosisError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from exc
    gateway = Gateway(policy, token=token, host=host, port=port, sampling=sampling)
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(gateway)
        except OSError as exc:
            raise error_exit(bind_failure(host, port, exc)) from None

        def announce() -> None:
            typer.echo(
                f"gateway:  {gateway.base_url}  (policy {policy.kind}, model {policy.model})"
            )
            typer.echo(f"token:    {gateway.token}")
            typer.echo(f"rollout:  {gateway.base_url}/v1/rollouts/<rollout_id>/chat/completions")

        await wait_for_stop_signal(on_ready=announce)
