"""A small network of "hosts" on this machine: one network namespace per host, joined by veth pairs to a
bridge that lives in a namespace of its own, so nothing is added to the root namespace's network.

Names: every namespace is `ocrmh<owner pid>-<lab tag>-<host>`; the owner is the pytest process that made it. A run
killed before its teardown (a time limit, SIGKILL) leaves its namespaces behind: `clean_leftovers()`
removes those whose owner is gone (processes in them killed by PID, then the namespace deleted; its
veths and the bridge go with it). Addresses: 10.213.17.0/24, which exists only inside these namespaces.

A host's processes may also get a mount namespace of their own (`hide=`): an empty tmpfs is mounted over
each hidden folder, so a worker cannot see the master's run folder or images, nor the master a worker's
folder. Those mounts live and die with the process's mount namespace; the root's mount table is untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "ocrmh"
SUBNET = "10.213.17"
BRIDGE = "br0"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\S+)")


class LabUnavailable(Exception):
    """Namespaces cannot be made here (not root, no `ip netns`): the tests are skipped with this reason."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process still in `ns` (by PID, as `ip netns pids` lists them), then delete it."""
    for _ in range(3):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    _ip("netns", "del", ns, check=False)


def clean_leftovers() -> list[str]:
    """Remove the namespaces of earlier runs whose pytest is gone; return their names."""
    gone = []
    for ns in namespaces():
        m = _NAME.match(ns)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _kill_namespace(ns)
            gone.append(ns)
    return gone


def root_network() -> str:
    """The root namespace's links, addresses and routes: the lab must leave them as they were."""
    parts = [_ip("-o", "link", "show", check=False).stdout, _ip("-o", "addr", "show", check=False).stdout,
             _ip("route", "show", "table", "all", check=False).stdout]  # fmt: skip
    # counters and timers change by themselves; names, addresses and routes must not
    return "\n".join(re.sub(r"(valid_lft|preferred_lft) \S+", "", p) for p in parts)


def check_available() -> None:
    """Raise LabUnavailable with the reason when this machine cannot make the lab."""
    if os.geteuid() != 0:
        raise LabUnavailable("needs root (network and mount namespaces): run as root, e.g. in CI's container")
    for tool in ("ip", "unshare", "openssl"):
        if shutil.which(tool) is None:
            raise LabUnavailable(f"`{tool}` is missing: install iproute2, util-linux and openssl")
    probe = f"{PREFIX}{os.getpid()}-probe"
    steps = [("netns", "add", probe), ("-n", probe, "link", "add", BRIDGE, "type", "bridge"),
             ("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")]  # fmt: skip
    try:
        for step in steps:
            res = _ip(*step, check=False)
            if res.returncode != 0:
                raise LabUnavailable(f"`ip {' '.join(step)}` failed: {res.stderr.strip()}")
    finally:
        _ip("netns", "del", probe, check=False)
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode != 0:
        raise LabUnavailable("`unshare -m` failed: mount namespaces are not allowed here")


@dataclass
class Lab:
    hosts: dict[str, str]  # host name -> its address
    tag: str = "lab"  # two labs of one pytest differ by it
    owner: int = field(default_factory=os.getpid)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ns(self, host: str) -> str:
        return f"{PREFIX}{self.owner}-{self.tag}-{host}"

    def up(self) -> None:
        """The bridge namespace and one namespace per host, each with `eth0` on the bridge."""
        br = self.ns("bridge")
        _ip("netns", "add", br)
        _ip("-n", br, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", br, "link", "set", BRIDGE, "up")
        for host, addr in self.hosts.items():
            ns = self.ns(host)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # both ends are made in the bridge namespace and one is moved at once: never in the root's
            _ip("-n", br, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", br, "link", "set", f"v-{host}", "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def down(self) -> None:
        """Kill every process started here (its process group, by PID), then delete the namespaces."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for host in [*self.hosts, "bridge"]:
            _kill_namespace(self.ns(host))

    def spawn(
        self,
        host: str,
        argv: list[str],
        log: Path,
        cwd: Path,
        env: dict[str, str] | None = None,
        hide: tuple[Path, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """`argv` in `host`'s network namespace and a mount namespace of its own with an empty tmpfs over
        each `hide` folder; its own process group; stdout and stderr to `log`."""
        mounts = "".join(f"mount -t tmpfs -o size=64m ocrmh {shlex.quote(str(p))} && " for p in hide)
        script = f'{mounts}cd {shlex.quote(str(cwd))} && exec "$@"'
        cmd = ["ip", "netns", "exec", self.ns(host), "unshare", "-m", "--propagation", "private",
               "sh", "-c", script, "sh", *argv]  # fmt: skip
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(
        self, host: str, argv: list[str], timeout_s: float, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A short command in `host`'s network namespace (raises on failure when `check`)."""
        res = subprocess.run(["ip", "netns", "exec", self.ns(host), *argv], capture_output=True, text=True,
                             timeout=timeout_s, env={**os.environ, **(env or {})})  # fmt: skip
        if check and res.returncode != 0:
            raise AssertionError(f"{argv} in {host} failed ({res.returncode}): {res.stderr[-2000:]}")
        return res

    def cut(self, host: str) -> None:
        """Cut `host` off the network, as a pulled cable: its bridge port goes down."""
        _ip("-n", self.ns("bridge"), "link", "set", f"v-{host}", "down")


def wait_for_line(log: Path, prefix: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The rest of the first line of `log` that starts with `prefix`; fails early if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[-1]} exited ({proc.returncode}) before '{prefix}':\n{text[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no '{prefix}' in {log} within {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")

