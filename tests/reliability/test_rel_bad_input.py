"""Bad input ends before any load in ONE line on stderr that names the problem, with exit status 2.

LEVELS, HOST, STYLE, images (empty folder, zero-byte file, not an image, decompression bomb), the GPU
source spec, and a missing or corrupt run folder given to `python -m reports` (what `make report` runs).
Each case is a real CLI process; no run folder is left behind by a run that never started. An answer
whose text is merely poor is not bad input: the run goes on with one warning line (the last test).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from rel_procs import REPO, ScriptedServer, ok_answer, one_line, run_argv

from analysis.table.loader import load_run
from loadtest.launch.procs import free_port


def _cli(args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    """An OCR server that always answers well: only the input under test can be wrong."""
    srv = ScriptedServer(lambda _n: ok_answer())
    try:
        yield srv
    finally:
        srv.close()


def _run(host: str, out: Path, *extra: str) -> list[str]:
    """`python -m loadtest run` against `host` into `out`, then `extra`."""
    return ["loadtest", "run", "--host", host, "--out", str(out), *extra]


def _expect_one_line(args: list[str], out: Path, *needles: str, within_s: float = 30) -> str:
    t0 = time.monotonic()
    res = _cli(args)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    line = one_line(res.stderr)
    for needle in needles:
        assert needle in line, line
    assert time.monotonic() - t0 < within_s
    assert not out.exists() or not any(out.iterdir()), "no run folder for a run that never started"
    return line


@pytest.mark.parametrize(
    ("levels", "needle"),
    [
        ("abc", "LEVELS"),
        ("0", "LEVELS"),
        ("-4", "LEVELS"),
        ("1.5", "LEVELS"),
        ("2,x,8", "LEVELS"),
        (",", "LEVELS"),
    ],
)
def test_bad_levels(levels, needle, server, tmp_path):
    out = tmp_path / "results"
    _expect_one_line(_run(server.url, out, "--levels", levels), out, needle)


@pytest.mark.parametrize(
    ("host", "needles"),
    [
        ("gpu-box:8000", ("HOST", "http://")),
        ("ftp://127.0.0.1:21", ("HOST",)),
        ("", ("HOST",)),
        ("127.0.0.1", ("HOST",)),
    ],
)
def test_bad_host(host, needles, tmp_path):
    out = tmp_path / "results"
    _expect_one_line(_run(host, out), out, *needles)


def test_a_server_slower_than_the_request_timeout(procs, tmp_path):
    def slow(_n: int):  # type: ignore[no-untyped-def]
        time.sleep(3.0)
        return ok_answer()

    srv = procs.server(slow)
    out = tmp_path / "results"
    _expect_one_line(_run(srv.url, out, "--request-timeout-s", "1"), out, "REQUEST_TIMEOUT_S", within_s=15)


def test_unknown_style(server, tmp_path):
    out = tmp_path / "results"
    _expect_one_line(_run(server.url, out, "--style", "grpc"), out, "STYLE", "multipart")


def test_a_style_the_server_does_not_speak(procs, tmp_path):
    html = procs.server(lambda _n: (200, {"Content-Type": "text/html"}, b"<html><body>Welcome</body></html>"))
    out = tmp_path / "results"
    _expect_one_line(_run(html.url, out, "--style", "openai"), out, "openai answer", "ENDPOINT")


def test_an_endpoint_that_does_not_exist(procs, tmp_path):
    missing = procs.server(lambda _n: (404, {}, b'{"detail": "Not Found"}'))
    out = tmp_path / "results"
    _expect_one_line(_run(missing.url, out), out, "404", "ENDPOINT")


def _bomb_png(path: Path, side_px: int = 60_000) -> None:
    """A tiny PNG whose header claims side x side pixels (3.6 gigapixels): never to be decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side_px, side_px, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def _good_png(path: Path) -> None:
    Image.new("L", (320, 200), 255).save(path)


@pytest.mark.parametrize(
    "case", ["empty folder", "zero-byte", "not an image", "decompression bomb", "missing folder"]
)
def test_bad_image_folders(case, server, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    if case != "empty folder":
        _good_png(folder / "good.png")
    if case == "zero-byte":
        (folder / "empty.png").write_bytes(b"")
        needles: tuple[str, ...] = ("empty.png", "0 bytes")
    elif case == "not an image":
        (folder / "notes.png").write_text("this is not an image\n")
        needles = ("notes.png",)
    elif case == "decompression bomb":
        _bomb_png(folder / "bomb.png")
        needles = ("bomb.png",)
    elif case == "missing folder":
        folder = tmp_path / "nope"
        needles = (str(folder), "does not exist")
    else:
        needles = (str(folder),)
    out = tmp_path / "results"
    t0 = time.monotonic()
    _expect_one_line(_run(server.url, out, "--scenario", "folder", "--images", str(folder)), out, *needles)
    assert time.monotonic() - t0 < 20, "a bomb is refused from its header, not decoded"


def test_a_single_image_that_is_a_decompression_bomb(server, tmp_path):
    bomb = tmp_path / "bomb.png"
    _bomb_png(bomb)
    out = tmp_path / "results"
    _expect_one_line(_run(server.url, out, "--scenario", "folder", "--images", str(bomb)), out, "bomb.png")


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("nvidia", ("GPU",)),
        ("sidecar:", ("GPU",)),
        ("dcgm:localhost:9400", ("GPU",)),
        ("sidecar:http://127.0.0.1:{closed}", ("127.0.0.1:{closed}",)),
        ("dcgm:http://127.0.0.1:{closed}/metrics", ("127.0.0.1:{closed}",)),
        ("dcgm:{server}/metrics", ("metrics",)),
    ],
)
def test_bad_gpu_source(spec, needles, server, tmp_path):
    closed = str(free_port())
    fill = {"closed": closed, "server": server.url}
    out = tmp_path / "results"
    _expect_one_line(
        _run(server.url, out, "--gpu", spec.format(**fill)), out, *(n.format(**fill) for n in needles)
    )


def test_a_sidecar_that_refuses_the_token(procs, server, tmp_path):
    car = procs.sidecar("--source", "fake", "--token", "right-token")
    out = tmp_path / "results"
    _expect_one_line(
        _run(server.url, out, "--gpu", f"sidecar:{car.url}", "--gpu-token", "wrong-token"),
        out,
        "401",
        "token",
    )
    _expect_one_line(_run(server.url, out, "--gpu", f"sidecar:{car.url}"), out, "401", "token")


def test_nvml_on_a_machine_without_a_gpu_driver(server, tmp_path):
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    out = tmp_path / "results"
    _expect_one_line(_run(server.url, out, "--gpu", "nvml"), out, "GPU")


def _valid_run(path: Path) -> Path:
    path.mkdir()
    (path / "manifest.json").write_text('{"schema_version": 1, "run_id": "x"}\n')
    return path


@pytest.mark.parametrize(
    "case", ["missing", "a file", "empty folder", "corrupt manifest", "corrupt requests", "corrupt steps"]
)
def test_reports_refuses_a_missing_or_corrupt_run_folder_in_one_line(case, tmp_path):
    run = tmp_path / "run"
    if case == "a file":
        run.write_text("not a folder")
    elif case == "empty folder":
        run.mkdir()
    elif case == "corrupt manifest":
        _valid_run(run)
        (run / "manifest.json").write_text("{not json")
    elif case == "corrupt requests":
        _valid_run(run)
        (run / "requests.csv").write_bytes(b"\x00\xff garbage\nno,header,here\n1,2,3\n")
    elif case == "corrupt steps":
        _valid_run(run)
        (run / "steps.jsonl").write_text('{"step_index": 0}\nnot json at all\n{"step_index": 1}\n')
    res = _cli(["reports", str(run)])
    assert res.returncode == 2, res.stdout + res.stderr
    line = one_line(res.stderr)
    assert str(run) in line or "run folder" in line, line
    assert not (run / "report.html").exists() if run.is_dir() else True


def test_a_server_whose_text_does_not_match_is_measured_with_one_warning_not_failed(procs, tmp_path):
    """A healthy server answering text far from the page (markup, another model, a constant): the
    pre-flight warns once, naming the field it read, and the run measures capacity: every answer is ok,
    its quality recorded (answer_kind, cer), and the manifest marks the answer check off. Before, every
    request was a `wrong_answer` failure and the verdict was "saturated at one user"."""
    srv = procs.server(lambda _n: ok_answer("OK"))
    out = tmp_path / "results"
    run = procs.run(run_argv(srv, out, levels="1,2", step_s=2, gpu=False))
    run_dir = run.run_dir()
    run.finish_with_report(150)
    # the short steps' own line (rel_procs' MIN_STEP_REQUESTS=5) apart: the answer's is the one warning
    warnings = [line for line in run.err if line.startswith("warning:") and "MIN_STEP_REQUESTS=" not in line]
    assert len(warnings) == 1, run.output()
    for needle in ("far from", '"OK"', "all strings of the answer", "JSON_PATH=", "answer check off"):
        assert needle in warnings[0], warnings[0]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["answer_check"] == {"enabled": False, "why": warnings[0].removeprefix("warning: ")}
    rows = load_run(run_dir).requests
    rows = rows[rows["failure_kind"] != "cut"]
    assert len(rows) > 20 and rows["ok"].all(), rows["failure_kind"].value_counts()
    assert (rows["answer_kind"] == "wrong_answer").all() and (rows["cer"] > 0.9).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["knee"].get("criterion") != "errors", summary["knee"]
