"""What the run says to a person reads right: counts in the right number, the time it promises, a
quitting worker's rows (issue 32's words)."""

from __future__ import annotations

from loadtest.method.live import phase_name
from loadtest.wiring.link import quit_words


def _ended(stepped: list[int], aborted: bool = True) -> str:
    return phase_name(None, stepped, finished=True, aborted=aborted, planned=[1, 2], knee_level=None,
                      before_baseline=False)  # fmt: skip


def test_a_run_ended_names_its_levels_in_the_right_number() -> None:
    assert _ended([1]) == "stopped: reached 1 load after the baseline (1 user)"
    assert _ended([2]) == "stopped: reached 1 load after the baseline (2 users)"
    assert _ended([2, 4], aborted=False) == "done: measured 2 loads after the baseline (2, 4 users)"
    assert _ended([]) == "stopped: reached 0 loads after the baseline"


def test_a_quitting_worker_says_rows_sent_in_the_final_batch_are_not_lost() -> None:
    assert quit_words(10, 10, True) == "10 rows, 10 acknowledged by the master"
    assert quit_words(10, 9, True).startswith(
        "10 rows, 9 acknowledged by the master; the other 1 went in the final batch"
    )
    assert quit_words(10, 9, False) == "10 rows, 9 acknowledged by the master: merge-rows adds the other 1"
