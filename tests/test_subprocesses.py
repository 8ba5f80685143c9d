import asyncio
import sys

import pytest

from tests.subprocesses import communicate_within


async def test_a_child_past_its_limit_is_killed_and_reaped() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    with pytest.raises(TimeoutError):
        await communicate_within(process, 2)
    assert process.returncode is not None and process.returncode < 0  # killed, and reaped


async def test_a_child_within_its_limit_gives_its_output() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert await communicate_within(process, 30) == (b"out\n", b"err\n")
