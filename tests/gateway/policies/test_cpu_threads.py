import os

import pytest

from osmosis_ai.gateway.policies._cpu_threads import default_threads, usable_cores
from osmosis_ai.gateway.policies.embedded import EmbeddedPolicy
from osmosis_ai.gateway.policies.hf_dir import import_torch_stack


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("4,2", 4), (" 2 ", 2)])
def test_the_embedded_models_threads_follow_omp_num_threads(
    monkeypatch: pytest.MonkeyPatch, value: str, threads: int
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == threads
    assert EmbeddedPolicy().n_threads == threads
    assert EmbeddedPolicy(n_threads=5).n_threads == 5  # an explicit count wins


@pytest.mark.parametrize("value", [None, "", "0", "many"])
def test_without_a_usable_omp_num_threads_it_leaves_one_core_for_the_runs_own_work(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert usable_cores() == len(os.sched_getaffinity(0))
    assert default_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    assert EmbeddedPolicy().n_threads == default_threads()


def test_one_core_still_gets_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert default_threads() == 1


@pytest.mark.parametrize("omp", [None, "3"])
def test_torch_computes_on_the_default_threads_unless_omp_num_threads_is_set(
    monkeypatch: pytest.MonkeyPatch, omp: str | None
) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(7)
    try:
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        import_torch_stack("a test")
        # Unset, it follows the default; set, torch read it when it was imported and we
        # leave its pool alone.
        assert torch.get_num_threads() == (default_threads() if omp is None else 7)
    finally:
        torch.set_num_threads(before)
