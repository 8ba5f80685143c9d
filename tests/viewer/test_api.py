"""The viewer's JSON API over a real finished run, served by a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from osmosis_ai.viewer import Viewer
from tests.viewer.conftest import ARTIFACT_TEXT, FAILURE

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(finished_run_root: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        Viewer(finished_run_root) as viewer,
        httpx.AsyncClient(base_url=viewer.served_url, timeout=30) as client,
    ):
        yield client


async def _items(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await http.get("/api/runs/finished/items")
    assert response.status_code == 200
    return list(response.json())


async def test_runs_overview_and_items(http: httpx.AsyncClient) -> None:
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


async def test_failed_rollout_shows_its_error(http: httpx.AsyncClient) -> None:
    failed = next(i for i in await _items(http) if i["status"] == "failed")
    detail = (await http.get(f"/api/runs/finished/rollouts/{failed['rollout_id']}")).json()
    assert detail["diagnostics"]["exception_type"] == "RuntimeError"
    assert FAILURE in detail["diagnostics"]["traceback"]


async def test_trajectory_artifacts_and_download(http: httpx.AsyncClient) -> None:
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
async def test_paths_outside_the_artifacts_are_refused(http: httpx.AsyncClient, path: str) -> None:
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
async def test_unknown_or_crafted_names_are_not_found(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 404


async def test_page_and_assets_are_served_with_a_strict_policy(http: httpx.AsyncClient) -> None:
    page = await http.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert (await http.get("/static/app.js")).status_code == 200


async def test_finished_runs_have_no_live_previews(http: httpx.AsyncClient) -> None:
    assert (await http.get("/api/runs/finished/previews")).json() == []


async def test_other_host_names_are_refused(http: httpx.AsyncClient) -> None:
    rebound = await http.get("/api/runs", headers={"Host": "evil.example"})
    assert rebound.status_code == 421
    local = await http.get("/api/runs", headers={"Host": "localhost:1234"})
    assert local.status_code == 200


async def test_symlinks_out_of_a_rollout_are_not_followed(
    http: httpx.AsyncClient, finished_run_root: Path, tmp_path_factory: pytest.TempPathFactory
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
