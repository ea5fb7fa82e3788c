"""`python -m simulator`: parse flags, start the server, print its URLs, stop cleanly on SIGTERM/SIGINT.

Prints exactly (flushed; tools parse them):
    simulator: http://<host>:<port>                 (https:// with --tls-cert/--tls-key)
    dcgm: http://<host>:<dcgm_port>/metrics        (absent with --dcgm-port -1)
A user error (unknown profile, bad flag, port in use) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from typing import NoReturn

from simulator.front.server import ServerConfig, SimServer
from simulator.model.faults import FaultError, Faults, updated_faults
from simulator.model.options import ALLOCATORS, ANSWER_SHAPES, HABITS, PROFILE_DEFAULTS, Options, make_options
from simulator.model.profiles import DEFAULT_PROFILE, PROFILES, ProfileError, get_profile
from simulator.model.settings import settle

SETTINGS = ("max_num_seqs", "gpu_memory_utilization", "runaway_rate", "stall_every_s", "stall_s")


class UserError(Exception):
    """A mistake in the command line: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see python -m simulator --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m simulator", description="Simulated GPU OCR server (see simulator/README.md).")
    _add_serving_flags(p)
    _add_model_flags(p)
    _add_habit_flags(p)
    _add_fault_flags(p)
    return p


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """Which profile, where and how it listens (TLS, a metrics token), its seed, clock and body limits."""
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"one of {', '.join(sorted(PROFILES))}")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--dcgm-port", type=int, default=9400, help="DCGM exporter port; 0 picks one, -1 disables")
    p.add_argument("--tls-cert", default="", help="serve HTTPS (API, /metrics and DCGM) with this PEM certificate")
    p.add_argument("--tls-key", default="", help="the private key of --tls-cert (PEM)")
    p.add_argument(
        "--metrics-token", default="", help="/metrics and the DCGM page answer 401 without 'Authorization: Bearer <it>'"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every duration")
    p.add_argument("--max-body-mib", type=float, default=64.0)
    p.add_argument("--max-pixels", type=int, default=50_000_000, help="decompression-bomb limit (pixels)")


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """The model's options and settings: gateway, engine slots and pool, stalls, heat, CPU pool, answers,
    allocator (and the request log, kept where --help has always listed it)."""
    p.add_argument("--gateway-slots", type=int, default=None, help="gateway semaphore size (0: no gateway; default: the profile's)")
    p.add_argument("--gateway-queue", type=int, default=None, help="gateway bounded queue (requests; default: the profile's)")
    p.add_argument("--gateway-wait-s", type=float, default=None, help="longest gateway queue wait (s; default: the profile's)")
    p.add_argument("--retry-after-s", type=int, default=None, help="Retry-After of the 503s (s; default: the profile's, 1)")
    p.add_argument("--max-num-seqs", type=int, default=0, help="engine slots, as vLLM's --max-num-seqs (default: the profile's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.0,
                   help="vllm profiles: the pool preallocated, a share of the card (default: the profile's, 0.9)")
    p.add_argument("--runaway-rate", type=float, default=0.0,
                   help="share of answers that run to max_tokens (finish_reason length, a repeated tail)")
    p.add_argument("--request-log", default="", help="append one CSV line per OCR request with the server's own times")
    p.add_argument("--stall-every-s", type=float, default=0.0, help="the engine stops every this many seconds ...")
    p.add_argument("--stall-s", type=float, default=0.0, help="... for this long (in-flight requests wait)")
    p.add_argument("--heat", action=argparse.BooleanOptionalAction, default=None,
                   help="the card heats with load and throttles past 83 C (default: the profile's; hot-24g has it)")
    p.add_argument("--cpu-workers", type=int, default=0, help="CPU preprocessing pool size (0: none)")
    p.add_argument("--cpu-ms-per-mpix", type=float, default=150.0, help="CPU ms per megapixel in that pool")
    p.add_argument("--max-side", type=int, default=0, help="resize so the longest side is at most this (px)")
    p.add_argument(
        "--answer-shape", default="text", choices=ANSWER_SHAPES, help="how answers are written (any profile)"
    )
    p.add_argument(
        "--allocator", default="free", choices=ALLOCATORS,
        help="device memory view: free (falls back per request), caching (PyTorch's high-water mark),"
        " caching-empty-cache (caching with torch.cuda.empty_cache() per request)",
    )  # fmt: skip


def _add_habit_flags(p: argparse.ArgumentParser) -> None:
    """Habits of real servers (simulator/README.md), defaults Options's: the truth records them."""
    o = Options()
    p.add_argument("--error-rate", type=float, default=o.error_rate,
                   help="share of requests answered --error-status at every load (the truth records it)")
    p.add_argument("--error-status", type=int, default=o.error_status, help="their HTTP status (default 502)")
    p.add_argument("--first-request-mib", type=float, default=o.first_request_mib,
                   help="memory the first request loads once and keeps (lazy CUDA modules, workspaces)")
    p.add_argument("--other-card-mib", type=float, default=o.other_card_mib,
                   help="another job holds this much of card 0, steady; the server's card becomes 1")
    p.add_argument("--slow-first-requests", type=int, default=o.slow_first_requests,
                   help="the first N requests take --slow-first-s more (lazy init, a first compile)")
    p.add_argument("--slow-first-s", type=float, default=o.slow_first_s, help="their extra time (s)")
    p.add_argument("--latency-drift-pct-per-min", type=float, default=o.latency_drift_pct_per_min,
                   help="engine steps grow this many %% slower per minute since start (latency creeps in a soak)")


def _add_fault_flags(p: argparse.ArgumentParser) -> None:
    """Faults (simulator.model.faults), defaults Faults's: spikes, resets, a slow start, a leak, OOMs."""
    d = Faults()
    p.add_argument("--spike-rate", type=float, default=d.spike_rate, help="fraction delayed by --spike-ms")
    p.add_argument("--spike-ms", type=float, default=d.spike_ms)
    p.add_argument("--reset-rate", type=float, default=d.reset_rate, help="fraction of connections reset")
    p.add_argument("--slow-start-s", type=float, default=d.slow_start_s, help="503 for this long after start")
    p.add_argument("--leak-mib-per-request", type=float, default=d.leak_mib_per_request,
                   help="memory each answered request leaves behind for good (MiB; a soak's creep)")
    p.add_argument("--force-oom", type=int, default=d.force_oom, help="the next N requests fail with OOM")
    p.add_argument("--restart-on-oom", action="store_true", help="an OOM takes the server down --restart-s")
    p.add_argument("--restart-s", type=float, default=d.restart_s)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    profile = get_profile(args.profile)
    if args.time_scale <= 0:
        raise UserError("--time-scale must be > 0")
    for name in ("gateway_slots", "gateway_queue", "cpu_workers", "max_side", "max_pixels"):
        if (getattr(args, name) or 0) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0")
    if args.max_body_mib <= 0 or (args.gateway_wait_s is not None and args.gateway_wait_s <= 0) or args.cpu_ms_per_mpix < 0:
        raise UserError("--max-body-mib and --gateway-wait-s must be > 0, --cpu-ms-per-mpix >= 0")
    given = {name: getattr(args, name) for name in PROFILE_DEFAULTS if getattr(args, name) is not None}
    options = make_options(
        profile,
        **given,
        **{name: getattr(args, name) for name in SETTINGS},
        cpu_workers=args.cpu_workers,
        cpu_ms_per_mpix=args.cpu_ms_per_mpix,
        max_side=args.max_side,
        time_scale=args.time_scale,
        answer_shape=args.answer_shape,
        allocator=args.allocator,
        **{name: getattr(args, name) for name in HABITS},
    )
    try:
        settle(profile, options)  # a memory utilisation that leaves no KV cache is one line now, not later
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    if options.other_card_mib > profile.total_mib:
        raise UserError(f"--other-card-mib {options.other_card_mib:g} is more than the card ({profile.total_mib:g} MiB)")
    names = [name for name in Faults.__dataclass_fields__ if name not in HABITS]  # those start from options
    try:
        faults = updated_faults(Faults(), {k: getattr(args, k) for k in names})
    except FaultError as exc:
        raise UserError(f"--{str(exc).replace('_', '-')}") from None
    return ServerConfig(
        profile=profile,
        options=options,
        faults=faults,
        seed=args.seed,
        max_body_mib=args.max_body_mib,
        max_pixels=args.max_pixels,
        metrics_token=args.metrics_token,
        request_log=args.request_log,
    )


def tls_from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """A server context from --tls-cert/--tls-key, or None (plain HTTP)."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UserError("--tls-cert and --tls-key go together: give both (PEM files) or neither")
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"cannot load --tls-cert/--tls-key ({exc}): give a PEM certificate and its key") from None
    return context


async def serve(
    config: ServerConfig, host: str, port: int, dcgm_port: int | None, tls: ssl.SSLContext | None = None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the URLs are printed: a caller may signal at once
        loop.add_signal_handler(sig, stop.set)
    try:
        server = SimServer(config)
    except ValueError as exc:  # the request log cannot be written
        raise UserError(str(exc)) from None
    try:
        bound, dcgm_bound = await server.start(host, port, dcgm_port, tls)
    except OSError as exc:
        await server.stop()
        raise UserError(
            f"cannot listen on {host}: {exc.strerror or exc}; pick another port (0 picks a free one)"
        ) from None
    scheme = "https" if tls is not None else "http"
    print(f"simulator: {scheme}://{host}:{bound}", flush=True)
    if dcgm_bound is not None:
        print(f"dcgm: {scheme}://{host}:{dcgm_bound}/metrics", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        config = config_from_args(args)
        dcgm_port = None if args.dcgm_port < 0 else args.dcgm_port
        asyncio.run(serve(config, args.host, args.port, dcgm_port, tls_from_args(args)))
    except (UserError, ProfileError) as exc:
        print(f"simulator: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0
