"""Exact percentiles and an order-statistic confidence interval for a quantile.

Percentiles use numpy's default (linear interpolation between order statistics), on all samples, no
histogram. The interval for the q-quantile is distribution-free: the number of samples below the true
quantile is Binomial(n, q), so the order statistics X(l) and X(u) with P(l <= B <= u - 1) >= 1 - alpha
bracket it (Hahn & Meeker). Where the data cannot reach alpha/2 in a tail (small n), that bound is the
sample minimum or maximum, which widens the interval honestly instead of inventing precision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]


def percentile(values: FloatArray, q: float) -> float:
    """The q-th percentile (0..100) with numpy's linear interpolation; NaN when empty."""
    if values.size == 0:
        return math.nan
    return float(np.percentile(values, q))


def stat(values: FloatArray, how: str) -> float:
    """numpy's `how` ("mean", "median", "max", ...) of the values as a float; NaN when empty."""
    if values.size == 0:
        return math.nan
    return float(getattr(np, how)(values))


def latency_cv(values: FloatArray) -> float:
    """Coefficient of variation (sample standard deviation / mean); NaN under two values or a zero mean.
    The step table's `latency_cv` and the master's live request target (loadtest/method/timing.py) both use it."""
    if values.size < 2:
        return math.nan
    mean = float(values.mean())
    return float(values.std(ddof=1)) / mean if mean > 0 else math.nan


def _binomial_cdf(n: int, p: float) -> FloatArray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), in log space so large n stays exact."""
    k = np.arange(n + 1, dtype=np.float64)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))
    log_pmf = log_fact[n] - log_fact[: n + 1] - log_fact[n::-1] + k * math.log(p) + (n - k) * math.log1p(-p)
    cdf = np.cumsum(np.exp(log_pmf - log_pmf.max()))
    return cdf / cdf[-1]


def quantile_ci(sorted_values: FloatArray, q: float = 0.95, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the q-quantile from sorted samples; NaNs when empty."""
    n = int(sorted_values.size)
    if n == 0:
        return math.nan, math.nan
    alpha = (1.0 - confidence) / 2.0
    cdf = _binomial_cdf(n, q)
    # lower rank l (1-based): the largest l with P(B <= l - 1) <= alpha
    below = np.nonzero(cdf <= alpha)[0]
    low_rank = int(below[-1]) + 1 if below.size else 1
    # upper rank u: the smallest u with P(B <= u - 1) >= 1 - alpha
    above = np.nonzero(cdf >= 1.0 - alpha)[0]
    high_rank = int(above[0]) + 1 if above.size else n
    low_rank = min(max(low_rank, 1), n)
    high_rank = min(max(high_rank, 1), n)
    return float(sorted_values[low_rank - 1]), float(sorted_values[high_rank - 1])


def linear_fit(x: FloatArray, y: FloatArray) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (slope b, intercept a, r2). NaNs with fewer than 2 distinct x."""
    if x.size < 2 or float(np.ptp(x)) == 0.0:
        return math.nan, math.nan, math.nan
    x_mean, y_mean = float(x.mean()), float(y.mean())
    dx, dy = x - x_mean, y - y_mean
    sxx = float((dx * dx).sum())
    slope = float((dx * dy).sum()) / sxx
    intercept = y_mean - slope * x_mean
    ss_tot = float((dy * dy).sum())
    resid = dy - slope * dx
    r2 = 1.0 - float((resid * resid).sum()) / ss_tot if ss_tot > 0 else 1.0
    return slope, intercept, r2


def num(row: Any, name: str) -> float:
    """A number from a step row (a dict or other mapping, or a record); NaN when absent or not a number."""
    value = row.get(name) if isinstance(row, Mapping) else getattr(row, name, math.nan)
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """`frame.to_dict("records")` (Python values, not numpy ones), a column at a time: pandas' own walks the
    ~80 columns of a step table one `iloc` each, and the knee reads the table at every step change."""
    columns = list(frame.columns)
    return [dict(zip(columns, values, strict=True)) for values in zip(*(frame[c].tolist() for c in columns), strict=True)]


def t_975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%) for df degrees of freedom, by its series in 1/df (Abramowitz
    & Stegun 26.7.5: within 0.01 from df = 3, exact 12.706 / 4.303 below); inf under 1."""
    if df < 1:
        return math.inf
    if df <= 2:
        return (12.706, 4.303)[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2) + (
        3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)  # fmt: skip


def slope_ci95(x: FloatArray, y: FloatArray) -> tuple[float, float, float]:
    """The least-squares slope (`linear_fit`) and its 95% interval (t with n - 2 degrees of freedom on the
    residuals' spread): (slope, low, high); NaNs with fewer than 3 points or 2 distinct x."""
    slope, intercept, _ = linear_fit(x, y)
    if x.size < 3 or math.isnan(slope):
        return math.nan, math.nan, math.nan
    resid = y - (intercept + slope * x)
    sxx = float(((x - x.mean()) ** 2).sum())
    se = math.sqrt(float((resid * resid).sum()) / (x.size - 2) / sxx)
    half = t_975(int(x.size) - 2) * se
    return slope, slope - half, slope + half


def wilson_ci95(hits: int, n: int) -> tuple[float, float]:
    """Wilson's 95% interval of a proportion hits / n (sound at 0 and 1, unlike the normal one); NaNs at n = 0."""
    if n <= 0:
        return math.nan, math.nan
    z, p = 1.959964, hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
