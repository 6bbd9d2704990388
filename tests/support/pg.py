"""A throwaway PostgreSQL cluster for tests: real server, temp directory, free port, torn down after.

``cluster()`` starts one cluster per test process on first use (initdb + pg_ctl
from Debian's ``postgresql-15``, or ``PG_BIN``), as the ``postgres`` user when
the tests run as root (PostgreSQL refuses to run as root). ``fresh_database``
gives each test its own database; ``make_store`` is the ``JobStore`` factory
the contract tests in tests/unit/batch/test_batch_store.py run on.

Without PostgreSQL (no binaries, no psycopg) the tests that need it skip, except
in CI (``CI=true``), where they fail: ``scripts/ensure_postgres.sh`` installs it.

Teardown: ``atexit`` stops the cluster and removes its directory. NOTE: a
watchdog process holds a pipe from this process and does the same when the pipe
closes, so a test run killed with SIGKILL (a CI timeout) leaves no server behind.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.required import missing

if TYPE_CHECKING:
    from service.batch.store import JobStore

PG_VERSION = "15"
SERVER_SETTINGS = {  # a test cluster: speed over durability (the data dies with the test run)
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "32MB",
}
# NOTE: runs in its own session (no terminal signals): waits for the pipe to close, then stops the server.
WATCHDOG = """
import shutil, subprocess, sys
sys.stdin.read()
subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


class Unavailable(RuntimeError):
    """No PostgreSQL server binaries (or no psycopg) on this machine."""


def find_bindir() -> Path:
    """initdb/pg_ctl/postgres: ``PG_BIN``, else Debian's /usr/lib/postgresql/15/bin (else the newest there)."""
    candidates = [os.environ.get("PG_BIN", ""), f"/usr/lib/postgresql/{PG_VERSION}/bin"]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for c in candidates:
        if c and all(os.access(Path(c) / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(c)
    raise Unavailable("PostgreSQL server binaries not found (run scripts/ensure_postgres.sh, or set PG_BIN)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgCluster:
    """One running cluster; ``dsn(name)`` connects to database ``name`` as the superuser.

    By default it listens on 127.0.0.1 of this process's network namespace. With ``netns`` it runs
    inside that namespace (``ip netns exec``), listens on ``host`` and trusts ``trust`` (a CIDR: the
    replicas' network; tests/support/netns.py); ``dsn`` then works from that network only.
    """

    bindir: Path
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="inference-pg-")))
    port: int = 0
    netns: str = ""
    host: str = "127.0.0.1"
    trust: str = ""
    _watchdog: subprocess.Popen[bytes] | None = None
    _made: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user=postgres dbname={dbname} connect_timeout=10"

    def admin_dsn(self, dbname: str = "postgres") -> str:
        """Over the cluster's Unix socket: works from this process whatever network namespace it runs in."""
        return f"host={self.root} port={self.port} user=postgres dbname={dbname} connect_timeout=10"

    def url(self, dbname: str) -> str:
        """The database as a ``--batch-db`` URL."""
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}"

    def _as_owner(self, *cmd: str) -> list[str]:
        """Run as ``postgres`` when we are root (PostgreSQL refuses root), else as ourselves; in ``netns``."""
        owned = ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)
        return ["ip", "netns", "exec", self.netns, *owned] if self.netns else owned

    def _pg_ctl(self, *args: str) -> list[str]:
        return self._as_owner(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args)

    def start(self) -> PgCluster:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C"]
        subprocess.run(self._as_owner(*initdb), check=True, capture_output=True)
        if self.trust:
            with (self.datadir / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.trust} trust\n")
        stop = self._pg_ctl("stop", "-m", "immediate", "-w")
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(self.root), *stop],
            stdin=subprocess.PIPE, start_new_session=True,
        )
        fixed = self.port != 0  # a port chosen by the caller (e.g. a server already pointed at it)
        for _attempt in range(1 if fixed else 3):  # NOTE: a free port can be taken between probe and bind
            self.port = self.port if fixed else free_port()
            done = self._start()
            if done.returncode == 0:
                return self
        log = (self.root / "log").read_text(errors="replace")[-2000:] if (self.root / "log").exists() else ""
        self.stop()
        raise RuntimeError(f"pg_ctl start failed: {done.stderr.decode(errors='replace')}\n{log}")

    def _start(self) -> subprocess.CompletedProcess[bytes]:
        settings = {**SERVER_SETTINGS, "listen_addresses": self.host, "port": self.port,
                    "unix_socket_directories": self.root}
        opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
        return subprocess.run(self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.root / "log"), "-o", opts),
                              capture_output=True)

    def restart(self, down: Callable[[], None] = lambda: None) -> None:
        """Stop the server (``fast``: sessions are cut, as in a failover), run ``down()``, start it again."""
        subprocess.run(self._pg_ctl("stop", "-m", "fast", "-w", "-t", "60"), check=True, capture_output=True)
        try:
            down()
        finally:
            done = self._start()
            if done.returncode != 0:
                raise RuntimeError(f"pg_ctl start failed: {done.stderr.decode(errors='replace')}")

    def stop(self) -> None:
        """Stop the server and remove its directory (idempotent)."""
        if self.datadir.exists():
            subprocess.run(self._pg_ctl("stop", "-m", "immediate", "-w"), capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            self._watchdog.stdin.close()
            self._watchdog.wait(timeout=30)
            self._watchdog = None

    def create_database(self, name: str) -> str:
        """Create database ``name`` once (later calls reuse it); its DSN."""
        import psycopg

        with self._lock:
            if name not in self._made:
                with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                self._made.add(name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with self._lock, psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._made.discard(name)


_cluster: PgCluster | None = None
_missing = ""  # why there is no cluster, once known (not probed again for every test)
_cluster_lock = threading.Lock()


def require() -> Path:
    """The server binaries' directory; skips (fails in CI) without them or without psycopg."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401

        return find_bindir()
    except (ImportError, Unavailable) as exc:
        missing("PostgreSQL", str(exc))


def cluster() -> PgCluster:
    """The test process's cluster, started on first use and stopped at exit."""
    global _cluster, _missing
    with _cluster_lock:
        if _cluster is None and not _missing:
            try:
                import psycopg  # noqa: F401
                import psycopg_pool  # noqa: F401

                bindir = find_bindir()
            except (ImportError, Unavailable) as exc:
                _missing = str(exc)
            else:
                _cluster = PgCluster(bindir).start()
                atexit.register(_cluster.stop)
        if _cluster is None:
            missing("PostgreSQL", _missing)  # skipped, or failed in CI (scripts/ensure_postgres.sh)
        assert _cluster is not None
        return _cluster


def database_name(key: str) -> str:
    """A database name derived from ``key`` (e.g. a test's tmp_path): the same key, the same database."""
    return "t_" + hashlib.sha1(key.encode()).hexdigest()[:20]


def fresh_database(key: str) -> str:
    """The DSN of the database for ``key`` (created on first use)."""
    return cluster().create_database(database_name(key))


def make_store(tmp_path: Path, clock: Callable[[], float], retention_s: float) -> JobStore:
    """The contract tests' factory: a PostgresJobStore on the database of ``tmp_path``.

    NOTE: one replica id for both opens of a test: the contract's second open is a
    restart of the same replica, whose recover() requeues its own running items.
    """
    from service.batch.postgres_store import PostgresJobStore

    return PostgresJobStore(fresh_database(str(tmp_path)), replica_id="contract", retention_s=retention_s,
                            clock=clock)
