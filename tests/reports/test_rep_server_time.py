"""The report says which latency each figure is, and shows the server's own time beside the round trip."""

from __future__ import annotations

from rep_fixtures import build_run

from reports import render_report


def test_without_a_server_time_the_report_says_only_the_round_trip_was_measured() -> None:
    run = build_run()
    html = render_report(run.summary, run.frames())
    assert "client&#39;s round trip" in html or "client's round trip" in html
    assert "reported no time of its own" in html and 'class="split"' not in html


def test_the_split_shows_both_percentiles_and_the_difference() -> None:
    run = build_run()
    summary = {**run.summary, "latency_split": [
        {"step_index": 3, "level": 4, "client_p50_ms": 120.0, "client_p95_ms": 200.0, "server_p50_ms": 80.0,
         "server_p95_ms": 150.0, "outside_server_p95_ms": 50.0, "source": "answers"},
    ]}  # fmt: skip
    html = render_report(summary, run.frames())
    assert 'class="split"' in html and "reported no time of its own" not in html
    row = html.split('class="split"', 1)[1].split("</tbody>", 1)[0]
    for figure in ("120", "80.0", "200", "150", "50.0"):  # the ms filter keeps a decimal under 100
        assert f">{figure} ms<" in row, row
    assert "outside the server" in html and "its answers" in row


def test_a_bound_stands_where_the_histogram_gives_no_figure_in_the_split_and_the_step_table() -> None:
    run = build_run()
    steps = [dict(s) for s in run.summary["steps"]]
    coarse = {"server_p50_ms": None, "server_p95_ms": None, "server_p50_le_ms": 300.0, "server_p95_le_ms": 300.0,
              "server_time_source": "vllm histogram", "vllm_e2e_p95_ms": 285.0}  # fmt: skip
    steps = [{**s, **coarse} if s.get("phase") == "step" else s for s in steps]
    summary = {**run.summary, "steps": steps, "latency_split": [
        {"step_index": 3, "level": 4, "client_p50_ms": 120.0, "client_p95_ms": 160.0, "server_p50_ms": None,
         "server_p95_ms": None, "server_p50_le_ms": 300.0, "server_p95_le_ms": 300.0,
         "outside_server_p95_ms": None, "source": "vllm histogram", "coarse": True},
    ]}  # fmt: skip
    html = render_report(summary, run.frames())
    split = html.split('class="split"', 1)[1].split("</tbody>", 1)[0]
    assert split.count("≤ 300 ms") == 2 and "285" not in split and "coarser than the latency" in split
    table = html.split('class="steps"', 1)[1].split("</table>", 1)[0]
    assert "server P95" in table and "≤ 300 ms" in table and "285" not in table
