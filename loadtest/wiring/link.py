"""Master <-> worker messages beyond Locust's own: the suite version, the image set, the rows.

    worker --ocr_hello {version, host}--> master        (at the worker's init)
    master --ocr_refused {master, worker}--> worker     (versions differ: one line on stderr, exit 2)
    master --ocr_images {digest, blob}--> worker        (once per worker and image set, by SHA-256)
    worker --ocr_images_ok {digest, error}--> master
    rows: loadtest/traffic/rowlink.py (batches four times a second, a flush at each step's end, a final batch)

Handlers run inside Locust's receive loop (a heartbeat waits behind them): each does a bounded
amount of work; the only waits (for image sets, flush answers, final batches) happen in the master's
shape greenlet or test_stop, with gevent sleeps and deadlines, never in a handler.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import STATE_MISSING, STATE_RUNNING, MasterRunner, Runner, WorkerRunner

from loadtest.method.progress import progress
from loadtest.settings.run_config import RunConfig
from loadtest.settings.version import suite_version
from loadtest.traffic import rowlink, users
from loadtest.traffic.merge import LOCAL_COPY_SUFFIX, WORKER_COPY_DIR, LocalCopy
from loadtest.traffic.payloads import build_payloads, image_set_for
from loadtest.traffic.rowlink import DEFAULT_WORKER_DIR, LOCAL_WORKER_ENV, WORKER_DIR_ENV, Inbox, Outbox
from loadtest.traffic.state import STATE, worker_id_of
from scenarios import ImageSet, ScenarioError, decode_image_set, encode_image_set, image_set_digest

log = logging.getLogger(__name__)
HELLO = "ocr_hello"
REFUSED = "ocr_refused"
IMAGES = "ocr_images"
IMAGES_OK = "ocr_images_ok"
DIGEST_OPTION = "ocr_images_sha256"  # set on the master's options: forwarded to workers with each spawn
IMAGES_WAIT_S = 120.0  # megabytes per worker over a slow link
REBALANCE_WAIT_S = 10.0  # for Locust's dispatch in progress to end before a dropped worker's users move
REBALANCE_AFTER_S = (0.0, 0.5, 1.0, 2.0, 4.0)  # pauses before each resend of the shares (~7.5 s in all)


# --- worker side ---------------------------------------------------------------------------
class _Worker:
    outbox: Outbox | None = None
    final_sent = False
    images: dict[str, ImageSet] = {}  # noqa: RUF012 - one per process
    wanted = ""  # the digest the current run's spawn message named
    cfg: RunConfig | None = None


def setup_worker(environment: Environment, runner: WorkerRunner) -> None:
    runner.register_message(REFUSED, _on_refused)
    runner.register_message(IMAGES, _on_images)
    runner.register_message(rowlink.ROWS_ACK, _on_ack)
    runner.register_message(rowlink.FLUSH_MESSAGE, _on_flush)
    runner.register_message(rowlink.FINAL_MESSAGE, _on_final, concurrent=True)  # it waits for the users
    environment.events.test_stop.add_listener(lambda **_kw: _send_final(runner))
    environment.events.test_stop.add_listener(_rejoin_at_once)
    environment.events.quitting.add_listener(_on_worker_quit)
    runner.greenlet.spawn(_ship_loop, runner)
    runner.send_message(HELLO, {"version": suite_version(), "host": socket.gethostname()})


def _rejoin_at_once(environment: Environment, **_kwargs: Any) -> None:
    """After a stop Locust's worker sleeps its stop timeout before it rejoins the master's count and reads
    its messages again (runners.py, "stop"): 55 s in which no new run could start. Its users have stopped by
    now (test_stop fires after them) and its final batch is sent: nothing is left to wait for. The next
    spawn message sets the stop timeout again for that run's step-downs."""
    environment.stop_timeout = 0.0


def _on_refused(environment: Environment, msg: Any) -> None:
    print(
        f"error: this worker runs suite version {msg.data['worker']}, the master at"
        f" {getattr(environment.runner, 'master_host', '?')} runs {msg.data['master']}: install the same"
        " version of the suite on every driver machine",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)  # Locust has no way to end a worker with a status of ours; nothing is held yet


def _on_images(environment: Environment, msg: Any) -> None:
    digest, error = str(msg.data.get("digest", "")), ""
    try:
        _Worker.images = {digest: decode_image_set(msg.data["blob"], digest)}  # the last set only
    except ScenarioError as exc:
        error = str(exc)
        log.error("image set from the master refused: %s", exc)
    assert environment.runner is not None
    environment.runner.send_message(IMAGES_OK, {"digest": digest, "error": error})
    if digest == _Worker.wanted and _Worker.cfg is not None:
        _apply_images(_Worker.cfg)  # the run started before the images came: users were waiting


def start_worker_run(environment: Environment, cfg: RunConfig) -> None:
    """At test_start on a worker: this run's outbox and local copy, payloads from the master's images."""
    options = environment.parsed_options
    run_dir = str(getattr(options, "ocr_run_dir", "") or "")
    local = os.environ.get(LOCAL_WORKER_ENV) and run_dir  # on the master's machine: beside the run's files
    _outbox_for(Path(run_dir).name if run_dir else "run", Path(run_dir) / WORKER_COPY_DIR if local else None)
    _Worker.wanted, _Worker.cfg = str(getattr(options, DIGEST_OPTION, "") or ""), cfg
    _apply_images(cfg)


def _apply_images(cfg: RunConfig) -> None:
    image_set = _Worker.images.get(_Worker.wanted)
    if image_set is None:  # users wait (OcrUser sleeps without payloads) until the images arrive
        log.warning("waiting for the image set %s from the master", _Worker.wanted[:12] or "(none named)")
        users.set_payloads(None)
        return
    users.set_payloads(build_payloads(cfg, image_set))


def _outbox_for(run_id: str, folder: Path | None = None) -> Outbox:
    box = _Worker.outbox
    if box is not None and box.run_id == run_id:
        return box
    if box is not None and box.copy is not None:
        box.copy.close()  # a new run from the web UI
    if folder is None:
        folder = Path(os.environ.get(WORKER_DIR_ENV) or DEFAULT_WORKER_DIR).resolve() / run_id
    folder.mkdir(parents=True, exist_ok=True)
    _Worker.outbox = Outbox(run_id, LocalCopy(folder / f"{STATE.worker_id}{LOCAL_COPY_SUFFIX}"))
    _Worker.final_sent = False
    STATE.pack_as_they_come()  # its rows only go out packed
    return _Worker.outbox


def _send(runner: Runner, batches: list[dict[str, Any]]) -> None:
    for data in batches:
        try:
            runner.send_message(rowlink.ROWS_MESSAGE, data)
        except Exception as exc:  # a broken connection: the batch stays unacknowledged and is sent again
            log.warning("rows not sent to the master (%s); they are in the local copy", exc)


def next_batches(flush_round: int | None = None, final: bool = False) -> list[dict[str, Any]]:
    """The rows taken since the last batch (none if no run started) and any batch due again."""
    box = _Worker.outbox
    if box is None:
        return []
    n, blob = STATE.take_packed()
    fresh = [box.packed_batch(n, blob, flush_round, final)] if n or flush_round is not None or final else []
    return box.resends(every=final) + fresh


def _ship_loop(runner: WorkerRunner) -> None:
    while True:
        gevent.sleep(rowlink.SHIP_INTERVAL_S)
        _send(runner, next_batches())


def _on_flush(environment: Environment, msg: Any) -> None:
    assert environment.runner is not None
    _outbox_for(str(msg.data.get("run_id") or "run"))
    _send(environment.runner, next_batches(flush_round=int(msg.data["round"])))


def _on_final(environment: Environment, msg: Any) -> None:
    """The run ended: stop the users (requests in flight end within the stop timeout), then the final batch."""
    runner = environment.runner
    assert runner is not None
    runner.stop()  # fires test_stop, which sends the final batch; a stopped runner returns at once
    _send_final(runner)


def _send_final(runner: Runner) -> None:
    if _Worker.outbox is None or _Worker.final_sent:
        return
    _Worker.final_sent = True
    _send(runner, next_batches(final=True))


def _on_ack(environment: Environment, msg: Any) -> None:
    box = _Worker.outbox
    if box is not None and msg.data.get("run_id") == box.run_id:
        box.on_ack(msg.data)


def _on_worker_quit(environment: Environment, **_kwargs: Any) -> None:
    box = _Worker.outbox
    if box is None:
        return
    if box.copy is not None:
        n, blob = STATE.take_packed()  # a worker that quits without a final batch (master gone)
        if n:
            box.packed_batch(n, blob)
        box.copy.close()
    print(f"worker {STATE.worker_id}: {quit_words(box.produced, box.acked_rows, _Worker.final_sent)};"
          f" local copy: {box.copy.path if box.copy else '-'}", flush=True)  # fmt: skip


def quit_words(produced: int, acked: int, final_sent: bool) -> str:
    """What a quitting worker says of its rows: the master's acknowledgement of the final batch often
    comes after its quit, so rows sent in it are said as sent, not as lost."""
    if acked >= produced:
        return f"{produced} rows, {acked} acknowledged by the master"
    if final_sent:
        return (f"{produced} rows, {acked} acknowledged by the master; the other {produced - acked} went in the"
                " final batch, whose acknowledgement the master's quit cut (merge-rows adds any it lacks)")  # fmt: skip
    return f"{produced} rows, {acked} acknowledged by the master: merge-rows adds the other {produced - acked}"


# --- master side ---------------------------------------------------------------------------
class _Master:
    offers: dict[tuple[Any, ...], tuple[str, bytes, ImageSet]] = {}  # noqa: RUF012 - by config key
    current: tuple[str, bytes, ImageSet] | None = None
    accepted: dict[str, str] = {}  # noqa: RUF012 - client id -> the digest it acknowledged ("" none)
    sent: dict[str, str] = {}  # noqa: RUF012 - client id -> the digest sent to it
    hosts: dict[str, str] = {}  # noqa: RUF012
    inbox: Inbox | None = None
    flush_round = 0


def setup_master(runner: MasterRunner, cfg: RunConfig | None) -> None:
    runner.register_message(HELLO, _on_hello)
    runner.register_message(IMAGES_OK, _on_images_ok)
    if cfg is not None:
        try:
            _offer(cfg)  # read or drawn once, before any worker waits for them
        except (ScenarioError, OSError) as exc:
            log.error("no image set: %s", exc)


def _offer(cfg: RunConfig) -> tuple[str, bytes, ImageSet]:
    key = (cfg.scenario, cfg.images, cfg.seed, cfg.buckets, cfg.max_side)
    if key not in _Master.offers:
        image_set = image_set_for(cfg)
        blob = encode_image_set(image_set)
        digest = image_set_digest(blob)
        _Master.offers = {key: (digest, blob, image_set)}  # the last set only: megabytes
        progress(
            f"images: {len(image_set.items)} image(s), {len(blob) / 1e6:.1f} MB, sha256 {digest[:12]};"
            " sent to each worker once"
        )
    _Master.current = _Master.offers[key]
    return _Master.current


def _on_hello(environment: Environment, msg: Any) -> None:
    runner = environment.runner
    assert isinstance(runner, MasterRunner)
    client_id, theirs, ours = msg.node_id, str(msg.data.get("version")), suite_version()
    host = str(msg.data.get("host", "?"))
    if theirs != ours:
        runner.send_message(REFUSED, {"master": ours, "worker": theirs}, client_id=client_id)
        _drop(runner, client_id)
        progress(f"[refused] a worker on {host}: its suite version {theirs} is not the master's {ours}")
        return
    _Master.accepted[client_id] = ""
    _Master.hosts[client_id] = host
    if _Master.inbox is not None:
        _Master.inbox.hello(worker_id_of(client_id), host)
    if _Master.current is not None:
        _send_images(runner, client_id, _Master.current)


def _drop(runner: MasterRunner, client_id: str) -> None:
    """Forget a refused worker as Locust forgets one that quit, without ending the run."""
    node = runner.clients.get(client_id)
    if node is None:
        return
    del runner.clients[client_id]
    dispatcher = runner._users_dispatcher
    if dispatcher is not None:
        dispatcher.remove_worker(node)
        gevent.spawn(_rebalance, runner)


def _rebalance(runner: MasterRunner) -> None:
    """Give a dropped worker's users back to the others. Locust gave it users as soon as it connected,
    before its hello, taking them from the others, which stop them gracefully: a user finishing its
    request still counts as running, so a share sent back at once is ignored and the worker ends up
    with a user fewer (seen in the multi-host test: a step ran one user short to its end). So every
    worker's share is sent again while those requests end; a worker at its share ignores it."""
    for delay_s in REBALANCE_AFTER_S:
        gevent.sleep(delay_s)
        deadline = time.monotonic() + REBALANCE_WAIT_S  # Locust refuses a start while it dispatches
        while runner.state != STATE_RUNNING and time.monotonic() < deadline:
            gevent.sleep(0.1)
        dispatcher = runner._users_dispatcher
        if runner.state != STATE_RUNNING or not runner.worker_count or dispatcher is None:
            return
        dispatcher._prepare_rebalance()  # every worker's share, as if from 0, sent with the next start
        runner.start(runner.target_user_count, runner.spawn_rate)


def _send_images(runner: MasterRunner, client_id: str, offer: tuple[str, bytes, ImageSet]) -> None:
    digest, blob, _ = offer
    if _Master.sent.get(client_id) == digest:
        return
    _Master.sent[client_id] = digest
    runner.send_message(IMAGES, {"digest": digest, "blob": blob}, client_id=client_id)


def _on_images_ok(environment: Environment, msg: Any) -> None:
    if msg.data.get("error"):
        progress(
            f"[warning] worker {worker_id_of(msg.node_id)} could not use the image set: {msg.data['error']}"
        )
        return
    if msg.node_id in _Master.accepted:
        _Master.accepted[msg.node_id] = str(msg.data.get("digest", ""))


def live_clients(runner: MasterRunner) -> list[str]:
    """Connected, accepted workers (a worker whose heartbeats stopped is not live)."""
    return [n.id for n in runner.clients.values() if n.state != STATE_MISSING and n.id in _Master.accepted]


def start_master_run(runner: MasterRunner, cfg: RunConfig, run_id: str, options: Any) -> str:
    """At the run's first tick: name the image set in the options, send it where it is missing, and
    wait (bounded) until the expected workers hold it. Returns "" or a warning."""
    offer = _offer(cfg)
    setattr(options, DIGEST_OPTION, offer[0])
    _Master.inbox = Inbox(run_id)
    for client_id in list(_Master.accepted):
        _Master.inbox.hello(worker_id_of(client_id), _Master.hosts.get(client_id, ""))
    expect = max(int(getattr(options, "expect_workers", 1) or 1), 1)
    deadline = time.monotonic() + IMAGES_WAIT_S
    while True:
        live = live_clients(runner)
        for client_id in live:
            _send_images(runner, client_id, offer)
        waiting = [c for c in live if _Master.accepted.get(c) != offer[0]]
        if not waiting and len(live) >= expect:  # a refused worker Locust counted is not among them
            return ""
        if time.monotonic() > deadline:
            return (
                f"{len(live) - len(waiting)} of {expect} expected workers hold the image set after"
                f" {IMAGES_WAIT_S:.0f} s; the run goes on with them"
            )
        gevent.sleep(0.05)


def current_inbox() -> Inbox | None:
    return _Master.inbox


def receive(client_id: str, data: dict[str, Any], runner: Any) -> list[Any]:
    """A batch of rows from a worker: counted once, acknowledged; its new rows."""
    inbox = _Master.inbox
    if inbox is None:
        return []
    rows, ack = inbox.receive(worker_id_of(client_id), data, time.time())
    try:
        runner.send_message(rowlink.ROWS_ACK, ack, client_id=client_id)
    except Exception as exc:  # the worker sends the batch again; it is counted once
        log.debug("ack to %s failed: %s", client_id, exc)
    return rows


def flush(runner: MasterRunner) -> list[str]:
    """At a step's end: ask every live worker for its rows and wait (bounded) for the answers.
    Returns the workers that did not answer, those Locust found missing while it waited included:
    they were lost in this step."""
    inbox = _Master.inbox
    if inbox is None:
        return []
    _Master.flush_round += 1
    r, live = _Master.flush_round, live_clients(runner)
    for client_id in live:
        runner.send_message(rowlink.FLUSH_MESSAGE, {"round": r, "run_id": inbox.run_id}, client_id=client_id)
    deadline = time.monotonic() + rowlink.FLUSH_WAIT_S
    ids = {worker_id_of(c): c for c in live}
    while time.monotonic() < deadline:  # no wait for a worker Locust has found missing meanwhile
        if not [w for w in inbox.not_answered(r, list(ids)) if ids[w] in live_clients(runner)]:
            break
        gevent.sleep(0.01)
    return inbox.not_answered(r, list(ids))


def collect_final(runner: MasterRunner, stop_timeout_s: float) -> Inbox | None:
    """At the run's end: every live worker stops its users and sends its final batch; wait for them
    (the stop timeout lets requests in flight end, then FINAL_WAIT_S), a lost worker not at all."""
    inbox = _Master.inbox
    if inbox is None:
        return None
    for client_id in live_clients(runner):
        try:
            runner.send_message(rowlink.FINAL_MESSAGE, {"run_id": inbox.run_id}, client_id=client_id)
        except Exception as exc:
            log.debug("final request to %s failed: %s", client_id, exc)
    deadline = time.monotonic() + stop_timeout_s + rowlink.FINAL_WAIT_S
    while time.monotonic() < deadline:
        live = {worker_id_of(c) for c in live_clients(runner)}
        if not [w for w in inbox.without_final() if w in live]:
            break
        gevent.sleep(0.05)
    _Master.inbox = None
    return inbox
