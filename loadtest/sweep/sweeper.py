"""`python -m loadtest sweep`: the whole method once per setting, each in its own run folder, side by side.

    python -m loadtest sweep --host URL --gpu sidecar:URL --sweep 'max_num_seqs=8,16,32,64'
    python -m loadtest sweep --targets 'seqs16=http://gpu-a:8000,seqs32=http://gpu-b:8000'
    python -m loadtest sweep --host URL --sweep 'max_side=0,1024'          (client settings: no restart)

Every flag of `run` applies to every setting. Settings come from loadtest.sweep.grid (SWEEP, TARGETS);
the server restarts between them through loadtest.sweep.restart (the sidecar's server control, or
SERVER_CMD here). Everything is checked before any load: the grid, each setting's config, the images,
who restarts the server. Then per setting: restart (when the server is this sweep's to restart), then the
run's own path (`cli.run_method`: pre-flight, Locust, report) in `<sweep>/<setting dir>/`, then
`setting.json` beside it and the sweep's report above (`reports.sweep.write_sweep`, after every setting,
so a stopped sweep keeps a partial sweep.csv). A server that never becomes healthy, or a run that fails,
marks its setting `failed` with why and the server's last lines; the sweep goes on.
Ctrl-C / SIGTERM stops the setting that runs (its run is rendered, as `run` does), keeps everything
finished, says where in one line and exits 130. Otherwise: 0 when a setting ran to its answer, 1 when
every setting failed, 2 for a mistake found before any load.

Sweep folder `<OUT>/sweep-<YYYYmmdd-HHMMSS>/`: `sweep.json` (keys, server template, targets, SLO, settings
with their folders), one run folder per setting with its `setting.json` (status ok|failed, why, the
server's output tail, start and end), and above them `sweep.csv`, `sweep.html`, `recommended-config.yaml`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from gpu_sampler.server_control import ServerControlError, check_values
from loadtest.launch import run as cli
from loadtest.launch.procs import fail
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from loadtest.sweep.grid import (
    TARGET_KEY,
    Setting,
    SweepError,
    build_grid,
    check_grid,
    parse_per_target,
    parse_sweep,
    parse_targets,
    run_overrides,
    server_keys,
)
from loadtest.sweep.restart import Restarted, ServerRestarter, back_to_pick, restarter_for
from loadtest.traffic.payloads import build_payloads, unchanged_resize

SWEEP_FILE = "sweep.json"
SETTING_FILE = "setting.json"
SWEEP_SCHEMA_VERSION = 1
STOPPED_EXIT = 130


@dataclass(frozen=True)
class SweepPlan:
    """A sweep checked whole, before any load."""

    axes: dict[str, tuple[str, ...]]
    targets: dict[str, str]
    settings: list[Setting]
    configs: list[RunConfig]  # one per setting
    restarter: ServerRestarter | None
    slo_p95_s: float
    out: Path


def prepare(ns: argparse.Namespace) -> SweepPlan:
    """Every check that needs no load: the grid, who restarts the server, each setting's config, the images."""
    base = cli.config_from_args(ns)
    axes, targets = parse_sweep(ns.sweep), parse_targets(ns.targets)
    if not targets and not base.host:
        raise SweepError("give HOST (the server every setting runs against), or TARGETS='name=URL,...'")
    if not ns.server_start_timeout_s > 0:
        raise SweepError(f"bad --server-start-timeout-s {ns.server_start_timeout_s}: give seconds > 0, e.g. 600")
    has_server_keys = bool(server_keys(axes))
    if not has_server_keys:
        check_grid(axes, targets, None)  # before anyone is asked about a server
    restarter = restarter_for(ns.server_cmd, ns.server_health, base.gpu, base.gpu_token, base.tls(),
                              ns.server_start_timeout_s, has_server_keys)  # fmt: skip
    try:
        check_grid(axes, targets, None if restarter is None else restarter.placeholders)
        settings = build_grid(axes, targets)
        if restarter is not None:
            check_server_values(restarter.placeholders, settings)
        sources = _per_target_sources(ns, targets)
        configs = [setting_config(base, s, sources) for s in settings]
        for line in check_images(configs):
            print(line, file=sys.stderr, flush=True)
    except BaseException:
        if restarter is not None:
            restarter.close()
        raise
    return SweepPlan(axes=axes, targets=targets, settings=settings, configs=configs, restarter=restarter,
                     slo_p95_s=base.slo_p95_s, out=Path(base.out).resolve())  # fmt: skip
    # resolved: the Locust master runs in the repository's folder, and each run folder is named to it


def check_server_values(placeholders: tuple[str, ...], settings: list[Setting]) -> None:
    """Each setting's server values by the rule the server control itself applies (a value starting with
    '-' must be a number, at most VALUE_CHARS long): refused here, before any load, not at its restart."""
    for setting in settings:
        try:
            check_values(placeholders, setting.server_values())
        except ServerControlError as exc:
            raise SweepError(f"setting {setting.label}: {exc}") from None


def _per_target_sources(ns: argparse.Namespace, targets: dict[str, str]) -> dict[str, dict[str, str]]:
    """{target: {"gpu": GPU, "server_metrics": URL}} from TARGET_GPU and TARGET_METRICS: servers on other
    machines (each its own card) or with their metrics elsewhere (trtllm-serve: /prometheus/metrics)."""
    gpus = parse_per_target(getattr(ns, "target_gpu", ""), "TARGET_GPU", targets, "a=dcgm:http://gpu-a:9400/metrics")
    metrics = parse_per_target(getattr(ns, "target_metrics", ""), "TARGET_METRICS", targets,
                               "trt=http://gpu-b:8000/prometheus/metrics")  # fmt: skip
    sources: dict[str, dict[str, str]] = {}
    for name in targets:
        given = {"gpu": gpus.get(name, ""), "server_metrics": metrics.get(name, "")}
        sources[name] = {key: value for key, value in given.items() if value}
    return sources


def setting_config(base: RunConfig, setting: Setting, sources: dict[str, dict[str, str]] | None = None) -> RunConfig:
    """The run config of one setting: its overrides on the sweep's, SERVER_METRICS following a target, and a
    target's own GPU source and metrics URL where TARGET_GPU / TARGET_METRICS name them (`sources`)."""
    overrides = run_overrides(setting)
    if setting.target_url and base.server_metrics:
        overrides["server_metrics"] = metrics_of_target(base, setting.target_url)
    overrides.update((sources or {}).get(str(setting.values.get(TARGET_KEY, "")), {}))
    data = {**dataclasses.asdict(base), **overrides}
    try:
        return RunConfig.from_mapping(data)
    except ConfigError as exc:
        raise SweepError(f"setting {setting.label}: {exc}") from None


def metrics_of_target(base: RunConfig, target_url: str) -> str:
    """SERVER_METRICS on each target: its path on the target's origin (given as HOST's, or with no HOST)."""
    metrics = urllib.parse.urlsplit(base.server_metrics)
    if base.host and urllib.parse.urlsplit(base.host)[:2] != metrics[:2]:
        raise SweepError(
            f"with TARGETS, SERVER_METRICS follows each target: give it on HOST's origin (e.g. {base.host}/metrics)"
            " or with no HOST, or leave it empty"
        )
    return target_url + (metrics.path or "/metrics")


def check_images(configs: list[RunConfig]) -> list[str]:
    """Build each distinct image set and request once (a bad image or a resize stops the sweep here); return
    a warning line for each max_side that changes no page (it measures what max_side=0 measures)."""
    seen: set[tuple[Any, ...]] = set()
    warnings: list[str] = []
    for cfg in configs:
        key = (cfg.scenario, cfg.images, cfg.seed, cfg.buckets, cfg.max_side, cfg.style, cfg.endpoint, cfg.field)
        if key not in seen:
            seen.add(key)
            build_payloads(cfg)
            warnings += [line for line in [unchanged_resize(cfg, "max_side")] if line and line not in warnings]
    return warnings


def new_sweep_folder(out: Path) -> Path:
    """`<OUT>/sweep-<YYYYmmdd-HHMMSS>` (a suffix when that second is taken); never an existing folder."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1, 1000):
        path = out / (f"sweep-{stamp}" if n == 1 else f"sweep-{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise SweepError(f"{out} has no free sweep folder name for {stamp}: give another OUT")


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def sweep_record(plan: SweepPlan) -> dict[str, Any]:
    keys = ([TARGET_KEY] if plan.targets else []) + list(plan.axes)
    where = plan.restarter.where if plan.restarter is not None else ""
    return {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "keys": keys,
        "server_cmd": plan.restarter.template if plan.restarter is not None else "",
        "server_control": where,  # "SERVER_CMD", "the sidecar at URL", or "" (no restarts)
        "targets": plan.targets,
        "slo_p95_s": plan.slo_p95_s,
        "started_unix_s": time.time(),
        "settings": [{"setting": s.label, "values": s.values, "dir": s.dir_name} for s in plan.settings],
    }


class _Stop:
    """Ctrl-C or SIGTERM arrived: the setting that runs ends as `run` ends, and no other starts."""

    requested = False


@contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM set _Stop.requested and interrupt as Ctrl-C does (run_locust then stops its
    master and the partial run is rendered); the handlers before are put back at the end."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        _Stop.requested = True
        raise KeyboardInterrupt

    before = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def run_sweep(plan: SweepPlan, ns: argparse.Namespace) -> int:
    sweep_dir = new_sweep_folder(plan.out)
    write_json(sweep_dir / SWEEP_FILE, sweep_record(plan))
    total = len(plan.settings)
    print(f"sweep folder: {sweep_dir} ({total} setting{'s' * (total != 1)})", flush=True)
    statuses: list[str] = []
    report: Path | None = None
    restored = ""
    _Stop.requested = False
    with _stop_signals():
        for i, (setting, cfg) in enumerate(zip(plan.settings, plan.configs, strict=True), start=1):
            if _Stop.requested:
                break
            print(f"== setting {i}/{total}: {setting.label}", flush=True)
            record = run_setting(plan, setting, cfg, sweep_dir / setting.dir_name, ns)
            statuses.append(str(record["status"]))
            word = "ok" if record["status"] == "ok" else f"failed: {record['why']}"
            print(f"setting {setting.label}: {word}", flush=True)
            report = write_sweep_report(sweep_dir) or report
        if plan.restarter is not None and statuses and not _Stop.requested:
            restored = restore_pick(plan, plan.restarter, sweep_dir, last_ok=statuses[-1] == "ok")
    return finish(sweep_dir, statuses, total, report, restored)


def picked_label(sweep_dir: Path) -> str | None:
    """The pick's setting label, as the sweep's report marked it in sweep.csv; None without one."""
    try:
        with (sweep_dir / "sweep.csv").open(newline="", encoding="utf-8") as f:
            return next((row["setting"] for row in csv.DictReader(f) if row.get("pick") == "true"), None)
    except OSError:  # no report was written: no pick is known
        return None


def restore_pick(plan: SweepPlan, restarter: ServerRestarter, sweep_dir: Path, last_ok: bool) -> str:
    """The server put back to the pick (restart.back_to_pick), recorded in sweep.json as `server_after`;
    the words for the last line. A Ctrl-C meanwhile is said, the sweep's answer kept."""
    label = picked_label(sweep_dir)
    picked = next((s for s in plan.settings if s.label == label), None)
    try:
        said = back_to_pick(restarter, picked, plan.settings[-1], last_ok)
    except KeyboardInterrupt:
        _Stop.requested = False  # the settings all ran: the sweep's answer stands
        said = f"stopped while putting the server back to the pick, {label}: it may be down; restart it yourself"
    if said:
        meta = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
        write_json(sweep_dir / SWEEP_FILE, {**meta, "server_after": {"pick": label, "said": said}})
    return said


def finish(sweep_dir: Path, statuses: list[str], total: int, report: Path | None, restored: str = "") -> int:
    """The sweep's last lines and exit status (see the module doc)."""
    ok = statuses.count("ok")
    if _Stop.requested:
        print(f"sweep stopped after {len(statuses)} of {total} settings ({ok} ok): their folders and a partial"
              f" sweep.csv are in {sweep_dir}", flush=True)  # fmt: skip
        return STOPPED_EXIT
    if not ok:
        fail(f"every setting failed: see why in each {SETTING_FILE} under {sweep_dir}")
    last = f"report: {report}" if report else f"sweep: {sweep_dir} (its report: python -m reports sweep {sweep_dir})"
    print(f"{last}; {restored}" if restored else last, flush=True)
    return 0 if ok else 1


def run_setting(
    plan: SweepPlan, setting: Setting, cfg: RunConfig, run_dir: Path, ns: argparse.Namespace
) -> dict[str, Any]:
    """Restart (when the sweep restarts the server), then the whole method; setting.json in its folder."""
    started = time.time()
    restart: Restarted | None = None
    outcome: cli.RunOutcome | None = None
    try:
        if plan.restarter is not None:
            print(f"restarting the server ({plan.restarter.where}) with {setting.server_values() or 'its command'}",
                  flush=True)  # fmt: skip
            restart = plan.restarter.restart(setting.server_values())
        if restart is None or restart.ok:
            outcome = cli.run_method(cfg, ns.remote_workers, ns.master_bind_host, ns.master_port, run_dir=run_dir)
    except KeyboardInterrupt:
        _Stop.requested = True
    status, why, tail = judge(plan, restart, outcome)
    ran = (run_dir / "manifest.json").exists()
    if _Stop.requested and ran and not (run_dir / "report.html").exists():
        cli.render(run_dir)  # the stop came before or during its report: the partial run is rendered still
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "setting": setting.label,
        "values": setting.values,
        "target": setting.target_url,
        "status": status,
        "why": why,
        "server_output_tail": tail,
        "started_unix_s": started,
        "ended_unix_s": time.time(),
        "restart_s": restart.elapsed_s if restart is not None else None,
        "exit_status": outcome.code if outcome is not None else None,
    }
    write_json(run_dir / SETTING_FILE, record)
    return record


def judge(
    plan: SweepPlan, restart: Restarted | None, outcome: cli.RunOutcome | None
) -> tuple[str, str, list[str]]:
    """(status, why, the server's last lines) of a setting that ended."""
    if _Stop.requested:
        return "failed", "stopped (Ctrl-C or SIGTERM) during this setting: its run folder holds what it measured", []
    if restart is not None and not restart.ok:
        return "failed", f"the server did not become healthy: {restart.why}", restart.output_tail
    if outcome is None:
        return "failed", "the setting did not run", []
    if outcome.code == 0 and not outcome.why:
        return "ok", "", []
    tail = plan.restarter.output_tail() if plan.restarter is not None else []
    return "failed", outcome.why or f"the run ended with exit status {outcome.code}", tail


def write_sweep_report(sweep_dir: Path) -> Path | None:
    """sweep.csv, sweep.html and the pick's recommended-config.yaml (reports.sweep); None when they could
    not be drawn (one warning line: the sweep goes on)."""
    from reports.sweep import (
        write_sweep,  # here: the report's pandas and matplotlib only once a setting ended
    )

    try:
        return Path(write_sweep(sweep_dir))
    except Exception as exc:  # noqa: BLE001 - a report that cannot be drawn must not end the sweep
        print(f"warning: the sweep's report was not written ({type(exc).__name__}: {exc}); render it later:"
              f" python -m reports sweep {sweep_dir}", flush=True)  # fmt: skip
        return None
