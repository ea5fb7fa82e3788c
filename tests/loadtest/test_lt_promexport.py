"""/metrics on the master: the collector's series from a real Controller fed rows and samples, and the checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.method.controller import Controller
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from loadtest.views.promexport import RowTally, RunCollector
from runfolder import GpuSample, RequestRow, ServerSample


def _row(i: int, step: int, level: int, latency_ms: float, kind: str = "") -> RequestRow:
    return RequestRow(
        request_id=f"w-{i}", t_start_unix_s=1000.0 + i, step_index=step, phase="step", level=level,
        scenario="fixed", bucket="1000x700", latency_ms=latency_ms, ttft_ms=None,
        status_code=500 if kind else 200, ok=not kind, failure_kind=kind, bytes_sent=1, bytes_received=1,
        cer=None, prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True, worker_id="w",
        error_text="",
    )  # fmt: skip


def _scrape(ctl: Controller, tally: RowTally) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(lambda: (ctl, tally)))
    text = generate_latest(registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_series_carry_the_rows_and_samples_in_base_units(tmp_path: Path) -> None:
    ctl = Controller(RunConfig(), tmp_path, None, broadcast=lambda _tag: None)
    tally = RowTally()
    ctl.row_listeners.append(tally.add)
    ctl.on_rows([_row(i, 3, 4, 100.0 + i) for i in range(1, 101)] + [_row(200, 3, 4, 5.0, "oom")])
    ctl.on_gpu([GpuSample(t_unix_s=1.0, step_index=3, source="dcgm", gpu_index=0, mem_used_mib=2048.0,
                          mem_total_mib=24576.0, mem_reserved_mib=None, util_pct=50.0, proc_mem_mib=None,
                          temp_c=70.0, power_w=250.0)])  # fmt: skip
    ctl.on_server([ServerSample(t_unix_s=1.0, step_index=3, num_requests_running=4.0, num_requests_waiting=2.0,
                                kv_cache_usage_frac=0.5, num_preemptions_total=0.0, kv_cache_size_tokens=None,
                                max_num_seqs=None)])  # fmt: skip
    got = _scrape(ctl, tally)
    assert got["ocrcap_requests_total"] == [({"step": "3", "level": "4"}, 101.0)]
    assert got["ocrcap_request_errors_total"] == [({"step": "3", "level": "4", "kind": "oom"}, 1.0)]
    p95 = dict((labels["quantile"], v) for labels, v in got["ocrcap_step_latency_seconds"])
    assert p95["0.5"] == pytest.approx(0.1505) and p95["0.95"] == pytest.approx(0.19505)
    assert got["ocrcap_gpu_memory_used_bytes"] == [({"gpu": "0"}, 2048.0 * 1024 * 1024)]
    assert got["ocrcap_gpu_utilization_ratio"][0][1] == pytest.approx(0.5)
    assert got["ocrcap_gpu_temperature_celsius"][0][1] == 70.0
    assert got["ocrcap_server_requests_waiting"] == [({}, 2.0)]
    assert "ocrcap_gpu_sm_clock_hertz" not in got  # not read: no series rather than a made-up value


@pytest.mark.parametrize(("fields", "words"), [
    ({"metrics_port": 70000}, "bad METRICS_PORT=70000"),
    ({"metrics_port": 9646, "metrics_host": ""}, "METRICS_HOST is empty"),
])  # fmt: skip
def test_a_bad_metrics_setting_is_one_line(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RunConfig(**fields).checked()  # type: ignore[arg-type]


def test_the_uis_default_metrics_port_taken_gives_a_free_one_quietly() -> None:
    """`ui` serves /metrics on 9646 by default; another process there must not cost the user /metrics."""
    import socket
    import urllib.request

    from loadtest.views import promexport

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = RunConfig(metrics_host="127.0.0.1")
        env = object()
        try:
            served = promexport.start_metrics(env, cfg, port, or_free=True)
            assert served and served != port
            with urllib.request.urlopen(f"http://127.0.0.1:{served}/metrics", timeout=5) as reply:
                assert reply.status == 200
            with pytest.raises(ConfigError, match=f"METRICS_PORT={port} on 127.0.0.1: .*pick a free port"):
                promexport.start_metrics(object(), cfg, port)  # a port the user named must be free
        finally:
            server, thread = promexport._servers.pop(id(env))
            server.shutdown()
            thread.join(timeout=5)
