"""The run's live metrics for Prometheus: `/metrics` on the master (prometheus_client), off unless METRICS_PORT.

Beside the DCGM exporter's and the server's own series, a dashboard or alert then sees what the load test
is doing: which phase and level, and what the suite measures at it. Names follow Prometheus' conventions
(prefix `ocrcap_`, base units, `_total` counters); `step` and `level` labels are the run folder's.

ocrcap_run_info{run_id}                        1 while this master serves a run
ocrcap_phase{phase}                            1 for the current phase (idle/warmup/baseline/step/cooldown)
ocrcap_run_finished                            1 once the plan ended
ocrcap_step_index, ocrcap_level_users          the current step and the users the plan asks for
ocrcap_requests_total{step,level}              requests whose rows reached the master (every attempt)
ocrcap_request_errors_total{step,level,kind}   failed requests by failure kind (loadtest.traffic.failures)
ocrcap_step_throughput_requests_per_second{step,level}  ok answers per second of a measured step: a closed
                                               step's figure (the web panel's), the current one's so far
ocrcap_step_latency_seconds{step,level,quantile}  P50 (0.5) and P95 (0.95) of the step's ok answers so far
ocrcap_step_server_latency_seconds{...}        the same over the server's own time, where it reports one
ocrcap_gpu_memory_used_bytes{gpu}, ocrcap_gpu_memory_total_bytes, ocrcap_gpu_utilization_ratio (0..1),
ocrcap_gpu_temperature_celsius, ocrcap_gpu_power_watts, ocrcap_gpu_sm_clock_hertz,
ocrcap_gpu_throttle_reasons                    the server's card, as last sampled (NVML's bitmask)
ocrcap_server_requests_running, ocrcap_server_requests_waiting, ocrcap_server_kv_cache_usage_ratio
A collector reads the controller at each scrape (no global registry): the numbers are the panel's.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from analysis.common.stats import percentile
from loadtest.method.controller import MEASURED, Controller
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from runfolder import Phase, RequestRow

MIB = 1024 * 1024
UI_METRICS_PORT = 9646  # `ui` serves /metrics here unless METRICS_PORT names another port
_QUANTILES = (("0.5", 50.0), ("0.95", 95.0))


@dataclass
class StepTally:
    """Running totals of one step's request rows."""

    level: int
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ok_latency_ms: array = field(default_factory=lambda: array("d"))
    server_ms: array = field(default_factory=lambda: array("d"))


class RowTally:
    """Rows as they reach the master, per step: what the scrape's counters and quantiles read."""

    def __init__(self) -> None:
        self.steps: defaultdict[int, StepTally] = defaultdict(lambda: StepTally(level=0))

    def add(self, rows: list[RequestRow]) -> None:
        for row in rows:
            tally = self.steps[row.step_index]
            tally.level = row.level
            tally.requests += 1
            if row.ok:
                tally.ok_latency_ms.append(row.latency_ms)
                server_ms = getattr(row, "server_time_ms", None)
                if server_ms is not None and math.isfinite(server_ms):
                    tally.server_ms.append(server_ms)
            elif row.failure_kind:
                tally.errors[row.failure_kind] += 1


def _gauge(name: str, doc: str, labels: list[str], values: list[tuple[list[str], float | None]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for label_values, value in values:
        if value is not None and math.isfinite(value):
            family.add_metric(label_values, float(value))
    return family


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


class RunCollector(Collector):
    """Collects from the controller `current()` returns (None before the first tick) and its tally."""

    def __init__(self, current: Callable[[], tuple[Controller, RowTally] | None]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        got = self.current()
        if got is None:
            yield _gauge("ocrcap_run_finished", "1 once the plan ended", [], [])
            return
        ctl, tally = got
        yield from self._state(ctl)
        yield from self._steps(ctl, tally)
        yield from self._gpu(ctl)
        server = ctl.last_server
        get = (lambda name: getattr(server, name)) if server else (lambda name: None)
        yield _gauge("ocrcap_server_requests_running", "requests the server runs now (its /metrics)", [],
                     [([], get("num_requests_running"))])  # fmt: skip
        yield _gauge("ocrcap_server_requests_waiting", "requests waiting in the server's queue (its /metrics)", [],
                     [([], get("num_requests_waiting"))])  # fmt: skip
        yield _gauge("ocrcap_server_kv_cache_usage_ratio", "vLLM KV-cache usage, 0..1", [],
                     [([], get("kv_cache_usage_frac"))])  # fmt: skip

    def _state(self, ctl: Controller) -> Iterator[Metric]:
        spec = ctl.spec
        yield _gauge("ocrcap_run_info", "the run this master serves", ["run_id"], [([ctl.run_dir.name], 1.0)])
        yield _gauge("ocrcap_phase", "1 for the plan's current phase", ["phase"],
                     [([str(p)], 1.0 if spec and spec.phase == p else 0.0) for p in Phase])  # fmt: skip
        yield _gauge("ocrcap_run_finished", "1 once the plan ended", [], [([], 1.0 if ctl.finished else 0.0)])
        yield _gauge("ocrcap_step_index", "the plan's current step", [], [([], float(ctl.step_index))])
        yield _gauge("ocrcap_level_users", "users the plan asks for now", [], [([], float(spec.level if spec else 0))])

    def _steps(self, ctl: Controller, tally: RowTally) -> Iterator[Metric]:
        requests = CounterMetricFamily("ocrcap_requests", "requests whose rows reached the master", labels=["step", "level"])
        errors = CounterMetricFamily("ocrcap_request_errors", "failed requests by kind", labels=["step", "level", "kind"])
        latency: list[tuple[list[str], float | None]] = []
        server: list[tuple[list[str], float | None]] = []
        for index, t in sorted(tally.steps.items()):
            labels = [str(index), str(t.level)]
            requests.add_metric(labels, t.requests)
            for kind, count in sorted(t.errors.items()):
                errors.add_metric([*labels, kind], count)
            ok_ms, server_ms = np.array(t.ok_latency_ms), np.array(t.server_ms)  # copies: add() may grow them
            for quantile, q in _QUANTILES:  # the step table's own percentiles (analysis.common.stats)
                if ok_ms.size:
                    latency.append(([*labels, quantile], percentile(ok_ms, q) / 1000.0))
                if server_ms.size:
                    server.append(([*labels, quantile], percentile(server_ms, q) / 1000.0))
        yield requests
        yield errors
        yield _gauge("ocrcap_step_latency_seconds", "client round trip of the step's ok answers so far",
                     ["step", "level", "quantile"], latency)  # fmt: skip
        yield _gauge("ocrcap_step_server_latency_seconds", "the server's own time of the step's ok answers so far",
                     ["step", "level", "quantile"], server)  # fmt: skip
        yield _gauge("ocrcap_step_throughput_requests_per_second", "ok answers per second of a measured step",
                     ["step", "level"], _throughputs(ctl))  # fmt: skip

    def _gpu(self, ctl: Controller) -> Iterator[Metric]:
        gpu = ctl.last_gpu
        labels = [str(gpu.gpu_index)] if gpu else []
        read: Callable[[str], Any] = (lambda name: getattr(gpu, name, None)) if gpu else (lambda name: None)

        def one(name: str, doc: str, value: float | None) -> Metric:
            return _gauge(name, doc, ["gpu"], [(labels, value)] if gpu else [])

        yield one("ocrcap_gpu_memory_used_bytes", "device memory used", _scaled(read("mem_used_mib"), MIB))
        yield one("ocrcap_gpu_memory_total_bytes", "device memory", _scaled(read("mem_total_mib"), MIB))
        yield one("ocrcap_gpu_utilization_ratio", "GPU utilisation, 0..1", _scaled(read("util_pct"), 0.01))
        yield one("ocrcap_gpu_temperature_celsius", "GPU temperature", read("temp_c"))
        yield one("ocrcap_gpu_power_watts", "board power", read("power_w"))
        yield one("ocrcap_gpu_sm_clock_hertz", "SM clock", _scaled(read("sm_clock_mhz"), 1e6))
        throttle = read("throttle_reasons")
        yield one("ocrcap_gpu_throttle_reasons", "NVML clock throttle reasons bitmask",
                  None if throttle is None else float(throttle))  # fmt: skip


def _throughputs(ctl: Controller) -> list[tuple[list[str], float | None]]:
    out = [([str(r["step_index"]), str(r["level"])], r.get("throughput_rps")) for r in list(ctl.completed)]
    spec = ctl.spec
    if spec is not None and spec.phase in MEASURED and not ctl.finished:
        rps = ctl.live.throughput_rps(ctl.step_index, ctl.phase_start, ctl.clock())
        out.append(([str(ctl.step_index), str(spec.level)], rps))
    return out


_runs: dict[int, tuple[Controller, RowTally]] = {}
_servers: dict[int, Any] = {}


def track(environment: Any, ctl: Controller) -> None:
    """The controller a master's /metrics shows: the running run (or the last one), with a fresh tally."""
    tally = RowTally()
    ctl.row_listeners.append(tally.add)
    _runs[id(environment)] = (ctl, tally)


def start_metrics(environment: Any, cfg: RunConfig, port: int | None = None, or_free: bool = False) -> int | None:
    """Serve /metrics for `environment`'s runs on cfg.metrics_host:(port or cfg.metrics_port); the port served,
    None when off (port 0). Once per environment (a second call returns the first port). The `ui` command
    calls it with its own default port, `or_free`: a free port when that one is taken (another `ui`, another
    exporter); headless runs only with METRICS_PORT, which must be free."""
    key = id(environment)
    if key in _servers:
        return int(_servers[key][0].server_port)
    chosen = cfg.metrics_port if port is None else port
    if not chosen:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(lambda: _runs.get(key)))
    try:
        _servers[key] = start_http_server(chosen, cfg.metrics_host, registry=registry)
    except OSError as exc:
        if or_free:
            _servers[key] = start_http_server(0, cfg.metrics_host, registry=registry)
            return int(_servers[key][0].server_port)
        raise ConfigError(f"METRICS_PORT={chosen} on {cfg.metrics_host}: {exc.strerror or exc}; pick a free port") from None
    return int(_servers[key][0].server_port)
