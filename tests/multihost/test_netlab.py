"""The lab's own cleanup: namespaces a killed run left behind are removed with their processes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from netlab import PREFIX, SUBNET, Lab, LabUnavailable, check_available, clean_leftovers, namespaces

pytestmark = pytest.mark.multihost


def _needs_lab() -> None:
    try:
        check_available()
    except LabUnavailable as exc:
        pytest.skip(f"multi-host lab unavailable: {exc}")


@pytest.mark.timeout(60)
def test_a_host_sees_neither_the_hidden_folders_nor_the_root_network(tmp_path: Path) -> None:
    _needs_lab()
    secret = tmp_path / "master"
    secret.mkdir()
    (secret / "page.png").write_bytes(b"only on the master")
    lab = Lab({"a": f"{SUBNET}.91"}, tag="self")
    try:
        lab.up()
        log = tmp_path / "a.log"
        script = f"ls -A {secret}; echo --; ip -o -4 addr show"
        assert lab.spawn("a", ["sh", "-c", script], log, cwd=tmp_path, hide=(secret,)).wait(timeout=20) == 0
        listing, addrs = log.read_text().split("--\n")
        assert listing == ""  # an empty tmpfs over the master's folder
        assert sorted(line.split()[1] for line in addrs.splitlines()) == ["eth0", "lo"]
        assert f"{SUBNET}.91/24" in addrs and (secret / "page.png").exists()  # the host's own view only
    finally:
        lab.down()
    assert not [ns for ns in namespaces() if ns.startswith(lab.ns(""))]


@pytest.mark.timeout(60)
def test_leftovers_of_a_killed_run_are_removed() -> None:
    _needs_lab()
    dead_owner = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have this id
    ns = f"{PREFIX}{dead_owner}-w1"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"], start_new_session=True)
    try:
        time.sleep(0.3)
        assert ns in clean_leftovers()
        assert ns not in namespaces()
        assert sleeper.wait(timeout=10) != 0  # killed, not left running
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
