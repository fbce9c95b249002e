"""Gate 3's goals (issue 39), checked on what a book reproduction run records."""

import pytest

from hf_recurrence.experiments.memory_gate3 import early_share, gate3_goals


def comparison(relative: float, low: float, high: float) -> dict:
    return {"relative_difference": relative, "low": low, "high": high}


def report(carried: dict, lost: float | None = 0.8, versus_overlap: float | None = -0.01, late_gap: float = 0.01):
    """A run's record: the control 0.2 nats worse than the recurrent arm at positions 0-3, `late_gap` at 4-31."""
    recurrent = [3.0] * 32
    control = [3.2] * 4 + [3.0 + late_gap] * 28
    comparisons = {"recurrent vs control": carried}
    if versus_overlap is not None:
        comparisons["recurrent vs baseline@T/8"] = comparison(versus_overlap, versus_overlap - 0.01, 0.0)
    run = {"comparisons": comparisons, "nll_by_window_position": {"recurrent@0": recurrent, "control@0": control}}
    return run if lost is None else {**run, "carried_gain_lost_when_shuffled": lost}


def test_every_goal_passes_on_a_gain_that_is_large_specific_early_and_beats_the_overlap():
    lines = gate3_goals(report(comparison(-0.03, -0.04, -0.01)))
    assert [line.split()[0] for line in lines] == ["PASS"] * 4
    assert lines[0].endswith("-3.00% [-4.00%, -1.00%]") and lines[1].endswith("80% given back")
    assert lines[2].endswith("85% of it there")  # 0.8 + 12 x 0.01 of 0.8 + 28 x 0.01 nats


@pytest.mark.parametrize(
    ("carried", "lost", "failing"),
    [
        (comparison(-0.03, -0.05, -0.004), 0.8, "carried context"),  # upper bound above -0.5%
        (comparison(-0.01, -0.02, -0.006), 0.8, "carried context"),  # too small
        (comparison(-0.03, -0.04, -0.01), 0.5, "another document's memory"),  # not specific enough
    ],
)
def test_a_goal_missed_fails_by_name(carried, lost, failing):
    lines = gate3_goals(report(carried, lost))
    assert [line for line in lines if line.startswith("FAIL")] == [
        line for line in lines if line.startswith(f"FAIL {failing}")
    ]
    assert any(line.startswith(f"FAIL {failing}") for line in lines)


def test_no_gain_fails_the_goals_that_need_one_and_missing_reads_are_not_run():
    lines = gate3_goals(report(comparison(0.01, 0.0, 0.02), lost=None, versus_overlap=None, late_gap=-0.1))
    assert lines[0].startswith("FAIL carried context")
    assert lines[1].startswith("NOT RUN another document's memory") and "one document" in lines[1]
    assert lines[2].startswith("FAIL most of the gap") and lines[2].endswith("not better overall")
    assert lines[3].startswith("NOT RUN the recurrent arm at overlap 0")
    no_gain = gate3_goals(report(comparison(0.01, 0.0, 0.02), lost=5.0))[1]
    assert no_gain.startswith("FAIL another document's memory") and "no gain to give back" in no_gain


def test_the_early_share_skips_positions_too_rarely_predicted():
    by_position = {"recurrent@0": [None, 3.0, 3.0, 3.0], "control@0": [None, 3.3, 3.0, 3.1]}
    assert early_share(by_position) == pytest.approx(1.0)
