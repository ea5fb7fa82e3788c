"""The sidecar's API over HTTPS (a certificate made at test time) and the client's one-line refusals.

A real sidecar server (gpu_sampler.sidecar.make_server, a fake GPU) in a thread of this process on
127.0.0.1; the client verifies its certificate as every request of the suite does.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_sampler import FakeGpuReader, GpuMonitor, SamplerError, SidecarClient
from gpu_sampler.__main__ import main as sampler_main
from gpu_sampler.sidecar import Sidecar, make_server
from gpu_sampler.tls import TlsSettings, server_context

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from it_certs import CertFiles, make_self_signed  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertFiles, CertFiles]:
    folder = tmp_path_factory.mktemp("certs")
    return make_self_signed(folder, "sidecar"), make_self_signed(folder, "other")


@pytest.fixture
def https_sidecar(certs: tuple[CertFiles, CertFiles]) -> Iterator[str]:
    own, _other = certs
    sidecar = Sidecar(FakeGpuReader(), interval_s=0.05)
    server = make_server(sidecar, "127.0.0.1", 0, "tok", server_context(str(own.cert), str(own.key)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    sidecar.start()
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        sidecar.stop()


def test_the_client_verifies_the_sidecars_certificate(https_sidecar, certs):
    own, other = certs
    for tls in (TlsSettings(), TlsSettings(ca_pem=other.cert.read_text())):
        with pytest.raises(SamplerError) as refused:
            SidecarClient(https_sidecar, token="tok", tls=tls).health()
        line = str(refused.value)
        assert "certificate" in line and "CA_BUNDLE=" in line and "INSECURE=1" in line and "\n" not in line

    # a client speaking plain HTTP to the TLS port: one line, and the sidecar goes on serving
    with pytest.raises(SamplerError, match="unreachable|TLS"):
        SidecarClient(https_sidecar.replace("https://", "http://"), token="tok").health()
    # one that connects and says nothing holds only its own thread, not the others' calls
    with socket.create_connection(("127.0.0.1", int(https_sidecar.rsplit(":", 1)[1]))):
        for tls in (TlsSettings(ca_pem=own.cert.read_text()), TlsSettings(insecure=True)):
            assert SidecarClient(https_sidecar, token="tok", tls=tls, timeout_s=5).health()["ok"]

    monitor = GpuMonitor(f"sidecar:{https_sidecar}", token="tok", tls=TlsSettings(ca_pem=own.cert.read_text()))
    monitor.check()
    assert monitor.info()["available"] is True


def test_sidecar_tls_flags_are_checked_in_one_line(certs, capsys):
    own, _other = certs
    cases = {
        ("--tls-cert", str(own.cert)): "--tls-cert and --tls-key go together",
        ("--tls-cert", str(own.cert), "--tls-key", str(own.cert)): "cannot load --tls-cert",
        ("--ca-bundle", str(own.key)): "--ca-bundle",
        ("--insecure", "--ca-bundle", str(own.cert)): "give one",
        ("--metrics-headers", "Bearer s3cret-value"): "bad --metrics-headers",
    }
    for flags, words in cases.items():
        assert sampler_main(["serve", "--source", "fake", "--port", "0", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, (flags, err)
        assert "s3cret-value" not in err
