"""Time to the answer: our method (`loadtest demo`) against guidellm's knee profile on the same simulator.

Not a `make bench` goal (guidellm is no dependency of the project; the name has no `bench_` prefix): run it
by hand once guidellm is installed in a venv of its own, outside the project:

    python3.11 -m venv /opt/guidellm-venv && /opt/guidellm-venv/bin/pip install 'guidellm[vision]'
    python bench/guidellm_compare.py --guidellm /opt/guidellm-venv/bin/guidellm [--profile pytorch-24g]
        [--simulator-args '--error-rate 0.02 --reset-rate 0.01']

Each round runs, one after the other on the same machine:
- guidellm: a fresh simulator of PROFILE (and SIMULATOR_ARGS, as ours gets them) on 127.0.0.1, then `guidellm run --profile kind=knee` over
  `--streams` (each level `--step-s` long, our demo's STEP_S), sending the demo's own page (the same image,
  prompt and max_tokens) to /v1/chat/completions. Offline: the data is a local JSONL and the tokenizer a
  tiny word-level one written here (guidellm only counts prompt tokens with it; the simulator's work follows
  the image). Its time to the knee is from its launch to the end of its last level (a lower bound: it
  prints the knee after that level's statistics), its exit beside it. Its answer: its own knee (the first
  level at or above the knee it fits) and, over its levels, the smallest one reaching 95% of the best
  throughput (the rule of `simulator.truth`).
- ours: a fresh simulator as guidellm's, then `python -m loadtest run` with the demo's settings against it
  (`loadtest.commands.run.demo_run_flags`: `loadtest demo --profile PROFILE --simulator-args SIMULATOR_ARGS`
  less the simulator's start), verify on (or `--verify false`). Its time to the recommendation is from its
  launch to the end of the cooldown after the last measured level (where verify or the report begins), its
  exit beside it: each contender is timed on a server already up, as a user runs either (until issue 33's
  fifteenth session ours was timed through `demo`, its simulator's ~0.9 s start included).
The simulator's truth for the page is printed for both. Every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support import ROOT, run_bounded  # noqa: E402

from loadtest.commands.run import demo_run_flags  # noqa: E402
from loadtest.launch.run import start_simulator  # noqa: E402
from loadtest.method.child import stop_process  # noqa: E402
from loadtest.settings.run_config import RunConfig  # noqa: E402
from scenarios import build_image_set  # noqa: E402
from simulator.truth import KNEE_FRACTION  # noqa: E402

INSTALL = ("guidellm not found: install it outside the project (python3.11 -m venv /opt/guidellm-venv && "
           "/opt/guidellm-venv/bin/pip install 'guidellm[vision]') and pass --guidellm /opt/guidellm-venv/bin/guidellm")  # fmt: skip
DATA_ROWS = 500  # more than any level sends at 8 s (about 120 at the plateau of pytorch-24g)
# A word-level tokenizer guidellm can load offline (AutoTokenizer from a folder); no hub, no model.
TOKENIZER_CODE = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["[UNK]", "[PAD]"] + [chr(c) for c in range(33, 127)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(sys.argv[1])
"""


@dataclass(frozen=True)
class Outcome:
    """One contender's run: when it named its answer and exited (s from its launch), and the answer."""

    named_s: float
    exit_s: float
    answer: str
    detail: str


def pick_95(levels: list[tuple[int, float]]) -> int | None:
    """The smallest level reaching KNEE_FRACTION of the best throughput (simulator.truth's rule)."""
    if not levels:
        return None
    best_rps = max(rps for _, rps in levels)
    return min(level for level, rps in levels if rps >= KNEE_FRACTION * best_rps)


def write_inputs(folder: Path, guidellm_python: Path) -> tuple[Path, Path, tuple[int, int, int]]:
    """The demo's page as a file, guidellm's JSONL of it, a local tokenizer; and (width, height, max_tokens)."""
    cfg = RunConfig()
    item = build_image_set(cfg.scenario, seed=cfg.seed).items[0]
    page = folder / item.name
    page.write_bytes(item.data)
    row = json.dumps({"prompt": cfg.prompt, "image": str(page), "output_tokens_count": cfg.max_tokens})
    data = folder / "data.jsonl"
    data.write_text((row + "\n") * DATA_ROWS)
    tokenizer = folder / "tokenizer"
    subprocess.run([str(guidellm_python), "-c", TOKENIZER_CODE, str(tokenizer)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return data, tokenizer, (item.width_px, item.height_px, cfg.max_tokens)


def truth_knee(url: str, size: tuple[int, int, int]) -> int:
    width, height, max_tokens = size
    with urllib.request.urlopen(f"{url}/truth?width={width}&height={height}&max_tokens={max_tokens}") as reply:
        return int(json.load(reply)["knee_concurrency"])


def _run_group(cmd: list[str], timeout_s: float, log: Path, env: dict[str, str]) -> tuple[int, float]:
    """Run `cmd` in a process group of its own (guidellm starts worker processes); past the timeout, SIGINT
    then SIGKILL that group, by its id. Returns the exit status and the wall seconds."""
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, time.monotonic() - t0


def run_guidellm(ns: argparse.Namespace, exe: Path, folder: Path, data: Path, tokenizer: Path,
                 size: tuple[int, int, int]) -> tuple[Outcome, int]:  # fmt: skip
    sim, url, _ = start_simulator(ns.profile, shlex.split(ns.simulator_args))
    try:
        truth = truth_knee(url, size)
        result, log = folder / "guidellm.json", folder / "guidellm.log"
        profile = {"kind": "knee", "initial_streams": [int(s) for s in ns.streams.split(",")],
                   "adaptive": ns.adaptive}  # fmt: skip
        cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url},model={model_of(ns.profile)}",
               "--profile", json.dumps(profile), "--constraint", f"kind=max_duration,seconds={ns.step_s:g}",
               "--data", f"kind=json_file,path={data}", "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
               "--output", f"kind=json,path={result}", "--disable-progress"]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no hub here: fail, never wait
        if ns.guidellm_processes:  # guidellm starts one worker process per stream, up to this (default 10)
            env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(ns.guidellm_processes)
        launched_unix_s = time.time()
        code, wall_s = _run_group(cmd, ns.timeout_s, log, env)
    finally:
        stop_process(sim)
    if code != 0 or not result.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise SystemExit(f"guidellm failed (exit {code}, log {log}): {tail}")
    return read_guidellm(json.loads(result.read_text()), launched_unix_s, wall_s), truth


def read_guidellm(doc: dict[str, Any], launched_unix_s: float, wall_s: float) -> Outcome:
    """guidellm's JSON output: each level's successful requests/s, its knee, when its last level ended."""
    levels: list[tuple[int, float]] = []
    errors, last_end = 0, launched_unix_s
    for bench in doc["benchmarks"]:
        streams = int(bench["config"]["strategy"]["streams"])
        levels.append((streams, float(bench["metrics"]["requests_per_second"]["successful"]["mean"])))
        errors += int(bench["scheduler_state"]["errored_requests"])
        last_end = max(last_end, float(bench["scheduler_state"]["end_time"]))
    knee: dict[str, Any] = next((c["final"]["throughput"] for c in doc.get("conclusions", []) if c.get("kind") == "knee_detection"),
                {})  # fmt: skip
    own = knee.get("saturation_concurrency")
    own_text = f"{own:g} (knee fit {knee['knee']:.2f})" if own is not None else f"none ({knee.get('reason', '?')})"
    table = ", ".join(f"{level}: {rps:.2f}" for level, rps in levels)
    return Outcome(last_end - launched_unix_s, wall_s, f"{own:g}" if own is not None else "none",
                   f"its knee {own_text}; 95% rule over its levels {pick_95(levels)}; rps by level {table};"
                   f" errors {errors}")  # fmt: skip


def model_of(profile: str) -> str:
    from simulator.model.profiles import PROFILES  # the served model name, as /v1/chat/completions expects it

    return PROFILES[profile].model_name


def run_ours(ns: argparse.Namespace, verify: bool, folder: Path) -> Outcome:
    """`loadtest run` with the demo's settings against a fresh simulator already serving, as guidellm gets it:
    each is timed from its own launch, the server's start apart."""
    out = folder / f"ours-verify-{str(verify).lower()}"
    sim, url, dcgm = start_simulator(ns.profile, shlex.split(ns.simulator_args))
    cmd = [sys.executable, "-m", "loadtest", "run", *demo_run_flags(url, dcgm), "--out", str(out),
           "--verify", str(verify).lower()]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        launched_unix_s, t0 = time.time(), time.monotonic()
        code, stdout, stderr = run_bounded(cmd, ns.timeout_s, env=env)
        wall_s = time.monotonic() - t0
    finally:
        stop_process(sim)
    runs = sorted(p for p in out.glob("*") if (p / "steps.jsonl").exists())
    if code != 0 or not runs:
        raise SystemExit(f"loadtest demo failed (exit {code}): {(stderr or stdout).strip().splitlines()[-1:]}")
    steps = [json.loads(line) for line in (runs[-1] / "steps.jsonl").read_text().splitlines() if line.strip()]
    verify_rows = [r for r in steps if r["phase"] in ("verify", "drain")]
    named_unix_s = verify_rows[0]["t_start_unix_s"] if verify_rows else steps[-1]["t_end_unix_s"]
    summary = json.loads((runs[-1] / "summary.json").read_text())
    measured = sorted({int(r["level"]) for r in steps if r["phase"] == "step"})
    return Outcome(named_unix_s - launched_unix_s, wall_s, str(summary.get("recommended_level")),
                   f"levels measured {measured}; run {runs[-1]}")


def _line(name: str, o: Outcome) -> str:
    return f"{name}: answer {o.answer}, named at {o.named_s:.0f} s, exit at {o.exit_s:.0f} s ({o.detail})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--guidellm", default=os.environ.get("GUIDELLM") or shutil.which("guidellm") or "",
                   help="the guidellm executable (default: $GUIDELLM, or guidellm on PATH)")  # fmt: skip
    p.add_argument("--profile", default="pytorch-24g", help="the simulator's profile, for both")
    p.add_argument("--simulator-args", default="",
                   help="more flags of `python -m simulator`, for both (flaky: '--error-rate 0.02 --reset-rate 0.01')")  # fmt: skip
    p.add_argument("--streams", default="1,2,4,8,16", help="guidellm's knee levels (at least 5)")
    p.add_argument("--step-s", type=float, default=8.0, help="guidellm's seconds per level (the demo's STEP_S)")
    p.add_argument("--adaptive", action="store_true", help="guidellm refines once around its knee")
    p.add_argument("--guidellm-processes", type=int, default=0,
                   help="guidellm's GUIDELLM__MAX_WORKER_PROCESSES (default: its own, 10)")  # fmt: skip
    p.add_argument("--verify", choices=("true", "false", "both"), default="true", help="ours with VERIFY")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=600.0, help="each contender's run at most")
    p.add_argument("--keep", default="", help="a folder to keep the runs in (default: a temporary one)")
    ns = p.parse_args(argv)
    exe = Path(ns.guidellm) if ns.guidellm else None
    if exe is None or not exe.exists():
        print(INSTALL)
        return 2
    verifies = [True, False] if ns.verify == "both" else [ns.verify == "true"]
    with tempfile.TemporaryDirectory(prefix="guidellm-compare-") as tmp:
        base = Path(ns.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        data, tokenizer, size = write_inputs(base, exe.parent / "python")
        times: dict[str, list[float]] = {}
        for r in range(1, ns.rounds + 1):
            folder = base / f"round-{r}"
            folder.mkdir(exist_ok=True)
            print(f"round {r}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
            gl, truth = run_guidellm(ns, exe, folder, data, tokenizer, size)
            print(f"  truth of {ns.profile} for the page: knee {truth}", flush=True)
            print("  " + _line("guidellm knee profile", gl), flush=True)
            times.setdefault("guidellm", []).append(gl.named_s)
            for verify in verifies:
                ours = run_ours(ns, verify, folder)
                name = f"ours (verify {str(verify).lower()})"
                print("  " + _line(name, ours), flush=True)
                times.setdefault(name, []).append(ours.named_s)
        print("; ".join(f"{k}: median named at {statistics.median(v):.0f} s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
