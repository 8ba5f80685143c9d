"""``osmosis train run`` whose every update is first timed on copies, unshared and shared.

Run by ``prefix.py`` as ``python _update_ab.py train run CONFIG [flags]``. Before each real
update, the step's very sequences are trained ``PREFIX_BENCH_REPEATS`` times on a copy of the
model and optimiser with ``share_prefix`` off and on, alternating; each pair's seconds and
the tokens computed are appended to ``PREFIX_BENCH_OUT`` (one JSON line per step). The real
update then runs as configured, so the run goes on as it would.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import osmosis_ai.train.algorithm.update as update
from osmosis_ai.cli import main

_REAL = update.train_step
_OUT = Path(os.environ["PREFIX_BENCH_OUT"])
_REPEATS = int(os.environ.get("PREFIX_BENCH_REPEATS", "3"))


def _timed(model: Any, optimizer: Any, sequences: Any, settings: Any, **options: Any) -> Any:
    pairs: list[dict[str, float | int]] = []
    for _ in range(_REPEATS):
        pair: dict[str, float | int] = {}
        for share in (False, True):
            # One deepcopy of both keeps the optimiser's state on the copy's parameters.
            twin, twin_optimizer = copy.deepcopy((model, optimizer))
            reference = options.get("reference_model")
            chosen = dataclasses.replace(settings, share_prefix=share)
            started = time.perf_counter()
            metrics = _REAL(
                twin, twin_optimizer, sequences, chosen,
                step=options["step"], grammars=options.get("grammars"),
                advantages=options.get("advantages"),
                reference_model=twin if reference is model else reference,
            )  # fmt: skip
            key = "shared" if share else "unshared"
            pair[f"{key}_sec"] = time.perf_counter() - started
            pair[f"{key}_computed"] = metrics.computed_tokens
            pair["tokens"] = metrics.tokens
            del twin, twin_optimizer
        pairs.append(pair)
    with _OUT.open("a") as out:
        out.write(json.dumps({"step": options["step"], "pairs": pairs}) + "\n")
    return _REAL(model, optimizer, sequences, settings, **options)


# The learner imports it from its module at each update.
update.train_step = _timed  # type: ignore[assignment]

if __name__ == "__main__":
    sys.argv = ["osmosis", *sys.argv[1:]]
    main()
