"""Memory per page size, measured alone, and the odds of running out at each level (issue 49).

A mixed run's baseline sends each size alone first (the sizes phase: SIZE_ALONE_REQUESTS each, fewest pixels
first: loadtest/method/plan.py), then its mix; both run one user, so each request is alone on the server: its
rise is the highest GPU reading (the server's card) between its start and its answer, over idle (the idle
phase's median: not a slope's intercept, which a mix of sizes across levels pushes up: 8,751 MiB where
pages-24g idled at 7,000). A reading every 0.5 s (DCGM) falls inside few short requests: those it misses are
left out, and a size none of whose requests had a reading takes its rise from the fit (`measured` False;
640x480 at 44 ms on pages-24g); a size never sent alone (a run from before the sizes phase) takes it from the
fit too, with its median latency under load. Per size bucket of the run's mix:
    rise_mib          the median of its requests' rises (requests with no reading inside are left out)
    latency_alone_ms  the median latency of its answered requests alone
    weight            its share of the mix: as configured (the manifest's page_mix), else as the client sent it
Where sizes differ (two buckets or more with a rise), a least-squares line over the buckets:
    rise = fixed_mib + mib_per_mpix x megapixels        (a vision encoder's tokens grow with pixels)
The odds per level are analysis.estimate.oom_odds's with free = total - other processes - idle.
A caching allocator (the device shows a high-water mark that never falls between requests): each size's rise
is the mark it reached in the sizes phase over the reading before the pre-flight's request (`_marks`): sent
fewest pixels first, each size sets a new mark. Without a sizes phase the mark shows the largest page seen so
far, not this page's own: no table. A fixed-size run has one bucket: no table, no odds, its answers as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.estimate.estimate_record import Estimate
from analysis.estimate.oom_odds import in_service_weights, oom_odds_by_level, safe_level

_SIZE = re.compile(r"^(?:\d+x\d+\.\.)?(\d+)x(\d+)$")  # "WxH", or a folder's band "WxH..WxH": its largest
MIN_SIZES = 2  # a mix: at least two buckets measured
MIX_TOP_LEVEL = 256  # a mix's estimate: the odds computed up to this many requests in service
MARK_AFTER_S = 1.0  # a caching allocator's largest size: its mark read up to this long after its last answer


@dataclass(frozen=True)
class PageSize:
    bucket: str  # "WxH"
    mpix: float
    weight: float  # share of the run's requests
    baseline_requests: int  # alone, with a GPU reading inside
    rise_mib: float  # one request alone, over idle
    latency_alone_ms: float
    measured: bool = True  # False: no reading fell inside its requests; its rise is the fit's
    sent_px: tuple[int, int] | None = None  # (w, h) sent where MAX_SIDE resized it (the bucket keeps the source's name)

    @property
    def px(self) -> tuple[int, int] | None:
        """The (width, height) the server was sent: MAX_SIDE's, else the bucket's own."""
        return self.sent_px or size_of(self.bucket)


@dataclass(frozen=True)
class PageMemory:
    sizes: tuple[PageSize, ...]
    free_mib: float  # total - other processes - idle: what requests may hold
    fixed_mib: float | None  # the fit's part that does not grow with pixels
    mib_per_mpix: float | None

    def odds(self, top_level: int, max_side: int = 0) -> list[float]:
        """odds(N) for N = 1 .. top_level; with max_side > 0, pages resized to it (from the fit)."""
        sizes = [self.resized(s, max_side) for s in self.sizes] if max_side > 0 else list(self.sizes)
        incs = [s.rise_mib for s in sizes]
        service = in_service_weights([s.weight for s in sizes], [s.latency_alone_ms for s in sizes])
        return oom_odds_by_level(incs, [s.weight for s in sizes], service, self.free_mib, top_level)

    def resized(self, size: PageSize, max_side: int) -> PageSize:
        """`size` resized to a long side of at most `max_side` (`_resized`: its rise from the fit)."""
        return _resized(size, max_side, self)

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": [asdict(s) for s in self.sizes], "free_mib": self.free_mib, "fixed_mib": self.fixed_mib,
                "mib_per_mpix": self.mib_per_mpix}  # fmt: skip


def _resized(size: PageSize, max_side: int, fit: PageMemory) -> PageSize:
    """The page resized to a long side of at most max_side: its rise from the fit, its latency alone
    scaled by the rise's share (time grows with pixels too); unchanged where it is already within."""
    if size.px is None or fit.mib_per_mpix is None or fit.fixed_mib is None:
        return size
    w, h = size.px
    if max(w, h) <= max_side:
        return size
    scale = max_side / max(w, h)
    mpix = round(w * scale) * round(h * scale) / 1e6
    rise = min(size.rise_mib, max(0.0, fit.fixed_mib + fit.mib_per_mpix * mpix))
    latency = size.latency_alone_ms * min(1.0, mpix / size.mpix)
    return PageSize(f"{round(w * scale)}x{round(h * scale)}", mpix, size.weight, size.baseline_requests, rise,
                    max(latency, 1e-3))  # fmt: skip


ALONE_PHASES = ("sizes", "baseline")  # one user: each request alone on the server


def page_memory(requests: pd.DataFrame, steps: pd.DataFrame, card: pd.DataFrame, estimate: Estimate,
                weights: Mapping[str, float] | None = None,
                sent: Mapping[str, tuple[int, int]] | None = None) -> PageMemory | None:  # fmt: skip
    """The measured sizes of a mixed run (module doc); None for one size, no GPU-memory readings, or a caching
    allocator's memory without a sizes phase. `weights`: each size's share of the mix as configured (the
    manifest's page_mix), else the shares the run sent outside its sizes phase; `sent`: each bucket's size as
    MAX_SIDE sent it (sent_sizes), its megapixels the fit's."""
    if estimate.idle_mib is None or not estimate.total_mib or card.empty or not is_mixed(requests):
        return None
    caching = estimate.memory_case == "caching_allocator"
    phase_of = dict(zip(steps["step_index"], steps["phase"].astype(str), strict=True)) if not steps.empty else {}
    sizes_idx = [i for i, ph in phase_of.items() if ph == "sizes"]
    if caching and not sizes_idx:
        return None
    idle_idx = [i for i, ph in phase_of.items() if ph == "idle"]
    idle = card.loc[card["step_index"].isin(idle_idx), "mem_used_mib"].dropna()
    # a caching allocator's idle is the reading before the pre-flight's request (its mark since: the estimate's)
    idle_mib = float(estimate.idle_mib) if caching or idle.empty else float(idle.median())
    alone = requests[requests["step_index"].isin([i for i, ph in phase_of.items() if ph in ALONE_PHASES])
                     & requests["ok"].astype(bool)]  # fmt: skip
    rises = _caching_rises(alone, steps, card, sizes_idx, idle_mib) if caching else _rises(alone, card, idle_mib)
    sizes: list[PageSize] = []
    unread: list[PageSize] = []
    for bucket, share in _shares(requests, sizes_idx, weights).items():
        px = (sent or {}).get(bucket) or size_of(bucket)
        latency = alone.loc[alone["bucket"].astype(str) == bucket, "latency_ms"]
        if latency.empty:  # a size the baseline never sent: its latency under load stands in (an upper bound)
            answered = requests[requests["ok"].astype(bool) & (requests["bucket"].astype(str) == bucket)]
            latency = answered["latency_ms"]
        if px is None or latency.empty or share <= 0:
            continue
        got = rises.get(bucket, [])
        size = PageSize(bucket, px[0] * px[1] / 1e6, float(share), len(got), float(np.median(got)) if got else 0.0,
                        float(latency.median()), measured=bool(got), sent_px=(sent or {}).get(bucket))  # fmt: skip
        (sizes if got else unread).append(size)
    if len(sizes) < MIN_SIZES:
        return None
    fixed, slope = _fit(sizes)
    sizes += [replace(s, rise_mib=max(0.0, (fixed or 0.0) + (slope or 0.0) * s.mpix)) for s in unread]
    sizes.sort(key=lambda s: s.mpix)
    free = float(estimate.total_mib) - (estimate.other_mem_mib or 0.0) - idle_mib
    return PageMemory(tuple(sizes), free, fixed, slope)


def size_of(bucket: str) -> tuple[int, int] | None:
    """A bucket's (width, height) in pixels: its own, or a band's largest image's ("WxH..WxH"); None for none."""
    match = _SIZE.match(bucket)
    return (int(match.group(1)), int(match.group(2))) if match else None


def sent_sizes(manifest: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Each bucket's largest page as MAX_SIDE sent it (the manifest's images_sent), where it was resized; {}
    without MAX_SIDE. A resized page keeps its source's bucket (a sweep compares the same pages), so its
    megapixels are read here, not from the bucket's name."""
    told = manifest.get("images_sent")
    sizes = told.get("sizes") if isinstance(told, Mapping) else None
    out: dict[str, tuple[int, int]] = {}
    for entry in sizes if isinstance(sizes, list) else []:
        try:
            bucket, before, after = str(entry["bucket"]), tuple(entry["before_px"]), tuple(entry["after_px"])
            w, h = int(after[0]), int(after[1])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        known = out.get(bucket)
        if before != after and (known is None or w * h > known[0] * known[1]):
            out[bucket] = (w, h)
    return out


def mix_weights(manifest: Mapping[str, Any]) -> dict[str, float] | None:
    """Each size bucket's weight in the mix as configured (the manifest's `page_mix.weights`), None without."""
    mix = manifest.get("page_mix")
    weights = mix.get("weights") if isinstance(mix, Mapping) else None
    if not isinstance(weights, Mapping):
        return None
    return {str(b): float(w) for b, w in weights.items() if isinstance(w, int | float)} or None


def _shares(requests: pd.DataFrame, sizes_idx: list[int], weights: Mapping[str, float] | None) -> dict[str, float]:
    """Each size's share of the mix: as configured where known, else as sent (the sizes phase, which sends
    each size alike, left out)."""
    if weights:
        total = sum(w for w in weights.values() if w > 0)
        return {str(b): float(w) / total for b, w in weights.items() if w > 0} if total > 0 else {}
    sent = requests[~requests["step_index"].isin(sizes_idx)] if sizes_idx else requests
    return {str(b): float(s) for b, s in sent["bucket"].astype(str).value_counts(normalize=True).items()}


def mix_estimate(estimate: Estimate, page: PageMemory, risk: float) -> Estimate:
    """A mixed run's estimate from its sizes measured alone: the highest level whose odds of running out of
    memory (every lower level's too) are within `risk` (OOM_RISK), its increment the mix's mean memory a
    request in service. Not the baseline's peak (one size's: whichever its draws reached), nor a slope refitted
    across levels of mixed pages (their peaks follow which pages happened to be in service: an idle of 8,808
    MiB where the card idled at 7,000). At most the engine's limit where known."""
    odds = page.odds(MIX_TOP_LEVEL)
    safe = safe_level(odds, risk)
    service = in_service_weights([s.weight for s in page.sizes], [s.latency_alone_ms for s in page.sizes])
    mean_mib = sum(q * s.rise_mib for q, s in zip(service, page.sizes, strict=True))
    value = safe if estimate.max_num_seqs is None else min(safe, estimate.max_num_seqs)
    each = ", ".join(f"{s.bucket} {s.rise_mib:,.0f} MiB" for s in page.sizes)
    reason = (
        f"a mix of {len(page.sizes)} page sizes, each measured alone ({each}): {mean_mib:,.0f} MiB a request in"
        f" service on average; the odds that a request runs the card out of memory ({page.free_mib:,.0f} MiB"
        f" free above idle) stay within OOM_RISK {risk:g} up to {safe} requests in service"
        + (" (or more: the odds were computed that far)" if safe >= MIX_TOP_LEVEL else "")
        + (f"; capped at the engine's limit max_num_seqs {value}" if value != safe else "")
    )
    return replace(estimate, estimate=value, increment_mib=mean_mib, available_mib=page.free_mib, reason=reason,
                   mix_risk=risk)  # fmt: skip


def is_mixed(requests: pd.DataFrame) -> bool:
    """The run sent pages of two sizes or more (SCENARIO=mixed, a folder of sizes)."""
    if requests.empty or "bucket" not in requests.columns:
        return False
    return sum(1 for b in requests["bucket"].astype(str).unique() if _SIZE.match(b)) >= MIN_SIZES


def _rises(base: pd.DataFrame, card: pd.DataFrame, idle_mib: float) -> dict[str, list[float]]:
    """Per bucket, each alone request's highest reading over idle (requests with no reading left out)."""
    t = card["t_unix_s"].to_numpy(dtype=np.float64)
    mem = card["mem_used_mib"].to_numpy(dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t, mem = t[order], mem[order]
    out: dict[str, list[float]] = {}
    for start, latency, bucket in zip(base["t_start_unix_s"], base["latency_ms"], base["bucket"].astype(str), strict=True):
        lo, hi = np.searchsorted(t, start, "left"), np.searchsorted(t, start + latency / 1000.0, "right")
        inside = mem[lo:hi]
        inside = inside[~np.isnan(inside)]
        if inside.size:
            out.setdefault(bucket, []).append(max(0.0, float(inside.max()) - idle_mib))
    return out


def _caching_rises(alone: pd.DataFrame, steps: pd.DataFrame, card: pd.DataFrame, sizes_idx: list[int],
                   idle_mib: float) -> dict[str, list[float]]:  # fmt: skip
    """A caching allocator's rise per size: the marks of the sizes phase (`_marks`), the smallest's read from
    the warm-up before it too (it sent the smallest page only: its readings are that mark)."""
    warmup = steps[(steps["step_index"] == min(sizes_idx) - 1) & (steps["phase"].astype(str) == "warmup")]
    first_s = float(warmup["t_start_unix_s"].iloc[0]) if not warmup.empty and "t_start_unix_s" in warmup else None
    return _marks(alone[alone["step_index"].isin(sizes_idx)], card, idle_mib, first_s)


def _marks(alone: pd.DataFrame, card: pd.DataFrame, idle_mib: float, first_s: float | None = None) -> dict[str, list[float]]:
    """A caching allocator's sizes phase (fewest pixels first): per bucket, the high-water mark its requests
    reached over idle: the highest reading from its first request's start to the next size's (the last: to
    its last answer; the first: from `first_s`, the warm-up on the smallest page, where given). The mark never
    falls between requests, so a reading after the request still shows it; each size is larger than the one
    before, so the mark it reaches is its own peak. One value per size."""
    if alone.empty:
        return {}
    ordered = alone.sort_values("t_start_unix_s", kind="stable")
    firsts = ordered.groupby(ordered["bucket"].astype(str), sort=False)["t_start_unix_s"].min().sort_values()
    if first_s is not None:  # 640x480's three requests took 110 ms on pages-24g: no 0.5 s reading fell there
        firsts.iloc[0] = min(float(firsts.iloc[0]), first_s)
    end_s = float((ordered["t_start_unix_s"] + ordered["latency_ms"] / 1000.0).max())
    bounds = [*firsts.tolist()[1:], end_s + MARK_AFTER_S]  # the next size's start is not this size's
    out: dict[str, list[float]] = {}
    for (bucket, start), stop in zip(firsts.items(), bounds, strict=True):
        inside = card.loc[(card["t_unix_s"] >= start) & (card["t_unix_s"] < stop), "mem_used_mib"].dropna()
        if not inside.empty:
            out[str(bucket)] = [max(0.0, float(inside.max()) - idle_mib)]
    return out


def _fit(sizes: list[PageSize]) -> tuple[float | None, float | None]:
    """rise = fixed + slope x Mpix by least squares over the buckets; (None, None) where sizes do not differ."""
    x = np.array([s.mpix for s in sizes])
    if np.ptp(x) <= 0:
        return None, None
    slope, fixed = np.polyfit(x, np.array([s.rise_mib for s in sizes]), 1)
    return float(fixed), float(slope)
