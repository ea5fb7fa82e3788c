"""The verify phase's verdict: did the recommended config hold under open-loop overload?

Input: the requests and steps of phase "verify" (open-loop load at about 1.5x the plateau throughput)
and "drain" (a light probe after that load stops), the recommended config, the baseline's P95 and the
plateau throughput of the stepped load. Output (summary.json `verify`): {"passed", "rate_rps", "checks":
[{"name", "passed", "value", "limit", "unit", "why"}], ...}; passed when every check passed. A run
without verify rows gets None (VERIFY=0, or a run that stopped before it; the report says which).
Checks (over the verify phase's logical requests: final attempts):
- admitted_p95_within_timeout: P95 latency (from the actual send) of the admitted requests (all but those
  turned away with 503/429 or never connected; a timeout counts as past the limit) at most the
  recommended request_timeout_s.
- excess_rejected_fast: of the requests not admitted, the share turned away with 503/429 within
  REJECT_FAST_MS, at least EXCESS_FAST_MIN_SHARE (a timeout, a cut or a slow 503 is not fast). A server that
  fails a share of requests at every load (a 500, a reset: a flaky balancer's 502s) fails about as many in
  the window: the server's own failures, not its answer to the excess; those the stepped load's rate accounts
  for (`own_failure_share`, `own_set_aside`) are set aside, the rest count as not turned away fast. With no
  request turned away the check passes only when the server kept up: the median latency of the answers
  sent in the last third of the window within LATENCY_GROWTH_MAX x that of the first third (a queue
  without bound grows all along; counting answers inside a short window reads its edges as a shortfall).
- no_oom: no request of verify or drain failed with an out-of-memory answer.
- queue_drained: after the load stops, answers are back to the baseline's latency (a drain probe within
  DRAIN_SLACK x the baseline P95, and every probe after it), counted from the end of the verify window to
  that probe's answer, within the queue's wait timeout + the request timeout: the last request a bounded
  queue admitted waits at most the one and runs at most the other. (The queue holds about one wait timeout
  of work, so a limit of the wait timeout alone sits exactly on what a full, correct queue takes; a queue
  without bound takes far longer: its backlog grows with every second of overload.) Without probes, the last answer the
  server gave to a verify request stands in (failed when some got none: the server may still be busy);
  without a baseline, the bound is 2x the fastest probe's latency.
A server with no admission control (none turned away, the excess queued or timed out) fails with a plain
`why` and an `advice` naming what the recommended config would change; `admission_control` is True when
the server turned requests away, False when it queued the excess, None when the load never exceeded it.

Through a gateway (GATEWAY, loadtest/method/gateway.py): the plan runs the window a second time through
HAProxy started with the recommended config; its phases carry the gateway's URL (steps.jsonl `via`). The
summary's `verify` then holds the server as it is at its top level and as `raw`, the window through the
gateway as `gateway` (the same keys, and `via`), and `compared`: the two in one line for the first screen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num, percentile
from analysis.table.steps import WindowShares

VERIFY_PHASE, DRAIN_PHASE = "verify", "drain"
REJECT_FAST_MS = 1000.0  # a 503/429 answered within a second: the caller can back off at once
EXCESS_FAST_MIN_SHARE = 0.95  # of the requests not admitted, at least this share turned away fast
LATENCY_GROWTH_MAX = 2.0  # nothing turned away is fine only while latency holds: late median within 2x early
NO_ANSWER_MS = 1e12  # a timeout's latency in the P95: longer than any limit (inf would warn in numpy)
DRAIN_SLACK = 1.5  # "back to baseline": a probe within 1.5x the baseline P95
REJECTED, TIMEOUT, OOM, CUT, CONNECTION = "rejected", "timeout", "oom", "cut", "connection"
OVERLOAD_KINDS = (REJECTED, TIMEOUT, OOM, CUT)  # answers to the load itself; any other failure may be the server's own
OWN_SET_ASIDE_ERRORS = 2.0  # own failures set aside: up to their expected count plus this many Poisson errors


def _check(
    name: str, passed: bool, value: float | None, limit: float | None, unit: str, why: str
) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "value": value, "limit": limit, "unit": unit, "why": why}


def _server(config: Mapping[str, Any]) -> dict[str, Any]:
    server = config.get("server")
    return dict(server) if isinstance(server, Mapping) else {}


def _queue(server: Mapping[str, Any]) -> Mapping[str, Any]:
    queue = server.get("queue")
    return queue if isinstance(queue, Mapping) else {}


class Window:
    """The verify phase's requests (final attempts), their outcomes and the window they ran in."""

    def __init__(self, requests: pd.DataFrame, steps: pd.DataFrame) -> None:
        verify = steps[steps["phase"] == VERIFY_PHASE]
        self.t0, self.t1 = float(verify["t_start_unix_s"].min()), float(verify["t_end_unix_s"].max())
        self.duration_s = self.t1 - self.t0
        part = requests[requests["step_index"].isin(verify["step_index"].tolist())]
        final = part["final_attempt"].fillna(True).astype(bool) if "final_attempt" in part.columns else True
        self.rows = part[final | part["ok"]]
        self.kind = self.rows["failure_kind"].astype(str).to_numpy()
        self.ok = self.rows["ok"].to_numpy(dtype=bool)
        self.latency_ms = self.rows["latency_ms"].to_numpy(dtype=np.float64)
        told = pd.to_numeric(verify["rate_rps"], errors="coerce").dropna() if "rate_rps" in verify.columns else None
        self.offered_rps = (
            float(told.mean()) if told is not None and not told.empty
            else len(self.rows) / self.duration_s if self.duration_s > 0 else math.nan
        )  # fmt: skip
        self.sent_rps = len(self.rows) / self.duration_s if self.duration_s > 0 else math.nan
        self.start_s = self.rows["t_start_unix_s"].to_numpy(dtype=np.float64)
        end_s = self.start_s + self.latency_ms / 1000.0
        # answers per second inside the window, each by the share of its time there (as the step table counts)
        self.served_rps = WindowShares(part).throughput_rps(self.t0, self.t1)
        answered = self.rows["status_code"].to_numpy(dtype=np.float64) > 0  # a timeout's end is not the server's
        self.last_answer_s = float(end_s[answered].max()) if answered.any() else math.nan

    def count(self, kind: str) -> int:
        return int((~self.ok & (self.kind == kind)).sum())

    def latency_early_late_ms(self) -> tuple[float, float]:
        """Median latency of the answers sent in the first and in the last third of the window."""
        third = self.duration_s / 3.0
        early = self.ok & (self.start_s < self.t0 + third)
        late = self.ok & (self.start_s >= self.t1 - third)
        return percentile(self.latency_ms[early], 50), percentile(self.latency_ms[late], 50)


def check_admitted_p95(w: Window, timeout_s: float) -> dict[str, Any]:
    """Admitted: every request the server did not turn away (503/429) or refuse to connect. A timeout
    counts as past the limit (the caller got no answer), a cut request by the time it had run."""
    admitted = ~np.isin(w.kind, (REJECTED, CONNECTION))
    timed_out = admitted & (w.kind == TIMEOUT)
    limit_ms = timeout_s * 1000.0
    name = "admitted_p95_within_timeout"
    if not admitted.any():
        return _check(name, False, None, limit_ms, "ms", "no request was admitted: all were turned away")
    p95 = percentile(np.where(timed_out, NO_ANSWER_MS, w.latency_ms)[admitted], 95)
    floor = percentile(w.latency_ms[admitted], 95)  # what the rows show: a timeout at the client's timeout
    passed = p95 <= limit_ms
    told = f"P95 of the {int(admitted.sum())} admitted requests "
    told += f"{p95:,.0f} ms" if p95 < NO_ANSWER_MS else f"at least {floor:,.0f} ms ({int(timed_out.sum())} timed out)"
    if passed:
        why = f"{told}, within the recommended request_timeout_s {timeout_s:g} s"
    else:
        why = f"{told}, past the recommended request_timeout_s {timeout_s:g} s: admitted requests waited in a queue"
    return _check(name, passed, p95 if p95 < NO_ANSWER_MS else floor, limit_ms, "ms", why)


def turned_away_fast(kind: Any, latency_ms: Any) -> Any:
    """A request not admitted was turned away fast: a 503/429 (REJECTED) within REJECT_FAST_MS. Of one request
    (the controller's live count, loadtest/method/controller.py) or elementwise of a window's columns."""
    return (kind == REJECTED) & (latency_ms <= REJECT_FAST_MS)


def may_be_own(kind: Any) -> Any:
    """A failure that is neither turned away nor the load's own (OVERLOAD_KINDS): a 500, a reset, the server's
    own. Of one failure kind (the controller's live count, per failed request: a tuple's membership, ~60 ns
    with the call, where numpy's takes ~10 us) or elementwise of a window's column."""
    if isinstance(kind, str):
        return kind not in OVERLOAD_KINDS
    return ~np.isin(kind, OVERLOAD_KINDS)


def own_failure_share(table: pd.DataFrame, top_level: float) -> float | None:
    """The share of requests the server failed on its own under the stepped load (the baseline and the steps at
    levels up to `top_level`, the recommended concurrency): failures that are neither turned away nor the load's
    own (OVERLOAD_KINDS), over every outcome there; None when no such level was measured (step table rows)."""
    if table.empty or "errors" not in table.columns:
        return None
    rows = table[table["phase"].isin(("baseline", "step")) & (pd.to_numeric(table["level"]) <= top_level)]
    outcomes = float((pd.to_numeric(rows["requests"]) - pd.to_numeric(rows["retried"]).fillna(0)).sum())
    if outcomes <= 0:
        return None
    own = sum(int(n) for errors in rows["errors"] if isinstance(errors, Mapping)
              for kind, n in errors.items() if may_be_own(kind))  # fmt: skip
    return own / outcomes


def own_set_aside(own: int, served: int, share: float | None) -> int:
    """Of `own` failures among `served` requests (not turned away) of a window, how many the server's own rate
    (`own_failure_share`) accounts for: up to its expected count plus OWN_SET_ASIDE_ERRORS Poisson errors."""
    expected = (share or 0.0) * served
    return min(own, math.ceil(expected + OWN_SET_ASIDE_ERRORS * math.sqrt(expected))) if expected > 0 else 0


def check_excess_rejected(w: Window, own_share: float | None = None) -> dict[str, Any]:
    """Of the requests not admitted, the share turned away fast (module doc); the server's own failures, as
    many as its rate under the stepped load accounts for, set aside."""
    turned = ~w.ok
    rejected = turned & (w.kind == REJECTED)
    fast = turned & turned_away_fast(w.kind, w.latency_ms)
    own = turned & may_be_own(w.kind)
    aside = own_set_aside(int(own.sum()), int(len(w.rows) - rejected.sum()), own_share)
    name = "excess_rejected_fast"
    if int(turned.sum()) <= aside:
        early_ms, late_ms = w.latency_early_late_ms()
        kept_up = not late_ms > LATENCY_GROWTH_MAX * early_ms  # NaN (too few answers): nothing says it grew
        held = f"median latency {early_ms:,.0f} ms early in the window, {late_ms:,.0f} ms late"
        answered = f"all {len(w.rows)} requests"
        if aside:
            answered = f"{len(w.rows) - aside} of {len(w.rows)} requests{_aside_words(aside, own_share)}"
        why = (
            f"no excess: the server answered {answered} and its latency held ({held}); the load"
            " did not exceed what it serves, so admission control was not exercised"
            if kept_up else
            f"nothing was turned away while latency grew ({held}): the excess queued instead of getting 503"
        )  # fmt: skip
        return _check(name, kept_up, 1.0 if kept_up else 0.0, EXCESS_FAST_MIN_SHARE, "share", why)
    share = float(fast.sum()) / float(turned.sum() - aside)
    slow = int((rejected & ~fast).sum())
    why = (
        f"{int(turned.sum()) - aside} requests not admitted: {int(fast.sum())} turned away with 503/429 within"
        f" {REJECT_FAST_MS / 1000:g} s"
        + (f" (P95 {percentile(w.latency_ms[rejected], 95):,.0f} ms)" if rejected.any() else "")
        + f", {slow} slow 503/429, {w.count(TIMEOUT)} timed out, {w.count(CUT)} cut, {int(own.sum()) - aside} other"
        f" failures{_aside_words(aside, own_share)}"
    )
    return _check(name, share >= EXCESS_FAST_MIN_SHARE, share, EXCESS_FAST_MIN_SHARE, "share", why)


def _aside_words(aside: int, own_share: float | None) -> str:
    if not aside:
        return ""
    return (f" ({aside} more failed as the server fails {own_share or 0:.1%} of requests at any load, under the"
            " stepped load too: its own failures, set aside)")  # fmt: skip


def check_no_oom(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    indexes = steps.loc[steps["phase"].isin((VERIFY_PHASE, DRAIN_PHASE)), "step_index"].tolist()
    part = requests[requests["step_index"].isin(indexes)]
    ooms = int((part["failure_kind"].astype(str) == OOM).sum())
    why = "no out-of-memory answer" if not ooms else f"{ooms} requests failed with an out-of-memory answer"
    return _check(
        "no_oom", ooms == 0, float(ooms), 0.0, "requests", why + " during the verify load and the drain"
    )


def _probes(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    indexes = steps.loc[steps["phase"] == DRAIN_PHASE, "step_index"].tolist()
    part = requests[requests["step_index"].isin(indexes)]
    return part.sort_values("t_start_unix_s", kind="stable")


def check_drained(
    w: Window, probes: pd.DataFrame, baseline_p95_ms: float | None, wait_s: float, timeout_s: float
) -> dict[str, Any]:
    limit_s = wait_s + timeout_s
    limit_text = f"the queue's wait timeout {wait_s:g} s + the request timeout {timeout_s:g} s"
    name = "queue_drained"
    answered = probes[probes["ok"]]
    unanswered_probes = int(probes["failure_kind"].astype(str).isin((TIMEOUT, CUT)).sum())
    if answered.empty and unanswered_probes:
        why = f"no drain probe came back before the drain ended ({unanswered_probes} timed out or cut): the queue"
        return _check(name, False, None, limit_s, "s", why + " had not drained")
    if answered.empty:
        if math.isnan(w.last_answer_s):
            return _check(
                name, False, None, limit_s, "s", "not measured: no drain probe and no answer after the load"
            )
        unanswered = w.count(TIMEOUT) + w.count(CUT)
        if unanswered:
            why = f"no drain probe answered, and {unanswered} verify requests got no answer (timed out or cut):"
            return _check(name, False, None, limit_s, "s", why + " the server may still be working through them")
        took = max(0.0, w.last_answer_s - w.t1)
        why = f"no drain probe answered: the last verify answer came {took:.1f} s after the load stopped"
        return _check(
            name, took <= limit_s, took, limit_s, "s", why + f" (limit: {limit_text})"
        )
    latency = answered["latency_ms"].to_numpy(dtype=np.float64)
    if baseline_p95_ms is not None and not math.isnan(baseline_p95_ms):
        bound, whose = (
            baseline_p95_ms * DRAIN_SLACK,
            f"{DRAIN_SLACK:g}x the baseline P95 {baseline_p95_ms:,.0f} ms",
        )
    else:
        bound, whose = 2.0 * float(latency.min()), "2x the fastest probe (no baseline in this run)"
    slow = np.flatnonzero(latency > bound)
    first = int(slow[-1]) + 1 if slow.size else 0  # every probe from here on is back to the baseline
    if first >= latency.size:
        why = f"answers never came back to the baseline: the last probe took {latency[-1]:,.0f} ms against {whose}"
        return _check(name, False, None, limit_s, "s", why)
    end_s = float(answered["t_start_unix_s"].iloc[first]) + latency[first] / 1000.0
    took = max(0.0, end_s - w.t1)
    passed = took <= limit_s
    why = (
        f"answers back to the baseline ({latency[first]:,.0f} ms, within {whose}) {took:.1f} s after the load"
        f" stopped, {'within' if passed else 'past'} {limit_text}"
    )
    return _check(name, passed, took, limit_s, "s", why)


def advice(config: Mapping[str, Any]) -> str:
    """What the recommended config would change in front of a server that queues everything."""
    s = _server(config)
    queue = _queue(s)
    seqs = config.get("vllm_args")
    vllm = f" (vLLM: {seqs[0]} {seqs[1]})" if isinstance(seqs, list | tuple) and len(seqs) == 2 else ""
    return (
        f"Put the recommended config in front: max_concurrency {s.get('max_concurrency')}{vllm}, a queue of"
        f" {queue.get('max_size')} with wait_timeout_s {queue.get('wait_timeout_s')}, {s.get('reject_status', 503)}"
        f" with Retry-After {s.get('retry_after_s')} s. Then at most {s.get('max_concurrency')} run and"
        f" {queue.get('max_size')} wait; a request past the queue or its wait timeout is answered"
        f" {s.get('reject_status', 503)} at once instead of waiting, so admitted requests finish within"
        f" request_timeout_s {s.get('request_timeout_s')} s and callers back off instead of timing out."
        " HAProxy does exactly that from haproxy.cfg beside the config: python -m loadtest gateway --run RUN_DIR"
    )


def verify_summary(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    config: Mapping[str, Any],
    baseline_p95_ms: float | None = None,
    plateau_rps: float | None = None,
    own_share: float | None = None,
) -> dict[str, Any] | None:
    """summary.json's `verify` (module doc); None when the run has no verify phase with requests. `own_share`:
    the server's own failure share under the stepped load (`own_failure_share`), set aside from the excess."""
    if steps.empty or not (steps["phase"] == VERIFY_PHASE).any():
        return None
    w = Window(requests, steps)
    if w.rows.empty:
        return None
    server = _server(config)
    queue = _queue(server)
    timeout_s = num(server, "request_timeout_s")
    checks = [
        check_admitted_p95(w, timeout_s),
        check_excess_rejected(w, own_share),
        check_no_oom(requests, steps),
        check_drained(
            w, _probes(requests, steps), baseline_p95_ms, num(queue, "wait_timeout_s"), timeout_s
        ),
    ]
    passed = all(c["passed"] for c in checks)
    rejected = w.count(REJECTED)
    no_admission = rejected == 0 and not (checks[0]["passed"] and checks[1]["passed"])
    return {
        "passed": passed, "rate_rps": w.offered_rps, "sent_rps": w.sent_rps, "served_rps": w.served_rps,
        "plateau_rps": plateau_rps,
        "window_s": w.duration_s, "requests": int(len(w.rows)), "answered_ok": int(w.ok.sum()), "rejected": rejected,
        "timed_out": w.count(TIMEOUT), "admission_control": True if rejected else False if no_admission else None,
        "rejected_p95_ms": percentile(w.latency_ms[~w.ok & (w.kind == REJECTED)], 95) if rejected else None,
        "why": _verdict_text(w, checks, no_admission, plateau_rps),
        "advice": advice(config) if not passed else "", "checks": checks,
    }  # fmt: skip


def _verdict_text(
    w: Window, checks: list[dict[str, Any]], no_admission: bool, plateau_rps: float | None
) -> str:
    load = f"{w.offered_rps:.2f} rps for {w.duration_s:.0f} s"
    if plateau_rps and plateau_rps > 0:
        load += f" ({w.offered_rps / plateau_rps:.1f}x the plateau {plateau_rps:.2f} rps)"
    oom = next((c for c in checks if c["name"] == "no_oom" and not c["passed"]), None)
    if no_admission and oom is not None:  # the excess was let in and ran out of memory: not a queue
        return (
            f"The server has no admission control: at {load} it turned nothing away with 503/429 and let the"
            f" excess in, where it ran out of GPU memory ({oom['why']})"
        )
    if no_admission:
        return (
            f"The server has no admission control: at {load} it turned nothing away with 503/429 and queued"
            f" everything ({checks[0]['why']}): under overload its latency grows without bound"
        )
    failed = [c["name"] for c in checks if not c["passed"]]
    if not failed and w.count(REJECTED) == 0 and not (~w.ok).any():
        return (
            f"Every check passed at {load}, but the server kept up with that load: it was never overloaded, so"
            " admission control was not exercised; verify at a higher rate to prove it"
        )
    if not failed:
        return f"The recommended config held at {load}: every check passed"
    return f"The recommended config did not hold at {load}: {', '.join(failed)} failed"


def split_by_gateway(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the phases against the server as it is, the phases through a gateway: steps.jsonl's `via`)."""
    if steps.empty or "via" not in steps.columns:
        return steps, steps.iloc[0:0]
    through = steps["via"].notna() & (steps["via"].astype(str) != "")
    return steps[~through], steps[through]


def with_gateway(raw: dict[str, Any], gateway: dict[str, Any] | None, gateway_steps: pd.DataFrame) -> dict[str, Any]:
    """summary.json's `verify` (module doc): `raw` at the top level and as `raw`; `gateway` and `compared`
    when the window also ran through a gateway."""
    out = {**raw, "raw": dict(raw)}
    if gateway is None:
        return out
    gateway["via"] = str(gateway_steps["via"].dropna().iloc[0])
    out["gateway"] = gateway
    out["compared"] = f"as it is: {_in_words(raw)}; behind the recommended HAProxy: {_in_words(gateway)}"
    return out


def _in_words(verdict: Mapping[str, Any]) -> str:
    """ "failed, turned nothing away and queued everything, admitted P95 11,247 ms" and the like."""
    checks = {c["name"]: c for c in verdict.get("checks", [])}
    words = ["passed" if verdict.get("passed") else "failed"]
    if verdict.get("admission_control") is False:
        oom = not checks.get("no_oom", {}).get("passed", True)
        words.append("turned nothing away and " + ("ran out of GPU memory" if oom else "queued everything"))
    elif verdict.get("rejected"):
        fast = verdict.get("rejected_p95_ms")
        words.append(f"{verdict['rejected']} of {verdict.get('requests')} turned away"
                     + (f" within {fast:,.0f} ms (P95)" if fast is not None else ""))  # fmt: skip
    admitted = checks.get("admitted_p95_within_timeout", {}).get("value")
    if admitted is not None:
        words.append(f"admitted P95 {admitted:,.0f} ms")
    return ", ".join(words)
