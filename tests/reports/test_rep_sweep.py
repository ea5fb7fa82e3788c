"""The sweep report (reports/sweep.py) on a sweep folder made of real run folders.

Once per module, two short real runs (`python -m loadtest run`, levels 1,2,4,8, no refinement) against the
simulator's oom-first-24g profile (memory for 6 pages at once) behind its gateway, as the two settings of a
sweep of the gateway's semaphore: `gateway_slots=2` never lets more than 2 requests reach the model (no
OOM), `gateway_slots=8` lets 8 in and OOMs from 7 on. A third setting failed (its server never became
healthy; its output holds markup that must stay text) and a fourth is not run yet. The pick must be the
OOM-free setting although the other served more, every file above the settings must be written, and the
page must show the pick, the table and links that open each setting's own report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

import analysis
from loadtest.launch.run import start_simulator
from loadtest.method.child import stop_process
from reports import ReportError
from reports.__main__ import main as reports_main
from reports.sweep import write_sweep
from runfolder import GATEWAY_FILE

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
from pages import CHROMIUM_ARGS, collect_errors  # noqa: E402
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

RUN_TIMEOUT_S = 150.0
EVIL = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'
SETTINGS = [
    {"setting": "gateway_slots=2", "values": {"gateway_slots": "2"}, "dir": "gateway_slots-2"},
    {"setting": "gateway_slots=8", "values": {"gateway_slots": "8"}, "dir": "gateway_slots-8"},
    {"setting": "gateway_slots=0", "values": {"gateway_slots": "0"}, "dir": "gateway_slots-0"},
    {"setting": "gateway_slots=16", "values": {"gateway_slots": "16"}, "dir": "gateway_slots-16"},
]


def _short_run(slots: str, out: Path) -> Path:
    """One setting's run folder: a simulator behind a gateway of `slots`, a short real run, both stopped."""
    sim, url, dcgm = start_simulator(
        "oom-first-24g",
        ["--time-scale", "0.25", "--gateway-slots", slots, "--gateway-queue", "64", "--gateway-wait-s", "60"],
    )
    args = ["run", "--host", url, "--gpu", f"dcgm:{dcgm}", "--server-metrics", f"{url}/metrics", "--out", str(out),
            "--workers", "0", "--levels", "1,2,4,8", "--refine", "0", "--verify", "false", "--step-s", "3", "--warmup-s", "1",
            "--idle-s", "1", "--cooldown-s", "2", "--baseline-rounds", "1", "--baseline-round-requests", "5"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "loadtest", *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"the run timed out:\n{output[-3000:]}") from None
    finally:
        stop_process(sim)
    folders = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    assert proc.returncode == 0 and len(folders) == 1, output[-3000:]
    return folders[0]


def _setting_json(entry: dict[str, Any], status: str, why: str = "", tail: list[str] | None = None) -> str:
    return json.dumps({"setting": entry["setting"], "values": entry["values"], "target": "", "status": status,
                       "why": why, "server_output_tail": tail or [], "started_unix_s": 1.0, "ended_unix_s": 2.0})  # fmt: skip


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep folder as the sweep command leaves it: sweep.json, two real settings, a failed, a pending one."""
    root = tmp_path_factory.mktemp("sweep")
    sweep = root / "sweep-20261201-120000"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"keys": ["gateway_slots"], "server_cmd": "", "targets": {},
                                                  "slo_p95_s": 0.0, "started_unix_s": 1.0, "settings": SETTINGS}))  # fmt: skip
    for entry in SETTINGS[:2]:
        run = _short_run(entry["values"]["gateway_slots"], root / f"runs-{entry['dir']}")
        shutil.move(str(run), str(sweep / entry["dir"]))
        (sweep / entry["dir"] / "setting.json").write_text(_setting_json(entry, "ok"))
    failed = sweep / SETTINGS[2]["dir"]
    failed.mkdir()
    why = "the server never answered 200 on http://127.0.0.1:9/health within 600 s"
    (failed / "setting.json").write_text(_setting_json(SETTINGS[2], "failed", why, ["loading model", EVIL]))
    return sweep


@pytest.mark.slow  # two real runs (~80 s); test_it_sweep renders a real sweep in make test
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_the_oom_free_setting_is_picked_from_real_runs(sweep_dir: Path) -> None:
    html = write_sweep(sweep_dir)
    assert html == sweep_dir / "sweep.html" and html.is_file()
    table = pd.read_csv(sweep_dir / "sweep.csv", dtype={"gateway_slots": str})
    assert table["setting"].tolist() == [s["setting"] for s in SETTINGS]
    assert table["status"].tolist() == ["ok", "ok", "failed", "pending"]
    two, eight = table.iloc[0], table.iloc[1]
    shown = table.drop(columns=["why", "remark"]).to_string()
    assert two["oom_count"] == 0 and eight["oom_count"] > 0, shown
    assert eight["oom_rate"] == pytest.approx(eight["oom_count"] / eight["requests"])
    assert eight["plateau_rps"] > two["plateau_rps"], shown  # the other served more, and OOMed
    assert table["pick"].tolist() == [True, False, False, False]
    assert 0 < two["peak_mem_share"] < 1 and two["gpu_util_mean"] > 0 and two["p95_ms_at_rec"] > 0
    assert two["recommended_level"] >= 1 and two["estimate"] >= 1
    assert str(eight["remark"]).startswith("OOMs in ")
    assert table.loc[2, "remark"].startswith("failed: the server never answered")
    assert pd.isna(table.loc[0, "preemptions"])  # a PyTorch-style server exports no preemption counter


@pytest.mark.slow  # two real runs (~80 s); test_it_sweep renders a real sweep in make test
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_the_config_is_the_picks_own_plus_the_swept_gateway(sweep_dir: Path) -> None:
    write_sweep(sweep_dir)
    text = (sweep_dir / "recommended-config.yaml").read_text()
    config = yaml.safe_load(text)
    own = yaml.safe_load((sweep_dir / "gateway_slots-2" / "recommended-config.yaml").read_text())
    assert config["server"] == own["server"]
    assert config["gateway"] == {"semaphore": 2} and config["sweep_values"] == {"gateway_slots": 2}
    assert config["picked"] == "gateway_slots=2"
    assert text.startswith("# Sweep sweep-20261201-120000: picked gateway_slots=2")
    # the pick's water marks beside it: its own alert rules
    alerts = (sweep_dir / "alerts.yaml").read_text()
    assert alerts == (sweep_dir / "gateway_slots-2" / "alerts.yaml").read_text() and "groups:" in alerts


@pytest.mark.slow  # two real runs (~80 s); test_it_sweep renders a real sweep in make test
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_a_sweep_with_nothing_picked_says_so_in_the_config(sweep_dir: Path, tmp_path: Path) -> None:
    write_sweep(sweep_dir)
    only_ooms = tmp_path / "sweep-oom"
    only_ooms.mkdir()
    shutil.copytree(sweep_dir / "gateway_slots-8", only_ooms / "gateway_slots-8")
    # no sweep.json: a folder of settings (the sweep was stopped before writing it) is read from setting.json;
    # no summary.json (stopped before its analysis): the analysis runs in memory on the raw files
    (only_ooms / "gateway_slots-8" / "summary.json").unlink()
    write_sweep(only_ooms)
    assert not (only_ooms / "gateway_slots-8" / "summary.json").exists()  # reads only, writes above
    row = pd.read_csv(only_ooms / "sweep.csv").iloc[0]
    full = pd.read_csv(sweep_dir / "sweep.csv").iloc[1]
    measured = ["plateau_rps", "p95_ms_at_rec", "oom_count", "peak_mem_share", "gpu_util_mean", "estimate"]
    assert row[measured].tolist() == full[measured].tolist()
    config = yaml.safe_load((only_ooms / "recommended-config.yaml").read_text())
    assert config == {"picked": None}
    assert not (only_ooms / "alerts.yaml").exists()  # no pick, no water marks to watch
    text = (only_ooms / "recommended-config.yaml").read_text()
    assert "no setting picked, so no config to paste. The closest was gateway_slots=8." in text
    assert pd.read_csv(only_ooms / "sweep.csv")["pick"].tolist() == [False]


def test_the_cli_writes_the_sweep_and_refuses_a_folder_that_is_none(tmp_path: Path, capsys: Any) -> None:
    assert reports_main(["sweep", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("reports: ") and "not a sweep folder" in err and "\n" not in err
    with pytest.raises(ReportError, match="no sweep folder"):
        write_sweep(tmp_path / "absent")
    (tmp_path / "sweep.json").write_text("{torn")
    assert reports_main(["sweep", str(tmp_path)]) == 2
    assert "sweep.json: not a JSON object" in capsys.readouterr().err


def test_damaged_settings_are_failed_with_a_line_and_the_rest_still_reported(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep-damaged"
    torn, garbled = sweep / "a-1", sweep / "a-2"
    torn.mkdir(parents=True)
    garbled.mkdir()
    (torn / "setting.json").write_text('{"setting": "a=1", "stat')  # the sweep was killed mid-write
    (garbled / "setting.json").write_text(_setting_json({"setting": "a=2", "values": {"a": "2"}}, "ok"))
    (garbled / "requests.csv").write_text("not,the,header\n1,2,3\n")
    write_sweep(sweep)
    table = pd.read_csv(sweep / "sweep.csv")
    assert table["status"].tolist() == ["failed", "failed"]
    assert table.loc[0, "why"] == "setting.json is unreadable"
    assert (
        table.loc[1, "why"].startswith("its run folder cannot be read: ")
        and "missing column" in table.loc[1, "why"]
    )
    assert yaml.safe_load((sweep / "recommended-config.yaml").read_text()) == {"picked": None}


@pytest.mark.slow  # two real runs (~80 s); test_it_sweep renders a real sweep in make test
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_the_cli_prints_the_report_path(sweep_dir: Path, capsys: Any) -> None:
    assert reports_main(["sweep", str(sweep_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {sweep_dir / 'sweep.html'}"


@pytest.mark.slow  # two real runs (~80 s); test_it_sweep renders a real sweep in make test
@pytest.mark.browser
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_the_page_shows_the_pick_the_table_and_working_links(sweep_dir: Path, chromium: Path) -> None:
    from playwright.sync_api import sync_playwright

    html = write_sweep(sweep_dir)
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors = collect_errors(page)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html.as_uri(), wait_until="load", timeout=30_000)
            picked = page.locator("#pick-setting")
            assert picked.inner_text().strip() == "gateway_slots=2" and picked.is_visible()
            assert picked.bounding_box()["y"] < 800  # type: ignore[index]
            assert "with no OOM" in page.locator("#pick-why").inner_text()
            rows = page.locator("table.sweep tbody tr")
            assert rows.count() == 4
            assert rows.nth(0).get_attribute("class") == "pick" and "failed" in rows.nth(2).inner_text()
            images = page.locator("figure.chart img")
            assert images.count() == 4
            for i in range(4):
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 100")
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert "window.__pwned = 1" in page.locator("#failed pre.tail").inner_text()
            links = page.locator("a.report-link")
            assert links.count() == 2
            for i in range(2):
                href = links.nth(i).get_attribute("href")
                assert href == f"{SETTINGS[i]['dir']}/report.html"
                links.nth(i).click()
                page.wait_for_load_state("load")
                assert page.url == (sweep_dir / str(href)).as_uri()
                assert page.locator("#recommended-level").count() == 1  # the setting's own report opened
                page.go_back(wait_until="load")
        finally:
            browser.close()
    assert errors == []
    others = [u for u in requests if not u.startswith(("data:", "file://"))]
    assert others == [], f"the page made network requests: {others}"


def test_the_picks_haproxy_cfg_sits_beside_the_sweeps_config(tmp_path: Path) -> None:
    """Fast, on synthetic run folders: the pick's own gateway is copied up, headed by which setting it is;
    a pick whose folder has none (its run named no server) leaves none, an older one removed."""
    sweep_dir = tmp_path / "sweep-x"
    settings = []
    for slots, knee in ((2, 6), (4, 4)):
        run = synth_run(sweep_dir / f"slots-{slots}", true_knee=knee, step_s=10.0,
                        extra_manifest={"config": {"host": f"http://127.0.0.1:{8000 + slots}"}})  # fmt: skip
        analysis.write_outputs(run)
        (run / "setting.json").write_text(json.dumps({"status": "ok"}))
        settings.append({"setting": f"slots={slots}", "values": {"slots": str(slots)}, "dir": run.name})
    (sweep_dir / "sweep.json").write_text(json.dumps({"keys": ["slots"], "settings": settings}))
    write_sweep(sweep_dir)
    assert yaml.safe_load((sweep_dir / "recommended-config.yaml").read_text())["picked"] == "slots=2"
    own = (sweep_dir / "slots-2" / GATEWAY_FILE).read_text()
    assert (sweep_dir / GATEWAY_FILE).read_text() == f"# Sweep sweep-x: picked slots=2: its run folder's haproxy.cfg\n{own}"
    (sweep_dir / "slots-2" / GATEWAY_FILE).unlink()
    write_sweep(sweep_dir)
    assert not (sweep_dir / GATEWAY_FILE).exists()


def test_swept_server_flags_replace_the_vllm_args_line_and_its_note() -> None:
    from reports.sweep import _without_vllm_args

    config = {"server": {"max_concurrency": 4, "request_timeout_s": 8, "queue": {"max_size": 5, "wait_timeout_s": 5},
                         "reject_status": 503, "retry_after_s": 3}, "vllm_args": ["--max-num-seqs", 4]}  # fmt: skip
    text = analysis.config_yaml(config, {})
    assert "The server's own flag" in text
    left = _without_vllm_args(text)
    assert "vllm_args" not in left and "The server's own flag" not in left
    assert yaml.safe_load(left) == {"server": config["server"]}
