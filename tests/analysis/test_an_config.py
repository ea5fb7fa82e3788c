"""The serving config: seed 000's shape, values from the knee level's P95 and throughput, comments kept."""

from __future__ import annotations

import pandas as pd
import yaml

from analysis import Knee, build_config, config_yaml, estimate_capacity, recommend_config

EST = estimate_capacity(4000, 4500, 24000)
TABLE = pd.DataFrame([
    {"step_index": 2, "phase": "baseline", "level": 1, "p95_ms": 900.0, "throughput_rps": 1.2},
    {"step_index": 5, "phase": "step", "level": 4, "p95_ms": 2300.0, "throughput_rps": 1.9},
    {"step_index": 8, "phase": "step", "level": 8, "p95_ms": 5000.0, "throughput_rps": 2.0},
])  # fmt: skip
KNEE = Knee(True, 8, 8, 4, "knee at level 8", refine_between=(4, 8), criterion="latency")


def test_values_follow_the_recommended_level() -> None:
    config = recommend_config(TABLE, KNEE, EST, "pytorch")
    server = config["server"]
    assert server["max_concurrency"] == 4
    assert server["request_timeout_s"] == 8  # ceil(5 s wait + 2.3 s): above ceil(3 x 2.3 s), the admitted must fit
    assert server["queue"]["wait_timeout_s"] == 5  # ceil(2 x 2.3 s)
    assert server["queue"]["max_size"] == 5  # ceil(1.9 rps x 5 s x 0.5): what drains in half the wait
    assert server["reject_status"] == 503 and server["retry_after_s"] == 3  # ceil(2.3 s)
    assert "vllm_args" not in config


def test_vllm_gets_max_num_seqs() -> None:
    config = recommend_config(TABLE, KNEE, EST, "vllm")
    assert config["vllm_args"] == ["--max-num-seqs", 4]


def test_yaml_text_parses_back_to_the_content_and_comments_every_value() -> None:
    config, comments = build_config(TABLE, KNEE, EST, "vllm")
    text = config_yaml(config, comments, header="run x\nsecond line")
    assert yaml.safe_load(text) == config
    lines = text.splitlines()
    assert lines[:2] == ["# run x", "# second line"]
    valued = [
        line for line in lines if ":" in line and not line.rstrip().endswith(":") and not line.startswith("#")
    ]
    assert len(valued) == 11 and all("#" in line for line in valued)  # 7 server values, 4 of the breaker
    assert "the step before the knee at 8 users" in text and "wait 5 s + P95 2300 ms at 4 users" in text


def test_no_knee_and_no_safe_level() -> None:
    open_top = Knee(False, None, None, 8, "no knee")
    config, comments = build_config(TABLE, open_top, EST, "pytorch")
    assert config["server"]["max_concurrency"] == 8 and "test above 8" in comments["server.max_concurrency"]
    assert config["server"]["request_timeout_s"] == 15
    broken = Knee(True, 5, 4, None, "knee at level 4; saturated at one user")
    config, comments = build_config(TABLE, broken, EST, "pytorch")
    assert config["server"]["max_concurrency"] == 1 and "no safe level" in comments["server.max_concurrency"]
    assert config["server"]["request_timeout_s"] == 3  # from the baseline's 900 ms


def test_empty_table_still_gives_a_config() -> None:
    config = recommend_config(pd.DataFrame(), Knee(False, None, None, None, "no steps"), EST, "unknown")
    assert config["server"]["max_concurrency"] == 1 and config["server"]["request_timeout_s"] == 30


def test_circuit_breaker_trips_past_the_measured_p95_and_temperature() -> None:
    config, comments = build_config(TABLE, KNEE, EST, "pytorch")
    assert config["circuit_breaker"]["p95_ms"] == 3450  # 1.5 x P95 2300 ms at level 4
    assert config["circuit_breaker"]["gpu_temp_c"] is None  # no temperature read: none made up
    assert "no temperature read" in comments["circuit_breaker.gpu_temp_c"]
    hot = TABLE.assign(gpu_temp_c_peak=[60.0 + i for i in range(len(TABLE))])
    at_4 = float(hot.loc[(hot["level"] == 4) & (hot["phase"] == "step"), "gpu_temp_c_peak"].iloc[-1])
    config, comments = build_config(hot, KNEE, EST, "pytorch")
    assert config["circuit_breaker"]["gpu_temp_c"] == round(at_4 + 5)
    assert yaml.safe_load(config_yaml(config, comments))["circuit_breaker"] == config["circuit_breaker"]
def test_verify_and_drain_rows_never_set_the_timeouts() -> None:
    # a verify-only run (python -m loadtest verify): its drain probe runs at level 1 like the baseline, but its
    # latency is the overload's; the config must come from the baseline's
    drain = pd.DataFrame([{"step_index": 21, "phase": "drain", "level": 1, "p95_ms": 12_000.0, "throughput_rps": 0.1},
                          {"step_index": 20, "phase": "verify", "level": 1, "p95_ms": 9_000.0, "throughput_rps": 30.0}])  # fmt: skip
    table = pd.concat([TABLE, drain], ignore_index=True)
    broken = Knee(True, 5, 4, None, "knee at level 4; saturated at one user")
    config, _ = build_config(table, broken, EST, "pytorch")
    assert config["server"]["request_timeout_s"] == 3  # from the baseline's 900 ms, as without the rows


def test_each_block_says_what_enforces_it() -> None:
    import inspect

    import analysis.written.alerts as alerts

    config, comments = build_config(TABLE, KNEE, EST, "vllm")
    text = config_yaml(config, comments)
    blocks = {line.split(":")[0]: i for i, line in enumerate(text.splitlines()) if line and not line.startswith((" ", "#"))}
    lines = text.splitlines()

    def note_above(block: str) -> str:
        above = []
        for line in reversed(lines[: blocks[block]]):
            if not line.startswith("#"):
                break
            above.insert(0, line[2:])
        return " ".join(above)

    assert "Enforced by the gateway: haproxy.cfg" in note_above("server")
    breaker = note_above("circuit_breaker")
    assert "Advice, in part enforced" in breaker and "after 10 failed requests in a row" in breaker
    assert "OcrLatencyP95AboveMark" in breaker and "no rule watches a temperature" in breaker  # none read here
    assert "The server's own flag" in note_above("vllm_args")
    source = inspect.getsource(alerts)
    assert '"OcrLatencyP95AboveMark"' in source and '"OcrGpuTemperatureAboveMark"' in source  # the rules it names
    hot = dict(config, circuit_breaker={**config["circuit_breaker"], "gpu_temp_c": 71})
    assert "OcrGpuTemperatureAboveMark (the same limit)" in " ".join(config_yaml(hot, comments).replace("# ", "").split())
