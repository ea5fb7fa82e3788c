"""Summaries for the alert rule tests, and per rule the series that put a metric past or below its mark.

The series are written from what each exporter publishes (DCGM exporter per GPU, vLLM per engine,
prometheus-fastapi-instrumentator's grouped status codes), not from the rule's expression, so a rule
that reads the wrong metric or compares the wrong way fails its promtool case.
"""

from __future__ import annotations

import math
from typing import Any

from analysis.written.alerts import AlertRule


def step(level: int, index: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step_index": index, "phase": "step", "level": level, "requests": 400, "rejected": 4, "p95_ms": 800.0,
        "server_p95_ms": 700.0, "gpu_mem_peak_mib": 20_000.0, "kv_cache_peak_frac": 0.6, "preemptions": 0.0,
        "server_waiting_max": 3.0, "errors": {"rejected": 4}, "gpu_temp_c_peak": 71.0, "throttled": 0.0,
        "sm_clock_mhz_mean": 1800.0,
    }  # fmt: skip
    row.update(values)
    return row


def summary(kind: str = "vllm", **rec_values: Any) -> dict[str, Any]:
    """A run with steps at 2, 4 and 8; 4 is recommended (queue.max_size 12)."""
    return {
        "run_id": "20261201-120000-ab12",
        "server_kind": kind,
        "recommended_level": 4,
        "manifest": {"target": {"host": "http://gpu-box:8000"}},
        "config": {"server": {"max_concurrency": 4, "queue": {"max_size": 12, "wait_timeout_s": 2}}},
        "steps": [
            step(2, 3, p95_ms=500.0, sm_clock_mhz_mean=1900.0),
            step(4, 4, **rec_values),
            step(8, 5, p95_ms=3000.0, errors={"oom": 2}, sm_clock_mhz_mean=1500.0, throttled=0.4),
        ],
    }


def soak_summary(kind: str = "vllm") -> dict[str, Any]:
    """`summary` after a soak of level 4 whose memory crept 6,000 MiB/h on a 24,000 MiB card."""
    return {**summary(kind), "soak": {"level": 4, "duration_s": 600.0, "verdict": "creeping", "mem_total_mib": 24_000.0,
                                      "slope_mib_per_h": 6000.0, "slope_low_mib_per_h": 5800.0,
                                      "slope_high_mib_per_h": 6200.0, "hours_to_full": 2.5}}  # fmt: skip


def _counter(per_min: float) -> str:
    return f"0+{per_min:g}x40"


def _gauge(value: float) -> str:
    return f"{value:g}x40"


def series(rule: AlertRule, past: bool, vllm: bool) -> tuple[list[dict[str, str]], dict[str, str]]:
    """(input_series, labels of the firing alert beyond its rule labels) for `rule`, past its mark or below."""
    t = rule.threshold
    name = rule.alert
    gpu = {"gpu": "0", "UUID": "GPU-1", "Hostname": "gpu-box"}
    dcgm = '{gpu="0",UUID="GPU-1",Hostname="gpu-box"}'
    if name == "OcrLatencyP95AboveMark":
        metric = "vllm:e2e_request_latency_seconds_bucket" if vllm else "http_request_duration_seconds_bucket"
        low, high = f"{t / 2:g}", f"{t * 2:g}"  # all answers in (0, t/2] or in (t/2, 2t]
        in_low = 0.0 if past else 10.0
        return [
            {"series": f'{metric}{{le="{low}",model_name="ocr"}}', "values": _counter(in_low)},
            {"series": f'{metric}{{le="{high}",model_name="ocr"}}', "values": _counter(10)},
            {"series": f'{metric}{{le="+Inf",model_name="ocr"}}', "values": _counter(10)},
        ], {}
    if name == "OcrGpuMemoryAboveMark":
        return [{"series": f"DCGM_FI_DEV_FB_USED{dcgm}", "values": _gauge(t + 1 if past else t)}], {"gpu": "0"}
    if name == "OcrKvCacheAboveMark":
        v = t + 0.01 if past else t - 0.01
        return [{"series": 'vllm:kv_cache_usage_perc{engine="0",model_name="ocr"}', "values": _gauge(v)}], {}
    if name == "OcrServerErrors":
        return [
            {"series": 'http_requests_total{handler="/ocr",status="2xx"}', "values": _counter(50)},
            {"series": 'http_requests_total{handler="/ocr",status="5xx"}', "values": _counter(1 if past else 0)},
        ], {}
    if name == "OcrKvCachePreempting":
        return [{"series": 'vllm:num_preemptions_total{engine="0"}', "values": _counter(1 if past else 0)}], {}
    if name == "OcrQueueDeeperThanConfig":
        v = t + 1 if past else t
        return [{"series": 'vllm:num_requests_waiting{engine="0",model_name="ocr"}', "values": _gauge(v)}], {}
    if name == "OcrRejectionRate":
        share = t * 2 if past else t / 2
        away, done = 1000 * share, 1000 * (1 - share)  # per minute, rejections among all requests
        if vllm:
            return [
                {"series": 'vllm:admission_rejections_total{engine="0"}', "values": _counter(away)},
                {"series": 'vllm:e2e_request_latency_seconds_count{engine="0"}', "values": _counter(done)},
            ], {}
        return [
            {"series": 'http_requests_total{handler="/ocr",status="503"}', "values": _counter(away)},
            {"series": 'http_requests_total{handler="/ocr",status="200"}', "values": _counter(done)},
        ], {}
    if name == "OcrGpuTemperatureAboveMark":
        return [{"series": f"DCGM_FI_DEV_GPU_TEMP{dcgm}", "values": _gauge(t + 1 if past else t)}], {"gpu": "0"}
    if name == "OcrGpuThrottling":  # 0x20 SW thermal slowdown past the mark; 0x1 GPU idle (no throttle) below
        return [{"series": f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{dcgm}", "values": _gauge(32 if past else 1)}], gpu
    if name == "OcrGpuMemoryFullSoon":  # past: +100 MiB/min from 10,000 (24,000 in 140 min < 4 h); below: flat
        return [{"series": f"DCGM_FI_DEV_FB_USED{dcgm}", "values": "10000+100x40" if past else _gauge(t - 1)}], {"gpu": "0"}
    if name == "OcrSmClockBelowMark":
        return [{"series": f"DCGM_FI_DEV_SM_CLOCK{dcgm}", "values": _gauge(t - 1 if past else t)}], {"gpu": "0"}
    raise AssertionError(f"no promtool case for {name}")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def rule_case(rule_doc: dict[str, Any], vllm: bool, past: bool, rule: AlertRule) -> dict[str, Any]:
    """One `promtool test rules` case: `rule`'s series past its mark (it fires with the labels and
    annotations of `rule_doc`, its entry in alerts.yaml) or below it (nothing fires), read at 30 min."""
    inputs, labels = series(rule, past, vllm)
    firing = [{"exp_labels": {**rule_doc["labels"], **labels}, "exp_annotations": rule_doc["annotations"]}]
    return {
        "interval": "1m",
        "input_series": inputs,
        "alert_rule_test": [{"eval_time": "30m", "alertname": rule.alert, "exp_alerts": firing if past else []}],
    }
