"""Blocking calls on the shared worker threads: results, errors, batches, loops, fork, exit."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from osmosis_ai._offload import WORKERS, run_blocking


def _add(a: int, b: int, *, times: int = 1) -> int:
    return (a + b) * times


async def test_results_errors_and_keywords_come_back_from_another_thread() -> None:
    assert await run_blocking(_add, 2, 3, times=4) == 20
    assert await run_blocking(threading.get_ident) != threading.get_ident()
    with pytest.raises(FileNotFoundError):
        await run_blocking(os.stat, "/nonexistent/osmosis-offload")


async def test_a_thousand_concurrent_calls_all_complete_with_their_own_results() -> None:
    async with asyncio.timeout(30):
        results = await asyncio.gather(*(run_blocking(_add, n, 1) for n in range(1000)))
    assert results == [n + 1 for n in range(1000)]


async def test_a_slow_call_holds_one_worker_not_the_others() -> None:
    started = time.monotonic()
    slow = asyncio.ensure_future(run_blocking(time.sleep, 1.0))
    async with asyncio.timeout(30):
        quick = await asyncio.gather(*(run_blocking(_add, n, 0) for n in range(200)))
    quick_sec = time.monotonic() - started
    await slow
    assert quick == list(range(200)) and quick_sec < 0.9
    assert WORKERS > 1


async def test_a_cancelled_caller_stops_waiting_but_its_call_still_runs() -> None:
    ran = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        ran.set()

    waiter = asyncio.ensure_future(run_blocking(slow))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await run_blocking(ran.wait, 5)  # the next call still works, after the slow one ran


def test_a_finished_loop_is_not_kept_alive() -> None:
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(run_blocking(_add, 1, 2)) == 3
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None


def test_loops_in_several_threads_each_get_their_own_results() -> None:
    outcomes: dict[int, list[int]] = {}

    def run_loop(offset: int) -> None:
        async def main() -> list[int]:
            return list(await asyncio.gather(*(run_blocking(_add, n, offset) for n in range(300))))

        outcomes[offset] = asyncio.run(main())

    threads = [threading.Thread(target=run_loop, args=(k * 1000,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == {k * 1000: [n + k * 1000 for n in range(300)] for k in range(3)}


def test_a_forked_child_starts_its_own_workers() -> None:
    asyncio.run(run_blocking(_add, 1, 1))  # the parent's workers exist before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's threads are gone
        try:
            value = asyncio.run(asyncio.wait_for(run_blocking(_add, 20, 1, times=2), 10))
            os.write(write_end, str(value).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.read(read_end, 16) == b"42"
    os.close(read_end)


def test_interpreter_exit_waits_for_a_call_already_running(tmp_path: Path) -> None:
    # A cancelled save must still land before the process ends, as with asyncio.to_thread.
    path = tmp_path / "written"
    code = (
        "import asyncio, time, pathlib\n"
        "from osmosis_ai._offload import run_blocking\n"
        "def write():\n"
        "    time.sleep(0.5)\n"
        f"    pathlib.Path({str(path)!r}).write_text('done')\n"
        "async def main():\n"
        "    task = asyncio.ensure_future(run_blocking(write))\n"
        "    await asyncio.sleep(0.1)\n"
        "    task.cancel()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert path.read_text() == "done"
