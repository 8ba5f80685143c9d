"""A process's CPU time and resident memory, read from ``/proc`` (Linux), and processes that
keep the cores busy while a figure is measured beside them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["busy_processes", "cpu_seconds", "kernel_cpu_seconds", "rss_mb"]


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that spin on the CPU for as long as the block runs."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def _cpu_ticks(pid: int) -> tuple[int, int]:
    """(user, system) clock ticks the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    return sum(_cpu_ticks(pid)) / os.sysconf("SC_CLK_TCK")


def kernel_cpu_seconds(pid: int) -> float:
    """The system (kernel) part of `cpu_seconds`: system calls, the filesystem, sockets."""
    return _cpu_ticks(pid)[1] / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The process's resident memory now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} reports no VmRSS")
