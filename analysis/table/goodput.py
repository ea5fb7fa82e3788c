"""Goodput (answers in time AND right) and runaway answers, per step of the step table.

Goodput: a request is good when the server answered it (ok), within the latency limit, with a right text:
- in time: latency at most `latency_limit_ms` (SLO_P95_S when set, else the recommended request_timeout_s),
  measured from the intended send time where the run has it (open loop: what a caller feels), else from
  the actual send;
- right: its CER at most the baseline's for that image bucket (the worst the idle server gave: a
  deterministic server gives the same text every time) plus CER_MARGIN, where expected text exists; an
  empty or unreadable answer (answer_kind) and a runaway answer are never right.
`goodput_share` = good / the step's logical requests (final attempts: a failure counts against it);
`goodput_rps` = the step's throughput x good / ok answers, so it is counted like `throughput_rps` (by each
answer's share inside the window) and never exceeds it.
`goodput_peak`: the highest level (or open-loop rate) whose goodput still grows: walking the measured steps
upward, each level that beats the best goodput so far by GROWTH_MIN_FRAC grows; the last one that did.

Runaway: an ok answer that hit max_tokens (`finish_reason` "length") or ends in one phrase repeated
(`repeated_tail`, scenarios.runaway): `runaway`, `runaway_share` (of ok answers), and their P95 apart
(`runaway_p95_ms`) beside the P95 of the other answers (`p95_no_runaway_ms`). `runaway_summary` warns
when they stretch a step's P95 by more than RUNAWAY_STRETCH over the P95 without them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num, percentile

GOODPUT_COLUMNS = ["goodput_rps", "goodput_share"]
RUNAWAY_COLUMNS = ["runaway", "runaway_share", "runaway_p95_ms", "p95_no_runaway_ms"]
CER_MARGIN = 0.05  # a right answer may be 5 characters in 100 worse than the idle server's
GROWTH_MIN_FRAC = 0.05  # goodput grows when it beats the best so far by 5% (below: noise, or flat)
RUNAWAY_STRETCH = 1.2  # runaways that raise a step's P95 by 20% over the P95 without them: a warning
NOT_RIGHT_KINDS = ("bad_answer", "empty_answer")  # a 2xx answer that holds no readable text


def _text(part: pd.DataFrame, name: str) -> np.ndarray:
    if name not in part.columns:  # a frame from before the column
        return np.full(len(part), "", dtype=object)
    return part[name].astype(object).fillna("").astype(str).to_numpy()


def runaway_mask(part: pd.DataFrame) -> np.ndarray:
    """Rows whose answer ran away: finish_reason "length" or a repeated tail (ok answers only)."""
    ok = part["ok"].to_numpy(dtype=bool)
    length = _text(part, "finish_reason") == "length"
    # eq(True): a bool column, or floats/NaN in a frame built without the field, read the same
    tail = part["repeated_tail"].eq(True).to_numpy() if "repeated_tail" in part.columns else False
    return ok & (length | tail)


def runaway_columns(part: pd.DataFrame) -> dict[str, Any]:
    """The step's runaway columns from its own request rows."""
    if part.empty:
        return {
            "runaway": 0,
            "runaway_share": math.nan,
            "runaway_p95_ms": math.nan,
            "p95_no_runaway_ms": math.nan,
        }
    ok = part["ok"].to_numpy(dtype=bool)
    runaway = runaway_mask(part)
    latency = part["latency_ms"].to_numpy(dtype=np.float64)
    answered = int(ok.sum())
    return {
        "runaway": int(runaway.sum()),
        "runaway_share": float(runaway.sum()) / answered if answered else math.nan,
        "runaway_p95_ms": percentile(latency[runaway], 95),
        "p95_no_runaway_ms": percentile(latency[ok & ~runaway], 95),
    }


def caller_latency_ms(part: pd.DataFrame) -> np.ndarray:
    """Latency from the intended send time where the row has one (open loop), else from the actual send."""
    latency = part["latency_ms"].to_numpy(dtype=np.float64)
    if "t_intended_unix_s" not in part.columns:
        return latency
    lag_s = part["t_start_unix_s"].to_numpy(dtype=np.float64) - part["t_intended_unix_s"].to_numpy(
        dtype=np.float64
    )
    return np.where(np.isnan(lag_s), latency, latency + np.maximum(lag_s, 0.0) * 1000.0)


def cer_limits(
    requests: pd.DataFrame, baseline_steps: list[int], margin: float = CER_MARGIN
) -> dict[str, float]:
    """Per image bucket, the highest CER a right answer may have: the baseline's worst plus `margin`;
    key "" holds the limit over all buckets (for a bucket the baseline never sent). {} without a CER."""
    base = requests[requests["step_index"].isin(baseline_steps) & requests["ok"]]
    base = base[base["cer"].notna()]
    if base.empty:
        return {}
    limits = {
        str(b): float(c) + margin for b, c in base.groupby("bucket", observed=True)["cer"].max().items()
    }
    limits[""] = float(base["cer"].max()) + margin
    return limits


def good_mask(part: pd.DataFrame, latency_limit_ms: float, cer_limit: dict[str, float]) -> np.ndarray:
    """Rows that are goodput: ok, in time, right text (see the module doc)."""
    ok = part["ok"].to_numpy(dtype=bool)
    in_time = caller_latency_ms(part) <= latency_limit_ms if not math.isnan(latency_limit_ms) else True
    cer = part["cer"].to_numpy(dtype=np.float64)
    if cer_limit:
        buckets = part["bucket"].astype(str).to_numpy()
        limit = np.array([cer_limit.get(b, cer_limit[""]) for b in buckets], dtype=np.float64)
        right_cer = np.isnan(cer) | (cer <= limit + 1e-12)
    else:
        right_cer = np.ones(len(part), dtype=bool)
    readable = ~np.isin(_text(part, "answer_kind"), NOT_RIGHT_KINDS)
    return ok & in_time & right_cer & readable & ~runaway_mask(part)


def goodput_columns(
    part: pd.DataFrame, throughput_rps: float, latency_limit_ms: float, cer_limit: dict[str, float]
) -> dict[str, float]:
    """The step's goodput columns from its own request rows and its throughput."""
    if part.empty:
        return {"goodput_rps": math.nan, "goodput_share": math.nan}
    ok = part["ok"].to_numpy(dtype=bool)
    final = (
        part["final_attempt"].fillna(True).astype(bool).to_numpy()
        if "final_attempt" in part.columns
        else True
    )
    outcomes = int((ok | final).sum())  # a retried attempt is not an outcome; its final attempt is
    good = int(good_mask(part, latency_limit_ms, cer_limit).sum())
    answered = int(ok.sum())
    return {
        "goodput_rps": throughput_rps * good / answered
        if answered and not math.isnan(throughput_rps)
        else math.nan,
        "goodput_share": good / outcomes if outcomes else math.nan,
    }


def with_goodput(
    table: pd.DataFrame, requests: pd.DataFrame, latency_limit_ms: float, cer_limit: dict[str, float]
) -> pd.DataFrame:
    """The step table with its goodput columns filled (the limits are known only after the config)."""
    out = table.copy()
    if out.empty:
        return out
    groups = (
        {int(k): v for k, v in requests.groupby("step_index", sort=False).indices.items()}
        if not requests.empty
        else {}
    )
    values = [
        goodput_columns(requests.iloc[groups.get(int(row.step_index), [])], num(row, "throughput_rps"),
                        latency_limit_ms, cer_limit)
        for row in out.itertuples(index=False)
    ]  # fmt: skip
    for name in GOODPUT_COLUMNS:
        out[name] = [v[name] for v in values]
    return out


def _by_load(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Measured steps, one per level (or open-loop rate: the last measured), in rising order of load."""
    if table.empty:
        return []
    steps = table[table["phase"] == "step"]
    rows: dict[float, dict[str, Any]] = {}
    for row in steps.sort_values("step_index", kind="stable").to_dict("records"):
        rate = num(row, "rate_rps")
        rows[rate if not math.isnan(rate) else num(row, "level")] = row
    return [rows[k] for k in sorted(rows)]


def _load_text(row: dict[str, Any]) -> str:
    rate = num(row, "rate_rps")
    return f"{rate:g} rps" if not math.isnan(rate) else f"{int(row['level'])} users"


def goodput_peak(table: pd.DataFrame, latency_limit_s: float, where: str) -> dict[str, Any] | None:
    """The highest level whose goodput still grows (module doc); None without goodput in any step."""
    rows = [r for r in _by_load(table) if not math.isnan(num(r, "goodput_rps"))]
    if not rows:
        return None
    best, stalled = rows[0], None
    for row in rows[1:]:
        if num(row, "goodput_rps") > num(best, "goodput_rps") * (1.0 + GROWTH_MIN_FRAC):
            best, stalled = row, None
        elif stalled is None:
            stalled = row
    rate = num(best, "rate_rps")
    why = (
        f"goodput {num(best, 'goodput_rps'):.2f} rps at {_load_text(best)} (answers within {latency_limit_s:g} s,"
        f" {where}, with the right text)"
    )
    if stalled is not None:
        why += f"; {_load_text(stalled)} added no more than {GROWTH_MIN_FRAC:.0%}"
    else:
        why += "; it still grew at the highest load measured"
    return {
        "level": int(best["level"]), "rate_rps": None if math.isnan(rate) else rate,
        "goodput_rps": num(best, "goodput_rps"), "goodput_share": num(best, "goodput_share"),
        "latency_limit_s": latency_limit_s, "limit_from": where, "cer_margin": CER_MARGIN,
        "still_growing": stalled is None, "why": why,
    }  # fmt: skip


def runaway_summary(table: pd.DataFrame) -> dict[str, Any] | None:
    """Steps with runaway answers and a warning when they stretched a P95; None when no step had one."""
    if table.empty or "runaway" not in table.columns:
        return None
    hit = table[table["runaway"].fillna(0).astype(float) > 0]
    if hit.empty:
        return None
    keep = [
        "step_index",
        "phase",
        "level",
        "runaway",
        "runaway_share",
        "runaway_p95_ms",
        "p95_no_runaway_ms",
        "p95_ms",
    ]
    steps = hit[keep].to_dict("records")
    stretched = [s for s in steps if num(s, "p95_ms") > num(s, "p95_no_runaway_ms") * RUNAWAY_STRETCH]
    warning = None
    if stretched:
        worst = max(stretched, key=lambda s: num(s, "p95_ms") / num(s, "p95_no_runaway_ms"))
        warning = (
            f"runaway answers (max_tokens reached or a repeated tail) stretch the P95: at level {int(worst['level'])}"
            f" {num(worst, 'runaway_share'):.1%} of answers ran away and the P95 is {num(worst, 'p95_ms'):.0f} ms"
            f" against {num(worst, 'p95_no_runaway_ms'):.0f} ms without them; cap max_tokens and set a repetition"
            " penalty on the server, or the latency and capacity measured here are the runaways'"
        )
    return {
        "steps": steps,
        "total": int(hit["runaway"].sum()),
        "stretch_limit": RUNAWAY_STRETCH,
        "warning": warning,
    }
