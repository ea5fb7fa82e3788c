"""Event wiring, one function per concern (like locust/stats.py's setup_*_listeners).

- workers: say their suite version, build the payloads from the image set the master sent, tag
  requests with the step the master announces, ship exact rows to the master (loadtest/wiring/link.py,
  loadtest/traffic/rowlink.py: acknowledged batches, a flush at each step's end, a final batch), keep a
  local copy on their own disk.
- master: own the Controller (plan, run folder, GPU monitor), append rows as they arrive, each
  put on the master's clock with its worker's measured clock offset (loadtest/traffic/clock.py); count
  per worker the rows produced and received, and say which rows only a worker holds.
- local runs (no workers): the same master side, fed from this process's rows every second.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust import argument_parser, events
from locust.env import Environment
from locust.runners import LocalRunner, MasterRunner, Runner, WorkerRunner

from gpu_sampler import GpuMonitor
from loadtest.method.controller import Controller
from loadtest.settings.checks import ConfigError
from loadtest.settings.manifest import build_manifest
from loadtest.settings.options import add_arguments, from_namespace, with_env_secrets, worker_options
from loadtest.settings.run_config import RunConfig
from loadtest.settings.version import suite_version
from loadtest.traffic import clock, rowlink, users
from loadtest.traffic.merge import WORKER_COPY_DIR
from loadtest.traffic.payloads import build_payloads, page_mix_of
from loadtest.traffic.state import STATE, StepTag, worker_id_of
from loadtest.views import panel_runs, promexport, webui
from loadtest.wiring import link
from runfolder import Event, new_run_folder, write_manifest

log = logging.getLogger(__name__)
STEP_MESSAGE = "ocr_step"

WORKERS_POLL_S = 0.05  # how often the headless master looks for its expected workers (Locust: once a second)
WORKERS_OWN_WAIT_S = 30.0  # then Locust's own wait takes over: its "waiting for workers" lines, its max wait
_controllers: dict[int, Controller] = {}
_workers_seen: set[str] = set()  # accepted workers ever live, by worker id
_lost_announced: set[str] = set()  # those already reported lost (a worker_lost event each)
_offsets = clock.OffsetBook()  # the master's estimate of each worker's clock offset
_offsets_reported: dict[str, float] = {}  # per worker, the offset the current run's events last gave


def config_of(environment: Environment) -> RunConfig:
    cfg = from_namespace(environment.parsed_options, host=environment.host or "")
    return with_env_secrets(cfg, dict(os.environ))


# --- master side ---------------------------------------------------------------------------
def controller_for(environment: Environment) -> Controller:
    """The run's controller, made at the first tick (the web UI may change options until then)."""
    key = id(environment)
    if key in _controllers:
        return _controllers[key]
    cfg = config_of(environment)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else new_run_folder(Path(cfg.out))
    run_dir.mkdir(parents=True, exist_ok=True)
    options = environment.parsed_options
    assert options is not None  # Locust sets it before the first tick
    options.ocr_run_dir = str(run_dir)  # forwarded to workers with each spawn
    # so are the headers (unless HEADERS_FROM_WORKERS) and CA_BUNDLE's text
    vars(options).update(worker_options(cfg))
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    if not environment.stop_timeout:
        environment.stop_timeout = cfg.stop_timeout_s  # requests in flight at a step-down finish
    runner = environment.runner
    ctl = Controller(cfg, run_dir, None, broadcast=lambda tag: _broadcast(runner, tag),
                     flush=lambda: _flush(runner, ctl))  # fmt: skip
    try:  # a cooldown waits for users as long as Locust lets them finish (a --stop-timeout given to Locust)
        ctl.limits = ctl.limits.with_stop_timeout(float(environment.stop_timeout)).check()
    except ConfigError as exc:
        ctl.event("warning", f"{exc}; the run goes on with the config's {cfg.stop_timeout_s} s")
    if not (run_dir / "manifest.json").exists():
        write_manifest(run_dir, build_manifest(cfg, run_dir, **page_mix_of(cfg)))
    _start_monitor(cfg, ctl)
    _controllers[key] = ctl
    _offsets_reported.clear()  # a new run folder: its events and file start from the current estimates
    _workers_seen.clear()
    _lost_announced.clear()
    _report_offsets(ctl)
    panel_runs.track(environment, ctl)
    promexport.track(environment, ctl)
    if isinstance(runner, LocalRunner):
        gevent.spawn(_feed_local_rows, ctl)
    if isinstance(runner, MasterRunner):  # before the first spawn: workers need the images
        warning = link.start_master_run(runner, cfg, run_dir.name, options)
        if warning:
            ctl.event("warning", warning)
        ctl._update_manifest(images_sha256=getattr(options, link.DIGEST_OPTION, ""))
    ctl._update_manifest(suite_version=suite_version())
    return ctl


def _start_monitor(cfg: RunConfig, ctl: Controller) -> None:
    """The GPU, server-metrics and host samplers, checked and started; the manifest notes what the GPU source
    said. A source that cannot be read is a warning: the run goes on without GPU data."""
    monitor = GpuMonitor.from_spec(
        cfg.gpu,
        server_metrics_url=cfg.server_metrics or None,
        framework_metric=cfg.framework_metric,
        step_of=lambda: ctl.step_index,
        on_gpu=ctl.on_gpu,
        on_server=ctl.on_server,
        on_host=ctl.on_host,
        on_event=ctl.on_event,
        pid=cfg.server_pid or None,
        token=cfg.gpu_token or None,
        metrics_headers=cfg.metrics_header_dict(),
        tls=cfg.tls(),
    )
    try:
        monitor.check()
        monitor.start()
        ctl.monitor = monitor
    except ValueError as exc:
        ctl.event("warning", f"no GPU data: {exc}")
    info = monitor.info() if ctl.monitor is not None else {"available": False, "why_missing": "see events"}
    ctl._update_manifest(gpu=info)


def _broadcast(runner: Runner | None, tag: StepTag) -> None:
    if isinstance(runner, MasterRunner):
        share = dataclasses.replace(tag, rate_rps=tag.rate_rps / max(1, runner.worker_count))  # each its share
        runner.send_message(STEP_MESSAGE, dataclasses.asdict(share))


def _flush(runner: Runner | None, ctl: Controller) -> None:
    """At a phase's end, before its row is written and the plan decides: every row so far is in."""
    if isinstance(runner, LocalRunner):
        ctl.on_rows(STATE.take_rows())
    elif isinstance(runner, MasterRunner):
        late = link.flush(runner)
        if late:  # cut off or lost: its rows since its last batch are missing from this step
            ctl.mark_degraded(
                f"worker(s) {', '.join(late)} did not answer the step-end flush in {rowlink.FLUSH_WAIT_S:g} s:"
                " lost or cut off"
            )
            _lost_announced.update(late)
        inbox = link.current_inbox()
        if inbox is not None:
            ctl._update_manifest(row_tally=inbox.record())


def _feed_local_rows(ctl: Controller) -> None:
    while not ctl.finished:
        ctl.on_rows(STATE.take_rows())
        gevent.sleep(1.0)
    gevent.sleep(0.5)
    ctl.on_rows(STATE.take_rows())


def watch_workers(runner: Runner, ctl: Controller) -> None:
    """A worker that disappears marks the current step degraded, once (the step-end flush may have
    said it first); the run goes on with the rest."""
    if not isinstance(runner, MasterRunner):
        return
    live = {worker_id_of(c) for c in link.live_clients(runner)}
    gone = _workers_seen - live - _lost_announced
    if gone:
        ctl.mark_degraded(f"a worker was lost: {len(live)} of {len(live) + len(gone)} left")
        _lost_announced.update(gone)
    _workers_seen.update(live)


def _on_rows_message(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    client_id = msg.node_id
    rows = link.receive(client_id, msg.data, environment.runner)
    if not rows:
        return
    correction = _offsets.correction_s(worker_id_of(client_id))
    if correction:  # onto the master's clock, where the step windows are
        rows = [clock.corrected(row, correction) for row in rows]
    for ctl in _controllers.values():
        ctl.on_rows(rows)


def _on_master_stop(environment: Environment, **_kwargs: Any) -> None:
    if not isinstance(environment.runner, MasterRunner | LocalRunner):
        return
    stopped_by = panel_runs.take_user_stop(environment)  # "" when the plan ended, or Locust stopped by itself
    ctl = _controllers.get(id(environment))
    if ctl is not None:
        runner = environment.runner
        inbox = None
        if isinstance(runner, MasterRunner):  # rows keep arriving into ctl while it waits
            inbox = link.collect_final(runner, float(environment.stop_timeout or 0))
        _controllers.pop(id(environment), None)  # a later start from the web UI is a new run
        ctl.on_rows(STATE.take_rows())
        if inbox is not None:
            _report_rows_only_on_workers(ctl, inbox)
        if stopped_by:  # Locust's workers leave its count while they stop: a user's stop is no lost worker
            ctl.stop_by_user(stopped_by)
        elif isinstance(runner, MasterRunner) and runner.worker_count == 0:
            ctl.stop_early("every worker was lost: run ended before its plan; check the workers' logs")
        else:
            ctl.stop_early("the run was stopped before its plan ended")
        _report_offsets(ctl, final=True)
        ctl.close()
        if environment.web_ui is not None:  # headless runs are rendered by `python -m loadtest run`
            vars(environment.parsed_options)["ocr_run_dir"] = ""  # the next start from the page is a new run
            webui.render_soon(ctl, environment)


def _report_rows_only_on_workers(ctl: Controller, inbox: rowlink.Inbox) -> None:
    """One `rows_only_on_worker` event per worker whose rows did not all reach the master, or that was
    lost before its final count; the counts go to the manifest's `row_tally` for the report."""
    for worker_id, tally in sorted(inbox.workers.items()):
        if tally.only_on_worker or not tally.final:
            message = inbox.describe(worker_id, str(ctl.run_dir))
            ctl.on_event(Event(time.time(), ctl.step_index, "rows_only_on_worker", message))
    ctl._update_manifest(row_tally=inbox.record())


# --- clock offsets (protocol in loadtest/traffic/clock.py) ------------------------------------------
def _probe(runner: MasterRunner, client_id: str) -> None:
    runner.send_message(clock.CLOCK_PROBE, {"t_master_s": time.time()}, client_id=client_id)


def _probe_loop(runner: MasterRunner) -> None:
    """Probe every accepted worker once per PROBE_INTERVAL_S for the master's whole life. Not a worker
    that only connected: Locust's worker connects before its `init` registers the answer, and logged
    "Unknown message type received: ocr_clock_probe" for a probe that came first."""
    while True:
        for node_id in link.live_clients(runner):  # only after its hello: its init registered the probe
            try:
                _probe(runner, node_id)
            except Exception as exc:  # a broken connection: Locust's heartbeat deals with the worker
                log.debug("clock probe to %s failed: %s", node_id, exc)
        gevent.sleep(clock.PROBE_INTERVAL_S)


def _on_clock_reply(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    t_receive = time.time()  # first: every statement before it would count as round trip
    sample = clock.offset_sample(float(msg.data["t_master_s"]), float(msg.data["t_worker_s"]), t_receive)
    _offsets.add(worker_id_of(msg.node_id), sample)
    for ctl in _controllers.values():
        _report_offsets(ctl)


def _report_offsets(ctl: Controller, final: bool = False) -> None:
    """A clock_offset event for each worker whose estimate is new or moved (REPORT_CHANGE_S, or
    FINAL_CHANGE_S at the end: the first estimate may come from a slow round trip), and the
    estimates in workers/ (the merge applies them to rows only a local copy kept)."""
    best = _offsets.all_best()
    change = clock.FINAL_CHANGE_S if final else clock.REPORT_CHANGE_S
    moved = {
        w: s
        for w, s in best.items()
        if w not in _offsets_reported or abs(s.offset_s - _offsets_reported[w]) >= change
    }
    for worker_id, sample in moved.items():
        _offsets_reported[worker_id] = sample.offset_s
        ctl.on_event(Event(time.time(), ctl.step_index, "clock_offset", clock.describe(worker_id, sample)))
    if best and (moved or final):
        clock.write_offsets(ctl.run_dir / WORKER_COPY_DIR, best)


def _on_clock_probe(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    """Answer at once with this worker's clock (the skewed one under the test hook, as a real
    machine's wrong clock would answer)."""
    reply = {"t_master_s": msg.data["t_master_s"], "t_worker_s": STATE.now()}
    assert environment.runner is not None
    environment.runner.send_message(clock.CLOCK_REPLY, reply)


# --- worker side ---------------------------------------------------------------------------
def _on_step_message(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    STATE.tag = StepTag(**msg.data)


def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        link.start_worker_run(environment, config_of(environment))
    elif isinstance(runner, LocalRunner):
        users.set_payloads(build_payloads(config_of(environment)))


def _on_init(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        STATE.worker_id = worker_id_of(runner.client_id)
        STATE.now = clock.wall_clock(clock.skew_from_env(os.environ))  # the test hook, read once
        runner.register_message(STEP_MESSAGE, _on_step_message)
        runner.register_message(clock.CLOCK_PROBE, _on_clock_probe)
        link.setup_worker(environment, runner)
    elif isinstance(runner, MasterRunner):
        STATE.worker_id = "master"
        runner.register_message(rowlink.ROWS_MESSAGE, _on_rows_message)
        runner.register_message(clock.CLOCK_REPLY, _on_clock_reply)
        link.setup_master(runner, _config_or_none(environment))
        runner.greenlet.spawn(_probe_loop, runner)
    if not isinstance(runner, WorkerRunner):
        webui.attach(environment)
        _start_metrics(environment)
    environment.events.test_start.add_listener(_on_test_start)
    environment.events.test_stop.add_listener(_on_master_stop)
    if isinstance(runner, MasterRunner):
        _wait_for_workers(environment, runner)


def _wait_for_workers(environment: Environment, runner: MasterRunner) -> None:
    """A headless master's expected workers, looked for every WORKERS_POLL_S: Locust's own wait, after
    `init`, looks once a second (main.py start_automatic_run), so the run started up to a second after the
    last worker was ready; it now finds them ready at once. At most WORKERS_OWN_WAIT_S here."""
    options = environment.parsed_options
    expect = int(getattr(options, "expect_workers", 0) or 0) if options is not None and options.headless else 0
    until = time.monotonic() + WORKERS_OWN_WAIT_S
    while len(runner.clients.ready) < expect and time.monotonic() < until:
        gevent.sleep(WORKERS_POLL_S)


def _start_metrics(environment: Environment) -> None:
    """/metrics with METRICS_PORT; under the web UI (`ui`) on its default port unless METRICS_PORT says, or
    on a free port when that one is taken (the `metrics:` line says where)."""
    cfg = _config_or_none(environment) or RunConfig()
    under_ui = environment.web_ui is not None and not cfg.metrics_port
    port = promexport.UI_METRICS_PORT if under_ui else cfg.metrics_port
    if not port:
        return
    try:
        served = promexport.start_metrics(environment, cfg, port, or_free=under_ui)
    except (ConfigError, OSError) as exc:
        if under_ui:  # not even a free port: the UI runs on without /metrics
            print(f"warning: no /metrics: {exc} (METRICS_PORT=...)", file=sys.stderr, flush=True)
            return
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    print(f"metrics: http://{cfg.metrics_host}:{served}/metrics", flush=True)


def _config_or_none(environment: Environment) -> RunConfig | None:
    try:
        return config_of(environment)
    except ConfigError:
        return None  # the web UI's form sets it before a run starts


def _memoize_default_args() -> None:
    """Locust's worker rebuilds its whole default argument parser once per option of every spawn
    message (`runners.py`, `k not in argument_parser.default_args_dict()` inside a comprehension):
    measured here, a 270-650 ms stall of the worker's event loop at each step change, which inflated
    the latency of the requests in flight at step boundaries. The defaults never change in a process,
    so compute them once; callers only test membership, and each gets its own copy."""
    if getattr(argument_parser.default_args_dict, "__ocr_memoized__", False):
        return
    defaults = argument_parser.default_args_dict()

    def default_args_dict() -> dict[str, Any]:
        return dict(defaults)

    default_args_dict.__ocr_memoized__ = True  # type: ignore[attr-defined]
    argument_parser.default_args_dict = default_args_dict


def wire() -> None:
    """Register every listener; called once from locustfile.py at import."""
    _memoize_default_args()
    events.init_command_line_parser.add_listener(lambda parser, **_kw: add_arguments(parser))
    events.init.add_listener(_on_init)
