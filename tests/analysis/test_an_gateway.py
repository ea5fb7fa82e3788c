"""haproxy.cfg (analysis/overload/gateway.py): the recommended config's numbers in HAProxy's words, each with its comment;
several replicas; https to the server; no file without a recommendation; and Debian's `haproxy -c` accepts
every config written (`make test` installs haproxy; skipped, saying so, where it could not)."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analysis import analyze_run, load_run, write_outputs
from analysis.__main__ import main
from analysis.overload.gateway import (
    BREAKER_OPTIONS,
    GatewayError,
    Upstream,
    haproxy_config,
    parse_bind,
    parse_server,
    run_gateway,
    run_upstreams,
)
from loadtest.method.haproxy import find_haproxy
from runfolder import GATEWAY_FILE

HAPROXY = find_haproxy()
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy missing: apt-get install haproxy (make test installs it as root)"
)
CONFIG: dict[str, Any] = {
    "server": {"max_concurrency": 6, "request_timeout_s": 7, "queue": {"max_size": 12, "wait_timeout_s": 2},
               "reject_status": 503, "retry_after_s": 1},
}  # fmt: skip
COMMENTS = {
    "server.max_concurrency": "the step before the knee at 8 users",
    "server.request_timeout_s": "3 x P95 2300 ms at 6 users, rounded up",
    "server.queue.max_size": "5.80 rps x 2 s wait, rounded up: what drains within the wait timeout",
    "server.queue.wait_timeout_s": "2 x P95 2300 ms at 6 users, rounded up",
    "server.reject_status": "reject when the queue is full; never queue without bound",
    "server.retry_after_s": "about one P95 (P95 2300 ms at 6 users): when a slot frees",
}
ONE = [Upstream("127.0.0.1", 8000)]


def _note_above(text: str, directive: str) -> str:
    """The comment lines right above the first line that starts with `directive`, joined."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(directive))
    notes: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        notes.insert(0, line.strip().lstrip("# "))
    return " ".join(notes)


def _directives(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_each_number_of_the_config_is_enforced_and_says_where_it_came_from() -> None:
    text = haproxy_config(CONFIG, COMMENTS, ONE, bind="127.0.0.1:8080")
    lines = _directives(text)
    for line in ("bind 127.0.0.1:8080", "timeout queue 2s", "timeout server 7s", "timeout client 9s",
                 "timeout connect 5s", "option httpchk GET /health", "http-check expect ! rstatus ^5",
                 "server s1 127.0.0.1:8000 maxconn 6 check observe layer7 error-limit 10 on-error mark-down", "nbthread 1"):  # fmt: skip
        assert line in lines, line
    reject = next(line for line in lines if line.startswith("http-request return"))
    assert reject.startswith("http-request return status 503 ") and "hdr Retry-After 1 " in reject
    assert reject.endswith("if { queue(ocr_servers) ge 12 }")
    assert "http-after-response set-header Retry-After 1 if { status 503 } !{ res.hdr(retry-after) -m found }" in lines
    assert "balance leastconn" not in lines and "ssl" not in text.split("backend", 1)[1]
    # every number with its source: the config's key and its own comment, as recommended-config.yaml has them
    sources = {
        "timeout queue": ("2 s = server.queue.wait_timeout_s", COMMENTS["server.queue.wait_timeout_s"]),
        "timeout server": ("7 s = server.request_timeout_s", COMMENTS["server.request_timeout_s"]),
        "http-request return": ("12 waiting = server.queue.max_size 12", COMMENTS["server.queue.max_size"]),
        "http-after-response": ("Retry-After 1 = server.retry_after_s", COMMENTS["server.retry_after_s"]),
        "server s1": ("maxconn 6 = server.max_concurrency", COMMENTS["server.max_concurrency"]),
        "timeout client": ("9 s", "the queue's wait 2 s + the request timeout 7 s"),
        "timeout connect": ("5 s", "not measured, a fixed choice"),
        "bind": ("127.0.0.1:8080: GATEWAY_BIND", "default 127.0.0.1:8080"),
        "nbthread": ("one thread", "holds exactly"),
        "option httpchk": ("GET /health every 2 s", "HAProxy's default fall 3, rise 2"),
    }
    for directive, words in sources.items():
        note = _note_above(text, directive)
        for word in words:
            assert word in note, (directive, word, note)
    assert "503 at once (server.reject_status: reject when the queue is full" in _note_above(text, "http-request")
    assert max(len(line) for line in text.splitlines() if line.lstrip().startswith("#")) <= 110


def test_the_circuit_breaker_is_enforced_where_haproxy_can_and_the_rest_names_its_alert_rules() -> None:
    breaker = {"p95_ms": 3450, "gpu_temp_c": 71, "window_s": 60, "action": "reject_503"}
    text = haproxy_config({**CONFIG, "circuit_breaker": breaker}, COMMENTS, ONE)
    assert "server s1 127.0.0.1:8000 maxconn 6 check observe layer7 error-limit 10 on-error mark-down" in _directives(text)
    note = _note_above(text, "# maxconn")
    for words in ("10 requests in a row with a 5xx", "HAProxy's default error-limit", "circuit_breaker.p95_ms 3450",
                  "gpu_temp_c 71 HAProxy cannot read", "OcrLatencyP95AboveMark", "OcrGpuTemperatureAboveMark"):  # fmt: skip
        assert words in note, (words, note)
    without = haproxy_config(CONFIG, COMMENTS, ONE)  # an older run's config, without the block
    assert "error-limit 10 on-error mark-down" in without and "p95_ms" not in without


def test_a_config_without_comments_still_says_its_source() -> None:
    text = haproxy_config(CONFIG, {}, ONE)
    assert "6 = server.max_concurrency: as recommended-config.yaml has it" in _note_above(text, "server s1")


def test_several_replicas_each_get_the_measured_slots_and_share_a_queue_as_deep_as_theirs_together() -> None:
    three = [parse_server(u) for u in ("http://gpu-a:8000", "http://10.0.0.2:8000", "http://[fd00::3]:8001")]
    text = haproxy_config(CONFIG, COMMENTS, three)
    lines = _directives(text)
    breaker = "observe layer7 error-limit 10 on-error mark-down"
    assert [line for line in lines if line.startswith("server ")] == [
        f"server s1 gpu-a:8000 maxconn 6 check {breaker}", f"server s2 10.0.0.2:8000 maxconn 6 check {breaker}",
        f"server s3 [fd00::3]:8001 maxconn 6 check {breaker}"]  # fmt: skip
    assert "balance leastconn" in lines and "3 replicas" in _note_above(text, "balance")
    assert next(line for line in lines if line.startswith("http-request return")).endswith("ge 36 }")
    assert "server.queue.max_size 12 per replica x 3 replicas" in _note_above(text, "http-request")
    assert "on each replica" in _note_above(text, "server s1")


def test_https_to_the_server_checks_its_certificate_as_the_run_did() -> None:
    insecure = parse_server("https://gpu-box:8443", insecure=True)
    bundle = parse_server("https://gpu-box", ca_file="/etc/ocr/ca.pem")
    system = parse_server("https://10.0.0.5:8443")
    plain = parse_server("http://gpu-box:8000", insecure=True, ca_file="/etc/ocr/ca.pem")  # no TLS, no check
    assert (bundle.port, plain.insecure, plain.ca_file) == (443, False, "")
    lines = _directives(haproxy_config(CONFIG, COMMENTS, [insecure, bundle, system, plain]))
    assert [line.split(" check", 1)[1].removesuffix(f" {BREAKER_OPTIONS}") for line in lines if line.startswith("server ")] == [
        " ssl verify none sni str(gpu-box)",
        " ssl verify required ca-file /etc/ocr/ca.pem sni str(gpu-box) verifyhost gpu-box",
        " ssl verify required ca-file @system-ca",
        "",
    ]
    text = haproxy_config(CONFIG, COMMENTS, [insecure])
    assert "INSECURE=1" in _note_above(text, "server s1")


def _summary(**manifest_config: Any) -> dict[str, Any]:
    return {"run_id": "run-7", "recommended_level": 6, "knee": {"reason": "recommended 6: knee at level 8"},
            "config": CONFIG, "manifest": {"config": manifest_config}}  # fmt: skip


def test_the_runs_own_server_and_certificate_check_come_from_its_manifest() -> None:
    [up] = run_upstreams(_summary(host="https://gpu-box:8443", ca_bundle="/ca.pem"))
    assert up == Upstream("gpu-box", 8443, https=True, ca_file="/ca.pem")
    replicas = run_upstreams(_summary(host="https://gpu-box:8443", insecure=True), ["https://a:1", "https://b:2"])
    assert [(u.host, u.insecure) for u in replicas] == [("a", True), ("b", True)]
    [given] = run_upstreams(_summary(host="https://gpu-box", ca_bundle="/gone.pem"), ca_file="/here.pem")
    assert given.ca_file == "/here.pem"
    text = run_gateway(_summary(host="http://127.0.0.1:8000"), COMMENTS, ONE)
    assert text.startswith("# haproxy.cfg for run run-7, written by python -m analysis")
    assert "# Knee: recommended 6: knee at level 8" in text


@pytest.mark.parametrize(
    ("summary", "words"),
    [
        ({**_summary(host="http://a:1"), "recommended_level": None, "knee": {"reason": "the baseline itself failed"}},
         "no recommendation to enforce (the baseline itself failed)"),
        (_summary(), "names no server URL: give it with python -m loadtest gateway --servers"),
        (_summary(host="http://gpu-box:8000/v1"), "has a path or query (/v1)"),
    ],
)  # fmt: skip
def test_no_gateway_without_a_recommendation_or_a_server_it_can_name(summary: dict[str, Any], words: str) -> None:
    with pytest.raises(GatewayError, match=re.escape(words)) as info:
        run_upstreams(summary)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [("ftp://gpu-box:21", "is not http:// or https://"), ("gpu-box:8000", "is not http:// or https://"),
     ("http://gpu-box:8000/ocr", "has a path"), ("http://gpu-box:8000/?a=1", "has a path or query"),
     ("http://user:pw@gpu-box:8000", "carries credentials"), ("http://:8000", "no host name"),
     ("http://gpu box:8000", "no host name"), ("http://gpu-box:99999", "not 1-65535"),
     ("http://gpu-box:0", "port 0")],
)  # fmt: skip
def test_a_server_url_a_server_line_cannot_express_is_one_line_naming_the_fix(url: str, words: str) -> None:
    with pytest.raises(GatewayError, match=re.escape(words)) as info:
        parse_server(url)
    assert "--servers http://gpu-box:8000" in str(info.value) and "\n" not in str(info.value)


def test_server_urls_a_server_line_can_express() -> None:
    assert parse_server("http://gpu-box").address == "gpu-box:80"
    assert parse_server(" http://[::1]:8000/ ").address == "[::1]:8000"
    assert parse_server("https://10.0.0.5").url == "https://10.0.0.5:443"


@pytest.mark.parametrize("text", ["8080", "gpu-box:", "gpu-box:0", "gpu-box:70000", ":8080", "a b:80", "::1:80",
                                  "[gpu-box]:80", "127.0.0.1:80x"])  # fmt: skip
def test_a_bind_that_is_not_host_port_is_one_line(text: str) -> None:
    with pytest.raises(GatewayError, match="HOST:PORT|1-65535") as info:
        parse_bind(text)
    assert "--bind 127.0.0.1:8080" in str(info.value)


def test_binds_that_are_host_port() -> None:
    assert parse_bind("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_bind("[::1]:8080") == ("::1", 8080)
    assert parse_bind("0.0.0.0:80") == ("0.0.0.0", 80) and parse_bind("gw.local:1") == ("gw.local", 1)
    assert "bind [::1]:8080" in haproxy_config(CONFIG, COMMENTS, ONE, bind="[::1]:8080")


def test_the_run_folder_gets_haproxy_cfg_beside_its_config(make_run: Callable[..., Path]) -> None:
    path = make_run(extra_manifest={"config": {"host": "http://127.0.0.1:8000"}})
    summary = write_outputs(path)
    text = (path / GATEWAY_FILE).read_text()
    level = summary["recommended_level"]
    config = summary["config"]["server"]
    assert f"server s1 127.0.0.1:8000 maxconn {level} check" in text
    assert f"ge {config['queue']['max_size']} }}" in text and f"timeout queue {config['queue']['wait_timeout_s']}s" in text
    assert f"the step before the knee at {summary['knee']['knee_level']} users" in _note_above(text, "server s1")
    result = analyze_run(load_run(path))
    assert text == run_gateway(result.summary, result.config_comments, [Upstream("127.0.0.1", 8000)])


def test_no_recommendation_no_file_and_the_cli_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "levels": [1, 2],
                                                         "config": {"host": "http://127.0.0.1:8000"}}))  # fmt: skip
    (tmp_path / GATEWAY_FILE).write_text("# an older analysis's\n")
    assert main([str(tmp_path)]) == 0
    assert not (tmp_path / GATEWAY_FILE).exists()  # the older one was another analysis's: removed
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("no haproxy.cfg: no recommendation to enforce (") and "placeholder" in out[-1]


def test_the_cli_names_the_file_it_wrote(make_run: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make_run(extra_manifest={"config": {"host": "http://127.0.0.1:8000"}})
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {path}/{GATEWAY_FILE}"


def test_a_ca_bundle_gone_from_this_machine_writes_no_file(make_run: Callable[..., Path], tmp_path: Path) -> None:
    path = make_run(extra_manifest={"config": {"host": "https://gpu-box:8443", "ca_bundle": str(tmp_path / "gone.pem")}})
    write_outputs(path)
    assert not (path / GATEWAY_FILE).exists()


def _checked(text: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    assert HAPROXY is not None
    path = tmp_path / name
    path.write_text(text)
    return subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False)


@needs_haproxy
def test_haproxy_accepts_every_config_written(make_run: Callable[..., Path], tmp_path: Path) -> None:
    ca = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    https = [parse_server("https://127.0.0.1:8443", insecure=True)]
    if Path(ca).is_file():
        https.append(parse_server("https://localhost:8444", ca_file=ca))
    configs = {
        "one.cfg": haproxy_config(CONFIG, COMMENTS, ONE),
        "replicas.cfg": haproxy_config(CONFIG, COMMENTS, [parse_server(u) for u in (
            "http://127.0.0.1:8000", "http://localhost:8001", "http://[::1]:8002")], bind="[::1]:18080"),  # fmt: skip
        "https.cfg": haproxy_config(CONFIG, COMMENTS, https, bind="0.0.0.0:18081", health_path="/v1/models"),
        "no-comments.cfg": haproxy_config(CONFIG, {}, ONE),
        "breaker.cfg": haproxy_config({**CONFIG, "circuit_breaker": {"p95_ms": 10, "gpu_temp_c": None}}, {}, ONE),
    }
    path = make_run(extra_manifest={"config": {"host": "http://127.0.0.1:8000"}})
    write_outputs(path)
    configs["run.cfg"] = (path / GATEWAY_FILE).read_text()
    for name, text in configs.items():
        checked = _checked(text, tmp_path, name)
        assert checked.returncode == 0, (name, checked.stdout + checked.stderr)
        assert "[WARNING]" not in checked.stdout + checked.stderr, (name, checked.stderr)
