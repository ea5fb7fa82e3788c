"""The cooldown's end: memory back near idle, or stable at zero users (a caching allocator's
high-water mark never falls back, and must not hold every cooldown to its cap)."""

from __future__ import annotations

from pathlib import Path

from loadtest.method.controller import Controller
from loadtest.method.plan import PhaseSpec
from loadtest.method.settle import MemorySettle
from loadtest.settings.run_config import RunConfig
from runfolder import GpuSample, ServerSample

IDLE_MIB = 6000.0


class _FakeMonitor:
    def __init__(self) -> None:
        self.used_mib: float | None = None
        self.asked_soon = self.delivered = 0

    def latest_mem_used_mib(self) -> float | None:
        return self.used_mib

    def read_soon(self) -> None:
        self.asked_soon += 1

    def deliver(self) -> None:
        self.delivered += 1

    def mark_step(self, step_index: int) -> None:
        pass

    def stop(self) -> None:
        pass


def _sample(t_s: float, mem_mib: float, step: int = 3, gpu: int = 0) -> GpuSample:
    return GpuSample(t_s, step, "dcgm", gpu, mem_mib, 24576.0, 0.0, 0.0, None, None, None)


def _controller(tmp_path: Path) -> tuple[Controller, _FakeMonitor]:
    monitor = _FakeMonitor()
    ctl = Controller(RunConfig(), tmp_path, monitor, broadcast=lambda _tag: None)  # type: ignore[arg-type]
    ctl.idle_mib, ctl.step_index = IDLE_MIB, 3
    return ctl, monitor


def _feed(ctl: Controller, monitor: _FakeMonitor, t0: float, t1: float, mem: float) -> None:
    t = t0
    while t <= t1 + 1e-9:
        ctl.on_gpu([_sample(t, mem)])
        monitor.used_mib = mem
        t += 0.25


def test_a_high_water_mark_settles_once_stable_for_three_seconds(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    _feed(ctl, monitor, 100.0, 101.0, IDLE_MIB + 4000)  # requests in flight finishing
    _feed(ctl, monitor, 101.25, 103.0, IDLE_MIB + 4400)
    assert not ctl.memory_settled()  # far above idle and moved 400 MiB within the last 3 s
    _feed(ctl, monitor, 103.25, 104.5, IDLE_MIB + 4430)  # within max(64 MiB, 1% of idle)
    assert ctl.memory_settled()
    ctl.close()


def test_memory_that_keeps_moving_never_settles_above_idle(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    for i in range(40):
        _feed(ctl, monitor, 100.0 + i * 0.25, 100.0 + i * 0.25, IDLE_MIB + 2000 + 30 * i)  # 120 MiB/s
    assert not ctl.memory_settled()
    ctl.close()


def test_back_near_idle_settles_at_once_and_no_data_does_not_block(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    monitor.used_mib = IDLE_MIB + 100
    assert ctl.memory_settled()
    monitor.used_mib = None
    assert ctl.memory_settled()
    ctl.close()


def test_samples_of_another_phase_do_not_count(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    for t in range(10):
        ctl.on_gpu([_sample(100.0 + t, IDLE_MIB + 3000, step=2)])  # the step before, still arriving
    monitor.used_mib = IDLE_MIB + 3000
    assert not ctl.memory_settled()
    ctl.close()


def test_every_gpu_must_be_stable() -> None:
    settle = MemorySettle()
    for i in range(17):
        t = 10.0 + i * 0.25
        settle.add(0, t, 9000.0)
        settle.add(1, t, 9000.0 + (500.0 if i % 2 else 0.0))
    assert not settle.stable(IDLE_MIB)
    settle.reset()
    assert not settle.stable(IDLE_MIB)


def _server(t_s: float, running: float | None, waiting: float | None = 0.0) -> ServerSample:
    return ServerSample(t_s, 3, running, waiting, None, None, None, None)


def test_a_cooldown_back_at_idle_with_nothing_in_flight_ends_without_its_minimum(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    ctl.spec = PhaseSpec("cooldown", 0, "cooldown", 4.0, 15.0)
    drained_at = 100.0
    ctl.timing.drained_at = drained_at
    _feed(ctl, monitor, 99.0, 99.75, IDLE_MIB + 50)  # near idle, but read before the drain
    assert not ctl.at_rest(drained_at)
    assert not ctl.timing.cooldown_over(drained_at + 0.5, 0.5, 0)  # within its minimum, nothing read since
    _feed(ctl, monitor, 100.0, 100.5, IDLE_MIB + 50)
    assert ctl.at_rest(drained_at)
    assert ctl.timing.cooldown_over(drained_at + 0.5, 0.5, 0)  # 0.5 s into it: no fixed 4 s to wait out
    assert ctl.timing.last_at_rest  # the promise's "about" counts the cooldowns after the baseline's so
    ctl.last_server = _server(100.25, 2.0)  # the server still works on requests the users gave up on
    assert not ctl.at_rest(drained_at) and not ctl.timing.cooldown_over(drained_at + 0.5, 0.5, 0)
    ctl.last_server = _server(99.5, 0.0)  # a reading from before the drain says nothing about now
    assert not ctl.at_rest(drained_at)
    ctl.last_server = _server(100.5, 0.0, float("nan"))
    assert ctl.at_rest(drained_at)
    ctl.close()


def test_memory_above_idle_or_unread_keeps_the_minimum(tmp_path: Path) -> None:
    ctl, monitor = _controller(tmp_path)
    ctl.spec = PhaseSpec("cooldown", 0, "cooldown", 4.0, 15.0)
    ctl.timing.drained_at = 100.0
    _feed(ctl, monitor, 100.0, 101.0, IDLE_MIB + 3000)  # a high-water mark: settles only once stable
    assert not ctl.at_rest(100.0) and not ctl.timing.cooldown_over(101.0, 1.0, 0)
    monitor.used_mib = None  # no GPU reading: nothing says it is at rest; the minimum holds, then it ends
    assert not ctl.at_rest(100.0)
    assert not ctl.timing.cooldown_over(101.0, 1.0, 0) and ctl.timing.cooldown_over(104.0, 4.0, 0)
    assert not ctl.timing.last_at_rest  # ended at its minimum: "about" counts COOLDOWN_MIN_S per cooldown
    ctl.close()


def _baseline_closed(ctl: Controller, peak_mib: float) -> None:
    """A baseline (step 2) of ten answers, its GPU peak as the card saw it."""
    from runfolder import RequestRow, StepRow

    ctl.on_rows([RequestRow(
        request_id=f"w-{i}", t_start_unix_s=10.0 + i, step_index=2, phase="baseline", level=1, scenario="fixed",
        bucket="b", latency_ms=340.0, ttft_ms=None, status_code=200, ok=True, failure_kind="", bytes_sent=1,
        bytes_received=1, cer=None, prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True,
        worker_id="w", error_text="",
    ) for i in range(10)])  # fmt: skip
    ctl.live.close(StepRow(2, "baseline", 1, 10.0, 20.0, "complete", ""))
    ctl.card.peak_per_step[2] = peak_mib


def test_the_promise_counts_short_cooldowns_only_where_the_baseline_showed_memory_fall_back(tmp_path: Path) -> None:
    """The demo's server: the baseline raised memory 1114 MiB over idle and its cooldown found it back: later
    cooldowns end in ~2 s. A caching allocator whose high-water mark the pre-flight already set reads "idle"
    at that mark, so its baseline's cooldown is "at rest" with no fall seen: its later ones hold COOLDOWN_MIN_S."""
    ctl, _monitor = _controller(tmp_path)
    _baseline_closed(ctl, IDLE_MIB + 1114)
    ctl.timing.last_at_rest = True
    assert ctl._memory_falls_back(ctl._baseline_row())
    ctl.timing.last_at_rest = False  # ended at its minimum, memory held
    assert not ctl._memory_falls_back(ctl._baseline_row())
    ctl.close()
    (tmp_path / "held").mkdir()
    held, _monitor = _controller(tmp_path / "held")
    _baseline_closed(held, IDLE_MIB + 10)  # the pre-flight set the mark: no rise over "idle" in the baseline
    held.timing.last_at_rest = True
    assert not held._memory_falls_back(held._baseline_row())
    held.close()


def _idle_controller(tmp_path: Path, before_mib: dict[str, float] | None) -> tuple[Controller, _FakeMonitor]:
    """A controller in its idle phase (step 0), the manifest holding the pre-flight's reading `before_mib`."""
    from runfolder import write_manifest

    write_manifest(tmp_path, {"idle_before_preflight": None if before_mib is None else {
        "t_unix_s": 99.0, "mem_used_mib_by_gpu": before_mib, "samples": 5}})  # fmt: skip
    monitor = _FakeMonitor()
    ctl = Controller(RunConfig(), tmp_path, monitor, broadcast=lambda _tag: None)  # type: ignore[arg-type]
    ctl.step_index = 0
    return ctl, monitor


def _idle_spec(ctl: Controller) -> PhaseSpec:
    spec = next(ctl._plan)  # the plan's first phase: the idle one, at most IDLE_S
    assert spec.phase == "idle" and spec.max_s == RunConfig().idle_s
    return spec


def test_the_idle_phase_ends_once_two_readings_show_the_preflights_idle(tmp_path: Path) -> None:
    ctl, _monitor = _idle_controller(tmp_path, {"0": IDLE_MIB, "1": 300.0})
    spec = _idle_spec(ctl)
    ctl.on_gpu([_sample(100.0, IDLE_MIB + 20, step=0), _sample(100.0, 310.0, step=0, gpu=1)])
    assert not ctl.timing.done(spec, 0, 1.5)  # one reading of each card: not yet two
    ctl.on_gpu([_sample(100.5, IDLE_MIB, step=0), _sample(100.5, 300.0, step=0, gpu=1)])
    assert not ctl.timing.done(spec, 0, 0.9)  # never before IDLE_FLOOR_S
    assert ctl.timing.done(spec, 0, 1.0)  # back where the pre-flight found it: IDLE_S would read the same again
    ctl.close()


def test_an_idle_phase_that_kept_the_preflights_memory_or_lacks_its_reading_runs_idle_s(tmp_path: Path) -> None:
    ctl, _monitor = _idle_controller(tmp_path, {"0": IDLE_MIB})
    spec = _idle_spec(ctl)
    for t in (100.0, 100.5, 101.0, 101.5):  # a caching allocator kept the pre-flight's request: 512 MiB above
        ctl.on_gpu([_sample(t, IDLE_MIB + 512, step=0)])
    assert not ctl.timing.done(spec, 0, 2.0)
    ctl.close()
    other = tmp_path / "other"
    other.mkdir()
    ctl, _monitor = _idle_controller(other, None)  # no GPU source at the pre-flight: nothing to compare with
    spec = _idle_spec(ctl)
    for t in (100.0, 100.5, 101.0):
        ctl.on_gpu([_sample(t, IDLE_MIB, step=0)])
    assert not ctl.timing.done(spec, 0, 2.0)
    ctl.close()


def test_a_card_the_preflight_read_must_be_seen_again() -> None:
    settle = MemorySettle()
    for t in (10.0, 10.5):
        settle.add(0, t, IDLE_MIB)
    assert settle.back_at({0: IDLE_MIB}) and not settle.back_at({0: IDLE_MIB, 1: 300.0}) and not settle.back_at({})


def test_a_drained_cooldown_asks_for_readings_at_once_and_takes_them_as_they_come(tmp_path: Path) -> None:
    """At rest needs a card and a server reading taken since the drain: the samplers read at once (not at
    their next tick, up to 0.5 s on) and the controller takes what they read without the 0.25 s delivery."""
    ctl, monitor = _controller(tmp_path)
    ctl.spec = PhaseSpec("cooldown", 0, "cooldown", 4.0, 15.0)
    assert not ctl.timing.cooldown_over(100.0, 0.2, 3) and monitor.asked_soon == 0  # users still stopping
    assert not ctl.timing.cooldown_over(100.3, 0.5, 0)  # drained: nothing read since
    assert monitor.asked_soon == 1 and monitor.delivered == 1
    _feed(ctl, monitor, 100.35, 100.35, IDLE_MIB)
    assert ctl.timing.cooldown_over(100.4, 0.6, 0) and monitor.asked_soon == 1 and monitor.delivered == 2
    ctl.close()
