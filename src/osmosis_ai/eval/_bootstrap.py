"""Child-process entry of a server: ``python -m osmosis_ai.eval._bootstrap main.py`` (a
rollout server's entry point) or ``python .../_bootstrap.py -m module ...`` (a module, such as
vLLM's server, under an interpreter that may not have this package: it needs only the
standard library).

It makes the child follow its runner: on Linux the kernel sends it SIGTERM when the runner
dies (even by ``kill -9``), so a crashed ``osmosis eval run`` or ``osmosis train run`` never
leaves an orphaned server behind. Then it runs the entry point or module as ``__main__``.
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
    if sys.argv[1] == "-m":
        module = sys.argv[2]
        _follow_parent()
        # Run as a file, this directory leads sys.path: its modules (datasets.py,
        # config.py, ...) would shadow the packages of the same name the module imports.
        if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
            del sys.path[0]
        sys.argv = [module, *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    entrypoint = os.path.abspath(sys.argv[1])
    _follow_parent()
    sys.argv = [entrypoint, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(entrypoint))
    runpy.run_path(entrypoint, run_name="__main__")


if __name__ == "__main__":
    main()
