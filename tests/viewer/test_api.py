"""The viewer's JSON API over a real finished run, served by a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from osmosis_ai.errors import ConfigError
from osmosis_ai.viewer import Viewer
from tests.viewer.conftest import ARTIFACT_TEXT, FAILURE, copy_run

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(finished_run_root: Path) -> AsyncIterator[httpx2.AsyncClient]:
    async with (
        Viewer(finished_run_root) as viewer,
        httpx2.AsyncClient(base_url=viewer.served_url, timeout=30) as client,
    ):
        yield client


async def _items(http: httpx2.AsyncClient) -> list[dict[str, Any]]:
    response = await http.get("/api/runs/finished/items")
    assert response.status_code == 200
    return list(response.json())


async def test_runs_overview_and_items(http: httpx2.AsyncClient) -> None:
    (run,) = (await http.get("/api/runs")).json()
    assert run["name"] == "finished" and run["status"] == "finished"
    assert run["total_samples"] == 3 and run["rollout"] == "chatty"
    overview = (await http.get("/api/runs/finished")).json()
    assert overview["pass_at_k"] and overview["pass_at_k"][0]["k"] == 1
    assert overview["summary"]["failed"] == 1
    items = await _items(http)
    assert [(i["row_index"], i["status"]) for i in items] == [
        (0, "success"),
        (1, "failed"),
        (2, "success"),
    ]


async def test_failed_rollout_shows_its_error(http: httpx2.AsyncClient) -> None:
    failed = next(i for i in await _items(http) if i["status"] == "failed")
    detail = (await http.get(f"/api/runs/finished/rollouts/{failed['rollout_id']}")).json()
    assert detail["diagnostics"]["exception_type"] == "RuntimeError"
    assert FAILURE in detail["diagnostics"]["traceback"]


async def test_trajectory_artifacts_and_download(http: httpx2.AsyncClient) -> None:
    first = (await _items(http))[0]
    detail = (await http.get(f"/api/runs/finished/rollouts/{first['rollout_id']}")).json()
    sources = [step["source"] for step in detail["trajectory"]["steps"]]
    assert sources == ["user", "agent", "agent"]
    assert detail["artifacts"] == [{"path": "notes.txt", "size": len(ARTIFACT_TEXT)}]
    download = await http.get(
        f"/api/runs/finished/rollouts/{first['rollout_id']}/artifacts/notes.txt"
    )
    assert download.status_code == 200 and download.text == ARTIFACT_TEXT
    assert download.headers["content-disposition"].startswith("attachment")
    assert download.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path",
    [
        "..%2F..%2Fmanifest.json",
        "..%2F..%2F..%2Fmanifest.json",
        "%2Fetc%2Fpasswd",
        "a%2F..%2F..%2Fdiagnostics.json",
        "%2E%2E%2Fdiagnostics.json",
    ],
)
async def test_paths_outside_the_artifacts_are_refused(http: httpx2.AsyncClient, path: str) -> None:
    first = (await _items(http))[0]
    response = await http.get(f"/api/runs/finished/rollouts/{first['rollout_id']}/artifacts/{path}")
    assert response.status_code == 404
    assert "local_run_id" not in response.text and "root:" not in response.text


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/nope",
        "/api/runs/..%2F..",
        "/api/runs/finished/rollouts/..%2Fmanifest.json",
        "/api/runs/finished/rollouts/not-a-rollout",
    ],
)
async def test_unknown_or_crafted_names_are_not_found(http: httpx2.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 404


async def test_page_and_assets_are_served_with_a_strict_policy(http: httpx2.AsyncClient) -> None:
    page = await http.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert (await http.get("/static/app.js")).status_code == 200


async def test_finished_runs_have_no_live_previews(http: httpx2.AsyncClient) -> None:
    assert (await http.get("/api/runs/finished/previews")).json() == []


async def test_other_host_names_are_refused(http: httpx2.AsyncClient) -> None:
    rebound = await http.get("/api/runs", headers={"Host": "evil.example"})
    assert rebound.status_code == 421
    local = await http.get("/api/runs", headers={"Host": "localhost:1234"})
    assert local.status_code == 200


async def test_symlinks_out_of_a_rollout_are_not_followed(
    http: httpx2.AsyncClient, finished_run_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "id_rsa").write_text("private")
    first = (await _items(http))[0]
    trial = finished_run_root / "finished" / "rollout_trials" / first["rollout_id"]
    (trial / "artifacts" / "escape").symlink_to(outside)
    try:
        listed = (await http.get(f"/api/runs/finished/rollouts/{first['rollout_id']}")).json()
        served = await http.get(
            f"/api/runs/finished/rollouts/{first['rollout_id']}/artifacts/escape/id_rsa"
        )
    finally:
        (trial / "artifacts" / "escape").unlink()
    assert [a["path"] for a in listed["artifacts"]] == ["notes.txt"]
    assert served.status_code == 404 and "private" not in served.text


async def test_a_damaged_run_is_flagged_and_the_others_still_listed(damaged_root: Path) -> None:
    async with Viewer(damaged_root) as viewer, httpx2.AsyncClient(base_url=viewer.served_url) as c:
        listed = await c.get("/api/runs")
        assert listed.status_code == 200
        runs = {run["name"]: run for run in listed.json()}
        assert runs["finished"]["status"] == "finished" and "problem" not in runs["finished"]
        assert runs["bad-journal"]["status"] == "broken"
        assert "events.jsonl" in runs["bad-journal"]["problem"]
        assert "line 4" in runs["bad-journal"]["problem"]
        assert runs["bad-manifest"]["status"] == "broken"
        assert "manifest.json" in runs["bad-manifest"]["problem"]
        assert runs["bad-metrics"]["status"] == "broken"
        assert "metrics.json" in runs["bad-metrics"]["problem"]
        overview = await c.get("/api/runs/bad-journal")
        assert overview.status_code == 200
        assert overview.json()["status"] == "broken"
        assert overview.json()["problem"] == runs["bad-journal"]["problem"]
        items = await c.get("/api/runs/bad-journal/items")
        assert items.status_code == 409
        assert items.json()["detail"] == runs["bad-journal"]["problem"]


async def test_a_live_run_has_its_summary_from_the_journal(
    http: httpx2.AsyncClient, finished_run_root: Path, tmp_path: Path
) -> None:
    finished = (await http.get("/api/runs/finished")).json()["summary"]
    run_dir = copy_run(finished_run_root / "finished", tmp_path / "evals", live=True)
    async with (
        Viewer(run_dir.parent) as viewer,
        httpx2.AsyncClient(base_url=viewer.served_url) as c,
    ):
        (listed,) = (await c.get("/api/runs")).json()
        overview = (await c.get("/api/runs/finished")).json()
    assert overview["status"] == "running"
    assert overview["summary"]["pass_rate"] == finished["pass_rate"]
    assert overview["summary"]["reward_stats"] == finished["reward_stats"]
    assert overview["summary"]["tokens_used"] == finished["tokens_used"] > 0
    assert listed["pass_rate"] == finished["pass_rate"]
    assert listed["mean_reward"] == finished["reward_stats"]["mean"]


# ---- a token off loopback -------------------------------------------------------------------

TOKEN = "a-test-token-of-the-viewer-0123456789"


@pytest_asyncio.fixture(loop_scope="module")
async def guarded(finished_run_root: Path) -> AsyncIterator[Viewer]:
    async with Viewer(finished_run_root, token=TOKEN) as viewer:
        yield viewer


async def test_without_the_token_everything_is_refused(guarded: Viewer) -> None:
    async with httpx2.AsyncClient(base_url=guarded.served_url) as client:
        first = (await _items_of(client, headers={"Authorization": f"Bearer {TOKEN}"}))[0]
        for path in (
            "/api/runs",
            "/api/runs/finished",
            f"/api/runs/finished/rollouts/{first['rollout_id']}/artifacts/notes.txt",
            "/static/app.js",
        ):
            refused = await client.get(path)
            assert refused.status_code == 401, path
            assert "token" in refused.json()["detail"]
            assert ARTIFACT_TEXT not in refused.text
        page = await client.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
        assert "?token=" in page.text and TOKEN not in page.text
        wrong = await client.get("/api/runs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await client.get("/?token=nope")).status_code == 401


async def _items_of(client: httpx2.AsyncClient, **kwargs: Any) -> list[dict[str, Any]]:
    response = await client.get("/api/runs/finished/items", **kwargs)
    assert response.status_code == 200, response.text
    return list(response.json())


async def test_the_token_link_sets_a_strict_cookie_for_the_pages_fetches(guarded: Viewer) -> None:
    assert guarded.url.endswith(f"/?token={TOKEN}")
    async with httpx2.AsyncClient(base_url=guarded.served_url) as client:
        link = await client.get(f"/?token={TOKEN}&x=1")
        assert link.status_code == 303
        assert link.headers["location"] == "/?x=1"  # the token leaves the address bar
        cookie = link.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert "Path=/" in cookie
        assert (await client.get("/")).status_code == 200  # the client kept the cookie
        first = (await _items_of(client))[0]
        artifact = await client.get(
            f"/api/runs/finished/rollouts/{first['rollout_id']}/artifacts/notes.txt"
        )
        assert artifact.status_code == 200 and artifact.text == ARTIFACT_TEXT


@pytest.mark.parametrize("path", [b"//evil.example/x", b"/\\evil.example/x"])
async def test_a_crafted_path_in_the_token_link_stays_on_the_viewer(
    guarded: Viewer, path: bytes
) -> None:
    async with httpx2.AsyncClient(base_url=guarded.served_url) as client:
        request = client.build_request("GET", "/")
        request.url = request.url.copy_with(raw_path=path + f"?token={TOKEN}".encode())
        link = await client.send(request)
    assert link.status_code == 303
    assert link.headers["location"] == "/evil.example/x"


async def test_off_loopback_a_token_is_generated_and_required(finished_run_root: Path) -> None:
    exposed = Viewer(finished_run_root, host="0.0.0.0")
    other = Viewer(finished_run_root, host="0.0.0.0")
    assert exposed.token and other.token and exposed.token != other.token
    assert len(exposed.token) >= 32
    assert Viewer(finished_run_root, host="192.168.7.7").token
    for local in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert Viewer(finished_run_root, host=local).token is None
    # In process: a test binds nothing but 127.0.0.1.
    transport = httpx2.ASGITransport(app=exposed.app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://h") as client:
        refused = await client.get("/api/runs")
        allowed = await client.get(
            "/api/runs", headers={"Authorization": f"Bearer {exposed.token}"}
        )
    assert (refused.status_code, allowed.status_code) == (401, 200)


@pytest.mark.parametrize("token", ["short", "has space in it 0123456789", "semi;colon0123456789"])
async def test_a_token_that_cannot_be_a_cookie_is_refused(
    finished_run_root: Path, token: str
) -> None:
    with pytest.raises(ConfigError, match="token"):
        Viewer(finished_run_root, token=token)
