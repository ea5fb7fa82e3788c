"""TLS alike everywhere and a token-protected /metrics, against one simulator serving HTTPS with a
self-signed certificate made at test time (tests/integration/it_certs.py) and `--metrics-token`.

- the pre-flight refuses the certificate in one line naming CA_BUNDLE and INSECURE (not "nothing
  answers"), with no CA bundle and with a wrong one; passes with the right one and with --insecure;
- a scrape of /metrics or the DCGM page without the bearer is one line naming METRICS_HEADERS;
- the load itself verifies: OcrUser with the system's store fails every request on the certificate,
  with the CA bundle or INSECURE it is served (Locust's FastHttpUser alone skips the check);
- the sidecar serves HTTPS and scrapes HTTPS pages behind the bearer;
- a short real run over HTTPS, the CA bundle given, HEADERS kept off Locust's channel
  (--headers-from-workers) and used as the metrics headers by default: rows ok, server.csv and gpu.csv
  filled through the token, the token in no file of the run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from it_certs import CertFiles, make_self_signed
from it_procs import Simulator, spawn_cli, start_simulator, stop

from analysis import load_run
from gpu_sampler import SamplerError, SidecarClient
from gpu_sampler.tls import TlsSettings
from loadtest.commands import main as cli
from loadtest.launch.preflight import PreflightError, check_first_answer
from loadtest.launch.run import preflight
from loadtest.settings.run_config import RunConfig, with_ca_pem
from loadtest.traffic.payloads import build_payloads

TOKEN = "metrics-s3cret-5e6f7a8b"
PROBE = Path(__file__).resolve().parents[1] / "loadtest" / "lt_user_probe.py"


@dataclasses.dataclass(frozen=True)
class TlsSim:
    sim: Simulator
    cert: CertFiles  # the server's own: as a CA bundle it trusts exactly this server
    wrong: CertFiles  # another self-signed certificate: a CA bundle that does not


@pytest.fixture(scope="module")
def tls_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSim]:
    folder = tmp_path_factory.mktemp("certs")
    cert, wrong = make_self_signed(folder, "server"), make_self_signed(folder, "wrong")
    sim = start_simulator(
        "--time-scale", "0.05", "--tls-cert", str(cert.cert), "--tls-key", str(cert.key), "--metrics-token", TOKEN
    )
    try:
        yield TlsSim(sim, cert, wrong)
    finally:
        stop(sim.proc)


def _cfg(t: TlsSim, **fields: Any) -> RunConfig:
    return with_ca_pem(RunConfig(host=t.sim.url, levels="1", **fields)).checked()


def test_the_preflight_refuses_a_certificate_it_cannot_verify_in_one_line(tls_sim, tmp_path, capsys):
    for extra in ([], ["--ca-bundle", str(tls_sim.wrong.cert)]):
        code = cli.main(["run", "--host", tls_sim.sim.url, "--levels", "1", "--out", str(tmp_path), *extra])
        err = capsys.readouterr().err
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "certificate" in lines[0] and "CA_BUNDLE=" in lines[0] and "INSECURE=1" in lines[0], err
        assert "nothing answers" not in lines[0]
    assert not any(tmp_path.iterdir()), "no run folder before the checks pass"

    # HOST=http://... on the TLS port: the server closes the connection; the line says to use https://
    plain = RunConfig(host=tls_sim.sim.url.replace("https://", "http://"))
    ticks = iter(range(0, 1000, 10))  # a clock past the retry window at once
    enc = build_payloads(plain).encoded
    with pytest.raises(PreflightError, match=r"set HOST=https://127\.0\.0\.1:\d+$"):
        check_first_answer(plain, next(iter(enc.values())), sleep=lambda _s: None, clock=lambda: next(ticks))


def test_the_preflight_passes_with_the_ca_bundle_or_insecure_and_scrapes_need_the_bearer(tls_sim):
    metrics = {"server_metrics": tls_sim.sim.url + "/metrics", "gpu": f"dcgm:{tls_sim.sim.dcgm_url}"}
    bearer = f"Authorization: Bearer {TOKEN}"
    for trust in ({"ca_bundle": str(tls_sim.cert.cert)}, {"insecure": True}):
        answer_check, _idle = preflight(_cfg(tls_sim, metrics_headers=bearer, **trust, **metrics))
        assert answer_check["enabled"] is True
    # HEADERS stand for METRICS_HEADERS when those are not given (one auth proxy for both)
    preflight(_cfg(tls_sim, headers=bearer, insecure=True, **metrics))

    for headers in ("", "Authorization: Bearer wrong-0123"):
        with pytest.raises(SamplerError) as refused:
            preflight(_cfg(tls_sim, metrics_headers=headers, insecure=True, **metrics))
        line = str(refused.value)
        assert "401" in line and "METRICS_HEADERS=" in line and "\n" not in line, line
        assert "wrong-0123" not in line, "a header value is never shown"


def _probes(t: TlsSim, trusts: dict[str, list[str]]) -> dict[str, list[dict[str, Any]]]:
    """OcrUser under a Locust LocalRunner for a second per trust setting, side by side
    (tests/loadtest/lt_user_probe.py); the rows of requests that ended on their own (the probe's quit
    cuts the one in flight)."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(PROBE), t.sim.url, "1", "1", *fields],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for name, fields in trusts.items()
    }
    rows = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        rows[name] = [r for r in result["rows"] if r["failure_kind"] != "cut"]
    return rows


def test_the_load_verifies_certificates_as_the_preflight_does(tls_sim):
    rows = _probes(
        tls_sim,
        {
            "system store": [],  # Locust's FastHttpUser alone would skip the check and be served
            "wrong CA": [f"ca_bundle_pem={tls_sim.wrong.cert.read_text()}"],
            "its CA": [f"ca_bundle_pem={tls_sim.cert.cert.read_text()}"],
            "insecure": ["insecure=1"],
        },
    )
    for name in ("system store", "wrong CA"):
        assert len(rows[name]) >= 3 and not any(r["ok"] for r in rows[name]), name
        assert {r["failure_kind"] for r in rows[name]} == {"connection"}
        assert all("CERTIFICATE_VERIFY_FAILED" in r["error_text"] for r in rows[name]), rows[name][0]
    for name in ("its CA", "insecure"):
        assert len(rows[name]) >= 3 and all(r["ok"] for r in rows[name]), (name, rows[name][:1])


@pytest.mark.slow  # make test runs a whole method over HTTPS with the token across hosts: tests/multihost
@pytest.mark.timeout(150)
def test_a_run_over_https_records_rows_and_token_protected_metrics(tls_sim, tmp_path):
    args = [
        "run", "--host", tls_sim.sim.url, "--ca-bundle", str(tls_sim.cert.cert), "--headers-from-workers",
        "--server-metrics", tls_sim.sim.url + "/metrics", "--gpu", f"dcgm:{tls_sim.sim.dcgm_url}",
        "--levels", "1", "--workers", "1", "--step-s", "1", "--idle-s", "1", "--warmup-s", "0",
        "--cooldown-s", "1", "--cooldown-min-s", "0.5", "--baseline-rounds", "1",
        "--baseline-round-requests", "3", "--min-step-requests", "3", "--refine", "false",
        "--verify", "false",  # the verify window's overload is answered 503 on purpose: TLS is the point here
        "--out", str(tmp_path),
    ]  # fmt: skip
    proc = spawn_cli(args, env={"OCRCAP_HEADERS": f"Authorization: Bearer {TOKEN}"})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]

    requests = load_run(run_dir).requests
    assert len(requests) > 20 and requests["ok"].all(), requests["error_text"].dropna().head()
    for name in ("server.csv", "gpu.csv"):  # /metrics and DCGM, both behind the bearer
        assert len((run_dir / name).read_text().splitlines()) > 5, name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["headers"] == "Authorization: ***"
    assert manifest["config"]["ca_bundle_pem"].startswith("sha256:")
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        assert TOKEN.encode() not in path.read_bytes(), path
        assert b"BEGIN CERTIFICATE" not in path.read_bytes(), path


def test_the_sidecar_serves_https_and_scrapes_through_tls_and_the_bearer(tls_sim):
    """`python -m gpu_sampler serve` on HTTPS, reading the simulator's DCGM page and /metrics (HTTPS,
    behind the bearer) with the CA bundle and OCRCAP_METRICS_HEADERS from its environment."""
    cert = str(tls_sim.cert.cert)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpu_sampler", "serve", "--port", "0", "--interval-s", "0.1",
            "--scrape-interval-s", "0.1", "--tls-cert", cert, "--tls-key", str(tls_sim.cert.key),
            "--source", f"dcgm:{tls_sim.sim.dcgm_url}", "--server-metrics", tls_sim.sim.url + "/metrics",
            "--ca-bundle", cert,
        ],
        env={**os.environ, "OCRCAP_METRICS_HEADERS": f"Authorization: Bearer {TOKEN}"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sampler: https://127.0.0.1:"), line
        client = SidecarClient(line.split()[1], tls=TlsSettings(ca_pem=tls_sim.cert.cert.read_text()))
        deadline = time.monotonic() + 20
        page = client.samples_since(0)
        while not (page.gpu and page.server) and time.monotonic() < deadline:
            time.sleep(0.1)
            page = client.samples_since(0)
        assert page.gpu and all(s.source == "dcgm" for s in page.gpu), client.health()
        assert page.server, client.health()
        assert not client.health()["failures"], "no scrape was refused"
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
