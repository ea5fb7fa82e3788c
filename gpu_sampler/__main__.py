"""`python -m gpu_sampler serve`: the sidecar on the GPU machine (see gpu_sampler.sidecar for the API).

A user error (bad flag, no driver, off-loopback bind without a token) ends in one line and exit code 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import ssl
import sys
import threading
from types import FrameType

from gpu_sampler.errors import SamplerError
from gpu_sampler.readers import NO_DRIVER, HostReader, NvmlReader, ServerMetricsReader
from gpu_sampler.server_control import ServerControl, ServerControlError
from gpu_sampler.sidecar import Sidecar, build_gpu_reader, make_server, serve_until
from gpu_sampler.tls import CaBundleError, TlsSettings, read_ca_bundle, server_context

TOKEN_ENV = "GPU_SAMPLER_TOKEN"
METRICS_HEADERS_ENV = "OCRCAP_METRICS_HEADERS"
# Without NVML the sidecar can still serve the card of a DCGM exporter on this machine: that comes first.
SIDECAR_NO_DRIVER = (
    "no NVIDIA driver on this machine (NVML library not found): serve a DCGM exporter's card with"
    " --source dcgm:http://127.0.0.1:9400/metrics, or run the sidecar on the GPU machine (--source fake: a demo)"
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpu_sampler", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="sample the GPU and serve the samples over HTTP")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=9410, help="port (default 9410, beside a DCGM exporter on 9400; 0 picks a free one)")
    serve.add_argument("--source", default="nvml", help="nvml[:0 | :0,1 | :GPU-<uuid> | :MIG-<uuid>] | dcgm:URL[#0] | fake (default nvml: every GPU)")
    serve.add_argument("--interval-s", type=float, default=0.05, help="GPU sampling interval (default 0.05)")
    serve.add_argument("--scrape-interval-s", type=float, default=0.5, help="host/server metrics interval")
    serve.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (or ${TOKEN_ENV})")
    serve.add_argument("--server-metrics", default=None, help="the OCR server's /metrics URL, scraped here")
    serve.add_argument("--framework-metric", default="", help="gauge on --server-metrics with the framework's peak memory (torch.cuda.max_memory_allocated(); _bytes names read as bytes); empty: ocr_framework_peak_bytes when present")
    serve.add_argument("--pid", type=int, default=None, help="the server's PID: its GPU memory (children included) apart from other processes'")
    serve.add_argument("--ring-size", type=int, default=100_000, help="samples kept (default 100000, ~25 MB)")
    serve.add_argument("--tls-cert", default="", help="serve HTTPS with this certificate (PEM; with --tls-key)")
    serve.add_argument("--tls-key", default="", help="the private key of --tls-cert (PEM)")
    serve.add_argument("--insecure", action="store_true", help="do not verify the certificates of --source dcgm:https://... and --server-metrics https://...")
    serve.add_argument("--ca-bundle", default="", help="PEM file of the CAs to trust for those URLs (default: the system's)")
    serve.add_argument("--metrics-headers", default=os.environ.get(METRICS_HEADERS_ENV, ""), help=f"headers sent with those scrapes, 'Authorization: Bearer abc' (secret: prefer ${METRICS_HEADERS_ENV})")
    serve.add_argument("--server-cmd", default="", help="control the server: its command with {placeholders}, run without a shell, e.g. 'vllm serve MODEL --max-num-seqs {max_num_seqs}'; POST /server/restart starts it with values for them")
    serve.add_argument("--server-health", default="", help="with --server-cmd: the URL that answers 200 once the server is ready (e.g. http://127.0.0.1:8000/health)")
    serve.add_argument("--server-start-timeout-s", type=float, default=600.0, help="with --server-cmd: longest wait for that 200 (default 600)")
    serve.add_argument("--server-grace-s", type=float, default=10.0, help="with --server-cmd: SIGTERM, then SIGKILL after this (default 10)")
    serve.add_argument("--log-level", default="WARNING")
    return parser.parse_args(argv)


def client_tls(args: argparse.Namespace) -> TlsSettings:
    if args.insecure and args.ca_bundle:
        raise SamplerError("--insecure turns certificate checks off, --ca-bundle names what to trust: give one")
    try:
        return TlsSettings(insecure=args.insecure, ca_pem=read_ca_bundle(args.ca_bundle) if args.ca_bundle else "")
    except CaBundleError as err:
        raise SamplerError(str(err).replace("CA_BUNDLE=", "--ca-bundle ")) from None


def server_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SamplerError("--tls-cert and --tls-key go together: give both (PEM files) or neither")
    if not args.tls_cert:
        return None
    try:
        return server_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as err:
        raise SamplerError(
            f"cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key} ({err}): give a PEM certificate and its key"
        ) from None


def parse_header_text(text: str) -> dict[str, str]:
    """'A: 1; B: two' -> {'A': '1', 'B': 'two'}; the same form as the driver's HEADERS."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition(":")
        if not sep or not name.strip():
            raise SamplerError("bad --metrics-headers: an entry has no 'Name:' (its value is not shown): write 'Name: value; Other: value'")
        out[name.strip()] = value.strip()
    return out


def server_control(args: argparse.Namespace, tls: TlsSettings) -> ServerControl | None:
    if not args.server_cmd:
        if args.server_health:
            raise SamplerError("--server-health goes with --server-cmd: give the server's command too")
        return None
    if not args.server_health:
        raise SamplerError("--server-cmd needs --server-health URL: the URL that answers 200 once the server is ready")
    try:
        return ServerControl(
            args.server_cmd,
            args.server_health,
            start_timeout_s=args.server_start_timeout_s,
            grace_s=args.server_grace_s,
            tls=tls,
        )
    except ServerControlError as err:
        raise SamplerError(str(err)) from None


def build(args: argparse.Namespace) -> Sidecar:
    if not is_loopback(args.host) and not args.token:
        raise SamplerError(
            f"refusing to bind {args.host} without a token: add --token T (or set ${TOKEN_ENV}; the run sends it"
            " as OCRCAP_GPU_TOKEN), or bind 127.0.0.1"
        )
    if not args.interval_s > 0 or not args.scrape_interval_s > 0:
        raise SamplerError("--interval-s and --scrape-interval-s must be > 0: e.g. --interval-s 0.05")
    if args.server_metrics and not args.server_metrics.startswith(("http://", "https://")):
        raise SamplerError(f"bad --server-metrics {args.server_metrics!r}: use http://HOST:PORT/metrics")
    holder: list[Sidecar] = []
    tls, headers = client_tls(args), parse_header_text(args.metrics_headers)
    control = server_control(args, tls)
    step_of = lambda: holder[0].step_index if holder else -1  # noqa: E731
    reader = build_gpu_reader(args.source, step_of, args.pid, headers=headers, tls=tls)
    if isinstance(reader, NvmlReader):
        try:
            reader.check()
        except SamplerError as err:
            if str(err) == NO_DRIVER:
                raise SamplerError(SIDECAR_NO_DRIVER) from None
            raise
    sidecar = Sidecar(
        reader,
        interval_s=args.interval_s,
        server_reader=ServerMetricsReader(
            args.server_metrics, framework_metric=args.framework_metric, headers=headers, tls=tls
        )
        if args.server_metrics
        else None,
        host_reader=HostReader("gpu"),
        scrape_interval_s=args.scrape_interval_s,
        ring_size=args.ring_size,
        server_control=control,
        follow_server_pid=args.pid is None,
    )
    holder.append(sidecar)
    return sidecar


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        sidecar = build(args)
        server = make_server(sidecar, args.host, args.port, args.token, server_tls(args))
    except SamplerError as err:
        print(f"sampler: {err}", file=sys.stderr, flush=True)
        return 2
    except OSError as err:
        print(
            f"sampler: cannot bind {args.host}:{args.port} ({err.strerror}): pick another --port",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)  # a closed terminal too: the controlled server goes with us
    host, port = str(server.server_address[0]), server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if args.tls_cert else "http"
    print(f"sampler: {scheme}://{shown}:{port}", flush=True)
    serve_until(server, sidecar, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
