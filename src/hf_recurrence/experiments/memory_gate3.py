"""Gate 3 of the memory (issue 39): the books. A book reproduction run (`hf-recurrence reproduce --preset smollm2`,
`book_reproduction`) whose trained arms carry a memory (`--memory select`: the recurrent arm and its zero-input
control), LoRA in every arm, choices made on the validation book and the test books read once; `gate3_goals` checks
the gate's goals on what the run recorded (its results.json).
"""

import math

from .memory_gate2 import verdict


# The goals, fixed before any run (issue 39, gate 3).
CARRIED_GOAL, CARRIED_UPPER_BOUND = -0.02, -0.005  # recurrent vs control, relative perplexity, and its 95% upper bound
SHUFFLED_LOSS_GOAL = 2 / 3  # of the carried-context gain, lost with another document's memory
EARLY_POSITIONS = 16  # most of the gap at window positions below this


def percent(value: float) -> str:
    return f"{100 * value:+.2f}%"


def early_share(by_position: dict[str, list[float | None]]) -> float | None:
    """The share of the control-minus-recurrent NLL gap, summed over window positions (each position as many tokens
    at overlap 0), that lies at positions below `EARLY_POSITIONS`; None when the summed gap is not positive."""
    pairs = [
        (position, control - recurrent)
        for position, (control, recurrent) in enumerate(
            zip(by_position["control@0"], by_position["recurrent@0"], strict=True)
        )
        if control is not None and recurrent is not None
    ]
    total = sum(gap for _, gap in pairs)
    if not total > 0:
        return None
    return sum(gap for position, gap in pairs if position < EARLY_POSITIONS) / total


def gate3_goals(report: dict) -> list[str]:
    """The gate's goals, PASS/FAIL (NOT RUN where the run lacks the read a goal needs), one line each, from a book
    run's results.json: its `comparisons`, `carried_gain_lost_when_shuffled` and `nll_by_window_position`."""
    comparisons = report["comparisons"]
    carried = comparisons["recurrent vs control"]
    interval = f"{percent(carried['relative_difference'])} [{percent(carried['low'])}, {percent(carried['high'])}]"
    lines = [
        verdict(
            carried["relative_difference"] <= CARRIED_GOAL and carried["high"] <= CARRIED_UPPER_BOUND,
            f"carried context (recurrent vs its zero-input control) <= {percent(CARRIED_GOAL)}, 95% upper bound <= "
            f"{percent(CARRIED_UPPER_BOUND)}",
            interval,
        )
    ]
    lost = report.get("carried_gain_lost_when_shuffled")
    shuffled_goal = f"another document's memory gives back >= {SHUFFLED_LOSS_GOAL:.0%} of the carried-context gain"
    if lost is None:
        lines.append(f"NOT RUN {shuffled_goal}: the run read one document, no other to take the memory from")
    else:
        # A share of a gain indistinguishable from 0, or of a loss, says nothing.
        gained = carried["high"] < 0
        value = f"{lost:.0%} given back" if gained and not math.isnan(lost) else f"no gain to give back ({interval})"
        lines.append(verdict(gained and lost >= SHUFFLED_LOSS_GOAL, shuffled_goal, value))
    share = early_share(report["nll_by_window_position"])
    early_goal = (
        f"most of the gap (control - recurrent NLL, summed over window positions) at positions < {EARLY_POSITIONS}"
    )
    value = "no gap: the recurrent arm is not better overall" if share is None else f"{share:.0%} of it there"
    lines.append(verdict(share is not None and share > 0.5, early_goal, value))
    overlap_goal = "the recurrent arm at overlap 0 no worse than the LoRA baseline at overlap T/8"
    versus = comparisons.get("recurrent vs baseline@T/8")
    if versus is None:
        lines.append(f"NOT RUN {overlap_goal}: the run read no baseline at overlap T/8")
    else:
        lines.append(verdict(versus["relative_difference"] <= 0, overlap_goal, percent(versus["relative_difference"])))
    return lines


__all__ = ["gate3_goals"]
