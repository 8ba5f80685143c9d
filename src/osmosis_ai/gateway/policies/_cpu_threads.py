"""How many CPU threads the embedded model and torch compute on when the user says nothing.

llama.cpp's threads (and torch's OpenMP team) wait for each other at every operation by
spinning, so a run with as many threads as cores stalls whenever one of them is descheduled:
beside one busy process on 2 cores, ``make demo`` took 2.6 times as long as idle on 2 threads
and 1.09 times on 1 (docs/gateway.md). A run also needs a core for its own Python work (the
gateway, the workflow, the grader), so by default it leaves one core free.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["default_threads", "usable_cores", "use_default_torch_threads"]


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, which a container or ``taskset``
    narrows (``os.cpu_count`` does not)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on macOS or Windows
        return os.cpu_count() or 1


def _omp_num_threads() -> int | None:
    """``OMP_NUM_THREADS``'s first level when it is a positive integer."""
    first_level = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first_level) if first_level.isdigit() and int(first_level) > 0 else None


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is set (the convention torch and numpy follow), else one
    fewer than the usable cores, and at least one."""
    return _omp_num_threads() or max(1, usable_cores() - 1)


def use_default_torch_threads(torch: ModuleType) -> None:
    """Give torch's intra-op pool `default_threads` threads, unless ``OMP_NUM_THREADS`` is
    set (torch reads it itself). Process-wide; threads started later take the count too."""
    if _omp_num_threads() is None:
        torch.set_num_threads(default_threads())
