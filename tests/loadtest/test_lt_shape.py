"""The shape asks the controller several times within Locust's once-a-second tick (loadtest/wiring/shape.py):
a phase ends within POLL_S of its rule, not at the next whole second, and the phase after it is asked about
from then on, however short it is."""

from __future__ import annotations

from loadtest.wiring.shape import POLL_S, POLL_SPAN_S, polled


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_phase_that_ends_between_two_ticks_is_applied_within_a_poll():
    clock, applied = _Clock(), []
    ends_at = clock.now + 0.35  # e.g. a warm-up's 2 s bound, counted from just after the previous tick
    answer = polled(lambda: (8, 80.0) if clock.now >= ends_at else (0, 80.0), (0, 80.0),
                    lambda a: applied.append((clock.now, a)), clock.sleep, clock)  # fmt: skip
    assert answer == (8, 80.0) and [a for _, a in applied] == [(8, 80.0)]
    assert ends_at <= applied[0][0] <= ends_at + POLL_S + 1e-9


def test_a_short_phase_after_a_change_ends_within_the_same_tick():
    # the baseline's cooldown: its memory back 0.41 s in; Locust's loop would ask again only at its next second
    clock, applied = _Clock(), []
    start = clock.now

    def plan() -> tuple[int, float]:
        elapsed = clock.now - start
        return (1, 10.0) if elapsed < 0.1 else (0, 10.0) if elapsed < 0.51 else (6, 60.0)

    assert polled(plan, (1, 10.0), lambda a: applied.append((clock.now - start, a)), clock.sleep, clock) == (6, 60.0)
    assert [a for _, a in applied] == [(0, 10.0), (6, 60.0)]  # the cooldown, then the next warm-up
    assert 0.51 <= applied[1][0] <= 0.51 + POLL_S + 1e-9


def test_an_unchanged_phase_polls_one_span_and_the_run_end_is_answered_at_once():
    clock, asked, applied = _Clock(), [], []
    start = clock.now

    def same() -> tuple[int, float]:
        asked.append(clock.now)
        return (4, 40.0)

    assert polled(same, (4, 40.0), applied.append, clock.sleep, clock) == (4, 40.0) and not applied
    assert POLL_SPAN_S - POLL_S <= clock.now - start <= POLL_SPAN_S + 1e-9  # Locust's loop sleeps the rest
    polls = round(POLL_SPAN_S / POLL_S)
    assert polls <= len(asked) <= polls + 1  # asked every POLL_S, the first at once
    clock.now = start
    assert polled(lambda: None, (4, 40.0), applied.append, clock.sleep, clock) is None and clock.now == start
    assert polled(lambda: (4, 40.0), None, applied.append, clock.sleep, clock) == (4, 40.0)
    assert applied == [(4, 40.0)]  # a first answer, applied at once
