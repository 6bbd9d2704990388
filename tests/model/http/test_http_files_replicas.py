"""The HTTP batch API on two replicas of one PostgreSQL store (round-robin behind a load balancer):
a file uploaded through one replica is there on the other (and in its listing), so the batch is created
on B from A's upload and read back (and listed) on A. The uploaded files live in the shared database, not in a SQLite file
named after the URL (which used to be made under a ``postgresql:`` directory of the working directory).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.model.http.conftest import MODEL
from tests.support.pg import cluster, database_name, fresh_database
from tests.support.server import RunningServer, free_port, start_server, wait_batch_store

pytestmark = pytest.mark.model


@dataclass
class TwoServers:
    a: RunningServer
    b: RunningServer
    dsn: str  # the shared database
    cwd: Path  # the servers' working directory (empty at their start)


@pytest.fixture()
def two_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoServers]:
    """Servers A and B (HTTP on), replicas of one PostgreSQL store, run from an empty working directory.

    NOTE: not named ``replicas``: the suite's model guard knows fixtures by name."""
    dsn = fresh_database(str(tmp_path))  # skipped without PostgreSQL (failed in CI)
    url = cluster().url(database_name(str(tmp_path)))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    started: list[RunningServer] = []
    try:
        for replica in ("a", "b"):
            started.append(start_server(batch_db=url, replica_id=replica, http_port=free_port()))
        for srv in started:
            wait_batch_store(srv, timeout=600)
        yield TwoServers(started[0], started[1], dsn, work)
    finally:
        for srv in started:
            srv.close()


def http(srv: RunningServer) -> httpx2.Client:
    return httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=600)


def wait_done(client: httpx2.Client, batch_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (b := client.get(f"/v1/batches/{batch_id}").json())["status"] not in (
        "completed", "failed", "cancelled", "expired"
    ):
        assert time.monotonic() < deadline, f"batch still {b['status']}"
        time.sleep(0.2)
    return b


@pytest.mark.timeout(300)
def test_a_file_uploaded_to_one_replica_makes_a_batch_on_another(two_servers: TwoServers) -> None:
    import psycopg

    a_srv, b_srv = two_servers.a, two_servers.b
    rows = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL, "prompt": f"Number {i}:", "max_tokens": 4, "temperature": 0}}
            for i in range(3)]
    data = "\n".join(json.dumps(r) for r in rows).encode()
    with http(a_srv) as a, http(b_srv) as b:
        upload = a.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
        assert upload.status_code == 200, upload.text
        file_id = upload.json()["id"]
        with psycopg.connect(two_servers.dsn) as conn:  # in the shared database
            assert conn.execute("SELECT bytes FROM http_files WHERE id = %s", (file_id,)).fetchone() == (len(data),)

        seen = b.get(f"/v1/files/{file_id}")  # the next replica behind round-robin
        assert seen.status_code == 200 and seen.json()["bytes"] == len(data), seen.text
        assert b.get(f"/v1/files/{file_id}/content").content == data
        assert [f["id"] for f in b.get("/v1/files").json()["data"]] == [file_id]  # listed on B too

        created = b.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                              "completion_window": "24h"})
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["input_file_id"] == file_id

        read = a.get(f"/v1/batches/{batch['id']}")
        assert read.status_code == 200 and read.json()["id"] == batch["id"], read.text
        listed = a.get("/v1/batches", params={"limit": 5}).json()
        assert [x["id"] for x in listed["data"]] == [batch["id"]] and listed["has_more"] is False
        done = wait_done(a, batch["id"])
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 3, done
        content = b.get(f"/v1/files/{done['output_file_id']}/content").content
        out = [json.loads(x) for x in content.splitlines()]
        assert sorted(r["custom_id"] for r in out) == ["q0", "q1", "q2"]
        assert a.get(f"/v1/files/{done['output_file_id']}").json()["bytes"] == len(content)

        assert a.delete(f"/v1/files/{file_id}").json()["deleted"] is True  # deleted through A: gone on B
        assert b.get(f"/v1/files/{file_id}").status_code == 404
    made = sorted(str(p.relative_to(two_servers.cwd)) for p in two_servers.cwd.rglob("*"))
    assert not (two_servers.cwd / "postgresql:").exists() and not any("postgres" in p for p in made), made
