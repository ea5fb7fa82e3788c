"""After a sweep whose server outlives it (the sidecar's), the server is put back to the pick's setting with
one restart, none when it already runs it; the words end the sweep's last line. The restarter here is a
recorder we wrote (the real sidecar's restart is tests/integration/test_it_sweep.py's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadtest.sweep.grid import Setting
from loadtest.sweep.restart import Restarted, back_to_pick


@dataclass
class Recorder:
    outlives_sweep: bool = True
    answer: Restarted = field(default_factory=lambda: Restarted(ok=True, elapsed_s=2.5))
    where: str = "the sidecar at http://gpu:9400"
    template: str = "srv --n {n}"
    asked: list[dict[str, str]] = field(default_factory=list)

    @property
    def placeholders(self) -> tuple[str, ...]:
        return ("n",)

    def restart(self, values: dict[str, str]) -> Restarted:
        self.asked.append(values)
        return self.answer

    def output_tail(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def s(n: str, **client: str) -> Setting:
    return Setting(values={"n": n, **client})


def test_a_pick_other_than_the_last_setting_is_restarted_once_and_said() -> None:
    rec = Recorder()
    said = back_to_pick(rec, s("16"), s("32"), last_ok=True)
    assert rec.asked == [{"n": "16"}]
    assert said == "the server is back at the pick, n=16 (the sidecar at http://gpu:9400 restarted it in 2.5 s)"


def test_a_server_already_at_the_pick_is_not_restarted() -> None:
    rec = Recorder()
    assert "already" in back_to_pick(rec, s("16"), s("16"), last_ok=True) and rec.asked == []
    # the same server values, a client key apart: the server needs no restart either
    assert "already" in back_to_pick(rec, s("16", max_side="512"), s("16", max_side="0"), last_ok=True)
    assert rec.asked == []


def test_a_last_setting_that_failed_to_start_is_restarted_even_with_the_picks_values() -> None:
    rec = Recorder()
    back_to_pick(rec, s("16"), s("16"), last_ok=False)
    assert rec.asked == [{"n": "16"}]


def test_no_pick_keeps_the_last_setting_and_says_so() -> None:
    rec = Recorder()
    said = back_to_pick(rec, None, s("64"), last_ok=True)
    assert rec.asked == [] and said == "no pick to put the server back to: it keeps the last setting tried, n=64"


def test_a_restart_to_the_pick_that_fails_is_said_with_why() -> None:
    rec = Recorder(answer=Restarted(ok=False, why="not healthy within 30 s", output_tail=["CUDA OOM"]))
    said = back_to_pick(rec, s("16"), s("32"), last_ok=True)
    assert said.startswith("the server could NOT be put back to the pick, n=16: not healthy within 30 s")
    assert "CUDA OOM" in said and said.endswith("restart it with those values yourself")


def test_a_server_the_sweep_ran_itself_stops_with_it_and_is_not_put_back() -> None:
    rec = Recorder(outlives_sweep=False)
    assert back_to_pick(rec, s("16"), s("32"), last_ok=True) == "" and rec.asked == []
