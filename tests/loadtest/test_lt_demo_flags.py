"""`run` with `demo_run_flags` is the demo against a simulator that is already up (bench/guidellm_compare.py
times ours so, as guidellm is timed): the same settings, the same server, its GPU and metrics."""

from __future__ import annotations

from loadtest.commands import main as cli
from loadtest.commands.run import demo_run_flags
from loadtest.launch.run import config_from_args


def test_run_with_the_demo_flags_is_the_demos_config() -> None:
    url, dcgm = "http://127.0.0.1:8011", "http://127.0.0.1:9411/metrics"
    run = config_from_args(cli.build_parser().parse_args(["run", *demo_run_flags(url, dcgm)]))
    demo_ns = cli.build_parser().parse_args(["demo"])
    demo_ns.ocr_host, demo_ns.ocr_gpu, demo_ns.ocr_server_metrics = url, f"dcgm:{dcgm}", url + "/metrics"  # as cmd_demo
    assert run == config_from_args(demo_ns)
    assert run != config_from_args(cli.build_parser().parse_args(["run", "--host", url]))  # the demo's own phases
