"""render_report on synthetic runs: the verdict, the charts, the banners, and escaping."""

from __future__ import annotations

import math
import re

import pandas as pd
from rep_fixtures import build_run

from reports import ReportFrames, build_charts, render_report

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _imgs(html: str) -> list[str]:
    return re.findall(r'<img src="(data:image/png;base64,[A-Za-z0-9+/=]+)"', html)


def test_full_run_puts_the_verdict_config_and_every_chart_in_the_page() -> None:
    run = build_run()
    html = render_report(run.summary, run.frames())
    assert re.search(r'id="recommended-level">6<', html)
    assert "max_concurrency: 6" in html and "retry_after_s: 2" in html
    assert "the knee is at 8, so 6 is the recommended level" in html
    assert "floor((24,576 MiB × 0.7 − 9,000 MiB) / 1,000 MiB) = 8" in html
    assert "estimate predicted 15,000 MiB" in html
    keys = re.findall(r'id="chart-(\w+)"', html)
    assert keys == ["latency", "throughput", "memory", "utilisation", "errors", "timeline"]
    assert len(_imgs(html)) == len(keys)
    assert "chart-note" not in html
    assert 'id="banner-partial"' not in html and 'id="banner-nogpu"' not in html
    assert '<tr class="knee">' in html and '<tr class="rec">' in html


def test_page_is_self_contained() -> None:
    run = build_run(scenario="mixed")
    html = render_report(run.summary, run.frames())
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "@import" not in html and "url(" not in html
    assert "<link" not in html
    # Only our own copy-button script; every src is a data: URI.
    assert html.count("<script") == 1
    assert all(s.startswith("data:") for s in re.findall(r'src="([^"]*)"', html))
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert "summary.json" in hrefs and "steps.csv" in hrefs
    assert all(h.startswith("#") or "/" not in h for h in hrefs)


def test_no_gpu_partial_run_renders_banners_and_notes() -> None:
    run = build_run(gpu=False, complete=False)
    html = render_report(run.summary, run.frames())
    assert 'id="banner-partial"' in html
    assert "steps after 6 (run stopped): levels 8, 10" in html
    assert 'id="banner-nogpu"' in html
    assert "the sampler sidecar at http://gpu-box:9400 was unreachable." in html
    memory = html.split('id="chart-memory"')[1].split("</figure>")[0]
    assert "chart-note" in memory and "No GPU data in this run" in memory
    timeline = html.split('id="chart-timeline"')[1].split("</figure>")[0]
    assert "chart-note" in timeline
    assert "not reached" in html  # no knee among 2, 4, 6


def test_a_run_stopped_by_the_user_says_so_in_the_partial_banner() -> None:
    run = build_run(complete=False)
    why = "stopped by the user at load 3 of 5: step (6 users), with Locust's STOP"
    summary = {**run.summary, "events": [*run.summary.get("events", []),
                                         {"t_unix_s": 1.0, "step_index": 9, "kind": "user_stop", "message": why}]}  # fmt: skip
    html = render_report(summary, run.frames())
    banner = html.split('id="banner-partial"')[1].split("</div>")[0]
    assert "It was stopped by the user at load 3 of 5: step (6 users), with Locust&#39;s STOP." in banner
    text = re.sub(r"<[^>]+>", "", banner.replace("<br>", "\n"))  # as a person reads it: "…STOP." apart from "Missing:"
    assert "<br>Missing:" in banner and "STOP.Missing" not in text
    assert "stopped-by-user" not in render_report(run.summary, run.frames())


def test_untrusted_strings_are_escaped_everywhere() -> None:
    run = build_run(evil=EVIL)
    html = render_report(run.summary, run.frames())
    assert EVIL not in html
    assert html.count("<script") == 1
    assert "onerror=alert(1)>" not in html
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    assert escaped in html.split('id="run"')[1]  # manifest strings and event messages
    failures = html.split("What the failures said")[1].split("</table>")[0]
    assert escaped in failures  # error_text of failed requests


def test_mixed_and_soak_add_their_charts() -> None:
    mixed = build_run(scenario="mixed")
    keys = re.findall(r'id="chart-(\w+)"', render_report(mixed.summary, mixed.frames()))
    assert "buckets" in keys and "soak" not in keys
    soak = build_run(scenario="soak")
    charts = build_charts(soak.summary, soak.frames())
    by_key = {c.key: c for c in charts}
    assert by_key["soak"].image_uri and "creeping" in by_key["soak"].caption
    assert "the card is full 60 h after" in by_key["soak"].caption and "error rate" in by_key["soak"].caption
    assert "buckets" not in by_key


def test_empty_summary_and_frames_render_with_notes() -> None:
    html = render_report({}, ReportFrames())
    assert "no recommendation" in html
    assert len(_imgs(html)) == 0
    assert html.count("chart-note") == 6
    assert "No measured steps." in html


def test_nan_and_missing_values_do_not_crash() -> None:
    run = build_run()
    summary = dict(run.summary)
    steps = [dict(s) for s in summary["steps"]]
    for s in steps:
        s["p99_ms"] = math.nan
        s["gpu_util_peak_pct"] = None
        s.pop("kv_cache_peak_frac")
    steps[-1]["level"] = math.nan
    summary["steps"] = steps
    summary["knee"] = None
    summary["estimate"] = {"dimension": "none", "estimate": None, "reason": "single request too small"}
    frames = ReportFrames(plan=run.frames().plan, gpu=pd.DataFrame({"t_unix_s": ["bad", None]}))
    html = render_report(summary, frames)
    assert re.search(r'id="recommended-level">6<', html)
    assert "single request too small" in html
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)


def test_vllm_run_shows_the_kv_cache_dimension() -> None:
    run = build_run()
    summary = dict(run.summary)
    summary["server_kind"] = "vllm"
    summary["estimate"] = {
        "dimension": "kv_cache",
        "estimate": 9,
        "headroom": 0.7,
        "kv_cache_size_tokens": 20_000,
        "tokens_per_request": 1_500,
        "reason": "NVML memory is flat (preallocated): KV cache used instead",
    }
    summary["steps"] = [{**s, "kv_cache_peak_frac": s["level"] / 12} for s in summary["steps"]]
    summary["config"] = {"vllm": {"max_num_seqs": 6}}
    html = render_report(summary, run.frames())
    assert "<code>--max-num-seqs</code>" in html
    assert "floor(20,000 tokens × 0.7 / 1,500 tokens per request) = 9" in html
    assert 'id="chart-kv_cache"' in html and "max_num_seqs: 6" in html
    assert "<th>KV peak</th>" in html and "83%" in html  # level 10 of 12


def test_the_answer_shows_its_interval_a_lower_bound_and_an_answer_check_turned_off() -> None:
    run = build_run()
    summary = dict(run.summary)
    summary["knee"] = {**summary["knee"], "confidence": [5, 7], "narrow_hint": "a longer measured window (STEP_S)"}
    html = render_report(summary, run.frames())
    assert re.search(r'id="confidence"><b>5–7 at 95%</b>: a longer measured window \(STEP_S\)', html)
    assert 'id="at-least"' not in html and 'id="answer-check-off"' not in html
    summary["knee"] = {**summary["knee"], "confidence": [6, 6], "narrow_hint": ""}  # as the panel shows it
    assert 'id="confidence"><b>6–6 at 95%</b>' in render_report(summary, run.frames())
    summary["knee"] = {**summary["knee"], "found": False, "at_least": True, "confidence": None}
    summary["manifest"] = {**summary["manifest"], "answer_check": {"enabled": False, "why": "the first answer holds no text"}}
    html = render_report(summary, run.frames())
    assert re.search(r'id="recommended-level">≥ 6<', html) and 'id="at-least"' in html
    assert re.search(r'id="answer-check-off">Answer check off: the first answer holds no text', html)


def test_rows_only_a_worker_holds_are_one_line_and_absent_when_none() -> None:
    run = build_run()
    summary = dict(run.summary)
    assert 'id="rows-only-on-workers"' not in render_report(summary, run.frames())
    summary["rows_only_on_workers"] = {"w1a2b3c4d": 8}
    summary["workers_without_final_count"] = ["w9f8e7d6c"]
    html = render_report(summary, run.frames())
    line = re.search(r'id="rows-only-on-workers">(.*?)</p>', html)
    assert line is not None
    assert "worker w1a2b3c4d holds 8 rows the master never received" in line.group(1)
    assert "worker w9f8e7d6c was lost before its final count" in line.group(1) and "merge-rows" in line.group(1)


def test_a_preallocating_engines_formula_names_its_bounds_not_the_kv_arithmetic() -> None:
    from reports.render import estimate_formula

    estimate = {"dimension": "kv_cache", "estimate": 19, "kv_cache_size_tokens": 576000.0, "tokens_per_request": 1009.0,
                "headroom": 1.0, "binding": "activation_memory",
                "bounds": [{"name": "kv_cache", "requests": 570, "formula": "floor(576000 / 1009) = 570"},
                           {"name": "activation_memory", "requests": 19, "formula": "floor(2458 / 126) = 19"}]}  # fmt: skip
    text = estimate_formula(estimate)
    assert text.startswith("min(kv cache 570, activation memory 19) = 19") and "binding: activation memory" in text


def test_an_estimate_from_the_memory_above_idle_shows_its_margin_not_the_headroom() -> None:
    from reports.render import estimate_formula

    estimate = {"dimension": "gpu_memory", "estimate": 12, "total_mib": 24576.0, "idle_mib": 22118.0,
                "increment_mib": 180.0, "headroom": 0.7, "above_idle_margin": 0.9}  # fmt: skip
    text = estimate_formula(estimate)
    assert text.startswith("floor((24,576 MiB − 22,118 MiB idle) × 0.9 / 180 MiB) = 12"), text
    plain = estimate_formula({**estimate, "above_idle_margin": None, "idle_mib": 6000.0, "estimate": 62})
    assert plain.startswith("floor((24,576 MiB × 0.7 − 6,000 MiB) / 180 MiB) = 62"), plain


def test_a_mixed_runs_step_table_shows_the_odds_of_running_out() -> None:
    from reports.render import shown_columns

    assert "oom_odds" in shown_columns([{"oom_odds": 0.0005}, {"oom_odds": None}])
    assert "oom_odds" not in shown_columns([{"level": 4}])
