"""Hosts for tests: network namespaces joined by one bridge (iproute2), removed even after a crash.

``Network(["db", "cli", "r0", "r1", "r2"])`` builds, under a tag unique to this run::

    <tag>-hub    a bridge br0 without an address (a switch, not a router)
    <tag>-<name> one namespace per node: lo up, and eth0 (10.226.0.<10+k>/24), one end of a veth
                 pair whose other end is a port of br0 in the hub

Nothing is added to the machine's own namespace, and tests only ever address these namespaces'
addresses (or loopback). ``node.popen(argv)`` runs a process in a node (``ip netns exec``: the
process *is* the command, so its pid is the one to kill); ``cut(name)`` / ``restore(name)`` take the
node's eth0 down / up, cutting it off from every other node; ``enter(ns)`` moves the calling thread
into a namespace (the client processes of ``tests.support.client_host`` call it first thing).

Cleanup: ``close()`` kills every process still in the namespaces and deletes them. NOTE: a watchdog
process (its own session) holds a pipe from this process and does the same when the pipe closes, so
a test run killed with SIGKILL (a CI timeout) leaves no namespace and no server behind.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from tests.support.required import missing

SUBNET = "10.226.0"
CLONE_NEWNET = 0x40000000
# NOTE: runs in its own session: waits for the pipe to close, then kills what is left and deletes.
WATCHDOG = """
import subprocess, sys
sys.stdin.read()
for ns in sys.argv[1:]:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    subprocess.run(["kill", "-9", *pids], capture_output=True) if pids else None
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
"""


def require() -> None:
    """Skip (fail in CI) unless iproute2 is there and we may create namespaces (root)."""
    if shutil.which("ip") is None:
        missing("iproute2", "`ip` not found (scripts/ensure_netns.sh installs it)")
    if os.geteuid() != 0:
        missing("root", "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")


def ip(*args: str) -> str:
    """Run ``ip *args``; its stdout (raises with stderr on failure)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def enter(ns: str) -> None:
    """Move the calling thread into network namespace ``ns`` (sockets it opens from now on live there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Node:
    """One host: namespace ``ns`` with address ``address`` on the shared network."""

    name: str
    ns: str
    address: str

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kw)


class Network:
    """Namespaces joined by a bridge; see the module docstring. Use as a context manager."""

    def __init__(self, names: list[str]) -> None:
        require()
        self.tag = f"t26{secrets.token_hex(3)}"
        self.hub = f"{self.tag}-hub"
        self.nodes = {n: Node(n, f"{self.tag}-{n}", f"{SUBNET}.{10 + k}") for k, n in enumerate(names)}
        namespaces = [*(node.ns for node in self.nodes.values()), self.hub]
        self._watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, *namespaces], stdin=subprocess.PIPE,
                                          start_new_session=True)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @property
    def cidr(self) -> str:
        return f"{SUBNET}.0/24"

    def _build(self) -> None:
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for k, node in enumerate(self.nodes.values()):
            ip("netns", "add", node.ns)
            ip("-n", node.ns, "link", "set", "lo", "up")
            ip("-n", node.ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{k}", "netns", self.hub)
            ip("-n", self.hub, "link", "set", f"p{k}", "master", "br0")
            ip("-n", self.hub, "link", "set", f"p{k}", "up")
            ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            ip("-n", node.ns, "link", "set", "eth0", "up")

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def cut(self, name: str) -> None:
        """Take the node's link down: nothing reaches it, it reaches nothing (but loopback)."""
        ip("-n", self.nodes[name].ns, "link", "set", "eth0", "down")

    def restore(self, name: str) -> None:
        ip("-n", self.nodes[name].ns, "link", "set", "eth0", "up")

    def close(self) -> None:
        """Kill what still runs in the namespaces and delete them (idempotent)."""
        if self._watchdog.stdin is not None and not self._watchdog.stdin.closed:
            self._watchdog.stdin.close()  # NOTE: the watchdog does the cleanup, whoever closes the pipe
        self._watchdog.wait(timeout=60)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
