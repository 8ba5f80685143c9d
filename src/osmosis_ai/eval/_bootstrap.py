"""Child-process entry of a rollout server: ``python -m osmosis_ai.eval._bootstrap main.py``.

It makes the child follow its runner: on Linux the kernel sends it SIGTERM when the runner
dies (even by ``kill -9``), so a crashed ``osmosis eval run`` never leaves an orphaned
server behind. Then it runs the user's entry point as ``__main__``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import runpy
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _follow_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the runner died before the request took effect
        sys.exit(1)


def main() -> None:
    entrypoint = os.path.abspath(sys.argv[1])
    _follow_parent()
    sys.argv = [entrypoint, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(entrypoint))
    runpy.run_path(entrypoint, run_name="__main__")


if __name__ == "__main__":
    main()
