"""Rule 2b of the knee (analysis/knee/find.py): no recommendation above the engine's own limit.

An engine that runs at most L requests at once (vLLM's --max-num-seqs, a batch size) serves L users and
no more: with C > L users in a closed loop, C - L of them only wait in its queue. Their throughput can
still read a few percent above level L's. At level L every slot sits empty for the part of each
request's round trip spent outside the engine (the client sending it, the HTTP server, the driver's own
CPU), while past L a queued request fills it at once: real vLLM and the simulator at a short time scale
gain 5-8% that way (simulator hunyuan-vllm-24g --max-num-seqs 8 at time scale 0.25: 53.7 rps at 8 users,
58.1 at 10). That gain is bought with a whole service time of queueing for every user above L, and rule
2's 95% bar would then put the answer above L (level 10, "no knee yet"), where the engine still runs 8.

So where the limit L is known, the recommendation is at most L:
- the limit is the one the server shows (`server_limit`: vllm:num_requests_running stays at its most
  while others wait), else the one its /metrics gives (`server_max_num_seqs`: trtllm-serve's
  trtllm_max_batch_size_static, Triton's nv_trt_llm_request_metrics{request_type="max"}; vLLM has none),
  else the one the user gave (MAX_NUM_SEQS); a stated one (gauge or MAX_NUM_SEQS) not where the server
  ran more than that at once (the number is then not the engine's: several replicas behind a balancer);
- the cap is the lowest clean level at or above L (L itself once measured; below it the refinement
  measures L first, next_level.next_refine_level), and it applies when rule 2's answer lies above it;
- the level above the cap must show the queue, not more running: its throughput grows by less than
  QUEUE_GAIN_SHARE (half) of what its added users would bring if they ran (gain / (added users / cap)
  < 0.5). A server that scales past the stated limit like that runs the users; rule 2 then stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.common.stats import num

QUEUE_GAIN_SHARE = 0.5  # past the limit, more than half a proportional gain means the users run


@dataclass(frozen=True)
class EngineLimit:
    level: int  # requests the engine runs at once at most
    source: str  # where that comes from, for the reason


def server_limit(table: pd.DataFrame) -> int | None:
    """Requests the server runs at once at most, where it shows it: the most requests running stays the
    same at two or more steps while other requests wait (vllm:num_requests_running / _waiting)."""
    if table.empty or "server_running_max" not in table.columns:
        return None
    rows = table[(table["phase"] == "step") & (table["server_waiting_max"].astype(float) > 0)]
    running = rows["server_running_max"].astype(float).dropna().round()
    if running.empty:
        return None
    top = running.max()
    return int(top) if top >= 1 and int((running == top).sum()) >= 2 else None


def gauge_limit(table: pd.DataFrame) -> int | None:
    """The engine's limit as the server's /metrics gives it (`server_max_num_seqs`), None without one."""
    if table.empty or "server_max_num_seqs" not in table.columns:
        return None
    exported = table["server_max_num_seqs"].astype(float).max()
    return int(round(exported)) if not math.isnan(exported) and exported >= 1 else None


def _ran_more(table: pd.DataFrame, limit: int) -> bool:
    """Some step ran more requests at once than `limit`: it is not one engine's limit."""
    if table.empty or "server_running_max" not in table.columns:
        return False
    running = table.loc[table["phase"] == "step", "server_running_max"].astype(float).max()
    return not math.isnan(running) and running > limit


def engine_limit(table: pd.DataFrame, given: int, shown: int | None, given_from: str = "as given") -> EngineLimit | None:
    """The engine's limit the recommendation stays within: the server's own (`shown`), else its gauge's
    (`gauge_limit`), else `given` (MAX_NUM_SEQS; `given_from` says where the run took it), a stated one unless
    some step ran more requests at once than it; None when none is known."""
    if shown:
        return EngineLimit(shown, f"the server's vllm:num_requests_running stays at {shown} while others wait")
    exported = gauge_limit(table)
    for level, source in (
        (exported, f"the server's /metrics gives its limit {exported} (server.csv max_num_seqs)"),
        (given, f"MAX_NUM_SEQS={given} {given_from}"),
    ):
        if level is not None and level > 0 and not _ran_more(table, level):
            return EngineLimit(level, source)
    return None


def cap_level(clean: list[dict[str, Any]], limit: EngineLimit | None) -> tuple[int, str] | None:
    """(the level no answer exceeds, words for when it lowered one) where rule 2b applies to the clean
    points (sorted by level); None where it does not: no limit, no clean level at or above it with one
    above that, or a level above it that scaled."""
    if limit is None:
        return None
    at = next((r for r in clean if int(r["level"]) >= limit.level), None)
    above = None if at is None else next((r for r in clean if int(r["level"]) > int(at["level"])), None)
    if at is None or above is None:
        return None
    low, high = int(at["level"]), int(above["level"])
    t_low, t_high = num(at, "throughput_rps"), num(above, "throughput_rps")
    if not t_low > 0 or math.isnan(t_high):
        return None
    gain, proportional = t_high / t_low - 1, high / low - 1
    if gain >= QUEUE_GAIN_SHARE * proportional:
        return None
    where = f"level {low} is the engine's limit" if low == limit.level else (
        f"level {low} is the lowest measured at or above the engine's limit {limit.level}")  # fmt: skip
    words = (
        f"{where} ({limit.source}): level {high} gained only {gain:+.0%} over it with {proportional:.0%}"
        " more users, who wait in its queue (filling the slots each answer leaves empty until the next"
        f" request arrives), so the answer stays at {low}"
    )
    return low, words
