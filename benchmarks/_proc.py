"""A process's CPU time and resident memory, read from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "rss_mb"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The process's resident memory now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} reports no VmRSS")
