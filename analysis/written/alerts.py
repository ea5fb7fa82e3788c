"""alerts.yaml: Prometheus alert rules from the water marks the run measured at the recommended level.

Seed 000 ends: after deployment, watch P95, peak memory and OOMs, queue depth and rejections, and "when any
of them leaves the water mark of the load test, run the steps again". Each rule below is one mark, on a
metric the production server or its exporters already export (nothing here needs the suite running):

OcrLatencyP95AboveMark   P95 over 5 min > P95_MARGIN (1.5) x the P95 measured at the recommended level.
                         vLLM: vllm:e2e_request_latency_seconds (the server's own time; the mark is the
                         step's P95 from that histogram as histogram_quantile computes it, so a coarse
                         bucket cannot make it fire at the measured load; else the server's P95 from its
                         answers, else the client's); other servers: http_request_duration_seconds
                         (prometheus-fastapi-instrumentator; vLLM exports it too) against the client's P95.
OcrGpuMemoryAboveMark    DCGM_FI_DEV_FB_USED (MiB) > MEM_MARGIN (1.05) x the device's peak at that level.
OcrKvCacheAboveMark      vLLM: vllm:kv_cache_usage_perc > the peak fraction at that level (+10%, at most 1).
OcrServerErrors          any 5xx but 503 from the server (an OOM answers 500): the run's OOMs are counted.
OcrKvCachePreempting     vLLM: preemptions (its answer to a full KV cache) where the run saw none.
OcrQueueDeeperThanConfig vllm:num_requests_waiting > the recommended queue.max_size.
OcrRejectionRate         share of requests turned away (vLLM: vllm:admission_rejections_total; else 503/429
                         in http_requests_total) > max(2 x the share measured, REJECT_FLOOR 1%).
OcrGpuTemperatureAboveMark  DCGM_FI_DEV_GPU_TEMP > the peak seen + TEMP_MARGIN_C (5), where it was read.
OcrGpuThrottling         DCGM_FI_DEV_CLOCK_THROTTLE_REASONS has a power or thermal bit (0x4 SW power cap,
                         0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake), where the
                         sampler read throttle reasons; PromQL has no bit operators, so floor(x / 2^k) % 2^n.
OcrSmClockBelowMark      DCGM_FI_DEV_SM_CLOCK < CLOCK_MARGIN (0.9) x the lowest mean SM clock of a step.
OcrGpuMemoryFullSoon     a soak's rule (any run with summary["soak"], with or without a recommended level):
                         predict_linear(DCGM_FI_DEV_FB_USED[FULL_PACE_WINDOW]) FULL_WITHIN_H (4) hours ahead
                         > the card's total MiB the soak read, for FULL_FOR_S: memory will pass the card within
                         4 h at its last 30 min's pace; its description carries the soak's slope and time to full.
Every rule's annotations carry the measured number and a `runbook` line: run the steps again. Pure: the
summary dict in (analysis.written.summary), rules out; `alerts_yaml` turns them into the file's text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from analysis.common.stats import num
from analysis.written.config import BREAKER_P95_MULTIPLE, BREAKER_TEMP_MARGIN_C, row_at

P95_MARGIN = BREAKER_P95_MULTIPLE  # 1.5: where the recommended config's circuit breaker trips
MEM_MARGIN = 1.05
KV_MARGIN = 1.1
TEMP_MARGIN_C = BREAKER_TEMP_MARGIN_C  # 5
CLOCK_MARGIN = 0.9
REJECT_FLOOR = 0.01
GROUP = "ocr-capacity-water-marks"
# Power and thermal throttle bits of DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: bits 2-3 (0x4, 0x8), 5-7 (0xE0).
THROTTLE_EXPR = "(floor({m} / 4) % 4) + (floor({m} / 32) % 8) > 0"
FULL_WITHIN_H = 4  # hours: time for someone to drain and restart the server before it fills
FULL_PACE_WINDOW = "30m"  # the recent pace predict_linear fits
FULL_FOR_S = 600  # the projection holds 10 min: not one burst of requests


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule: a measured mark and the threshold past it."""

    alert: str
    expr: str
    for_s: int
    summary: str  # what it means, with the threshold
    description: str  # the measured number and where it came from
    threshold: float
    measured: float | None


def _fmt(value: float, spec: str = ".3g") -> str:
    return "n/a" if math.isnan(value) else f"{value:{spec}}"


def _latency_rule(row: dict[str, Any], vllm: bool, where: str) -> AlertRule | None:
    """vLLM: the mark as its histogram showed it (histogram_quantile's estimate, the rule's own), else the
    server's P95 from its answers; other servers, and vLLM without either: the client's round trip."""
    hist_p95, server_p95 = num(row, "vllm_e2e_p95_ms"), num(row, "server_p95_ms")
    if vllm and not math.isnan(hist_p95):
        p95_ms, which = hist_p95, "vLLM's e2e histogram P95 (as histogram_quantile gives it)"
    elif vllm and not math.isnan(server_p95):
        p95_ms, which = server_p95, "the server's own P95 (its answers)"
    else:
        p95_ms, which = num(row, "p95_ms"), "the client's P95 (round trip)"
    if math.isnan(p95_ms):
        return None
    metric = "vllm:e2e_request_latency_seconds" if vllm else "http_request_duration_seconds"
    threshold_s = round(p95_ms / 1000.0 * P95_MARGIN, 3)
    return AlertRule(
        alert="OcrLatencyP95AboveMark",
        expr=f"histogram_quantile(0.95, sum by (le) (rate({metric}_bucket[5m]))) > {threshold_s:g}",
        for_s=300,
        summary=f"P95 latency above {threshold_s:g} s ({P95_MARGIN:g} x the load test's P95)",
        description=f"{which} measured {p95_ms:.0f} ms {where}",
        threshold=threshold_s,
        measured=p95_ms,
    )


def _memory_rules(row: dict[str, Any], where: str) -> list[AlertRule]:
    rules = []
    peak_mib = num(row, "gpu_mem_peak_mib")
    if not math.isnan(peak_mib):
        limit = round(peak_mib * MEM_MARGIN)
        rules.append(AlertRule(
            alert="OcrGpuMemoryAboveMark", expr=f"max by (gpu) (DCGM_FI_DEV_FB_USED) > {limit}", for_s=120,
            summary=f"GPU memory used above {limit} MiB ({MEM_MARGIN:g} x the peak the load test saw)",
            description=f"the device's peak was {peak_mib:.0f} MiB {where}", threshold=limit, measured=peak_mib,
        ))  # fmt: skip
    kv = num(row, "kv_cache_peak_frac")
    if not math.isnan(kv):
        limit_frac = round(min(1.0, kv * KV_MARGIN), 3)
        rules.append(AlertRule(
            alert="OcrKvCacheAboveMark", expr=f"max(vllm:kv_cache_usage_perc) > {limit_frac:g}", for_s=120,
            summary=f"vLLM KV-cache usage above {limit_frac:g} (the load test's peak + 10%)",
            description=f"KV-cache usage peaked at {kv:.3f} {where}", threshold=limit_frac, measured=kv,
        ))  # fmt: skip
    return rules


def _oom_count(steps: list[dict[str, Any]]) -> int:
    return sum(int((s.get("errors") or {}).get("oom", 0)) for s in steps)


def _error_rules(row: dict[str, Any], steps: list[dict[str, Any]], vllm: bool, where: str) -> list[AlertRule]:
    oom_here = int((row.get("errors") or {}).get("oom", 0))
    rules = [AlertRule(
        alert="OcrServerErrors", expr='sum(rate(http_requests_total{status=~"5..",status!="503"}[5m])) > 0',
        for_s=60, summary="the server answers 5xx (an out-of-memory error answers 500)",
        description=f"{oom_here} OOM {where}; {_oom_count(steps)} in the whole run (a server that groups status"
                    " codes as 5xx counts its 503 rejections here too)", threshold=0.0,
        measured=float(oom_here),
    )]  # fmt: skip
    preempt = num(row, "preemptions")
    if vllm and not math.isnan(preempt) and preempt == 0:
        rules.append(AlertRule(
            alert="OcrKvCachePreempting", expr="sum(increase(vllm:num_preemptions_total[5m])) > 0", for_s=0,
            summary="vLLM preempts requests: its KV cache ran full", description=f"no preemption {where}",
            threshold=0.0, measured=0.0,
        ))  # fmt: skip
    return rules


def _queue_rules(row: dict[str, Any], config: Mapping[str, Any], vllm: bool, where: str) -> list[AlertRule]:
    rules = []
    queue_max = int(config.get("server", {}).get("queue", {}).get("max_size", 0))
    waiting = num(row, "server_waiting_max")
    if queue_max and (vllm or not math.isnan(waiting)):
        rules.append(AlertRule(
            alert="OcrQueueDeeperThanConfig", expr=f"sum(vllm:num_requests_waiting) > {queue_max}", for_s=120,
            summary=f"more than {queue_max} requests waiting (the recommended queue.max_size)",
            description=f"at most {_fmt(waiting, '.0f')} requests waited {where}", threshold=queue_max,
            measured=waiting if not math.isnan(waiting) else None,
        ))  # fmt: skip
    requests, rejected = num(row, "requests"), num(row, "rejected")
    share = rejected / requests if requests and not math.isnan(rejected) else 0.0
    limit = round(max(2 * share, REJECT_FLOOR), 4)
    if vllm:  # vLLM counts rejections apart from its finished requests
        away = "sum(rate(vllm:admission_rejections_total[5m]))"
        expr = f"{away} / ({away} + sum(rate(vllm:e2e_request_latency_seconds_count[5m]))) > {limit:g}"
    else:  # an HTTP counter has them among its requests
        expr = f'sum(rate(http_requests_total{{status=~"503|429"}}[5m])) / sum(rate(http_requests_total[5m])) > {limit:g}'
    rules.append(AlertRule(
        alert="OcrRejectionRate", expr=expr, for_s=300,
        summary=f"more than {limit:.2%} of requests turned away", threshold=limit, measured=share,
        description=f"{_fmt(rejected, '.0f')} of {_fmt(requests, '.0f')} requests ({share:.2%}) rejected {where}",
    ))  # fmt: skip
    return rules


def _heat_rules(row: dict[str, Any], steps: list[dict[str, Any]], where: str) -> list[AlertRule]:
    rules = []
    temp = num(row, "gpu_temp_c_peak")
    if not math.isnan(temp):
        limit = round(temp + TEMP_MARGIN_C)
        rules.append(AlertRule(
            alert="OcrGpuTemperatureAboveMark", expr=f"max by (gpu) (DCGM_FI_DEV_GPU_TEMP) > {limit}", for_s=300,
            summary=f"GPU temperature above {limit} C (the load test's peak + {TEMP_MARGIN_C:g} C)",
            description=f"the GPU peaked at {temp:.0f} C {where}", threshold=limit, measured=temp,
        ))  # fmt: skip
    throttled = [num(s, "throttled") for s in steps]
    if any(not math.isnan(t) for t in throttled):
        here = num(row, "throttled")
        seen = "was throttled already" if here > 0 else "ran unthrottled"
        rules.append(AlertRule(
            alert="OcrGpuThrottling", expr=THROTTLE_EXPR.format(m="DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), for_s=120,
            summary="the GPU's clocks are held down for power or heat", threshold=0.0, measured=here,
            description=f"the GPU {seen} {where}; the marks above hold only at the clocks the run had",
        ))  # fmt: skip
    clocks = [c for c in (num(s, "sm_clock_mhz_mean") for s in steps) if not math.isnan(c)]
    if clocks:
        limit = round(min(clocks) * CLOCK_MARGIN)
        rules.append(AlertRule(
            alert="OcrSmClockBelowMark", expr=f"min by (gpu) (DCGM_FI_DEV_SM_CLOCK) < {limit}", for_s=300,
            summary=f"SM clock below {limit} MHz ({CLOCK_MARGIN:g} x the lowest step mean of the load test)",
            description=f"the lowest step mean SM clock was {min(clocks):.0f} MHz in the run", threshold=limit,
            measured=min(clocks),
        ))  # fmt: skip
    return rules


def _soak_rule(summary: Mapping[str, Any]) -> list[AlertRule]:
    """After a soak: memory will pass the card within FULL_WITHIN_H at its recent pace (DCGM's used memory)."""
    soak = summary.get("soak")
    total = num(soak, "mem_total_mib") if isinstance(soak, Mapping) else math.nan
    if not isinstance(soak, Mapping) or math.isnan(total):
        return []
    slope, low, high = (num(soak, k) for k in ("slope_mib_per_h", "slope_low_mib_per_h", "slope_high_mib_per_h"))
    hours = num(soak, "hours_to_full")
    pace = f"memory {soak.get('verdict', '?')} at {_fmt(slope, '+,.0f')} MiB/h (95% interval {_fmt(low, '+,.0f')}"
    pace += f" to {_fmt(high, '+,.0f')})" + (f", the card full in {hours:.3g} h at that pace" if not math.isnan(hours) else "")
    limit = round(total)
    return [AlertRule(
        alert="OcrGpuMemoryFullSoon",
        expr=f"max by (gpu) (predict_linear(DCGM_FI_DEV_FB_USED[{FULL_PACE_WINDOW}], {FULL_WITHIN_H * 3600})) > {limit}",
        for_s=FULL_FOR_S,
        summary=f"GPU memory will pass the card ({limit} MiB) within {FULL_WITHIN_H} h at its last {FULL_PACE_WINDOW}'s pace",
        description=f"the soak (run {summary.get('run_id', '?')}) held {soak.get('level', '?')} for"
                    f" {_fmt(num(soak, 'duration_s'), '.0f')} s: {pace}",
        threshold=limit, measured=slope,
    )]  # fmt: skip


def alert_rules(summary: Mapping[str, Any]) -> list[AlertRule]:
    """The rules from summary.json's content (analysis.written.summary): its steps, recommended level and
    config; and after a soak, its projection of memory to the card's total."""
    soak = _soak_rule(summary)
    steps = [s for s in summary.get("steps") or [] if isinstance(s, dict)]
    level = summary.get("recommended_level")
    if level is None or not steps:
        return soak
    row = row_at(pd.DataFrame(steps), int(level))
    if row is None:
        return soak
    where = f"at the recommended level {level} (step {row.get('step_index')}, run {summary.get('run_id', '?')})"
    vllm = summary.get("server_kind") == "vllm"
    latency = _latency_rule(row, vllm, where)
    return [
        *([latency] if latency else []),
        *_memory_rules(row, where),
        *_error_rules(row, steps, vllm, where),
        *_queue_rules(row, summary.get("config") or {}, vllm, where),
        *_heat_rules(row, steps, where),
        *soak,
    ]


def runbook(summary: Mapping[str, Any]) -> str:
    """The runbook line every rule carries: run the steps again, against the same server."""
    target = (summary.get("manifest") or {}).get("target") or {}
    host = target.get("host") if isinstance(target, Mapping) else None
    return (f"The server left the water marks of load test {summary.get('run_id', '?')}: run the steps again"
            f" (make loadtest HOST={host or '<server>'}, same scenario) and paste the new recommended-config.yaml"
            " and alerts.yaml; until then the recommended config is not proven.")  # fmt: skip


def alerts_yaml(rules: list[AlertRule], runbook_line: str, header: str = "") -> str:
    """alerts.yaml text: one Prometheus rule group, each rule annotated with its mark and the runbook."""
    body = {"groups": [{"name": GROUP, "rules": [
        {"alert": r.alert, "expr": r.expr, **({"for": f"{r.for_s}s"} if r.for_s else {}),
         "labels": {"severity": "warning", "source": "ocr-capacity"},
         "annotations": {"summary": r.summary, "description": r.description, "runbook": runbook_line}}
        for r in rules]}]}  # fmt: skip
    lines = [f"# {' '.join(h.split())}" for h in header.splitlines() if h.strip()]
    if not rules:
        lines.append("# no rules: the run has no recommended level measured")
    text = yaml.safe_dump(body, sort_keys=False, width=10_000, allow_unicode=False)
    return "\n".join(lines) + ("\n" if lines else "") + text
