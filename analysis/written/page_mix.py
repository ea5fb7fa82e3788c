"""A mixed run's answer held safe for its mix (issue 49): the odds of running out of memory at each level
beside the OOMs seen there, the highest level within OOM_RISK, the recommendation bound by it, and the
resize that lifts it.

Rules:
- safe level = the highest level N whose odds (analysis.estimate.oom_odds), and every lower level's, are at
  most `risk` (OOM_RISK, default 0.001: one request in a thousand).
- recommended = min(the knee's recommendation, the safe level); the reason names which bound decided.
- a measured level with no OOM is not called safe on that alone: 0 in n bounds the rate at 3/n (the rule
  of three, 95%); where 3/n is above the risk, or the odds are, the level's row says so.
- the resize: the safe level with pages resized to each of RESIZE_SIDES px (their rise from the fit of MiB
  per megapixel), the best named where it lifts the safe level; HAProxy cannot resize: the client or a
  preprocessing step in front of the server does (the config's max_image_side says to what).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from analysis.estimate.oom_odds import rule_of_three, safe_level
from analysis.estimate.page_memory import PageMemory
from analysis.knee.find import Knee

DEFAULT_OOM_RISK = 0.001
RESIZE_SIDES = (2048, 1536, 1024)
TOP_LEVEL_FLOOR = 64  # odds are computed up to max(this, 2 x the highest level measured)


def _oom_mask(requests: pd.DataFrame) -> pd.Series:
    return requests["failure_kind"].astype(str).str.lower().str.contains("oom")


def level_rows(page: PageMemory, table: pd.DataFrame, requests: pd.DataFrame, odds: list[float],
               risk: float) -> list[dict[str, Any]]:  # fmt: skip
    """Per measured step: its odds, the requests and OOMs seen, by size, and what 0 in n bounds."""
    rows = []
    steps = table[table["phase"] == "step"] if not table.empty else table
    for step in steps.sort_values("step_index").to_dict("records"):
        level = int(step["level"])
        mine = requests[requests["step_index"] == step["step_index"]]
        ooms = mine[_oom_mask(mine)]
        bound = rule_of_three(len(mine)) if ooms.empty else None
        p = odds[level - 1] if level <= len(odds) else 1.0
        note = ""
        if ooms.empty and p > risk:
            note = f"no OOM seen, but the mix's odds are {p:.2%} a request"
        elif bound is not None and bound > risk:
            note = f"no OOM in {len(mine)} requests bounds the rate only at {bound:.1%} (3/n), above {risk:g}"
        rows.append({"step_index": int(step["step_index"]), "level": level, "oom_odds": p, "requests": len(mine),
                     "ooms": len(ooms), "ooms_by_size": _by_size(ooms),
                     "rate_bound_95": bound, "note": note})  # fmt: skip
    return rows


def mix_summary(page: PageMemory, table: pd.DataFrame, requests: pd.DataFrame, risk: float,
                knee_level: int | None = None) -> dict[str, Any]:  # fmt: skip
    """summary.json's `page_mix`: the sizes, the odds per level, the safe level and the resizes; the best
    resize is the largest side whose safe level reaches `knee_level` (resize no more than needed), else
    the one with the highest safe level."""
    measured = [int(v) for v in table["level"]] if not table.empty else []
    top = max(TOP_LEVEL_FLOOR, 2 * max(measured, default=1))
    odds = page.odds(top)
    safe = safe_level(odds, risk)
    resizes = []
    largest = max(page.sizes, key=lambda s: s.rise_mib)
    for side in RESIZE_SIDES:
        resized = safe_level(page.odds(top, side), risk)
        peak = page.resized(largest, side).rise_mib
        resizes.append({"max_side": side, "safe_level": resized,
                        "largest_rise_change": peak / largest.rise_mib - 1 if largest.rise_mib > 0 else 0.0})  # fmt: skip
    lifting = [r for r in resizes if r["safe_level"] > safe]
    enough = [r for r in lifting if knee_level is not None and r["safe_level"] >= knee_level]
    best = max(enough, key=lambda r: r["max_side"]) if enough else None
    if best is None and lifting:
        best = max(lifting, key=lambda r: (r["safe_level"], r["max_side"]))
    seen = requests[_oom_mask(requests)] if not requests.empty else requests
    return {
        **page.to_dict(), "oom_risk": risk, "oom_odds": odds[: max(max(measured, default=0), safe) + 1],
        "safe_level": safe, "limiting_size": largest.bucket, "levels": level_rows(page, table, requests, odds, risk),
        "ooms_by_size": _by_size(seen),
        "resizes": resizes, "best_resize": best,
    }  # fmt: skip


def _by_size(ooms: pd.DataFrame) -> dict[str, int]:
    """OOMs per page size, the sizes with none left out."""
    counts = ooms["bucket"].astype(str).value_counts() if not ooms.empty else pd.Series(dtype="int64")
    return {str(k): int(v) for k, v in counts.items() if v > 0}


def resize_words(mix: dict[str, Any], recommended: int | None) -> str:
    """'pages resized to at most 1536 px: 11 instead of 8, -40% peak' for the best resize, else ''."""
    best = mix.get("best_resize")
    if not best:
        return ""
    return (f"pages resized to at most {best['max_side']} px: {best['safe_level']} instead of {recommended},"
            f" {best['largest_rise_change']:+.0%} peak for the largest page ({mix['limiting_size']})")  # fmt: skip


def bound_by_the_mix(knee: Knee, mix: dict[str, Any]) -> Knee:
    """The knee's recommendation held to the mix's safe level; the reason names which bound decided."""
    level, safe, risk = knee.recommended_level, int(mix["safe_level"]), mix["oom_risk"]
    if level is None:
        return knee
    every = mix["oom_odds"]  # level 1, 2, ...
    if level <= safe:
        why = f" Safe for the mix too: the odds of running out of memory at {level} are at most {risk:g} (safe up to {safe})."
        resize = resize_words(mix, safe)
        if resize and safe == level:  # the mix's memory is what stops the next level
            why += f" The {mix['limiting_size']} pages set that limit; the resize that lifts it: {resize}."
        return replace(knee, reason=knee.reason + why + _seen_words(mix, level))
    at = f" ({every[level - 1]:.2%} a request)" if level <= len(every) else ""
    why = (f"Bound by the mix's memory, not the knee (the knee allows {level}): at {level} the odds that a request runs out of memory{at}"
           f" are above OOM_RISK {risk:g}; the highest level within it is {safe}, limited by the {mix['limiting_size']}"
           " pages" + (" (not even 1: 1 is what the card can do at all)." if safe < 1 else "."))  # fmt: skip
    resize = resize_words(mix, safe)
    if resize:
        why += f" The resize that lifts it: {resize} (prove it with make sweep SWEEP='max_side=0,{mix['best_resize']['max_side']}')."
    value = max(1, safe)
    why += _seen_words(mix, value)
    return replace(knee, recommended_level=value, reason=f"{why} {knee.reason}", confidence=(value, value), at_least=False)


ALONE_WORDS = (
    "What was measured and how: after a warm-up on the smallest page, one user sent each size alone, {n} requests"
    " each, fewest pixels first (the sizes phase), before the baseline's rounds of the mix; a size's MiB per"
    " request is the highest GPU reading during its requests over idle, the median of its requests. A caching"
    " allocator's memory never falls back between requests: its high-water mark rises at each new size (sent"
    " smallest first, so each is a new mark), and a size's MiB per request is the mark it raised over the reading"
    " before the run's first request. The weights are the mix as configured (BUCKETS, or the folder's images)."
)

OLD_RUN_WORDS = (
    "A run from before the sizes phase: each size as the baseline's random draws of the mix sent it alone; a"
    " size they missed takes its MiB per request from the fit."
)


def size_words(size: dict[str, Any]) -> str:
    """A size's name in the tables: its bucket, and what MAX_SIDE sent where it resized it."""
    sent = size.get("sent_px")
    return f"{size['bucket']} (sent as {sent[0]}x{sent[1]})" if sent else str(size["bucket"])


def mix_markdown(mix: dict[str, Any] | None) -> list[str]:
    """capacity.md's section for a mixed run: memory per page size, the odds per level beside the OOMs
    seen, the safe level and the resize; [] for a fixed-size run."""
    if not mix:
        return []
    alone = mix.get("alone_requests")
    words = ALONE_WORDS.format(n=alone) if alone else OLD_RUN_WORDS
    lines = ["", "## Memory per page size (each measured alone in the baseline)", "", words, "",
             "| size | weight in the mix | MiB per request | latency alone ms | requests alone |", "|---|---|---|---|---|"]  # fmt: skip
    for s in mix["sizes"]:
        fit = "" if s["measured"] else " (from the fit: no reading fell inside its requests)"
        lines.append(f"| {size_words(s)} | {s['weight']:.0%} | {s['rise_mib']:,.0f}{fit} | {s['latency_alone_ms']:,.0f} |"
                     f" {s['baseline_requests']} |")  # fmt: skip
    if mix["mib_per_mpix"] is not None:
        lines += ["", f"Fit: {mix['fixed_mib']:,.0f} MiB + {mix['mib_per_mpix']:,.0f} MiB per megapixel."]
    lines += ["", f"## The odds of running out of memory (OOM_RISK {mix['oom_risk']:g})", "",
              f"N requests in service are N draws of the mix (in service: weight x latency alone); a request fails"
              f" when its memory and the others' pass the {mix['free_mib']:,.0f} MiB free above idle. Exact"
              " distribution of the sum (analysis/estimate/oom_odds.py).", "",
              "| level | odds a request runs out | requests | OOMs seen | OOMs by size | note |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in mix["levels"]:
        by_size = ", ".join(f"{k}: {v}" for k, v in r["ooms_by_size"].items()) or "-"
        lines.append(f"| {r['level']} | {r['oom_odds']:.4%} | {r['requests']} | {r['ooms']} | {by_size} | {r['note'] or '-'} |")
    lines += ["", f"Safe level for the mix: **{mix['safe_level']}** (limited by the {mix['limiting_size']} pages)."]
    for r in mix["resizes"]:
        lines.append(f"- resized to at most {r['max_side']} px: safe level {r['safe_level']}"
                     f" ({r['largest_rise_change']:+.0%} memory for the largest page)")  # fmt: skip
    if "verify_ooms_by_size" in mix:
        seen = ", ".join(f"{k}: {v}" for k, v in mix["verify_ooms_by_size"].items()) or "none"
        lines += ["", f"Verify window (it sends the run's own mix): OOMs by size: {seen}."]
    if mix["best_resize"]:
        lines += ["", f"Best: {resize_words(mix, mix['safe_level'])}. HAProxy cannot resize: resize in the client or"
                  " a preprocessing step before the server (recommended-config.yaml's max_image_side); prove it with"
                  f" `make sweep SWEEP='max_side=0,{mix['best_resize']['max_side']}'`."]  # fmt: skip
    return lines


def _seen_words(mix: dict[str, Any], level: int) -> str:
    """What the measured step at `level` can say on its own (rule of three), where it cannot call it safe."""
    notes = [r["note"] for r in mix["levels"] if r["level"] == level and r["note"]]
    return f" At {level} as measured: {notes[-1]}." if notes else ""


def config_for_the_mix(config: dict[str, Any], comments: dict[str, str], mix: dict[str, Any] | None,
                       knee: Knee) -> None:  # fmt: skip
    """recommended-config.yaml for a mixed run, in place: max_concurrency's source where the mix bound it,
    and max_image_side where a resize lifts the safe level (HAProxy cannot resize: said where it goes)."""
    if not mix:
        return
    if knee.recommended_level is not None and knee.recommended_level == mix["safe_level"] and knee.reason.startswith("Bound"):
        comments["server.max_concurrency"] = (f"the highest level whose odds of running out of memory for the run's"
                                              f" mix are at most OOM_RISK {mix['oom_risk']:g} (below the knee)")  # fmt: skip
    best = mix.get("best_resize")
    if not best:
        return
    config["max_image_side"] = int(best["max_side"])
    comments["max_image_side"] = (
        f"resize pages to at most this long side: safe level {best['safe_level']} instead of {mix['safe_level']}"
        " (from the fit of MiB per megapixel); HAProxy cannot resize: the client or a preprocessing step in front"
        f" of the server does; max_concurrency is for pages as sent. Prove it: make sweep SWEEP='max_side=0,{best['max_side']}'"
    )


def with_mix_odds(steps: pd.DataFrame, mix: dict[str, Any] | None) -> pd.DataFrame:
    """The step table with `oom_odds` (the mix's odds at each row's level) for a mixed run; as it is otherwise."""
    if not mix or steps.empty:
        return steps
    odds = {r["level"]: r["oom_odds"] for r in mix["levels"]}
    every = mix["oom_odds"]
    return steps.assign(oom_odds=[odds.get(int(v), every[int(v) - 1] if 0 < int(v) <= len(every) else None)
                                  for v in steps["level"]])  # fmt: skip


def verify_ooms_by_size(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, int]:
    """OOMs of the verify window by page size (it sends the run's own mix: the same image set)."""
    if steps.empty or requests.empty:
        return {}
    verify = steps.loc[steps["phase"] == "verify", "step_index"].tolist()
    mine = requests[requests["step_index"].isin(verify)]
    return _by_size(mine[_oom_mask(mine)])
