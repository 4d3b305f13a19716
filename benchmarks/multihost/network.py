"""Hosts on one machine: a network namespace per host, all on one bridge.

The bridge lives in a namespace of its own (the hub); each host is a namespace with one
veth pair, ``eth0`` inside at ``10.77.N.x/24`` and its peer on the hub's bridge. One more
veth pair gives the root namespace (where the driver runs) ``10.77.N.254``. N is the
first ``10.77.N.0/24`` that no interface of the root namespace uses, claimed with a lock
file so two runs on one machine never share it. Every address is one this module
assigns, on an interface it created; nothing else is routed anywhere.

:class:`Network` is a context manager; its cleanup (also registered with ``atexit`` and
run on SIGTERM, SIGINT and SIGHUP) kills every process left in its namespaces, deletes
the namespaces (which deletes their veth pairs) and the root link, and releases the
subnet. It runs once, however many of those fire. A driver that is SIGKILLed cannot
clean up: its brokers and hosts get SIGTERM from the kernel (``PR_SET_PDEATHSIG``), and
the next run removes its namespaces and link (:func:`remove_leftovers`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

LOCKS = Path("/tmp")
SUBNETS = range(0, 250)


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message names it and its stderr."""


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _kill_namespace(name: str) -> None:
    """SIGKILL every process in namespace ``name`` (a bounded wait until they are gone)."""
    for _attempt in range(50):
        out = ip("netns", "pids", name, check=False)
        pids = [int(word) for word in out.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_leftovers() -> list[str]:
    """The namespaces and root links of earlier runs that could not clean up (a SIGKILL
    of the driver): their lock file is no longer held. Returns what it removed."""
    removed = []
    namespaces = [line.split()[0] for line in ip("netns", "list").splitlines() if line]
    for path in sorted(LOCKS.glob("ackgate-multihost-10.77.*.lock")):
        with path.open("a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a run that is alive
            lock.seek(0)
            run_id = lock.read().strip()
            if not run_id:
                continue
            for name in namespaces:
                if name.startswith(f"ackgate-mh-{run_id}-"):
                    _kill_namespace(name)
                    ip("netns", "del", name, check=False)
                    removed.append(name)
            link = f"mh{run_id}r"
            if ip("link", "show", link, check=False):
                ip("link", "del", link, check=False)
                removed.append(link)
            lock.truncate(0)
    return removed


def _claim_subnet(run_id: str) -> tuple[int, IO[str]]:
    """The first free 10.77.N.0/24 and the lock file that keeps it ours (it names the run,
    for :func:`remove_leftovers`)."""
    used = ip("-o", "-4", "addr", "show")
    for n in SUBNETS:
        if f" 10.77.{n}." in used:
            continue
        lock = (LOCKS / f"ackgate-multihost-10.77.{n}.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        lock.truncate(0)
        lock.write(run_id)
        lock.flush()
        return n, lock
    raise NetworkError("no free 10.77.N.0/24 subnet")


class Network:
    """A hub namespace with a bridge, one namespace per host, and a root-namespace link.

    ``hosts`` maps a host's name (a few letters) to the last byte of its address.
    """

    def __init__(self, hosts: dict[str, int]) -> None:
        self.run_id = uuid.uuid4().hex[:4]
        self.hosts = dict(hosts)
        self.subnet = -1
        self._lock: IO[str] | None = None
        self._namespaces: list[str] = []
        self._root_link = f"mh{self.run_id}r"
        self._cleaned = False
        self._previous: dict[int, object] = {}

    def namespace(self, host: str) -> str:
        return f"ackgate-mh-{self.run_id}-{host}"

    def address(self, host: str) -> str:
        return f"10.77.{self.subnet}.{self.hosts[host]}"

    def _hub_link(self, host: str) -> str:
        return f"mh{self.run_id}{host}p"  # the hub's end of the host's veth pair

    def __enter__(self) -> Network:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        atexit.register(self.cleanup)
        try:
            self._build()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Unwinds through every finally (and __exit__) of the driver, then cleanup runs.
        raise SystemExit(128 + signum)

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        remove_leftovers()
        self.subnet, self._lock = _claim_subnet(self.run_id)
        hub = self.namespace("hub")
        self._add_namespace(hub)
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "link", "set", "br0", "up")
        for host in self.hosts:
            ns = self.namespace(host)
            self._add_namespace(ns)
            inside = f"mh{self.run_id}{host}"
            ip("link", "add", inside, "type", "veth", "peer", "name", self._hub_link(host))
            ip("link", "set", inside, "netns", ns)
            ip("link", "set", self._hub_link(host), "netns", hub)
            ip("-n", hub, "link", "set", self._hub_link(host), "master", "br0", "up")
            ip("-n", ns, "link", "set", inside, "name", "eth0")
            ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        peer = f"mh{self.run_id}rp"
        ip("link", "add", self._root_link, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", hub)
        ip("-n", hub, "link", "set", peer, "master", "br0", "up")
        ip("addr", "add", f"10.77.{self.subnet}.254/24", "dev", self._root_link)
        ip("link", "set", self._root_link, "up")

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def cut(self, host: str) -> None:
        """Take the host's link down at the bridge: its packets go nowhere, as in a
        partition (its own ``eth0`` stays up, so its sockets time out rather than fail)."""
        ip("-n", self.namespace("hub"), "link", "set", self._hub_link(host), "down")

    def mend(self, host: str) -> None:
        ip("-n", self.namespace("hub"), "link", "set", self._hub_link(host), "up")

    def kill_all(self, host: str) -> int:
        """SIGKILL every process in ``host``'s namespace; how many there were."""
        out = ip("netns", "pids", self.namespace(host), check=False)
        count = len(out.split())
        _kill_namespace(self.namespace(host))
        return count

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        for name in self._namespaces:
            _kill_namespace(name)
        for name in reversed(self._namespaces):
            ip("netns", "del", name, check=False)
        ip("link", "del", self._root_link, check=False)
        if self._lock is not None:
            self._lock.close()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        atexit.unregister(self.cleanup)
