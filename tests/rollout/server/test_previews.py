"""Live previews through a real rollout server: files, HTTP, cadence, opt-out, status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout import LocalBackend, RolloutStatus
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.trajectory.preview import PREVIEW_ROOT_ENV
from tests.rollout.server.conftest import PROMPT, ServeFactory
from tests.rollout.server.workflows import SOURCES, Answer, ExactMatch, Talking

INTERVAL = 0.05
CANARY_KEY = "sk-rollout-canary-93c1"


@pytest.fixture
def preview_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "previews"
    monkeypatch.setenv(PREVIEW_ROOT_ENV, str(root))
    return root


def _backend(workflow: Any = Talking) -> LocalBackend:
    return LocalBackend(workflow=workflow, grader=ExactMatch)


async def _run(server: Any, rollout_id: str, **metadata: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Run one rollout, collecting every distinct preview seen over HTTP while it runs."""
    handle = await server.client.run_rollout(
        PROMPT,
        "http://127.0.0.1:9/v1",
        rollout_id,
        llm_api_key=CANARY_KEY,
        label="x",
        metadata=metadata,
    )
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while not handle.done():
            preview = await handle.preview()
            if preview is not None and (not seen or preview != seen[-1]):
                seen.append(preview)
            await asyncio.sleep(INTERVAL / 2)
        result = await handle
        final = await handle.preview()
    if final is not None and (not seen or final != seen[-1]):
        seen.append(final)
    return result, seen


def _versions(previews: list[dict[str, Any]]) -> list[int]:
    return [p["extra"]["osmosis"]["preview_version"] for p in previews]


@pytest.mark.parametrize("revision", [True, False])
async def test_previews_follow_the_conversation_and_skip_unchanged_looks(
    serve: ServeFactory, preview_root: Path, revision: bool
) -> None:
    async with serve(_backend(), previews=True, preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, f"grow-{revision}", turns=3, pause=0.3, revision=revision)
    assert result.status is RolloutStatus.SUCCESS
    assert seen, "no preview was published"
    versions = _versions(seen)
    assert versions == sorted(set(versions))  # every publication is new
    # ~25 looks over the rollout, but only content and status changes are published:
    # the prompt, three turns, and the statuses (running, grading, success) at most.
    assert versions[-1] <= 7
    final = seen[-1]
    assert final["extra"]["osmosis"]["status"] == "success"
    assert final["steps"][-1]["message"].startswith("turn 2")
    on_disk = json.loads((preview_root / f"grow-{revision}" / "preview.json").read_text())
    assert on_disk == final
    source = SOURCES[f"grow-{revision}"]
    if revision:  # the source's revision spared get_preview on unchanged looks
        assert source.preview_calls <= 4
    else:
        assert source.preview_calls > 8


async def test_rollout_key_and_credentials_never_reach_a_preview(
    serve: ServeFactory, preview_root: Path
) -> None:
    async with serve(_backend(), previews=True, preview_interval_sec=INTERVAL) as server:
        _, seen = await _run(server, "leaky", turns=2, pause=0.2, say=f"key {CANARY_KEY} token=abc")
    assert seen
    text = json.dumps(seen) + (preview_root / "leaky" / "preview.json").read_text()
    assert CANARY_KEY not in text and "token=abc" not in text
    assert "[REDACTED]" in text


async def test_opting_out_before_the_first_await_publishes_nothing(
    serve: ServeFactory, preview_root: Path
) -> None:
    async with serve(_backend(), previews=True, preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, "private", turns=3, pause=0.2, opt_out="before")
    assert result.status is RolloutStatus.SUCCESS
    assert seen == []
    assert not (preview_root / "private").exists()


async def test_opting_out_later_keeps_the_captured_preview_but_adds_nothing(
    serve: ServeFactory, preview_root: Path
) -> None:
    async with serve(_backend(), previews=True, preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, "later", turns=3, pause=0.3, opt_out="after")
    assert result.status is RolloutStatus.SUCCESS
    final = seen[-1]
    messages = [step.get("message") for step in final["steps"]]
    assert any(str(m).startswith("turn 0") for m in messages)
    assert not any(str(m).startswith("turn 2") for m in messages)
    assert final["extra"]["osmosis"]["status"] == "success"  # status still stamped


async def test_explicit_return_workflows_have_no_preview(
    serve: ServeFactory, preview_root: Path
) -> None:
    async with serve(_backend(Answer), previews=True, preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, "explicit", delay=0.3)
    assert result.status is RolloutStatus.SUCCESS
    assert seen == [] and not (preview_root / "explicit").exists()


async def test_failed_rollout_is_stamped_failure(serve: ServeFactory, preview_root: Path) -> None:
    class Failing(Talking):
        async def run(self, ctx: Any) -> None:
            await super().run(ctx)
            raise ValueError("broke after talking")

    async with serve(_backend(Failing), previews=True, preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, "failing", turns=2, pause=0.2)
    assert result.status is RolloutStatus.FAILURE
    assert seen[-1]["extra"]["osmosis"]["status"] == "failure"
    statuses = [p["extra"]["osmosis"]["status"] for p in seen]
    assert statuses[0] == "running"


async def test_previews_are_off_without_a_root_or_the_flag(serve: ServeFactory) -> None:
    async with serve(_backend(), preview_interval_sec=INTERVAL) as server:
        result, seen = await _run(server, "off", turns=2, pause=0.2)
    assert result.status is RolloutStatus.SUCCESS and seen == []


async def test_http_only_previews_need_no_root(serve: ServeFactory, tmp_path: Path) -> None:
    async with serve(_backend(), previews="on", preview_interval_sec=INTERVAL) as server:
        _, seen = await _run(server, "http-only", turns=2, pause=0.2)
    assert seen and seen[-1]["extra"]["osmosis"]["status"] == "success"


async def test_preview_endpoint_requires_the_lease(serve: ServeFactory, preview_root: Path) -> None:
    async with serve(_backend(), previews=True, preview_interval_sec=INTERVAL) as server:
        admitted = await server.admit("leased", metadata={"turns": 1, "pause": 0.1})
        lease = admitted.json()["polling_lease_token"]
        missing = await server.http.get("/rollout/leased/preview")
        wrong = await server.http.get(
            "/rollout/leased/preview", headers={"X-Osmosis-Rollout-Lease": "nope"}
        )
        unknown = await server.http.get(
            "/rollout/nobody/preview", headers={"X-Osmosis-Rollout-Lease": lease}
        )
        posted = await server.http.post(
            "/rollout/leased/preview", headers={"X-Osmosis-Rollout-Lease": lease}
        )
        async with asyncio.timeout(10):
            while (
                await server.http.get(
                    "/rollout/leased/result", headers={"X-Osmosis-Rollout-Lease": lease}
                )
            ).json()["status"] not in ("success", "failure"):
                pass
    assert (missing.status_code, wrong.status_code, unknown.status_code) == (422, 403, 404)
    assert posted.status_code == 405


#: previews= -> (previews on?, writing files?) without and with a preview root.
CHOICES: list[tuple[Any, tuple[bool, bool], tuple[bool, bool]]] = [
    ("auto", (False, False), (True, True)),
    ("on", (True, False), (True, True)),
    ("off", (False, False), (False, False)),
    (None, (False, False), (True, True)),  # the older spellings
    (True, (True, False), (True, True)),
    (False, (False, False), (False, False)),
]


@pytest.mark.parametrize(("previews", "without_root", "with_root"), CHOICES)
def test_preview_choice_decides_http_and_files(
    previews: Any,
    without_root: tuple[bool, bool],
    with_root: tuple[bool, bool],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hub_of() -> tuple[bool, bool]:
        app = create_rollout_server(backend=_backend(), previews=previews, configure_logging=False)
        hub = app.state.rollout.preview_hub
        return hub is not None, hub is not None and hub.directory is not None

    assert hub_of() == without_root
    monkeypatch.setenv(PREVIEW_ROOT_ENV, str(tmp_path / "previews"))
    assert hub_of() == with_root


@pytest.mark.parametrize("previews", ["http", "ON", 1, ""])
def test_unknown_preview_choice_names_the_choices(previews: Any) -> None:
    with pytest.raises(ValueError, match=r"previews must be 'auto', 'on' or 'off', got "):
        create_rollout_server(backend=_backend(), previews=previews, configure_logging=False)
