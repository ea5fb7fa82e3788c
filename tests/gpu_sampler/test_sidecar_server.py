"""The sidecar's server control as real processes on 127.0.0.1: the sidecar (`--server-cmd`), the simulator
or tests/gpu_sampler/fake_server.py under it, restarts over HTTP, refusals, and no child left behind."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sampler_fakes import SidecarProcess, text_server
from server_fakes import FAKE, alive
from waits import wait_until

from gpu_sampler import NoServerControl, SamplerError, SidecarClient
from gpu_sampler.server_control import RestartResult, ServerControlError
from loadtest.launch.procs import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = shlex.quote(sys.executable)


def sidecar_with(template: str, port: int, *extra: str) -> SidecarProcess:
    return SidecarProcess(
        "--source", "fake", "--port", "0", "--server-cmd", template,
        "--server-health", f"http://127.0.0.1:{port}/health", *extra,
    )  # fmt: skip


def post(url: str, body: bytes, token: str = "") -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fake_sidecar(port: int) -> Iterator[SidecarProcess]:
    process = sidecar_with(
        FAKE + f" --port {port} --setting {{setting}} --healthy-after-s {{after}}", port,
        "--server-start-timeout-s", "4", "--server-grace-s", "2",
    )  # fmt: skip
    try:
        yield process
    finally:
        process.stop()


def test_restart_through_the_sidecar_changes_the_simulators_slots(port: int) -> None:
    process = sidecar_with(
        f"{PYTHON} -m simulator --port {port} --dcgm-port -1 --gateway-slots {{slots}}", port,
        "--server-start-timeout-s", "60",
    )  # fmt: skip
    try:
        client = SidecarClient(process.url)
        info = client.server_info()
        assert info["placeholders"] == ["slots"] and info["running"] is False and info["pid"] is None
        assert info["start_timeout_s"] == 60.0
        truth = f"http://127.0.0.1:{port}/truth?width=1000&height=1000"
        for slots in (3, 5):
            result = client.restart_server({"slots": str(slots)})
            assert isinstance(result, RestartResult) and result.ok, result
            with urllib.request.urlopen(truth, timeout=10) as response:
                assert json.loads(response.read())["slots"] == slots
        info = client.server_info()
        assert info["running"] and info["values"] == {"slots": "5"} and info["pid"] > 0
        assert any("simulator: http://127.0.0.1" in line for line in info["output_tail"])
        with pytest.raises(ServerControlError, match="unknown placeholder 'max_num_seqs'") as refused:
            client.restart_server({"max_num_seqs": "8"})
        assert isinstance(refused.value, SamplerError | ValueError)  # caught with the client's other errors
        with pytest.raises(ServerControlError, match=r"bad value for \{slots\}"):
            client.restart_server({"slots": "4 --max-side 10"})
        assert client.server_info()["pid"] == info["pid"]  # bad values stopped nothing
    finally:
        process.stop()


def test_a_server_never_healthy_fails_with_its_last_lines_and_the_sidecar_lives(fake_sidecar: SidecarProcess, port: int) -> None:
    client = SidecarClient(fake_sidecar.url)
    result = client.restart_server({"setting": "big", "after": "-1"})
    assert not result.ok and result.why == f"no 200 from http://127.0.0.1:{port}/health within 4 s"
    assert "fake server line 2 setting=big" in result.output_tail
    assert client.health()["ok"]
    info = client.server_info()
    assert not info["running"] and info["output_tail"] == result.output_tail
    assert client.restart_server({"setting": "small", "after": "0"}).ok  # the next setting goes on


def test_a_second_restart_is_refused_while_samples_are_served(fake_sidecar: SidecarProcess) -> None:
    client = SidecarClient(fake_sidecar.url)
    results: list[RestartResult] = []
    # healthy 2 s after its start: the requests below land inside the restart even on a loaded core (the
    # sidecar's start timeout is 4 s)
    slow = threading.Thread(target=lambda: results.append(client.restart_server({"setting": "a", "after": "2"})))
    slow.start()
    try:
        wait_until(lambda: client.server_info()["restarting"], 10, what="the restart under way")
        assert client.samples_since(0).next_cursor > 0  # the sampler's API answers during the restart,
        assert client.server_info()["restarting"]  # before it ended: not held until the server is up
        status, body = post(fake_sidecar.url + "/server/restart", b'{"values": {"setting": "b", "after": "0"}}')
        assert status == 409 and "a restart is in progress" in str(body["error"])
        assert body["reason"] == "restart_in_progress"
        with pytest.raises(SamplerError, match="a restart is in progress") as refused:
            client.restart_server({"setting": "b", "after": "0"})
        assert not isinstance(refused.value, NoServerControl | ServerControlError)
    finally:
        slow.join(30)
    assert results and results[0].ok and client.server_info()["values"]["setting"] == "a"


def test_bad_bodies_are_400(fake_sidecar: SidecarProcess) -> None:
    for body in (b"not json", b'{"setting": "a"}', b'["a"]', b'{"values": ["a"]}', b'{"values": {"setting": "a b", "after": "0"}}'):
        status, answer = post(fake_sidecar.url + "/server/restart", body)
        assert status == 400 and "\n" not in str(answer["error"]), (body, answer)


def test_server_control_is_behind_the_token(port: int) -> None:
    process = sidecar_with(FAKE + f" --port {port}", port, "--token", "s3cret")
    try:
        status, _ = post(process.url + "/server/restart", b'{"values": {}}')
        assert status == 401
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(process.url + "/server", timeout=5)
        assert info.value.code == 401
        info.value.close()
        with pytest.raises(SamplerError, match="no token was sent: set OCRCAP_GPU_TOKEN or pass --gpu-token"):
            SidecarClient(process.url).restart_server({}, timeout_s=10)
        with pytest.raises(SamplerError, match="refused the token"):
            SidecarClient(process.url, token="wrong").restart_server({}, timeout_s=10)
        assert SidecarClient(process.url, token="s3cret").server_info()["running"] is False  # nothing started
        assert SidecarClient(process.url, token="s3cret").restart_server({}).ok
    finally:
        process.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_no_child_outlives_the_sidecar(port: int, tmp_path: Path, sig: int) -> None:
    child_file = tmp_path / "child.pid"
    process = sidecar_with(FAKE + f" --port {port} --child-pid-file {shlex.quote(str(child_file))}", port)
    try:
        client = SidecarClient(process.url)
        assert client.restart_server({}).ok
        leader, child = client.server_info()["pid"], int(child_file.read_text())
        assert alive(leader) and alive(child)
    finally:
        code = process.stop(sig)
    assert code == 0
    assert not alive(leader) and not alive(child)


def test_a_sidecar_without_server_cmd_says_how_to_start_it() -> None:
    process = SidecarProcess("--source", "fake", "--port", "0")
    try:
        status, body = post(process.url + "/server/restart", b'{"values": {"n": "1"}}')
        assert status == 409 and "--server-cmd" in str(body["error"]) and body["reason"] == "no_server_control"
        with pytest.raises(NoServerControl, match="start it with --server-cmd"):
            SidecarClient(process.url).server_info()
    finally:
        process.stop()


def test_a_sidecar_without_server_control_at_all_is_named() -> None:
    # an older sidecar: /server is a 404
    with text_server({"/health": '{"ok": true}'}) as (url, _state), pytest.raises(NoServerControl, match="no server control"):
        SidecarClient(url).server_info()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--server-cmd", "vllm serve m --n {n", "--server-health", "http://127.0.0.1:8000/health"], "literal brace twice"),
        (["--server-cmd", "vllm serve m --n {n}"], "--server-cmd needs --server-health"),
        (["--server-health", "http://127.0.0.1:8000/health"], "goes with --server-cmd"),
        (["--server-cmd", "vllm {n}", "--server-health", "localhost:8000"], "bad --server-health"),
    ],
)
def test_bad_server_flags_end_in_one_line(args: list[str], says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_sampler", "serve", "--source", "fake", "--port", "0", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr
