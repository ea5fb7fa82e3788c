"""Server control: the template and value checks, then real server processes (tests/gpu_sampler/fake_server.py)
started, restarted, timed out and stopped with their whole process group."""

from __future__ import annotations

import shlex
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fakes import FAKE, alive

from gpu_sampler.server_control import (
    OUTPUT_LINES,
    RestartInProgress,
    ServerControl,
    ServerControlError,
    check_values,
    parse_template,
)
from loadtest.launch.procs import free_port


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


# ---- the template ------------------------------------------------------------------------------------
def test_template_placeholders_in_order_once_each() -> None:
    words, names = parse_template("vllm serve m --max-num-seqs {n} --gmu {gmu} --x {n}-{gmu} '{{\"image\": 1}}'")
    assert names == ("n", "gmu")
    assert words[-1] == '{{"image": 1}}'  # literal braces doubled, kept for format()
    assert parse_template("server --fixed 1")[1] == ()


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("", "empty --server-cmd"),
        ("   ", "empty --server-cmd"),
        ("vllm serve 'unclosed", "close its quotes"),
        ("vllm --n {n", "literal brace twice"),
        ("vllm --n n}", "literal brace twice"),
        ("vllm --n {}", "use {name}"),
        ("vllm --n {0}", "use {name}"),
        ("vllm --n {n!r}", "use {name}"),
        ("vllm --n {n:>4}", "use {name}"),
        ("vllm --n {n.real}", "use {name}"),
        ("vllm --cfg '{\"image\": 1}'", "use {name}"),
        ("{prog} --n 1", "cannot be a placeholder"),
    ],
)
def test_bad_templates_are_one_line(template: str, says: str) -> None:
    with pytest.raises(ServerControlError) as info:
        ServerControl(template, "http://127.0.0.1:1/health")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_bad_health_url_and_limits() -> None:
    with pytest.raises(ServerControlError, match="--server-health"):
        ServerControl("srv {n}", "127.0.0.1:8000/health")
    with pytest.raises(ServerControlError, match="start-timeout"):
        ServerControl("srv {n}", "http://127.0.0.1:8000/health", start_timeout_s=0)


# ---- the values --------------------------------------------------------------------------------------
def test_values_fill_their_own_argument_only() -> None:
    control = ServerControl("srv --n {n} --tag run-{tag} --port {port}", "http://127.0.0.1:1/health")
    argv = control.command({"n": 16, "tag": "a.b_c-1", "port": "8000"})
    assert argv == ["srv", "--n", "16", "--tag", "run-a.b_c-1", "--port", "8000"]
    assert check_values(("n",), {"n": 0.85}) == {"n": "0.85"}
    assert check_values(("n",), {"n": "-1"}) == {"n": "-1"}  # a negative number is a value, not a flag


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"n": "16", "evil": "1"}, "unknown placeholder 'evil'"),
        ({"n": "16"}, "no value for {port}"),
        ({}, "no value for {n}"),
        ({"n": "16; rm -rf /", "port": "1"}, "bad value for {n}"),
        ({"n": "$(reboot)", "port": "1"}, "bad value for {n}"),
        ({"n": "`id`", "port": "1"}, "bad value for {n}"),
        ({"n": "16 --trust-remote-code", "port": "1"}, "bad value for {n}"),
        ({"n": "'16'", "port": "1"}, "bad value for {n}"),
        ({"n": '"16"', "port": "1"}, "bad value for {n}"),
        ({"n": "a|b", "port": "1"}, "bad value for {n}"),
        ({"n": "../../etc/passwd", "port": "1"}, "bad value for {n}"),
        ({"n": "16\n", "port": "1"}, "bad value for {n}"),
        ({"n": "", "port": "1"}, "bad value for {n}"),
        ({"n": None, "port": "1"}, "bad value for {n}"),
        ({"n": True, "port": "1"}, "bad value for {n}"),
        ({"n": ["16"], "port": "1"}, "bad value for {n}"),
        ({"n": "x" * 200, "port": "1"}, "bad value for {n}"),
        ({"n": "--enable-x", "port": "1"}, "must be a number"),
        ({"n": "-v", "port": "1"}, "must be a number"),
    ],
)
def test_bad_values_name_the_placeholder(values: dict[str, object], says: str) -> None:
    with pytest.raises(ServerControlError) as info:
        check_values(("n", "port"), values)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_values_must_be_an_object() -> None:
    with pytest.raises(ServerControlError, match="JSON object"):
        check_values(("n",), ["16"])  # type: ignore[arg-type]


# ---- real processes ----------------------------------------------------------------------------------
@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def control(port: int) -> Iterator[ServerControl]:
    made = ServerControl(
        FAKE + " --port {port} --setting {setting} --healthy-after-s {after} --lines {lines}",
        f"http://127.0.0.1:{port}/health",
        start_timeout_s=10,
        grace_s=2,
    )
    try:
        yield made
    finally:
        made.close()


def test_restart_changes_what_the_server_answers(control: ServerControl, port: int) -> None:
    assert control.pid is None and not control.info()["running"]
    first = control.restart({"port": port, "setting": "seqs8", "after": "0.3", "lines": "3"})
    assert first.ok and first.why == "" and first.elapsed_s >= 0.3, first
    assert "fake server line 0 setting=seqs8" in first.output_tail
    first_pid = control.pid
    assert first_pid is not None and fetch(f"http://127.0.0.1:{port}/setting") == "seqs8"
    second = control.restart({"port": port, "setting": "seqs16", "after": "0", "lines": "1"})
    assert second.ok, second
    assert fetch(f"http://127.0.0.1:{port}/setting") == "seqs16"
    assert control.pid not in (None, first_pid) and not alive(first_pid)
    assert control.output_tail()[0] == "fake server line 0 setting=seqs16"  # the old server's lines are gone
    info = control.info()
    assert info["running"] and info["values"] == {"port": str(port), "setting": "seqs16", "after": "0", "lines": "1"}
    assert info["placeholders"] == ["port", "setting", "after", "lines"] and not info["restarting"]
    control.stop()
    assert control.pid is None


def test_bad_values_leave_the_running_server_alone(control: ServerControl, port: int) -> None:
    assert control.restart({"port": port, "setting": "a", "after": "0", "lines": "1"}).ok
    pid = control.pid
    with pytest.raises(ServerControlError, match="bad value for {setting}"):
        control.restart({"port": port, "setting": "a;b", "after": "0", "lines": "1"})
    assert control.pid == pid and pid is not None and alive(pid)


def test_a_server_that_exits_fails_at_once_with_its_code_and_lines(port: int) -> None:
    control = ServerControl(FAKE + " --port {port} --exit-code 3", f"http://127.0.0.1:{port}/health", start_timeout_s=30)
    result = control.restart({"port": port})
    assert not result.ok and result.elapsed_s < 10
    assert result.why.startswith("server exited with code 3 after "), result.why
    assert result.output_tail[-1] == "fake server: exiting with 3"  # stderr merged into the tail
    assert "\n" not in result.why and control.pid is None


def test_a_server_never_healthy_times_out_and_is_stopped(port: int) -> None:
    control = ServerControl(
        FAKE + " --port {port} --healthy-after-s -1 --lines 250", f"http://127.0.0.1:{port}/health", start_timeout_s=3, grace_s=2
    )
    result = control.restart({"port": port})
    assert not result.ok
    assert result.why == f"no 200 from http://127.0.0.1:{port}/health within 3 s"
    assert len(result.output_tail) == OUTPUT_LINES  # the last 200 of its 251 lines
    assert result.output_tail[0] == "fake server line 51 setting="
    assert result.output_tail[-1].startswith("fake server pid ")
    assert control.pid is None and not control.info()["running"]


def test_a_program_that_does_not_exist(port: int) -> None:
    control = ServerControl("/no/such/server --port {port}", f"http://127.0.0.1:{port}/health")
    result = control.restart({"port": port})
    assert not result.ok and result.why.startswith("cannot start '/no/such/server'"), result.why


def test_a_port_held_by_another_process_is_named(port: int) -> None:
    other = ServerControl(FAKE + " --port {port}", f"http://127.0.0.1:{port}/health", start_timeout_s=10)
    try:
        assert other.restart({"port": port}).ok
        control = ServerControl(FAKE + " --port {port}", f"http://127.0.0.1:{port}/health", start_timeout_s=10)
        result = control.restart({"port": port})
        assert not result.ok and "another process holds its port" in result.why, result.why
        assert control.pid is None
    finally:
        other.close()


def test_stop_ends_the_whole_group_and_kills_what_ignores_sigterm(port: int, tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    control = ServerControl(
        FAKE + f" --port {{port}} --ignore-term --child-pid-file {shlex.quote(str(child_file))}",
        f"http://127.0.0.1:{port}/health",
        start_timeout_s=10,
        grace_s=0.5,
    )
    assert control.restart({"port": port}).ok
    leader, child = control.pid, int(child_file.read_text())
    assert leader is not None and alive(leader) and alive(child)
    started = time.monotonic()
    control.stop()
    assert not alive(leader) and not alive(child)
    assert 0.5 <= time.monotonic() - started < 5  # SIGTERM ignored: SIGKILL after the grace period


def test_a_second_restart_while_one_runs_is_refused(port: int) -> None:
    control = ServerControl(
        FAKE + " --port {port} --healthy-after-s {after}", f"http://127.0.0.1:{port}/health", start_timeout_s=10
    )
    results = []
    thread = threading.Thread(target=lambda: results.append(control.restart({"port": port, "after": "2"})))
    try:
        thread.start()
        deadline = time.monotonic() + 5
        while control.pid is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert control.restarting
        with pytest.raises(RestartInProgress, match="a restart is in progress"):
            control.restart({"port": port, "after": "0"})
        thread.join(15)
        assert results and results[0].ok
    finally:
        control.close()
        thread.join(15)


def test_stop_during_a_restart_gives_up_at_once(port: int) -> None:
    control = ServerControl(FAKE + " --port {port} --healthy-after-s -1", f"http://127.0.0.1:{port}/health", start_timeout_s=60)
    results = []
    thread = threading.Thread(target=lambda: results.append(control.restart({"port": port})))
    thread.start()
    deadline = time.monotonic() + 5
    while control.pid is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = control.pid
    control.close()
    thread.join(10)
    assert results and not results[0].ok and "stopped while starting" in results[0].why
    assert pid is not None and not alive(pid)
    assert not control.restart({"port": port}).ok  # closed: nothing starts any more
    assert control.pid is None


def test_sigterm_reaches_a_server_that_honours_it_within_grace(control: ServerControl, port: int) -> None:
    assert control.restart({"port": port, "setting": "a", "after": "0", "lines": "0"}).ok
    pid = control.pid
    assert pid is not None
    started = time.monotonic()
    control.stop()
    assert time.monotonic() - started < control.grace_s and not alive(pid)  # no SIGKILL was needed


class PidReader:
    """A GPU reader with the NvmlReader's `pid` attribute: the sidecar points it at the server it starts."""

    source = "fake"
    pid: int | None = None

    def read(self) -> list[object]:
        return []


@pytest.mark.parametrize("follow", [True, False])
def test_the_sidecar_follows_the_started_servers_pid_unless_given_one(port: int, follow: bool) -> None:
    from gpu_sampler.sidecar import Sidecar

    reader = PidReader()
    control = ServerControl(FAKE + " --port {port}", f"http://127.0.0.1:{port}/health", start_timeout_s=10)
    sidecar = Sidecar(reader, server_control=control, follow_server_pid=follow)
    try:
        answer = sidecar.restart_server({"port": str(port)})
        assert answer["ok"] and answer["why"] == "" and isinstance(answer["output_tail"], list)
        assert reader.pid == (control.pid if follow else None) and control.pid is not None
    finally:
        sidecar.stop()
    assert control.pid is None
