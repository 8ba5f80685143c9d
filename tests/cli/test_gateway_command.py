"""``osmosis gateway`` as a real child process in front of a real stub upstream."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx2

from osmosis_ai._serving import bind_socket
from osmosis_ai.testing import ChatStub

OSMOSIS = str(Path(sys.executable).with_name("osmosis"))


async def test_gateway_command_prints_url_and_token_serves_and_stops_on_sigterm() -> None:
    async with ChatStub() as stub:
        process = await asyncio.create_subprocess_exec(
            OSMOSIS,
            "gateway",
            "--policy",
            f"openai:{stub.base_url}:served-model",
            "--port",
            "0",
            "--sampling",
            "temperature=0",
            "--sampling",
            'stop=["END"]',
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            lines: dict[str, str] = {}
            async with asyncio.timeout(30):
                while "token" not in lines:
                    key, _, value = (await process.stdout.readline()).decode().partition(":")
                    lines[key.strip()] = value.strip()
            base_url = lines["gateway"].split()[0]
            headers = {"Authorization": f"Bearer {lines['token']}"}
            async with httpx2.AsyncClient(base_url=base_url, headers=headers) as http:
                response = await http.post(
                    "/v1/rollouts/r1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}]},
                )
            assert response.status_code == 200
            sent = stub.requests[-1]["body"]
            assert sent["model"] == "served-model"
            assert sent["temperature"] == 0 and sent["stop"] == ["END"]
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                code = await process.wait()
    assert code == 0


async def test_unknown_policy_is_a_usage_error() -> None:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "gateway", "--policy", "nonsense", stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"not recognised" in stderr


async def test_bad_sampling_is_a_usage_error() -> None:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "gateway", "--sampling", "stream=true", stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"sampling cannot set stream" in stderr


async def test_port_in_use_is_one_line_naming_the_port() -> None:
    taken = bind_socket()
    port = taken.getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            OSMOSIS, "gateway", "--port", str(port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(60):
            _, stderr = await process.communicate()
    finally:
        taken.close()
    assert process.returncode == 2, stderr
    text = stderr.decode()
    assert "Traceback" not in text
    (line,) = [line for line in text.splitlines() if line.startswith("error:")]
    assert f"port {port} on 127.0.0.1 is in use" in line and "--port" in line


async def test_upstream_timeout_flag_bounds_each_upstream_call() -> None:
    async with ChatStub(delay_sec=5) as stub:
        process = await asyncio.create_subprocess_exec(
            OSMOSIS, "gateway", "--policy", f"openai:{stub.base_url}:m",
            "--upstream-timeout", "0.5",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            lines: dict[str, str] = {}
            async with asyncio.timeout(30):
                while "token" not in lines:
                    line = await process.stdout.readline()
                    assert line, "the gateway exited before printing its token"
                    key, _, value = line.decode().partition(":")
                    lines[key.strip()] = value.strip()
            headers = {"Authorization": f"Bearer {lines['token']}"}
            async with httpx2.AsyncClient(
                base_url=lines["gateway"].split()[0], headers=headers, timeout=4
            ) as http:
                response = await http.post(
                    "/v1/rollouts/r1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}]},
                )
            assert response.status_code == 504 and "timed out" in response.text
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await process.wait()


async def test_non_positive_upstream_timeout_is_a_usage_error() -> None:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, "gateway", "--upstream-timeout", "0", stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"--upstream-timeout" in stderr and b"must be positive" in stderr
