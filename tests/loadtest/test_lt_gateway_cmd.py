"""`python -m loadtest gateway`: bad input is one line naming the fix, exit status 2, nothing written or
started; which file a call writes. In-process on the command's own function (no SIGTERM handler installed in
pytest); the real haproxy in front of a real server is tests/integration/test_it_gateway.py."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.commands import gateway
from loadtest.commands.main import build_parser
from loadtest.launch.procs import free_port
from loadtest.method.haproxy import find_haproxy
from runfolder import GATEWAY_FILE, GATEWAY_VARIANT_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

needs_haproxy = pytest.mark.skipif(
    find_haproxy() is None, reason="haproxy missing: apt-get install haproxy (make test installs it as root)"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with a recommendation (knee at 3, 2 recommended), its server on a loopback port nobody serves."""
    return synth_run(tmp_path_factory.mktemp("gw") / "run-1", levels=(1, 2, 3, 4), true_knee=2, step_s=10.0,
                     extra_manifest={"config": {"host": "http://127.0.0.1:9"}})  # fmt: skip


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def _gateway(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The command's exit status and its one line of stderr."""
    ns = build_parser().parse_args(["gateway", *argv])
    code = gateway.cmd_gateway(ns)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return code, err


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@needs_haproxy
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--bind", "8080"], "bind '8080' is not HOST:PORT: give HOST:PORT, e.g. --bind 127.0.0.1:8080"),
        (["--bind", "127.0.0.1:0"], "has a port that is not 1-65535"),
        (["--bind", "127.0.0.1:8080", "--servers", "http://gpu-a:8000/v1"], "has a path or query (/v1)"),
        (["--servers", "ftp://gpu-a:21"], "is not http:// or https://"),
        (["--servers", " , "], "names no server"),
        (["--health", "health"], "is not a plain URL path: give one such as --health /health"),
        (["--bind", "192.0.2.1:18080"], "the address is not this machine's"),
    ],
)
def test_bad_flags_are_one_line_before_the_run_is_read(
    run_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    before = _files(run_dir)
    bind = [] if "--bind" in argv else ["--bind", f"127.0.0.1:{free_port()}"]  # 8080 may be taken here
    code, err = _gateway(capsys, "--run", str(run_dir), *bind, *argv)
    assert code == 2 and err.startswith("error: ") and words in err, err
    assert _files(run_dir) == before


@needs_haproxy
def test_a_port_in_use_is_one_line(run_dir: Path, held_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _gateway(capsys, "--run", str(run_dir), "--bind", f"127.0.0.1:{held_port}")
    assert code == 2 and f"cannot listen on 127.0.0.1:{held_port}" in err and "give a free one with --bind" in err


@needs_haproxy
def test_run_folders_that_cannot_give_a_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    free = f"127.0.0.1:{free_port()}"
    code, err = _gateway(capsys, "--run", str(tmp_path / "nope"), "--bind", free)
    assert code == 2 and "no run folder at" in err
    stopped = tmp_path / "stopped"  # a run that ended before any request: no recommendation
    stopped.mkdir()
    (stopped / "manifest.json").write_text(json.dumps({"schema_version": 1, "levels": [1, 2],
                                                       "config": {"host": "http://127.0.0.1:9"}}))  # fmt: skip
    code, err = _gateway(capsys, "--run", str(stopped), "--bind", free)
    assert code == 2 and "no recommendation to enforce (" in err and not (stopped / GATEWAY_VARIANT_FILE).exists()
    sweep = tmp_path / "sweep-1"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    code, err = _gateway(capsys, "--run", str(sweep), "--bind", free)
    assert code == 2 and "is a sweep folder: pass its picked setting's run folder" in err


@needs_haproxy
def test_a_ca_bundle_gone_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = synth_run(tmp_path / "tls", levels=(1, 2, 3, 4), true_knee=2, step_s=10.0,
                    extra_manifest={"config": {"host": "https://127.0.0.1:9", "ca_bundle": str(tmp_path / "gone.pem")}})  # fmt: skip
    code, err = _gateway(capsys, "--run", str(run), "--bind", f"127.0.0.1:{free_port()}")
    assert code == 2 and "gone.pem, is not on this machine" in err and "--ca-bundle FILE" in err


def test_haproxy_missing_names_the_package(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("loadtest.method.haproxy.HAPROXY_DIRS", ())  # the one finder of haproxy
    code, err = _gateway(capsys, "--run", str(run_dir))
    assert code == 2 and err == (
        "error: haproxy is not installed: apt-get install haproxy (Debian's package), then run this again"
    )


def test_the_runs_own_file_without_flags_a_variant_with_them(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def config(*argv: str) -> tuple[str, Path]:
        text, path, _ups, _bind = gateway._config(build_parser().parse_args(["gateway", "--run", str(run_dir), *argv]))
        return text, path

    port = free_port()
    text, path = config("--bind", f"127.0.0.1:{port}")
    assert path == run_dir / GATEWAY_VARIANT_FILE and f"bind 127.0.0.1:{port}" in text
    text, path = config("--bind", f"127.0.0.1:{port}", "--servers", "http://127.0.0.1:9001,http://127.0.0.1:9002")
    assert path.name == GATEWAY_VARIANT_FILE and "balance leastconn" in text and "server s2 127.0.0.1:9002" in text
    assert "written by python -m loadtest gateway" in text
    # no flags: the run's own haproxy.cfg, as the analysis writes it (its default bind moved to a free port,
    # since 127.0.0.1:8080 may be taken on this machine)
    monkeypatch.setattr(gateway, "DEFAULT_BIND", f"127.0.0.1:{port}")
    text, path = config()
    assert path == run_dir / GATEWAY_FILE and "written by python -m analysis" in text
    assert "server s1 127.0.0.1:9 maxconn 2 check" in text


@needs_haproxy
def test_a_config_haproxy_refuses_is_one_line_and_replaces_nothing(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(run_dir)
    code, err = _gateway(capsys, "--run", str(run_dir), "--bind", f"127.0.0.1:{free_port()}",
                         "--servers", "http://no-such-host.invalid:8000")  # fmt: skip
    assert code == 2 and err.startswith("error: haproxy -c refused the gateway's config: ")
    assert "could not resolve address 'no-such-host.invalid'" in err and "give its address in --servers" in err
    assert _files(run_dir) == before  # neither the variant nor a temporary file left
