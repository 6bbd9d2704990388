"""A server process that also tells a test its own prefix index: ``python -m tests.support.indexed_replica SOCKET FLAGS``.

Replicas on hosts of their own (tests/model/scale/test_prefix_routing.py) are processes, so a test
cannot read ``KVBlockManager.indexed()`` in process as tests/model/kv/test_kv_events.py does, and the
server has no endpoint that lists its blocks. This launcher parses ``FLAGS`` as ``python -m service``
does (``load_config``), runs the real server in process (``RunningServer``: the integrity check after
every engine step) and listens on the Unix socket ``SOCKET``; a path socket is reachable from every
network namespace. Each connection gets one JSON line, once the engine is idle::

    {"pool": [uint64, ...], "host": [uint64, ...], "violations": [...]}

the chain hashes of the KV pool's registered blocks and of the host tier's, as the events send them
(unsigned), and the integrity violations seen so far. SIGTERM stops the server and removes the socket.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from typing import Any

from service.config import load_config
from tests.support.server import RunningServer, wait_idle

U64 = 1 << 64


def snapshot(srv: RunningServer) -> dict[str, Any]:
    """The replica's own index once its engine has nothing waiting or running."""
    wait_idle(srv, timeout=600)
    pool, host = srv.engine.kv.indexed()
    return {"pool": sorted(h % U64 for h in pool), "host": sorted(h % U64 for h in host),
            "violations": srv.violations[:3]}


def own_index(path: str, timeout: float = 600.0) -> dict[str, Any]:
    """Ask the launcher listening at ``path`` for its replica's index (any process, any namespace)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    return dict(json.loads(data))


def main(path: str, argv: list[str]) -> None:
    srv = RunningServer(load_config(argv))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # NOTE: bound once the server serves: the socket's existence says "ready"
    listener.listen()
    listener.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(json.dumps(snapshot(srv)).encode() + b"\n")
    finally:
        listener.close()
        os.unlink(path)
        srv.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
