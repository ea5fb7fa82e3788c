"""A sweep's grid: SWEEP and TARGETS parsed into settings, and every mistake one line before any load."""

from __future__ import annotations

import pytest

from loadtest.sweep.grid import (
    Setting,
    SweepError,
    build_grid,
    check_grid,
    parse_per_target,
    parse_sweep,
    parse_targets,
    run_overrides,
)


def test_several_keys_give_their_product_first_key_outermost():
    axes = parse_sweep(["max_num_seqs=16,32;max_side=0,1024"])
    assert axes == {"max_num_seqs": ("16", "32"), "max_side": ("0", "1024")}
    assert parse_sweep(["max_num_seqs=16,32", "max_side=0,1024"]) == axes  # repeated flags: the same
    grid = build_grid(axes, {})
    assert [s.label for s in grid] == [
        "max_num_seqs=16;max_side=0",
        "max_num_seqs=16;max_side=1024",
        "max_num_seqs=32;max_side=0",
        "max_num_seqs=32;max_side=1024",
    ]
    assert grid[1].dir_name == "max_num_seqs-16__max_side-1024"
    assert grid[1].server_values() == {"max_num_seqs": "16"}
    assert parse_sweep([grid[1].label]) == {"max_num_seqs": ("16",), "max_side": ("1024",)}  # a label is a SWEEP


def test_targets_are_settings_with_the_host_replaced():
    targets = parse_targets(" seqs16=http://gpu-a:8000/ , seqs32=https://gpu-b:8443")
    assert targets == {"seqs16": "http://gpu-a:8000", "seqs32": "https://gpu-b:8443"}
    grid = build_grid(parse_sweep(["max_side=0,1024"]), targets)
    assert [s.label for s in grid][:2] == ["target=seqs16;max_side=0", "target=seqs16;max_side=1024"]
    assert grid[2].dir_name == "target-seqs32__max_side-0"
    assert run_overrides(grid[3]) == {"max_side": 1024, "host": "https://gpu-b:8443"}
    assert grid[0].server_values() == {}


def test_max_num_seqs_also_sets_the_runs_engine_limit():
    (setting,) = build_grid(parse_sweep(["max_num_seqs=16;gmu=0.9"]), {})
    assert run_overrides(setting) == {"max_num_seqs": 16}
    assert setting.server_values() == {"max_num_seqs": "16", "gmu": "0.9"}
    with pytest.raises(SweepError, match="bad SWEEP value 'x8' for max_num_seqs: give a whole number"):
        run_overrides(Setting(values={"max_num_seqs": "x8"}))


@pytest.mark.parametrize(
    ("texts", "line"),
    [
        (["max_num_seqs=8,$(reboot)"], "bad SWEEP value '$(reboot)' for max_num_seqs: use numbers and plain words"),
        (["gmu=0.9 --evil"], "bad SWEEP value '0.9 --evil' for gmu"),
        (["max_num_seqs=8,`id`"], "bad SWEEP value '`id`'"),
        (["max_num_seqs"], "bad SWEEP entry 'max_num_seqs': write key=value,value"),
        (["8,16"], "bad SWEEP entry '8,16'"),
        (["max_num_seqs="], "SWEEP key max_num_seqs has an empty value"),
        (["max_num_seqs=8,,16"], "SWEEP key max_num_seqs has an empty value"),
        (["max_num_seqs=8,8"], "SWEEP key max_num_seqs repeats a value"),
        (["max_num_seqs=8", "max_num_seqs=16"], "SWEEP key max_num_seqs is given twice"),
        (["target=a,b"], "TARGETS='name=URL,name=URL', not SWEEP target="),
    ],
)
def test_a_bad_sweep_is_one_line(texts, line):
    with pytest.raises(SweepError) as info:
        parse_sweep(texts)
    assert line in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("seqs16", "bad TARGETS entry 'seqs16': write name=URL"),
        ("seqs16=gpu-a:8000", "bad TARGETS URL 'gpu-a:8000' for seqs16"),
        ("a;b=http://x:1", "bad TARGETS value 'a;b'"),
        ("a=http://x:1,a=http://y:1", "TARGETS names a twice"),
    ],
)
def test_bad_targets_are_one_line(text, line):
    with pytest.raises(SweepError, match=None) as info:
        parse_targets(text)
    assert line in str(info.value)


@pytest.mark.parametrize(
    ("sweep", "targets", "placeholders", "line"),
    [
        ([], {}, None, "nothing to sweep: give SWEEP="),
        (["max_num_seqs=8,16"], {}, None, "SWEEP key(s) max_num_seqs are not client settings"),
        (["max_num_seqs=8"], {"a": "http://x:1"}, None, "TARGETS are servers already running"),
        (["max_side=0,1024"], {"a": "http://x:1"}, (), "TARGETS are servers already running"),  # and SERVER_CMD
        (["max_num_sqs=8"], {}, ("max_num_seqs",), "unknown SWEEP key max_num_sqs: neither a client setting"),
        (["max_num_seqs=8"], {}, (), "(it has none: was it given a --server-cmd?)"),
        (["max_num_seqs=8"], {}, ("max_num_seqs", "gmu"), "the server's template has {gmu} and SWEEP gives it no value"),
    ],
)
def test_a_grid_that_cannot_run_is_one_line(sweep, targets, placeholders, line):
    with pytest.raises(SweepError) as info:
        check_grid(parse_sweep(sweep), targets, placeholders)
    assert line in str(info.value) and "\n" not in str(info.value)


def test_grids_that_can_run():
    check_grid(parse_sweep(["max_side=0,1024;style=json,multipart"]), {}, None)  # client settings only
    check_grid(parse_sweep(["max_num_seqs=8,16;gmu=0.8,0.9"]), {}, ("max_num_seqs", "gmu"))
    check_grid({}, {"a": "http://x:1", "b": "http://y:1"}, None)


def test_each_target_can_have_its_own_gpu_and_metrics():
    from loadtest.settings.run_config import RunConfig
    from loadtest.sweep.sweeper import setting_config

    targets = parse_targets("hf=http://127.0.0.1:8001,trt=http://127.0.0.1:8002")
    gpus = parse_per_target("hf=dcgm:http://127.0.0.1:9401/metrics, trt=dcgm:http://127.0.0.1:9402/metrics",
                            "TARGET_GPU", targets, "a=dcgm:URL")  # fmt: skip
    metrics = parse_per_target("trt=http://127.0.0.1:8002/prometheus/metrics", "TARGET_METRICS", targets, "x")
    assert gpus["trt"] == "dcgm:http://127.0.0.1:9402/metrics" and metrics == {"trt": "http://127.0.0.1:8002/prometheus/metrics"}
    base = RunConfig.from_mapping({"server_metrics": "", "gpu": "dcgm:http://127.0.0.1:9401/metrics"})
    sources = {"hf": {"gpu": gpus["hf"]}, "trt": {"gpu": gpus["trt"], "server_metrics": metrics["trt"]}}
    hf, trt = (setting_config(base, s, sources) for s in build_grid({}, targets))
    assert (hf.host, hf.gpu, hf.server_metrics) == ("http://127.0.0.1:8001", gpus["hf"], "")
    assert (trt.host, trt.gpu, trt.server_metrics) == ("http://127.0.0.1:8002", gpus["trt"], metrics["trt"])


@pytest.mark.parametrize(("text", "line"), [
    ("vllm=dcgm:http://x:9400/metrics", "TARGET_GPU names vllm, not one of TARGETS (hf, trt)"),
    ("hf", "bad TARGET_GPU entry 'hf': write name=VALUE per target"),
    ("hf=", "bad TARGET_GPU entry 'hf=': write name=VALUE per target"),
])  # fmt: skip
def test_a_bad_per_target_value_is_one_line(text, line):
    targets = parse_targets("hf=http://127.0.0.1:8001,trt=http://127.0.0.1:8002")
    with pytest.raises(SweepError) as info:
        parse_per_target(text, "TARGET_GPU", targets, "a=dcgm:URL")
    assert line in str(info.value) and "\n" not in str(info.value)
