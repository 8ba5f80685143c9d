import os

import pytest

from osmosis_ai.gateway.policies._llama import default_threads
from osmosis_ai.gateway.policies.embedded import EmbeddedPolicy


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("4,2", 4), (" 2 ", 2)])
def test_the_embedded_models_threads_follow_omp_num_threads(
    monkeypatch: pytest.MonkeyPatch, value: str, threads: int
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == threads
    assert EmbeddedPolicy().n_threads == threads
    assert EmbeddedPolicy(n_threads=5).n_threads == 5  # an explicit count wins


@pytest.mark.parametrize("value", [None, "", "0", "many"])
def test_without_a_usable_omp_num_threads_it_takes_the_cores_it_may_run_on(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == len(os.sched_getaffinity(0))
