"""Memory per page size, measured in the baseline, and the odds of running out at each level (issue 49).

The baseline runs one user, so each of its requests is alone on the server: its rise is the highest GPU
reading (the server's card) between its start and its answer, over idle (the idle phase's median: not a
slope's intercept, which a mix of sizes across levels pushes up: 8,751 MiB where pages-24g idled at 7,000).
A reading every 0.5 s (DCGM) falls inside few short requests: those it misses are left out, and a size none
of whose requests had a reading takes its rise from the fit (`measured` False; 640x480 at 44 ms on pages-24g),
and a size the baseline never drew takes it from the fit too, with its median latency under load. Per size bucket of the run's mix:
    rise_mib          the median of its requests' rises (requests with no reading inside are left out)
    latency_alone_ms  the median latency of its answered baseline requests
    weight            its share of the run's requests (the mix as the client sent it)
Where sizes differ (two buckets or more with a rise), a least-squares line over the buckets:
    rise = fixed_mib + mib_per_mpix x megapixels        (a vision encoder's tokens grow with pixels)
The odds per level are analysis.estimate.oom_odds's with free = total - other processes - idle.
Limits: a caching allocator (the device shows a high-water mark) shows the largest page seen so far, not
this page's own; the rise is then left out (`kept` says so) and the odds are not computed. A fixed-size run
has one bucket: no table, no odds, its answers as before.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.estimate.estimate_record import Estimate
from analysis.estimate.oom_odds import in_service_weights, oom_odds_by_level

_SIZE = re.compile(r"^(\d+)x(\d+)$")
MIN_SIZES = 2  # a mix: at least two buckets measured


@dataclass(frozen=True)
class PageSize:
    bucket: str  # "WxH"
    mpix: float
    weight: float  # share of the run's requests
    baseline_requests: int  # alone, with a GPU reading inside
    rise_mib: float  # one request alone, over idle
    latency_alone_ms: float
    measured: bool = True  # False: no reading fell inside its requests; its rise is the fit's


@dataclass(frozen=True)
class PageMemory:
    sizes: tuple[PageSize, ...]
    free_mib: float  # total - other processes - idle: what requests may hold
    fixed_mib: float | None  # the fit's part that does not grow with pixels
    mib_per_mpix: float | None

    def odds(self, top_level: int, max_side: int = 0) -> list[float]:
        """odds(N) for N = 1 .. top_level; with max_side > 0, pages resized to it (from the fit)."""
        sizes = [_resized(s, max_side, self) for s in self.sizes] if max_side > 0 else list(self.sizes)
        incs = [s.rise_mib for s in sizes]
        service = in_service_weights([s.weight for s in sizes], [s.latency_alone_ms for s in sizes])
        return oom_odds_by_level(incs, [s.weight for s in sizes], service, self.free_mib, top_level)

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": [asdict(s) for s in self.sizes], "free_mib": self.free_mib, "fixed_mib": self.fixed_mib,
                "mib_per_mpix": self.mib_per_mpix}  # fmt: skip


def _resized(size: PageSize, max_side: int, fit: PageMemory) -> PageSize:
    """The page resized to a long side of at most max_side: its rise from the fit, its latency alone
    scaled by the rise's share (time grows with pixels too); unchanged where it is already within."""
    match = _SIZE.match(size.bucket)
    if not match or fit.mib_per_mpix is None or fit.fixed_mib is None:
        return size
    w, h = int(match.group(1)), int(match.group(2))
    if max(w, h) <= max_side:
        return size
    scale = max_side / max(w, h)
    mpix = round(w * scale) * round(h * scale) / 1e6
    rise = min(size.rise_mib, max(0.0, fit.fixed_mib + fit.mib_per_mpix * mpix))
    latency = size.latency_alone_ms * min(1.0, mpix / size.mpix)
    return PageSize(f"{round(w * scale)}x{round(h * scale)}", mpix, size.weight, size.baseline_requests, rise,
                    max(latency, 1e-3))  # fmt: skip


def page_memory(requests: pd.DataFrame, steps: pd.DataFrame, card: pd.DataFrame, estimate: Estimate) -> PageMemory | None:
    """The measured sizes of a mixed run (module doc); None for one size, a caching allocator's memory,
    or no GPU-memory readings."""
    if estimate.idle_mib is None or not estimate.total_mib or card.empty or estimate.memory_case == "caching_allocator":
        return None
    if not is_mixed(requests):
        return None
    shares = requests["bucket"].astype(str).value_counts(normalize=True)
    idle_idx = steps.loc[steps["phase"] == "idle", "step_index"].tolist() if not steps.empty else []
    idle = card.loc[card["step_index"].isin(idle_idx), "mem_used_mib"].dropna()
    idle_mib = float(idle.median()) if not idle.empty else float(estimate.idle_mib)
    base_idx = steps.loc[steps["phase"] == "baseline", "step_index"].tolist() if not steps.empty else []
    base = requests[requests["step_index"].isin(base_idx) & requests["ok"].astype(bool)]
    rises = _rises(base, card, idle_mib)
    sizes: list[PageSize] = []
    unread: list[PageSize] = []
    for bucket, share in shares.items():
        match = _SIZE.match(str(bucket))
        latency = base.loc[base["bucket"].astype(str) == str(bucket), "latency_ms"]
        if latency.empty:  # a rare size the baseline never drew: its latency under load stands in (an upper bound)
            answered = requests[requests["ok"].astype(bool) & (requests["bucket"].astype(str) == str(bucket))]
            latency = answered["latency_ms"]
        if not match or latency.empty or share <= 0:
            continue
        got = rises.get(str(bucket), [])
        size = PageSize(str(bucket), int(match.group(1)) * int(match.group(2)) / 1e6, float(share), len(got),
                        float(np.median(got)) if got else 0.0, float(latency.median()), measured=bool(got))  # fmt: skip
        (sizes if got else unread).append(size)
    if len(sizes) < MIN_SIZES:
        return None
    fixed, slope = _fit(sizes)
    sizes += [replace(s, rise_mib=max(0.0, (fixed or 0.0) + (slope or 0.0) * s.mpix)) for s in unread]
    sizes.sort(key=lambda s: s.mpix)
    free = float(estimate.total_mib) - (estimate.other_mem_mib or 0.0) - idle_mib
    return PageMemory(tuple(sizes), free, fixed, slope)


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


def _fit(sizes: list[PageSize]) -> tuple[float | None, float | None]:
    """rise = fixed + slope x Mpix by least squares over the buckets; (None, None) where sizes do not differ."""
    x = np.array([s.mpix for s in sizes])
    if np.ptp(x) <= 0:
        return None, None
    slope, fixed = np.polyfit(x, np.array([s.rise_mib for s in sizes]), 1)
    return float(fixed), float(slope)
