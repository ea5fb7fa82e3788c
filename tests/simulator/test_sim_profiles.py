"""Servers unlike ours: each profile's truth has the shape it promises (pure model, virtual time)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator import PROFILES, truth
from simulator.exports.metrics import ServerStats, render_vllm_metrics
from simulator.front.answers import ocr_fields, page_lines, shaped_text
from simulator.model.closed_loop import simulate_closed_loop
from simulator.model.options import Options
from simulator.model.pipeline import Failed, Finished, Pipeline
from simulator.model.profiles import Profile, ProfileError
from simulator.model.work import drawn_work, work_of
from simulator.truth import KNEE_FRACTION, truth_of

NEW = ("smooth-24g", "noisy-24g", "vllm-far", "oom-first-24g")


def knee_of(points: list[tuple[int, float]]) -> int:
    peak = max(x for _, x in points)
    return min(c for c, x in points if x >= KNEE_FRACTION * peak)


def test_smooth_throughput_bends_slowly_with_no_corner() -> None:
    t = truth("smooth-24g", 1000, 700)
    by_c = {p.concurrency: p for p in t.curve}
    assert 8 <= t.knee_concurrency <= 20 and t.knee_concurrency < t.slots == 24
    assert t.estimate >= t.knee_concurrency
    share = [by_c[c].throughput_rps / t.plateau_rps for c in sorted(by_c)]
    gradual = [0.70 <= s < 0.95 for s in share]
    assert any(all(gradual[i : i + 3]) for i in range(len(gradual) - 2)), share
    # Concave: every added user up to the knee gains throughput, each gain no larger than the one before;
    # P95 grows by a steady step, never jumps (no hockey stick).
    gains = [by_c[c + 1].throughput_rps - by_c[c].throughput_rps for c in range(1, t.knee_concurrency)]
    assert all(g > 0 for g in gains)
    assert all(later <= 1.05 * earlier for earlier, later in zip(gains, gains[1:], strict=False))
    p95_steps = [by_c[c + 1].p95_ms - by_c[c].p95_ms for c in range(1, t.slots)]
    assert max(p95_steps) < 1.2 * min(p95_steps)


def test_truth_walk_stops_early_without_moving_the_knee() -> None:
    """The walk ends at 2 x knee + 4; levels past it would not move the knee (docstring of simulator.truth)."""
    smooth = truth("smooth-24g", 1000, 700)
    assert smooth.curve[-1].concurrency == 2 * smooth.knee_concurrency + 4
    assert smooth.oom_concurrency is not None
    walked = [(pt.concurrency, pt.throughput_rps) for pt in smooth.curve]
    past = range(len(smooth.curve) + 1, smooth.oom_concurrency)  # up to the OOM: 2 x slots + 4 is beyond
    full = walked + [
        (c, simulate_closed_loop(PROFILES["smooth-24g"], Options(), c, 1000, 700).throughput_rps) for c in past
    ]
    assert knee_of(full) == smooth.knee_concurrency
    far = truth("vllm-far", 1000, 700)
    assert len(far.curve) == 2 * far.knee_concurrency + 4 < 2 * far.slots + 4
    at_knee = far.curve[far.knee_concurrency - 1].throughput_rps
    for c in (64, 128):
        beyond = simulate_closed_loop(PROFILES["vllm-far"], Options(), c, 1000, 700, measured=2 * c)
        assert beyond.throughput_rps < at_knee / KNEE_FRACTION
    # The old profiles walk as far as before: 2 x slots + 4, or up to the OOM.
    assert len(truth("vllm-24g", 1000, 700).curve) == 20
    assert len(truth("pytorch-24g", 1000, 700).curve) == 16


def test_noisy_latency_has_a_long_tail_and_a_stable_knee() -> None:
    t = truth("noisy-24g", 1000, 700)
    one = t.curve[0]
    assert one.p95_ms / one.p50_ms >= 1.5
    plain = truth("pytorch-24g", 1000, 700)
    assert plain.curve[0].p95_ms == pytest.approx(plain.curve[0].p50_ms)
    # Noise moves latency, not memory: the same estimate and OOM as the server without it.
    assert (t.estimate, t.oom_concurrency, t.increment_mib) == (
        plain.estimate,
        plain.oom_concurrency,
        plain.increment_mib,
    )
    assert t.single_latency_ms == pytest.approx(plain.single_latency_ms, rel=0.1)
    # The knee does not depend on the truth's seed.
    p = PROFILES["noisy-24g"]
    for seed in (1, 2):
        points = [
            (c, simulate_closed_loop(p, Options(), c, 1000, 700, seed=seed).throughput_rps)
            for c in range(1, len(t.curve) + 1)
        ]
        assert knee_of(points) == t.knee_concurrency == 8


def test_answer_lengths_are_lognormal_seeded_and_within_the_budget() -> None:
    p = PROFILES["noisy-24g"]
    work = work_of(p, Options(), 1000, 700, None)

    def lengths(seed: int, n: int = 400) -> list[int]:
        rng = random.Random(seed)
        return [drawn_work(p, work, rng).output_tokens for _ in range(n)]

    a = lengths(3)
    assert a == lengths(3) and a != lengths(4)
    assert sorted(a)[len(a) // 2] == pytest.approx(work.output_tokens, rel=0.1)
    logs = [math.log(n) for n in a]
    mean = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
    assert sigma == pytest.approx(p.output_tokens_sigma, rel=0.15)
    short = work_of(p, Options(), 1000, 700, 40)
    rng = random.Random(0)
    assert max(drawn_work(p, short, rng).output_tokens for _ in range(200)) == 40
    assert drawn_work(p, work, rng).increment_mib == work.increment_mib
    plain = PROFILES["pytorch-24g"]
    assert drawn_work(plain, work, rng) is work


def test_vllm_far_kv_estimate_is_far_above_the_compute_knee() -> None:
    t = truth("vllm-far", 1000, 700)
    p = PROFILES["vllm-far"]
    assert 8 <= t.knee_concurrency <= 16 and t.slots == p.max_batch == 256
    assert t.estimate >= 30 * t.knee_concurrency
    assert t.estimate == t.kv_cache_size_tokens // (t.prompt_tokens + t.output_tokens)  # type: ignore[operator]
    assert t.increment_mib == 0.0 and t.oom_concurrency is None and t.idle_mib == p.idle_mib
    snap = Pipeline(p, Options()).snapshot(0.0)
    families = {f.name: f for f in text_string_to_metric_families(render_vllm_metrics(p, snap, ServerStats()))}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert "max_num_seqs" not in info and int(info["block_size"]) == p.kv_block_size_tokens  # as vLLM 0.32
    assert float(info["kv_cache_max_concurrency"]) == t.kv_cache_size_tokens / p.max_model_len  # type: ignore[operator]
    assert int(info["num_gpu_blocks"]) * int(info["block_size"]) == int(info["kv_cache_size_tokens"])
    assert int(info["kv_cache_size_tokens"]) == t.kv_cache_size_tokens


def test_oom_first_recommends_the_last_level_that_fits() -> None:
    t = truth("oom-first-24g", 1000, 700)
    p = PROFILES["oom-first-24g"]
    assert t.oom_concurrency is not None and 6 <= t.oom_concurrency <= 7 and p.max_batch == 16
    assert t.knee_concurrency == t.oom_concurrency - 1
    unbounded = truth_of(replace(p, total_mib=1e7), Options(), 1000, 700)
    assert unbounded.oom_concurrency is None or unbounded.oom_concurrency > 2 * p.max_batch + 4
    assert t.knee_concurrency < unbounded.knee_concurrency
    assert t.curve[-1].throughput_rps > 1.05 * t.curve[-2].throughput_rps  # still climbing at the wall
    # The request past the card's memory fails the moment it arrives, as an allocator does.
    work = work_of(p, Options(), 1000, 700, None)
    pipe = Pipeline(p, Options())
    for i in range(t.oom_concurrency):
        pipe.submit(i, work, 10.0)
    (failed,) = [o for o in pipe.advance(10.0) if isinstance(o, Failed)]
    assert (failed.job_id, failed.status, failed.t_ms) == (t.oom_concurrency - 1, 500, 10.0)
    assert "CUDA out of memory" in failed.message


def test_truth_of_every_profile_is_fast() -> None:
    """Under 6 s of CPU each (CPU time: other processes on a shared machine do not count, but a core shared
    with the suite's other shards slows it: hunyuan-vllm-24g took 3.2 s there, about 2 s alone). A guard
    against a truth an order of magnitude slower, which every test that asks it would pay."""
    for name in sorted(PROFILES):
        truth_of.cache_clear()
        t0 = time.process_time()
        truth(name, 1000, 700)
        assert time.process_time() - t0 < 6.0, name


def test_answer_shapes_change_only_the_characters() -> None:
    text = "Invoice 2024-001\nTotal 42.00 EUR"
    assert shaped_text("text", text, 400, 300) == text
    assert shaped_text("constant", text, 400, 300) == "OK"
    assert shaped_text("blank", text, 400, 300).strip() == "" and "\n" in shaped_text("blank", text, 9, 9)
    md = shaped_text("markdown", text, 400, 300)
    assert md.startswith("# ") and f"```text\n{text}\n```" in md
    lines = page_lines(text + " " + "word " * 40, 400, 300)
    assert [ln["text"] for ln in lines[:1]] == ["Invoice 2024-001"] and len(lines) >= 4
    for ln in lines + page_lines(text, 10, 10):
        x0, y0, x1, y1 = ln["box"]
        assert 0 <= x0 <= x1 and 0 <= y0 <= y1
    assert all(ln["box"][2] < 400 and ln["box"][3] < 300 for ln in lines)
    assert ocr_fields("boxes", text, 400, 300) == {"lines": page_lines(text, 400, 300)}
    assert shaped_text("boxes", text, 400, 300).splitlines()[0].startswith("<ref>Invoice 2024-001</ref><box>(")
    assert truth("pytorch-24g", 1000, 700, answer_shape="boxes") == truth("pytorch-24g", 1000, 700)
    with pytest.raises(ProfileError, match="answer_shape"):
        truth("pytorch-24g", 1000, 700, answer_shape="haiku")


@pytest.mark.parametrize("name", NEW)
def test_new_profiles_answer_a_4k_page_or_say_to_resize(name: str) -> None:
    t = truth(name, 640, 480)
    assert t.knee_concurrency >= 1 and t.plateau_rps > 0


def _alone_ms(p: Profile, width_px: int, height_px: int) -> float:
    """One request alone on the server (cheaper than a truth for the biggest pages)."""
    pipe = Pipeline(p, Options())
    pipe.submit(0, work_of(p, Options(), width_px, height_px, None), 0.0)
    while (due := pipe.next_due_ms()) is not None:
        for outcome in pipe.advance(due):
            if isinstance(outcome, Finished):
                return outcome.e2e_ms
    raise AssertionError("no answer")


def test_slow_vlm_takes_seconds_a_page_and_its_knee_is_its_batch() -> None:
    p = PROFILES["slow-vlm-24g"]
    t = truth("slow-vlm-24g", 1000, 700)
    assert p.kind == "pytorch" and 4000 <= t.single_latency_ms <= 8000, t.single_latency_ms
    assert t.knee_concurrency == t.slots == p.max_batch == 8
    assert t.oom_concurrency is not None and t.oom_concurrency > 2 * p.max_batch  # memory is not the limit
    assert abs(t.estimate - t.knee_concurrency) <= 1
    assert 1500 <= _alone_ms(p, 500, 500) <= 2500  # a small page: ~2 s
    assert 55_000 <= _alone_ms(p, 3500, 2300) <= 65_000  # a big one hits the token budget: ~60 s
    fast = truth("slow-vlm-24g", 1000, 700, time_scale=0.1)  # what the tests run
    assert fast.single_latency_ms == pytest.approx(0.1 * t.single_latency_ms, rel=1e-6)
    assert fast.knee_concurrency == t.knee_concurrency
