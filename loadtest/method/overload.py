"""Requests failing in a row with no answer: a server that is down, or one our own load flooded.

ABORT_AFTER_FAILURES refused/reset connections or timeouts in a row used to end the run ("the server
looks down"). Timeouts at a level far above what the server serves are a knee caused by our own load:
N users on a server that completes T requests a second keep each request N / T seconds (Little's law),
and past REQUEST_TIMEOUT_S every one of them times out while the server works at full speed (a real
vLLM, healthy at 2.4 requests a second, flooded with 269 users: 209 timeouts in a row). So, once a
streak reaches the threshold (`streak_verdict`):
- mostly refused/reset connections: nothing listens; the run ends (abort);
- timeouts of requests started at the baseline's level (one user): the server stops answering the
  baseline's load too; the run ends;
- timeouts of requests started above it, while a step runs at or above that level: the step ends early
  as past the knee (overload) and the plan steps down below it (plan.knee_past_overload);
- the same again after a step-down with no request answered since: the server looks hung; the run ends;
- the plan ends with nothing answered since such a step (no lower level left to measure): one request
  of one user (`recheck`) tells; no answer to it either, and the run ends as "looks down";
- else (a cooldown, or a lower step while the higher level's last requests time out): the tail of our
  own load; nothing to do.
A hung server is also ended by the controller's silence rule (no success for max(60 s, 3 x timeout)).
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.method.plan import PhaseSpec
from loadtest.traffic import failures
from runfolder import Phase, RequestRow

ABORT = "abort"
OVERLOAD = "overload"
# only a server that stops answering is down; fast 5xx/OOM answers are a knee, which the plan handles
SERVER_DOWN_KINDS = (failures.CONNECTION, failures.TIMEOUT)
RECHECK_GRACE_S = 5.0  # the recheck waits this long past the request timeout for its one answer


@dataclass
class FailureStreak:
    """Requests that failed in a row with no answer (failures.CONNECTION or TIMEOUT), as their rows arrive."""

    count: int = 0
    refused: int = 0  # refused or reset connections among them
    lowest_level: int | None = None  # the fewest users at which one of them was started

    def fail(self, kind: str, level: int) -> None:
        self.count += 1
        if kind == failures.CONNECTION:
            self.refused += 1
        self.lowest_level = level if self.lowest_level is None else min(self.lowest_level, level)

    def reset(self) -> None:
        self.count, self.refused, self.lowest_level = 0, 0, None


@dataclass(frozen=True)
class Verdict:
    action: str  # ABORT | OVERLOAD | "" (nothing to do)
    why: str = ""
    level: int | None = None  # OVERLOAD: the fewest users whose requests timed out


def streak_verdict(
    streak: FailureStreak,
    threshold: int,
    phase: str,
    level: int,
    stepped_down_from: int | None = None,
    answered_since: bool = True,
    baseline_level: int = 1,
) -> Verdict:
    """What a streak of failures means now (module doc). `phase`/`level`: the phase running; `stepped_down_from`:
    the level of the last step ended as overloaded, if any; `answered_since`: a request succeeded since."""
    n = streak.count
    if n < threshold:
        return Verdict("")
    if 2 * streak.refused >= n or streak.lowest_level is None:
        return Verdict(ABORT, f"{n} requests in a row failed (refused or reset connections, timeouts): the server"
                              " looks down; run ended")  # fmt: skip
    low = streak.lowest_level
    if low <= baseline_level:
        return Verdict(ABORT, f"{n} requests in a row failed (timeouts), down to {low} user(s) at once: the"
                              " server stopped answering the baseline's load too; it looks down; run ended")  # fmt: skip
    if phase != Phase.STEP or level < low:
        return Verdict("")  # the last requests of a higher level time out: our own load, already acted on
    if stepped_down_from is not None and not answered_since:
        return Verdict(ABORT, f"{n} requests in a row failed (timeouts) and none was answered since the plan"
                              f" stepped down from {stepped_down_from} users: the server looks hung; run ended")  # fmt: skip
    return Verdict(
        OVERLOAD,
        f"{n} requests in a row timed out, started at {low} users or more: our own load past the knee, not an"
        " outage",
        low,
    )


class OverloadWatch:
    """The controller's view: the streak as rows arrive, and the lowest step ended as past the knee."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.streak = FailureStreak()
        self.overload: tuple[int, int, str] | None = None  # (step index, level, why)
        self.answered_since = True  # the server answered (even an error) since a step ended as past the knee
        self._recheck: PhaseSpec | None = None

    def on_row(self, row: RequestRow) -> None:
        if row.failure_kind in SERVER_DOWN_KINDS:
            self.streak.fail(row.failure_kind, row.level)
            return
        if row.ok:
            self.streak.reset()
        if row.status_code:  # an HTTP answer, even a 5xx: something listens and answers
            self.answered_since = True

    def verdict(self, phase: str, level: int) -> Verdict:
        stepped_down_from = self.overload[1] if self.overload is not None else None
        return streak_verdict(self.streak, self.threshold, phase, level, stepped_down_from, self.answered_since)

    def step_ended(self, step_index: int, level: int, why: str) -> None:
        """A step ended early as past the knee: the plan steps down below `level`; a new streak begins."""
        if self.overload is None or level <= self.overload[1]:
            self.overload = (step_index, level, why)
        self.answered_since = False
        self.streak.reset()

    def recheck(self, request_timeout_s: float) -> PhaseSpec | None:
        """After the plan's last phase: one user's request, once, when a step ended as past the knee and
        nothing was answered since; None when there is nothing to tell."""
        if self.overload is None or self.answered_since or self._recheck is not None:
            return None
        self._recheck = PhaseSpec(
            Phase.WARMUP, 1, f"recheck: does the server still answer one user? Nothing was answered since the"
            f" step at {self.overload[1]} users timed out", 0.0, request_timeout_s + RECHECK_GRACE_S, 1,
        )  # fmt: skip
        return self._recheck

    def recheck_failed(self, spec: PhaseSpec | None, rows: int, elapsed_s: float) -> str:
        """Why the run ends when the recheck's request came back with no answer (or never came back)."""
        if spec is None or spec is not self._recheck or self.answered_since or self.overload is None:
            return ""
        if rows < 1 and elapsed_s < spec.max_s:
            return ""
        return (
            f"one user's request got no answer either, after the step at {self.overload[1]} users timed out:"
            " the server looks down; run ended"
        )

    def verdict_of(self, spec: PhaseSpec | None) -> Verdict:
        """The streak's verdict for the running phase (none running: no phase, level 0)."""
        return self.verdict(str(spec.phase), spec.level) if spec else self.verdict("", 0)

    def down_why(self, spec: PhaseSpec | None, rows: int, elapsed_s: float, silent_s: float | None,
                 request_timeout_s: float) -> str:  # fmt: skip
        """Why the run must end because the server stopped answering, or "" while it answers (timeouts of
        our own load above the baseline's level end a step instead). `silent_s`: since the last success."""
        verdict = self.verdict_of(spec)
        if verdict.action == ABORT:
            return verdict.why
        unanswered = self.recheck_failed(spec, rows, elapsed_s)
        if unanswered:
            return unanswered
        # a hung server fails slowly (one timeout per user at a time): also end on a long silence
        if silent_s is not None and silent_s > max(60.0, 3 * request_timeout_s):
            return f"no request succeeded for {silent_s:.0f} s: the server looks hung; run ended"
        return ""
