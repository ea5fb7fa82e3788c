"""Rule 1 of the knee (analysis/knee/find.py): when a point's failures end the safe range.

Errors are a knee when they grow with load. A balancer that drops 1% of requests at every level, the
baseline included, is not a limit of the server: the knee compares each point's failure rate with the
reference (the baseline pooled with the clean levels below it) and calls it failing only when

    rate - reference rate > max_error_rate (0.01, the smallest rise that matters), and
    one-sided Fisher exact test (hypergeometric: are this point's failures more than its share of all
    failures in both?) p < error_p (0.01), and failures >= min_failures (2).

The baseline itself has no reference: it is tested against max_error_rate alone (one-sided exact
binomial test, X ~ Bin(n, 0.01), p = P(X >= failures)). Counts are outcomes, not attempts: an attempt
tried again is `retried`, not failed; a request cut at a step-down is a failure; rejections (503/429)
count as failures (a sign of overload) and are named apart in the reason.

`point_failure` joins the four reasons a point fails (knee.py's rule 1): any OOM, the rise above, a
step that completed answers for fewer than half its users (`unanswered`), answers worse than the
baseline's (`answers_worse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.common.stats import num

ITERATION_CAP = 200_000  # terms of a tail sum; past the mode they shrink geometrically
TAIL_EPS = 1e-12


def _whole(row: dict[str, Any], name: str) -> int:
    number = num(row, name)
    return 0 if math.isnan(number) else int(number)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _tail(first: int, last: int, mode: float, log_term: Any) -> float:
    """sum of exp(log_term(k)) for k = first..last, stopping once past the mode the terms are negligible."""
    total = 0.0
    for k in range(first, min(last, first + ITERATION_CAP) + 1):
        term = math.exp(log_term(k))
        total += term
        if k > mode and term < TAIL_EPS * total:
            break
    return min(1.0, total)


def fisher_greater_p(fail_a: int, n_a: int, fail_b: int, n_b: int) -> float:
    """One-sided Fisher exact test: P(X >= fail_a) with X the failures that fall in sample a (n_a of the
    n_a + n_b requests) when the fail_a + fail_b failures are spread at random over both samples."""
    total, failures = n_a + n_b, fail_a + fail_b
    if n_a <= 0 or fail_a <= 0:
        return 1.0
    base = _log_comb(total, n_a)
    mode = (n_a + 1) * (failures + 1) / (total + 2)
    last = min(failures, n_a)
    return _tail(fail_a, last, mode, lambda k: _log_comb(failures, k) + _log_comb(total - failures, n_a - k) - base)


def binomial_greater_p(failures: int, n: int, rate: float) -> float:
    """One-sided exact binomial test: P(X >= failures) for X ~ Bin(n, rate)."""
    if failures <= 0:
        return 1.0
    if rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    return _tail(failures, n, n * rate, lambda k: _log_comb(n, k) + k * log_p + (n - k) * log_q)


@dataclass(frozen=True)
class Outcomes:
    """A point's requests as outcomes: each logical request once, by its final attempt."""

    requests: int = 0  # outcomes: attempts minus those tried again
    failed: int = 0  # cut and rejected included
    oom: int = 0
    rejected: int = 0
    cut: int = 0
    retried: int = 0
    kinds: tuple[tuple[str, int], ...] = ()

    def __add__(self, other: Outcomes) -> Outcomes:
        return Outcomes(requests=self.requests + other.requests, failed=self.failed + other.failed)

    @property
    def rate(self) -> float:
        return self.failed / self.requests if self.requests > 0 else math.nan


def outcomes_of(row: dict[str, Any]) -> Outcomes:
    errors = {str(k): int(v) for k, v in (row.get("errors") or {}).items()}
    failed = num(row, "failed_requests")
    retried = _whole(row, "retried")
    return Outcomes(
        requests=max(0, _whole(row, "requests") - retried),
        failed=sum(errors.values()) if math.isnan(failed) else int(failed),
        oom=sum(n for k, n in errors.items() if "oom" in k.lower()),
        rejected=_whole(row, "rejected") or errors.get("rejected", 0),
        cut=_whole(row, "cut_requests"),
        retried=retried,
        kinds=tuple(sorted(errors.items(), key=lambda kv: -kv[1])),
    )


def p_text(p: float) -> str:
    return "p<0.0001" if p < 1e-4 else f"p={p:.4f}"


def _apart(own: Outcomes) -> str:
    """What the reason names apart from the failures: rejections, cuts and retries."""
    words = []
    if own.rejected:
        words.append(f"{own.rejected} rejected (503/429)")
    if own.cut:
        words.append(f"{own.cut} cut at the step-down after the stop timeout")
    if own.retried:
        words.append(f"{own.retried} attempt(s) retried, not counted")
    return f"; {', '.join(words)}" if words else ""


def error_rise(row: dict[str, Any], reference: Outcomes, p: dict[str, Any]) -> tuple[str, bool]:
    """(why this point's failures end the safe range, whether that rests on few failures), or ("", False)."""
    own = outcomes_of(row)
    if own.requests <= 0 or own.failed < p["min_failures"]:
        return "", False
    kinds = ", ".join(f"{k} {n}" for k, n in own.kinds[:3])
    head = f"{own.rate:.1%} of {own.requests} requests failed" + (f" ({kinds})" if kinds else "")
    if reference.requests > 0:
        if own.rate - reference.rate <= p["max_error_rate"]:
            return "", False
        pval = fisher_greater_p(own.failed, own.requests, reference.failed, reference.requests)
        test = f"against {reference.rate:.1%} of {reference.requests} at lower loads (one-sided Fisher exact test {p_text(pval)})"
    else:
        if own.rate <= p["max_error_rate"]:
            return "", False
        pval = binomial_greater_p(own.failed, own.requests, p["max_error_rate"])
        test = f"above {p['max_error_rate']:.0%} (one-sided exact binomial test {p_text(pval)})"
    if pval >= p["error_p"]:
        return "", False
    return f"{head} {test}{_apart(own)}", own.failed < p["confirm_failures"]


def unanswered(row: dict[str, Any], baseline: dict[str, Any] | None, p: dict[str, Any]) -> str:
    """Words when a point completed far fewer requests than it has users: most users never got an answer.

    Only when one user alone (the baseline's mean latency) answers within the window: otherwise the window
    is too short for this server, not the server past its knee."""
    level, completed = int(row["level"]), num(row, "completed_requests")
    duration_s = num(row, "duration_s")
    if math.isnan(completed) or math.isnan(duration_s) or completed >= p["min_completed_share"] * level:
        return ""
    single_s = num(baseline, "mean_ms") / 1000.0 if baseline is not None else math.nan
    if not math.isnan(single_s) and single_s > duration_s:
        return ""
    return (
        f"completed {int(completed)} requests with {level} users in {duration_s:.0f} s (fewer than"
        f" {p['min_completed_share']:.0%} of its users got an answer): past the knee"
    )


def answers_worse(row: dict[str, Any], base: dict[str, Any] | None, p: dict[str, Any]) -> str:
    share, n = num(row, "bad_answer_share"), num(row, "ok_requests")
    base_share = 0.0 if base is None else num(base, "bad_answer_share")
    base_n = 1.0 if base is None else num(base, "ok_requests")
    if any(math.isnan(v) for v in (share, n, base_share, base_n)) or n <= 0 or base_n <= 0:
        return ""
    noise = 3.0 * math.sqrt(share * (1 - share) / n + base_share * (1 - base_share) / base_n)
    if share - base_share <= max(p["max_answer_drop"], noise):
        return ""
    return f"bad answers {share:.0%} against {base_share:.0%} in the baseline (answers got worse under load)"


def point_failure(
    row: dict[str, Any], reference: Outcomes, base: dict[str, Any] | None, p: dict[str, Any]
) -> tuple[str, bool]:
    """(why this point's failures end the safe range, whether that rests on few failures); "" when not."""
    own = outcomes_of(row)
    parts, few = [], False
    if own.oom:
        parts.append(f"{own.oom} OOM failure(s)")
    rise, few = error_rise(row, reference, p)
    if rise:
        parts.append(rise)
    silent = unanswered(row, base, p)
    if silent:
        parts.append(silent)
    if row is not base:
        worse = answers_worse(row, base, p)
        if worse:
            parts.append(worse)
    return "; ".join(parts), few and len(parts) == 1 and bool(rise)


def _clean_total(clean: list[dict[str, Any]]) -> Outcomes:
    total = Outcomes()
    for row in clean:
        total = total + outcomes_of(row)
    return total


def steady_loss(clean: list[dict[str, Any]], at_least: int) -> bool:
    """Whether the clean points (the baseline's included) hold at least `at_least` failures, none of which
    rose significantly above the levels below them (rule 1 let every one of them pass): a constant loss."""
    return len(clean) >= 2 and _clean_total(clean).failed >= at_least


THROUGHPUT_FIELDS = ("throughput_rps", "throughput_se_rps", "throughput_ci_low_rps", "throughput_ci_high_rps")


def answers_back_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its throughput counted on answers back, where a steady loss runs through the clean points
    (`steady_loss`): each failure (cuts excluded: no answer came back) counted as the share of an answer's
    time it held its user, `failed_held_ms` (its latency and the pause after it) over the answers' `mean_ms`,
    at most 1; a whole answer where that is not known (a run from before the column).

    Throughput counts successes. A balancer that drops 1% of answers at every load takes a level's share of
    them by chance: a window of ~64 requests that drew 2 (3.1%) reads 2% under its neighbours, and on a
    sharp server that put the limit's level just under 95% of the plateau (issue 48: recommended 7 where the
    limit is 6, 3 runs of 4). A failure costs its level the successes its user could have sent in the time
    it held: a whole answer's where it held the user as long (the answer lost on its way back), half of one
    where a fast 502 and the closed-loop user's pause after it (REJECT_PAUSE_S 0.5 s) sit beside 1 s
    answers, little at a level past the limit, whose users mostly queue (3 s answers at 16 users on 6
    slots). Counted as whole answers there, a window's chance share of fast 502s raised the plateau: 2 of 62
    at 16 users read it 3% high, and behind a hop of 45 ms after the slots (level 6 at 95.7%) the answer was
    7 (tests/integration/it_flaky.py --outside-s 0.045). The successes' throughput stays in
    `throughput_ok_rps`."""
    ok, failed, cut = num(row, "ok_requests"), num(row, "failed_requests"), num(row, "cut_requests")
    if not ok > 0 or not failed > 0:
        return row
    mean_ms = num(row, "mean_ms")
    held = num(row, "failed_held_ms") / mean_ms if mean_ms > 0 else math.nan
    share = 1.0 if math.isnan(held) else min(1.0, max(0.0, held))
    scale = (ok + share * (failed - (0.0 if math.isnan(cut) else cut))) / ok
    out = dict(row, throughput_ok_rps=row.get("throughput_rps"))
    out.update({name: num(row, name) * scale for name in THROUGHPUT_FIELDS if name in row})
    return out


def steady_errors(clean: list[dict[str, Any]], p: dict[str, Any]) -> str:
    """Words for failures among the clean points (the baseline's included) that never rose significantly
    above the levels below: a constant loss (a balancer's drops), which the reason names, not a knee."""
    if not steady_loss(clean, p["min_failures"]):
        return ""
    total = _clean_total(clean)
    first, last = clean[0], clean[-1]
    where = "from the baseline" if first.get("phase") == "baseline" else f"from {first['level']} users"
    return (
        f"a steady failure rate, {total.rate:.1%} ({total.failed} of {total.requests} requests) {where} to {last['level']}"
        " users, did not grow with load: a constant loss in front of or in the server, not its limit;"
        " levels are compared on answers back, failures counted with successes by the share of an answer's time"
        " they held their users"
    )
