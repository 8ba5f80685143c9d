"""What a training step's metrics make the run say."""

from __future__ import annotations

from osmosis_ai.train.loop.step import FlatStepsHint


def test_most_groups_all_equal_three_steps_in_a_row_is_said_once() -> None:
    hint = FlatStepsHint(groups=4, resample=0)
    flat, mixed = {"zero_gradient_groups": 3}, {"zero_gradient_groups": 2}  # 2 of 4: not most
    assert [hint.after(m) for m in (flat, flat, mixed, flat, flat)] == [None] * 5
    said = hint.after(flat)
    assert said is not None and "3 steps in a row" in said
    assert "set [algorithm] resample_zero_gradient = 2" in said
    assert [hint.after(flat) for _ in range(5)] == [None] * 5  # once per run
    already = FlatStepsHint(groups=4, resample=2)
    assert [already.after(flat) for _ in range(2)] == [None, None]
    expected = "raise [algorithm] resample_zero_gradient (now 2) or [training] group_size"
    assert expected in (already.after(flat) or "")


def test_the_step_reads_top_down_in_a_page() -> None:
    """``run_step`` stays a page (its phases live in ``batch.py``, the learner and
    ``report.py``): past 80 lines, fold a phase into its own function."""
    import inspect

    from osmosis_ai.train.loop.step import run_step

    assert len(inspect.getsource(run_step).splitlines()) <= 80
