"""``osmosis view`` and ``osmosis train run --view`` on the command line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx2

from tests.eval.conftest import OSMOSIS
from tests.viewer.conftest import ViewedTraining


def test_view_command_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [OSMOSIS, "view", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert result.returncode == 2 and "is not a directory" in result.stderr


def _view(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OSMOSIS, "view", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _view(str(tmp_path), "--port", str(port))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Errno" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"port {port}" in line and "--port" in line


def test_a_token_the_cookie_cannot_hold_is_refused(tmp_path: Path) -> None:
    result = _view(str(tmp_path), "--token", "short")
    assert result.returncode == 2 and "--token" in result.stderr
    assert "16 to 256" in result.stderr
    assert "Traceback" not in result.stderr


async def test_view_with_a_token_prints_the_link_once_and_refuses_without_it(
    finished_run_root: Path,
) -> None:
    token = "a-token-given-on-the-command-line"
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "view", str(finished_run_root), "--token", token,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        match = re.search(r"viewer: (http://\S+)/\?token=(\S+)", line)
        assert match and match.group(2) == token, line
        async with httpx2.AsyncClient(base_url=match.group(1), timeout=30) as client:
            assert (await client.get("/api/runs")).status_code == 401
            link = await client.get(f"/?token={token}")
            assert link.status_code == 303
            assert "samesite=strict" in link.headers["set-cookie"].lower()
            bearer = {"Authorization": f"Bearer {token}"}
            assert (await client.get("/api/runs", headers=bearer)).status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            out, err = await process.communicate()
    assert process.returncode == 0, err
    assert (line + out.decode() + err.decode()).count(token) == 1  # printed once


def test_train_run_with_view_serves_the_run_page_and_stays_up(
    viewed_training: ViewedTraining,
) -> None:
    output = viewed_training.output
    assert viewed_training.returncode == 0, output  # Ctrl-C ends the viewer, not a failure
    printed = re.search(r"viewer: http://127\.0\.0\.1:\d+/#/train/tiny\n", output)
    assert printed, output
    # The page's address first, the results table at the end, then the viewer stays up.
    table, stays = output.index("held-out results"), output.index("the viewer stays up")
    assert printed.start() < output.index("step 1: reward") < table < stays
    page = viewed_training.page
    assert page["status"] == "finished" and page["steps_done"] == page["steps_total"] == 3
    assert [line["step"] for line in page["metrics"]] == [1, 2, 3]
