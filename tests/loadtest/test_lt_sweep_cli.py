"""`python -m loadtest sweep`: a sweep that cannot run is one line and exit 2, before any load or folder.

The servers named here are closed loopback ports: a check that reached them would fail differently."""

from __future__ import annotations

import pytest

from loadtest.commands import main as cli
from loadtest.sweep.sweeper import SweepPlan, prepare

HOST = "http://127.0.0.1:9"  # discard port: nothing listens


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ([], "nothing to sweep: give SWEEP="),
        (["--sweep", "max_num_seqs=8,16"], "SWEEP key(s) max_num_seqs are not client settings"),
        (["--sweep", "max_num_seqs=8;rm -rf /"], "bad SWEEP entry 'rm -rf /'"),
        (["--sweep", "max_num_seqs=8,16|sh"], "bad SWEEP value '16|sh' for max_num_seqs"),
        (["--sweep", "max_side=0,5"], "setting max_side=5: bad MAX_SIDE=5"),
        (["--sweep", "max_side=0,big"], "bad SWEEP value 'big' for max_side: give a whole number"),
        (["--sweep", "scenario=fixed,huge"], "setting scenario=huge: unknown SCENARIO='huge'"),
        (["--sweep", "style=json,grpc"], "setting style=grpc: unknown STYLE='grpc'"),
        (["--targets", "a=http://127.0.0.1:9", "--sweep", "max_num_seqs=8"], "TARGETS are servers already running"),
        (["--sweep", "max_num_seqs=8", "--server-cmd", "srv --n {max_num_seqs}"], "SERVER_CMD needs SERVER_HEALTH"),
        (["--sweep", "max_side=0,1024", "--server-health", "http://127.0.0.1:9/health"], "SERVER_HEALTH is for SERVER_CMD"),
        (["--sweep", "max_side=0,1024", "--levels", "4,2,x"], "bad LEVELS='4,2,x'"),
        # a value the server would read as a flag: refused before load by the server control's own rule
        (["--sweep", "max_num_seqs=8,--16", "--server-cmd", "srv --n {max_num_seqs}", "--server-health",
          "http://127.0.0.1:9/health"], "setting max_num_seqs=--16: bad value for {max_num_seqs}"),
    ],
)
def test_a_sweep_that_cannot_run_is_one_line_before_anything(tmp_path, capsys, args, line):
    out = tmp_path / "out"
    assert cli.main(["sweep", "--host", HOST, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and line in err and "\n" not in err, err
    assert not out.exists()  # no sweep folder, no run folder


def test_without_host_or_targets(tmp_path, capsys):
    assert cli.main(["sweep", "--out", str(tmp_path), "--sweep", "max_side=0,1024"]) == 2
    assert "give HOST" in capsys.readouterr().err


def test_server_keys_through_a_sidecar_that_does_not_answer(tmp_path, capsys):
    args = ["sweep", "--host", HOST, "--out", str(tmp_path / "o"), "--gpu", "sidecar:http://127.0.0.1:9",
            "--sweep", "max_num_seqs=8,16"]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "sidecar" in err and "\n" not in err


def test_targets_take_server_metrics_on_their_own_origin(tmp_path):
    ns = cli.build_parser().parse_args(
        ["sweep", "--targets", "a=http://127.0.0.1:9,b=http://127.0.0.2:9", "--server-metrics",
         "http://127.0.0.1:9/metrics", "--sweep", "max_side=0,1024", "--out", str(tmp_path), "--levels", "1,2"]
    )  # fmt: skip
    plan: SweepPlan = prepare(ns)
    assert [c.host for c in plan.configs] == ["http://127.0.0.1:9"] * 2 + ["http://127.0.0.2:9"] * 2
    assert plan.configs[3].server_metrics == "http://127.0.0.2:9/metrics"
    assert [c.max_side for c in plan.configs] == [0, 1024, 0, 1024]
    assert plan.restarter is None


def test_max_num_seqs_reaches_the_plan_of_each_setting(tmp_path):
    ns = cli.build_parser().parse_args(["sweep", "--host", HOST, "--out", str(tmp_path), "--server-cmd",
                                        "true {max_num_seqs}", "--server-health", HOST + "/health",
                                        "--sweep", "max_num_seqs=8,16"])  # fmt: skip
    plan = prepare(ns)
    try:
        assert [c.max_num_seqs for c in plan.configs] == [8, 16]
        assert plan.restarter is not None and plan.restarter.placeholders == ("max_num_seqs",)
    finally:
        plan.restarter.close()


def test_a_max_side_that_changes_no_page_is_warned_before_load(tmp_path, capsys):
    """The default pages are 1000 x 700 px: max_side=1024 would send them as they are, so the sweep says so
    (and goes on); max_side=512 resizes them and is not warned."""
    ns = cli.build_parser().parse_args(["sweep", "--host", HOST, "--out", str(tmp_path), "--sweep",
                                        "max_side=0,512,1024,2048"])  # fmt: skip
    prepare(ns)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "warning: max_side=1024 changes no page (the largest is 1000 px on its longest side): it sends what"
        " max_side=0 sends; give a max_side below 1000 px to measure smaller pages",
        "warning: max_side=2048 changes no page (the largest is 1000 px on its longest side): it sends what"
        " max_side=0 sends; give a max_side below 1000 px to measure smaller pages",
    ]


@pytest.mark.parametrize(("max_side", "warned"), [("1024", True), ("512", False)])
def test_a_single_run_whose_max_side_changes_no_page_is_warned_before_load(tmp_path, capsys, max_side, warned):
    """`make loadtest MAX_SIDE=1024` on 1000 x 700 pages sends them as they are: one warning line before the
    pre-flight (here it then fails at once: nothing listens on HOST), named as the user wrote it."""
    code = cli.main(["run", "--host", HOST, "--out", str(tmp_path), "--max-side", max_side, "--gpu", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err, err  # the pre-flight's one line: no server
    expected = ("warning: MAX_SIDE=1024 changes no page (the largest is 1000 px on its longest side): it sends what"
                " MAX_SIDE=0 sends; give a MAX_SIDE below 1000 px to measure smaller pages")  # fmt: skip
    assert (err[0] == expected) == warned and sum("changes no page" in line for line in err) == int(warned), err
