"""The controller chooses the server's card after the baseline with the analysis's rule: printed with
its evidence, recorded in the manifest, watched alone by the live panel and the cooldown; and it re-states
the estimate when the steps' memory slope disagrees with it. The report takes the same card."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

import analysis
from loadtest.method.controller import Controller
from loadtest.settings.run_config import RunConfig
from runfolder import GpuSample, read_manifest

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))  # the fake runs the analysis tests use
from memory_runs import caching, fake_run, per_request  # noqa: E402


class _FakeMonitor:
    def __init__(self) -> None:
        self.card: int | None = None

    def use_card(self, gpu_index: int | None) -> None:
        self.card = gpu_index

    def latest_mem_used_mib(self) -> float | None:
        return None

    def mark_step(self, step_index: int) -> None:
        pass

    def stop(self) -> None:
        pass


class _Controller(Controller):
    """The real controller on a run in memory (the run folder's reload is the only thing replaced)."""

    def __init__(self, run: analysis.RunData, run_dir: Path, monitor: _FakeMonitor) -> None:
        super().__init__(RunConfig(), run_dir, monitor, broadcast=lambda _tag: None)  # type: ignore[arg-type]
        self.run = run

    def _load(self) -> Any:
        return self.run


def _sample(step: int, card: int, mem_mib: float) -> GpuSample:
    return GpuSample(1.0, step, "nvml", card, mem_mib, 24576.0, None, 50.0, None, None, None)


def test_the_moving_card_is_chosen_recorded_watched_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(per_request(5800.0, 500.0), levels=(), other_card_mib=20000.0)
    monitor = _FakeMonitor()
    ctl = _Controller(run, tmp_path, monitor)
    ctl.on_gpu([_sample(2, 0, 20000.0), _sample(2, 1, 6300.0)])  # before the choice: every card, as before
    assert ctl.gpu_peak_per_step[2] == 20000.0
    ctl.step_index = 3
    ctl._choose_levels()
    out = capsys.readouterr().out
    assert "server's card: card 1 (memory moved +50" in out and "card 0 steady at 20,00" in out
    manifest = read_manifest(tmp_path)
    assert manifest["server_gpu"]["index"] == 1 and monitor.card == 1
    assert ctl.estimate is not None and ctl.estimate["estimate"] == 22  # not "none" from card 0's peak
    assert ctl.idle_mib == pytest.approx(5800.0, abs=5)  # the cooldown's target: card 1's idle
    assert ctl.gpu_peak_per_step[2] == pytest.approx(6300.0, abs=10)  # the baseline's peak re-taken on card 1
    ctl.on_gpu([_sample(4, 0, 20000.0), _sample(4, 1, 7800.0)])
    assert ctl.last_gpu is not None and ctl.last_gpu.gpu_index == 1 and ctl.gpu_peak_per_step[4] == 7800.0
    report = analysis.analyze_run(dataclasses.replace(run, manifest=manifest)).summary
    assert report["server_gpu"]["index"] == 1 and report["estimate"]["estimate"] == ctl.estimate["estimate"]
    ctl.close()


def test_a_step_slope_that_disagrees_restates_the_estimate(tmp_path: Path) -> None:
    run = fake_run(caching(5800.0, 500.0, loaded=3000.0), levels=(2, 4, 8))
    ctl = _Controller(run, tmp_path, _FakeMonitor())
    ctl._choose_levels()
    assert ctl.estimate is not None and ctl.estimate["estimate"] == 3  # one request cannot tell the two apart
    live = analysis.step_table(run).assign(gpu_mem_peak_mib=float("nan"))  # the running totals carry no GPU
    ctl._restate_estimate(live)
    assert ctl.estimate["estimate"] == 16 and ctl.estimate["memory_case"] == "loaded_once_and_caching"
    assert read_manifest(tmp_path)["estimate"]["estimate"] == 16
    ctl._restate_estimate(live)  # agrees now: no second event
    assert list(analysis.load_run(tmp_path).events["kind"]).count("estimate") == 2
    ctl.close()



def test_after_the_choice_another_jobs_moving_card_does_not_hold_the_cooldown(tmp_path: Path) -> None:
    run = fake_run(per_request(5800.0, 500.0), levels=(), other_card_mib=20000.0)
    ctl = _Controller(run, tmp_path, _FakeMonitor())

    def feed() -> None:
        for i in range(20):  # 5 s at zero users: the server's card steady, the other job's card moving
            t = 100.0 + 0.25 * i
            ctl.on_gpu([dataclasses.replace(_sample(ctl.step_index, 0, 20000.0 + 300.0 * (i % 2)), t_unix_s=t),
                        dataclasses.replace(_sample(ctl.step_index, 1, 5900.0), t_unix_s=t)])  # fmt: skip

    ctl.step_index = 3
    feed()
    assert not ctl.settle.stable(5800.0)  # before the choice every card counts, as it always did
    ctl._choose_levels()
    ctl.step_index = 4
    ctl.settle.reset()  # a new phase
    feed()
    assert ctl.settle.stable(5800.0)
    ctl.close()
