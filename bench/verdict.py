"""A goal's verdict from repeated rounds, and what `make bench` does with it (not a benchmark itself).

Every bench script ends with one of three outcomes, as its exit status:
    met         0  the goal holds (for a sampled figure: its confidence interval lies wholly on the goal's side)
    missed      1  the goal does not hold (or the comparison is void: requests failed)
    no verdict  3  the figure's interval still straddles the goal when the time budget ran out: the machine
                   was too noisy to tell; the script says about how many rounds would decide it
`make bench` prints one summary line per script and exits 0 only when every goal is met: 1 when one was
missed (or a script crashed), else 3 when one has no verdict (rerun it on a quieter machine).

The driver benchmark is sequential: after its first `min_rounds` it looks again after every round and
stops as soon as the median's interval lies on one side of the goal, or when another round would run
past its budget. Looking after every round makes a wrong verdict a little likelier than the interval's
nominal 10% (a 90% interval, two-sided: 5% a side), which the one-sided verdict halves: about 5-8%.
"""

from __future__ import annotations

import math
import statistics

MET, MISSED, NO_VERDICT = 0, 1, 3  # exit statuses
CONFIDENCE = 0.90  # of the median's interval that must lie on one side of the goal for a verdict
MIN_ROUNDS = 7  # fewer rounds give no verdict: the median of so few moves with one noisy round


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The median and a distribution-free confidence interval for it: the k-th lowest and k-th highest
    of the values, k the largest with P(k-1 < Binomial(n, 1/2) < n-k+1) >= confidence (n=7: min-max,
    98%; n=9: 2nd lowest to 2nd highest, 96%; n=15: 4th lowest to 4th highest, 96%)."""
    xs, n = sorted(values), len(values)

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= confidence:
        k += 1
    if coverage(k) < confidence:  # too few values for any interval at that confidence
        return statistics.median(xs), -math.inf, math.inf
    return statistics.median(xs), xs[k - 1], xs[n - k]


def verdict(values: list[float], goal: float) -> str:
    """'met', 'missed' or 'undecided', from where the median's interval lies against `goal` (higher is
    better)."""
    if len(values) < MIN_ROUNDS:
        return "undecided"
    _, lo, hi = median_interval(values)
    if lo >= goal:
        return "met"
    if hi < goal:
        return "missed"
    return "undecided"


def next_step(
    values: list[float], goal: float, min_rounds: int, rounds_run: int, elapsed_s: float, budget_s: float
) -> str:
    """After a round: 'met' or 'missed' (stop, decided), 'more' (run another round) or 'undecided'
    (stop: another round, as long as the mean of the `rounds_run` so far, would end past `budget_s`).
    `values` are the rounds that count, at least `min_rounds` of them before any verdict."""
    if len(values) >= min_rounds:
        decided = verdict(values, goal)
        if decided != "undecided":
            return decided
    per_round_s = elapsed_s / max(1, rounds_run)
    return "more" if elapsed_s + per_round_s <= budget_s else "undecided"


def rounds_to_decide(values: list[float], goal: float) -> int | None:
    """About how many rounds in all would decide a straddling goal, if the rounds keep their spread: the
    interval narrows as 1/sqrt(n), so it clears the goal once its side facing the goal is shorter than
    |median - goal|.
    None when the median sits on the goal (no number of rounds tells which side) or too few values."""
    if len(values) < MIN_ROUNDS:  # none at all on a busy machine: no median to ask
        return None
    med, lo, hi = median_interval(values)
    if not math.isfinite(lo) or med == goal:
        return None
    half_width = med - lo if med > goal else hi - med  # the side of the interval that reaches the goal
    return max(len(values) + 1, math.ceil(len(values) * (half_width / abs(med - goal)) ** 2))


def exit_status(result: str) -> int:
    """The exit status of a result word: met 0, missed or void 1, no verdict 3."""
    return {"met": MET, "missed": MISSED, "void": MISSED}.get(result, NO_VERDICT)
