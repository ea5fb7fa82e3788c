"""write_outputs end to end on synthetic run folders, and the CLI's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from analysis import analyze, load_run, write_outputs
from analysis.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def _strict_json(path: Path) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in strict JSON")

    data: dict[str, Any] = json.loads(path.read_text(), parse_constant=refuse)
    return data


def test_pytorch_run_end_to_end(make_run: Callable[..., Path]) -> None:
    path = make_run(kind="pytorch", levels=(2, 4, 6, 8, 12), true_knee=6)
    summary = write_outputs(path, clock=lambda: 1234.5)
    on_disk = _strict_json(path / "summary.json")
    assert on_disk == summary
    assert summary["schema_version"] == 1 and summary["generated_unix_s"] == 1234.5
    assert summary["complete"] and summary["missing"] == [] and summary["server_kind"] == "pytorch"
    assert summary["recommended_level"] == 6 and summary["knee"]["knee_level"] == 8
    assert summary["estimate"]["dimension"] == "gpu_memory" and summary["estimate"]["estimate"] == 26
    assert summary["gpu"] == {"available": True, "source": "nvml", "name": "NVIDIA L4", "total_mib": 24576.0,
                              "why_missing": None}  # fmt: skip
    assert summary["baseline"]["requests"] == 60 and len(summary["baseline"]["rounds"]) == 3
    assert [s["level"] for s in summary["steps"]] == [1, 2, 4, 6, 8, 12]
    assert {b["bucket"] for b in summary["buckets"]} == {"1000x700"}
    assert summary["soak"] is None and summary["slo"] is None and summary["events"][0]["kind"] == "warning"
    assert summary["diagnosis"]["case"] == "compute_bound"
    steps = pd.read_csv(path / "steps.csv")
    assert list(steps["level"]) == [1, 2, 4, 6, 8, 12] and "status_200" in steps.columns
    assert "errors" not in steps.columns and "p95_ci_high_ms" in steps.columns
    assert yaml.safe_load((path / "recommended-config.yaml").read_text()) == summary["config"]
    capacity = (path / "capacity.md").read_text()
    for words in ("Dimension used: **GPU memory", "Estimate: **26** concurrent requests.", "floor(available / increment) = 26", "HyOCR-1.5", "NVIDIA L4",
                  "1000x700", "| headroom | 0.7 |", "Memory grows linearly", "No cross-request cache",
                  "same image size", "fragmentation", "## Measured vs estimated", "| 8 | step | 80"):  # fmt: skip
        assert words in capacity, words


def test_vllm_run_uses_the_kv_cache(make_run: Callable[..., Path]) -> None:
    path = make_run(kind="vllm")
    summary = write_outputs(path)
    assert summary["server_kind"] == "vllm" and summary["estimate"]["dimension"] == "kv_cache"
    assert summary["config"]["vllm_args"] == ["--max-num-seqs", 6]
    assert "Dimension used: **KV cache" in (path / "capacity.md").read_text()
    assert '["--max-num-seqs", 6]' in (path / "recommended-config.yaml").read_text()
    assert summary["steps"][1]["ttft_p50_ms"] is not None and summary["steps"][1]["kv_cache_peak_frac"] > 0


def test_errors_end_the_safe_range_and_show_in_the_csv(make_run: Callable[..., Path]) -> None:
    path = make_run(levels=(2, 4, 6), true_knee=12, errors_at=6)
    summary = write_outputs(path, slo_p95_s=0.25)
    assert summary["knee"]["criterion"] == "errors" and summary["recommended_level"] == 4
    steps = pd.read_csv(path / "steps.csv")
    assert steps["errors_http_5xx"].iloc[-1] > 0 and steps["status_500"].iloc[-1] > 0
    assert summary["slo"]["level"] == 4 and summary["slo"]["goodput_rps"] > 0


def test_partial_run_says_what_is_missing(make_run: Callable[..., Path]) -> None:
    path = make_run(levels=(2, 4, 6, 8, 12))
    lines = (path / "steps.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["level"] not in (8, 12)]
    (path / "steps.jsonl").write_text("\n".join(kept) + "\n")
    summary = analyze(load_run(path))
    assert not summary["complete"]
    assert any("levels 8, 12 not measured" in m for m in summary["missing"])
    assert "no knee" in summary["knee"]["reason"]


def test_manifest_headroom_is_the_default(make_run: Callable[..., Path]) -> None:
    path = make_run(extra_manifest={"config": {"headroom": 0.5}})
    assert analyze(load_run(path))["estimate"]["headroom"] == 0.5
    assert analyze(load_run(path), headroom=0.9)["estimate"]["headroom"] == 0.9


def test_cli_writes_and_exits_zero(make_run: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make_run()
    assert main([str(path), "--headroom", "0.8", "--slo-p95-s", "2"]) == 0
    out = capsys.readouterr().out
    assert "recommended max_concurrency: 6" in out and (path / "recommended-config.yaml").exists()
    assert _strict_json(path / "summary.json")["slo"]["p95_s"] == 2.0


def test_cli_user_errors_exit_two_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no such run folder" in err and "\n" not in err
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--headroom", "1.5"])
    assert info.value.code == 2 and "outside (0, 1]" in capsys.readouterr().err


def test_cli_as_a_process_prints_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "missing")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr and "no such run folder" in done.stderr


def test_run_that_stopped_before_any_request(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"schema_version": 1, "levels": [1, 2]}')
    summary = write_outputs(tmp_path)
    assert not summary["complete"] and summary["steps"] == [] and summary["baseline"] is None
    assert summary["estimate"]["dimension"] == "none" and summary["recommended_level"] is None
    assert summary["gpu"]["available"] is False and "gpu.csv missing" in summary["gpu"]["why_missing"]
    assert summary["diagnosis"]["case"] == "unknown" and summary["config"]["server"]["max_concurrency"] == 1
    assert (tmp_path / "steps.csv").read_text().startswith("step_index,phase,level")


def test_run_without_gpu_samples_still_finds_the_knee(make_run: Callable[..., Path]) -> None:
    path = make_run()
    (path / "gpu.csv").unlink()
    summary = write_outputs(path)
    assert summary["recommended_level"] == 6 and summary["estimate"]["estimate"] is None
    assert summary["gpu"]["available"] is False and summary["steps"][1]["gpu_mem_peak_mib"] is None


def test_manifest_slo_of_zero_means_unset(make_run: Callable[..., Path]) -> None:
    assert analyze(load_run(make_run("a", extra_manifest={"config": {"slo_p95_s": 0.0}})))["slo"] is None
    slo = analyze(load_run(make_run("b", extra_manifest={"config": {"slo_p95_s": 0.25}})))["slo"]
    assert slo["p95_s"] == 0.25 and slo["level"] == 6


def test_run_stopped_during_the_baseline_is_incomplete(make_run: Callable[..., Path]) -> None:
    path = make_run()
    lines = (path / "steps.jsonl").read_text().splitlines()
    (path / "steps.jsonl").write_text("\n".join(lines[:2]) + "\n")  # idle and warm-up only
    summary = analyze(load_run(path))
    assert not summary["complete"] and "baseline (run stopped before it)" in summary["missing"]
    assert "no GPU memory samples in the baseline phase" in summary["estimate"]["reason"]
