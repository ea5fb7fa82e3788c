"""What the run says to a person reads right: counts in the right number, the time it promises, a
quitting worker's rows (issue 32's words)."""

from __future__ import annotations

from loadtest.method.levels import REPORT_S, expected_s
from loadtest.method.live import phase_name
from loadtest.settings.run_config import RunConfig
from loadtest.wiring.link import quit_words


def _ended(stepped: list[int], aborted: bool = True) -> str:
    return phase_name(None, stepped, finished=True, aborted=aborted, planned=[1, 2], knee_level=None,
                      before_baseline=False)  # fmt: skip


def test_a_run_ended_names_its_levels_in_the_right_number() -> None:
    assert _ended([1]) == "stopped: reached 1 level after the baseline (1 user)"
    assert _ended([2]) == "stopped: reached 1 level after the baseline (2 users)"
    assert _ended([2, 4], aborted=False) == "done: measured 2 levels after the baseline (2, 4 users)"
    assert _ended([]) == "stopped: reached 0 levels after the baseline"


def test_the_time_promised_counts_every_phase_the_verify_windows_and_the_report() -> None:
    """The demo's test settings (steps of 4 s, cooldowns of 4 s, warm-ups of 1 s, verify windows of 4 s),
    a server answering in 0.2 s: 7 levels and two verify windows took 95 s of phases, then the report."""
    cfg = RunConfig(step_s=4, cooldown_s=4, warmup_s=1, verify_window_s=4)
    level_s = 1 + 4 + 2 + (0.2 + 4 + 1)  # warm-up, window, their ticks, the cooldown (drain, cap, tick)
    verify_s = 4 + 5 + 2 + (0.2 + 4 + 1)  # window, the drain's cap, ticks, cooldown
    assert expected_s(cfg, 7, 0.2, 2) == 7 * level_s + 2 * verify_s + REPORT_S
    assert expected_s(cfg, 7, 0.2, 2) >= 95 + REPORT_S
    slow = expected_s(cfg, 1, 10.0, 0)  # a 10 s request: the warm-up is two of them, the drain one
    assert slow == 20 + 4 + 2 + (10 + 4 + 1) + REPORT_S


def test_a_quitting_worker_says_rows_sent_in_the_final_batch_are_not_lost() -> None:
    assert quit_words(10, 10, True) == "10 rows, 10 acknowledged by the master"
    assert quit_words(10, 9, True).startswith("10 rows, 9 acknowledged by the master; the other 1 went in the final batch")
    assert quit_words(10, 9, False) == "10 rows, 9 acknowledged by the master: merge-rows adds the other 1"
