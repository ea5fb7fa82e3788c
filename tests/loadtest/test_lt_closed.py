"""The report starts once the master has closed the run folder, not once Locust has exited (issue 33: Locust's
quit sleeps 0.5 s per call and is called three times; the demo's report waited ~2.5 s for it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loadtest.launch.run import _wait_master
from loadtest.method.controller import Controller
from loadtest.settings.run_config import RunConfig
from runfolder import CLOSED_KEY, read_manifest, run_closed


def test_the_controller_says_the_run_folder_is_closed_once_its_files_are(tmp_path: Path) -> None:
    ctl = Controller(RunConfig(), tmp_path, None, broadcast=lambda _tag: None, clock=lambda: 1234.5)
    assert not run_closed(tmp_path)  # no manifest yet
    ctl.close()
    assert run_closed(tmp_path) and read_manifest(tmp_path)[CLOSED_KEY] == 1234.5


def test_the_launcher_calls_back_when_the_folder_closes_while_the_master_still_runs(tmp_path: Path) -> None:
    # a stand-in master: closes the run folder (as Controller.close does), then takes 1.5 s more to exit
    script = (
        "import sys, time; from pathlib import Path; from runfolder import write_manifest, CLOSED_KEY;"
        "time.sleep(0.3); write_manifest(Path(sys.argv[1]), {CLOSED_KEY: time.time()}); time.sleep(1.5)"
    )
    master = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=Path(__file__).parents[2])
    called: list[bool] = []
    code = _wait_master(master, tmp_path, lambda: called.append(master.poll() is None))
    assert code == 0 and called == [True]  # once, while the master still ran


def test_a_master_that_never_closes_the_folder_is_waited_for_without_a_call(tmp_path: Path) -> None:
    master = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    called: list[bool] = []
    assert _wait_master(master, tmp_path, lambda: called.append(True)) == 3 and not called
