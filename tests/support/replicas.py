"""Server replicas as separate hosts sharing one PostgreSQL job store (tests/model/scale/test_replicas_netns.py).

``ReplicaHosts(folder, replicas=3)`` builds a ``Network`` (tests/support/netns.py) of

* ``db``: a throwaway PostgreSQL 15 (tests/support/pg.py) listening on the db node's address;
* ``cli``: the clients (a ``ClientHost``: worker processes inside that namespace);
* ``r0``, ``r1``, ...: one ``python -m service`` process each (the default model, 1 thread),
  listening on its node's address, ``--batch-db postgresql://<db>/jobs``, ``--replica-id rN``,
  a short ``--batch-lease-s``, Prometheus metrics on port 9464, a tenants file with ``t1`` and ``t2``.

The test process reaches the database over its Unix socket (``sql``), the replicas only through the
client host. ``close()`` stops everything and removes the namespaces, also after a failed start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.support.client_host import ClientHost
from tests.support.netns import Network, Node
from tests.support.pg import PgCluster, require
from tests.support.replica_calls import wait_serving
from tests.support.server import ROOT, server_argv

PORT, METRICS_PORT = 50051, 9464
TOKENS = {"t1": "tok-tenant-one", "t2": "tok-tenant-two"}


class Replica:
    """One server process on its own host (restartable with the same replica id)."""

    def __init__(self, node: Node, args: list[str], log: Path) -> None:
        self.node, self.args, self.log = node, args, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def target(self) -> str:
        return f"{self.node.address}:{PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.node.address}:{METRICS_PORT}/metrics"

    def start(self) -> None:
        argv = server_argv("--replica-id", self.name, *self.args, host=self.node.address, port=PORT)
        with self.log.open("ab") as log:
            self.proc = self.node.popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        env=dict(os.environ))

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup (its leases stay until they expire)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


class ReplicaHosts:
    """The network, the database, the client host and the replicas; see the module docstring."""

    def __init__(self, folder: Path, replicas: int = 3, lease_s: float = 5.0, extra: tuple[str, ...] = ()) -> None:
        bindir = require()  # NOTE: skips (fails in CI) without PostgreSQL, before any namespace exists
        names = [f"r{i}" for i in range(replicas)]
        self.net = Network(["db", "cli", *names])
        self.pg: PgCluster | None = None
        self.clients: ClientHost | None = None
        self.replicas: list[Replica] = []
        try:
            db = self.net["db"]
            self.pg = PgCluster(bindir, netns=db.ns, host=db.address, trust=self.net.cidr).start()
            self.pg.create_database("jobs")
            self.clients = ClientHost(self.net["cli"])
            tenants = folder / "tenants.json"
            tenants.write_text(json.dumps({"tenants": {
                t: {"token_sha256": [hashlib.sha256(tok.encode()).hexdigest()]} for t, tok in TOKENS.items()}}))
            args = [*self.server_args(self.pg.url("jobs"), lease_s), "--auth-tokens", str(tenants), *extra]
            self.replicas = [Replica(self.net[n], args, folder / f"{n}.log") for n in names]
        except BaseException:
            self.close()
            raise

    @staticmethod
    def server_args(db_url: str, lease_s: float) -> list[str]:
        return ["--threads", "1", "--ctx", "4096", "--max-running", "8", "--batch-max-running", "4",
                "--batch-db", db_url, "--batch-lease-s", str(lease_s), "--response-cache-bytes", "0",
                "--keepalive-min-client-interval-s", "0.5", "--grace-seconds", "5",
                "--prometheus-port", str(METRICS_PORT)]

    @property
    def cli(self) -> ClientHost:
        assert self.clients is not None
        return self.clients

    @property
    def targets(self) -> list[str]:
        return [r.target for r in self.replicas]

    def start(self, *which: Replica, timeout: float = 300.0) -> None:
        """Start replicas (all by default) and wait until each one's BatchService is SERVING."""
        chosen = list(which or self.replicas)
        for r in chosen:
            r.start()
        waits = [self.cli.submit(wait_serving, r.target, "inference.v1.BatchService", timeout) for r in chosen]
        for r, w in zip(chosen, waits, strict=True):
            status = w.result(timeout + 10)
            assert status == "SERVING", f"{r.name} is {status}:\n{r.tail()}"

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of ``query`` on the job store (over the database's Unix socket)."""
        import psycopg

        assert self.pg is not None
        with psycopg.connect(self.pg.admin_dsn("jobs"), autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(query, args).fetchall()]

    def close(self) -> None:
        """Stop replicas, clients, the database, then remove the namespaces (each step even if one fails)."""
        with contextlib.ExitStack() as stack:
            stack.callback(self.net.close)
            if self.pg is not None:
                stack.callback(self.pg.stop)
            if self.clients is not None:
                stack.callback(self.clients.close)
            for r in self.replicas:
                stack.callback(r.kill)
