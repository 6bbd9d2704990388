"""Replicas as separate hosts: 3 servers, each in its own network namespace, one PostgreSQL job store.

The harness (tests/support/replicas.py) puts every replica (``python -m service``, the default
model, 1 thread, ``--batch-lease-s 5``), the clients and the database on hosts of their own,
joined by a bridge. Each test is bounded in time (``timeout``) and leaves every replica serving
for the next one:

* a job created through A is read, listed, watched and cancelled through B and C; another tenant
  sees nothing of it on any replica; an idempotency key names one job on every replica;
* 3 replicas share one 120-item job (each replica's worker runs a share; the split is printed);
* ``kill -9`` of one replica mid-job: its leased items run again on the others once the lease
  expired (not before); the job completes with exactly one result per custom_id;
* one replica's link cut mid-job and mid-stream: its streams end UNAVAILABLE, a round_robin
  client's watch carries on elsewhere, its leases are taken over; with the link back, no duplicate;
* the database restarted mid-job: while it is down BatchService answers UNAVAILABLE and Generate
  keeps serving; the job then completes with nothing lost or duplicated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from inference.v1 import batch_pb2 as bpb

from tests.support import replica_calls as rc
from tests.support.replicas import TOKENS, ReplicaHosts

pytestmark = pytest.mark.model
LEASE_S = 5.0
T1, T2 = TOKENS["t1"], TOKENS["t2"]
PROMPTS = ["Once upon a time", "The capital of France is", "List three colours:", "Water boils at"]
T = TypeVar("T")


def until(check: Callable[[], T], timeout: float, what: str | Callable[[], str]) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what if isinstance(what, str) else what()}")
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaHosts]:
    h = ReplicaHosts(tmp_path_factory.mktemp("netns"), replicas=3, lease_s=LEASE_S)
    try:
        h.start()
        yield h
    finally:
        h.close()


@pytest.fixture(autouse=True)
def all_serving(hosts: ReplicaHosts) -> Iterator[None]:
    """Every test starts and ends with all replicas up (a test that killed one restarts it)."""
    yield
    dead = [r for r in hosts.replicas if r.proc is None or r.proc.poll() is not None]
    if dead:
        hosts.start(*dead)


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def submit(hosts: ReplicaHosts, via: int, prefix: str, n: int, max_tokens: int = 16) -> str:
    job = hosts.cli.call(rc.submit, hosts.targets[via], T1, ids(prefix, n), PROMPTS, max_tokens)
    assert job.state == bpb.BATCH_STATE_IN_PROGRESS and job.counts.total == n
    return str(job.id)


def store_counts(hosts: ReplicaHosts, job_id: str) -> dict[tuple[str, str], int]:
    """(item state, owner) -> items of the job, straight from the database."""
    rows = hosts.sql("SELECT state, coalesce(owner, ''), count(*) FROM batch_items WHERE job_id = %s "
                     "GROUP BY 1, 2", job_id)
    return {(s, o): n for s, o, n in rows}


def results_by_id(hosts: ReplicaHosts, job_id: str) -> dict[str, tuple[str, int, str]]:
    """custom_id -> (replica that recorded it, attempts, error status), asserting one row each."""
    rows = hosts.sql("SELECT custom_id, coalesce(replica, ''), attempts, error_status FROM batch_results "
                     "WHERE job_id = %s", job_id)
    out = {cid: (replica, attempts, err) for cid, replica, attempts, err in rows}
    assert len(out) == len(rows)
    return out


def final_via(hosts: ReplicaHosts, via: int, job_id: str, timeout: float = 240, token: str = T1) -> bpb.Batch:
    """Watch the job through replica ``via`` until it is final; after UNAVAILABLE (its store reconnects)
    wait for its BatchService to be SERVING and watch again, as a client would; the final job."""
    deadline, target = time.monotonic() + timeout, hosts.targets[via]
    while (left := deadline - time.monotonic()) > 0:
        code, events = hosts.cli.call(rc.watch, target, token, job_id, "", left, timeout=left + 30)
        if code != "UNAVAILABLE":
            break
        hosts.cli.call(rc.wait_serving, target, "inference.v1.BatchService", left, timeout=left + 30)
    assert code == "OK", (code, events[-3:])
    code, job = hosts.cli.call(rc.get, hosts.targets[via], token, job_id)
    assert code == "OK" and job is not None
    return job


def assert_one_clean_result_each(hosts: ReplicaHosts, via: int, job_id: str, expected: list[str]) -> list[Any]:
    code, rows = hosts.cli.call(rc.results, hosts.targets[via], T1, job_id)
    assert code == "OK" and rows is not None
    assert [r[0] for r in rows] == expected  # exactly one result per custom_id
    assert [r for r in rows if r[3]] == []  # none failed
    return rows


@pytest.mark.timeout(420)
def test_a_job_created_through_a_is_read_listed_watched_and_cancelled_through_b_and_c(
    hosts: ReplicaHosts, tmp_path: Path
) -> None:
    a, b, c = hosts.targets
    job_id = submit(hosts, 0, "x", 90)
    code, seen = hosts.cli.call(rc.get, b, T1, job_id)
    assert code == "OK" and seen is not None and (seen.id, seen.counts.total) == (job_id, 90)
    assert job_id in (hosts.cli.call(rc.list_ids, c, T1)[1] or [])
    for call, target in ((rc.get, b), (rc.cancel, a), (rc.results, c)):
        assert hosts.cli.call(call, target, T2, job_id)[0] == "NOT_FOUND"  # another tenant, any replica
    assert hosts.cli.call(rc.list_ids, c, T2) == ("OK", [])
    started = tmp_path / "watch-started"
    watch = hosts.cli.submit(rc.watch, b, T1, job_id, str(started), 120.0)
    until(lambda: started.exists() and sum(n for (s, _), n in store_counts(hosts, job_id).items()
                                           if s == "completed") >= 9, 120, "9 items done")
    code, cancelled = hosts.cli.call(rc.cancel, c, T1, job_id)
    t_cancel = time.monotonic()
    assert code == "OK" and cancelled is not None
    assert cancelled.state in (bpb.BATCH_STATE_CANCELLING, bpb.BATCH_STATE_CANCELLED)
    until(lambda: hosts.cli.call(rc.get, a, T1, job_id)[1].state == bpb.BATCH_STATE_CANCELLED,  # type: ignore[union-attr]
          60, "the cancel stopped the items on every replica")
    print(f"\ncancel through C to CANCELLED seen through A: {time.monotonic() - t_cancel:.2f} s")
    code, events = watch.result(60)
    assert code == "OK" and events[-1][0] == bpb.BATCH_STATE_CANCELLED
    assert len({e[1] for e in events}) >= 2  # B's stream saw the progress
    assert {r for r, _, _ in results_by_id(hosts, job_id).values()} - {"r1", ""}  # ... made by A or C too
    done = store_counts(hosts, job_id)
    assert sum(done.values()) == 90 and not any(s in ("queued", "running") for s, _ in done)
    assert len(results_by_id(hosts, job_id)) == 90


@pytest.mark.timeout(180)
def test_an_idempotency_key_names_one_job_on_every_replica(hosts: ReplicaHosts) -> None:
    made = [hosts.cli.call(rc.submit, t, T1, ids("k", 3), PROMPTS, 4, "key-1") for t in hosts.targets]
    assert len({j.id for j in made}) == 1
    other = hosts.cli.call(rc.submit, hosts.targets[1], T2, ids("k", 3), PROMPTS, 4, "key-1")
    assert other.id != made[0].id  # the key is per tenant
    for job, token in ((made[0], T1), (other, T2)):
        assert final_via(hosts, 2, job.id, token=token).state == bpb.BATCH_STATE_COMPLETED


@pytest.mark.timeout(480)
def test_three_replicas_share_one_120_item_job(hosts: ReplicaHosts, record_property: Any) -> None:
    # NOTE: 120 items (40 a replica if shared evenly) prove the sharing as 300 did, in 40% of the time;
    # bench scenario O measures the 300-item job.
    n = 120
    job_id = submit(hosts, 0, "s", n)
    t0 = time.monotonic()
    code, events = hosts.cli.call(rc.watch_balanced, hosts.targets, T1, job_id, "", timeout=400)
    elapsed = time.monotonic() - t0
    assert code == "OK" and events[-1][0] == bpb.BATCH_STATE_COMPLETED and events[-1][1] == n
    split = {r: c for r, c in hosts.sql(
        "SELECT replica, count(*) FROM batch_results WHERE job_id = %s GROUP BY replica ORDER BY replica", job_id)}
    print(f"\n{n} items on 3 replicas in {elapsed:.1f} s: split {split}")
    record_property("split", split)
    assert set(split) == {"r0", "r1", "r2"} and sum(split.values()) == n
    assert_one_clean_result_each(hosts, 2, job_id, ids("s", n))


def running_on(hosts: ReplicaHosts, job_id: str, replica: str) -> list[str]:
    """custom_ids of the job's items that ``replica`` holds a claim on (RUNNING, its lease)."""
    rows = hosts.sql("SELECT custom_id FROM batch_items WHERE job_id = %s AND state = 'running' AND owner = %s "
                     "ORDER BY custom_id", job_id, replica)
    return [r[0] for r in rows]


def held_by(hosts: ReplicaHosts, job_id: str, custom_ids: list[str]) -> dict[str, str]:
    """custom_id -> the replica running it now or that recorded its result ("" while it is queued)."""
    running = dict(hosts.sql("SELECT custom_id, coalesce(owner, '') FROM batch_items WHERE job_id = %s "
                             "AND state = 'running'", job_id))
    recorded = {cid: replica for cid, (replica, _, _) in results_by_id(hosts, job_id).items()}
    return {cid: running.get(cid) or recorded.get(cid, "") for cid in custom_ids}


def done_count(hosts: ReplicaHosts, job_id: str) -> int:
    return int(hosts.sql("SELECT count(*) FROM batch_results WHERE job_id = %s", job_id)[0][0])


@pytest.mark.timeout(300)
def test_kill_9_of_one_replica_mid_job_reruns_its_leased_items_elsewhere_after_the_lease(
    hosts: ReplicaHosts,
) -> None:
    victim = hosts.replicas[2]
    job_id = submit(hosts, 0, "d", 60)
    until(lambda: done_count(hosts, job_id) >= 6 and running_on(hosts, job_id, "r2"), 120, "r2 runs items")
    victim.kill()
    t_kill = time.time()
    rows = hosts.sql("SELECT custom_id, lease_until FROM batch_items WHERE job_id = %s AND state = 'running' "
                     "AND owner = 'r2' ORDER BY custom_id", job_id)  # NOTE: after the kill: what r2 never finishes
    leased, lease_left = [r[0] for r in rows], min(r[1] for r in rows) - t_kill
    until(lambda: not running_on(hosts, job_id, "r2"), LEASE_S + 60, "r2's leases taken over")
    taken_over_s = time.time() - t_kill
    print(f"\nkill -9 of r2 with {len(leased)} leased items ({lease_left:.1f} s of lease left): "
          f"taken over after {taken_over_s:.1f} s")
    assert taken_over_s >= lease_left - 0.2  # NOTE: not before the lease ran out (seen within a poll)
    job = final_via(hosts, 0, job_id)
    assert job.state == bpb.BATCH_STATE_COMPLETED and job.counts.completed == 60
    assert_one_clean_result_each(hosts, 1, job_id, ids("d", 60))
    done = results_by_id(hosts, job_id)
    assert all(done[cid][0] != "r2" and done[cid][1] >= 2 for cid in leased), {c: done[c] for c in leased}
    assert sum(attempts for _, attempts, _ in done.values()) - 60 <= len(leased)  # rework: the leased items


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (any labels) in a /metrics page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.mark.timeout(360)
def test_a_cut_link_ends_its_streams_and_its_leases_are_taken_over_without_duplicates_after_restore(
    hosts: ReplicaHosts, tmp_path: Path,
) -> None:
    victim = hosts.replicas[1]
    job_id = submit(hosts, 0, "c", 150)
    flags = {k: tmp_path / k for k in ("watch", "generate", "balanced")}
    streams = {
        "watch": hosts.cli.submit(rc.watch, victim.target, T1, job_id, str(flags["watch"]), 300.0),
        "generate": hosts.cli.submit(rc.generate, victim.target, T1, "Tell a long story:", 3000,
                                     str(flags["generate"])),
        "balanced": hosts.cli.submit(rc.watch_balanced, hosts.targets, T1, job_id, str(flags["balanced"])),
    }
    until(lambda: all(f.exists() for f in flags.values()) and running_on(hosts, job_id, "r1"), 120,
          lambda: f"streams open (open: {[f.name for f in flags.values() if f.exists()]}; ended: "
          f"{[(k, s.result()) for k, s in streams.items() if s.done()]}) and r1 running items")
    hosts.net.cut("r1")
    held = running_on(hosts, job_id, "r1")
    try:
        assert streams["watch"].result(60)[0] == "UNAVAILABLE"
        code, deltas = streams["generate"].result(60)
        assert code == "UNAVAILABLE" and deltas > 0
        # NOTE: taken over means run by another replica; restored before that, r1 may claim them again itself
        # (a busy machine's r0 and r2 can still be finishing their own items when r1's leases are requeued).
        until(lambda: all(r not in ("", "r1") for r in held_by(hosts, job_id, held).values()), LEASE_S + 120,
              lambda: f"r1's leases taken over by another replica: {held_by(hosts, job_id, held)}")
        # NOTE: r1 itself notices once its connections time out (tcp_user_timeout, then the pool's wait)
        until(lambda: "batch store unavailable" in victim.log.read_text(), 60, "r1 reports the store unavailable")
    finally:
        hosts.net.restore("r1")
    assert hosts.cli.call(rc.wait_serving, victim.target, "inference.v1.BatchService", 120.0, timeout=150) == "SERVING"
    code, events = streams["balanced"].result(300)
    assert code == "OK" and events[-1][0] == bpb.BATCH_STATE_COMPLETED  # the client's retry landed elsewhere
    assert_one_clean_result_each(hosts, 0, job_id, ids("c", 150))
    done = results_by_id(hosts, job_id)
    assert all(done[cid][0] != "r1" for cid in held), {c: done[c] for c in held}
    page = until(lambda: hosts.cli.call(rc.scrape, victim.metrics_url), 30, "r1's metrics")
    assert metric(page, "inference_batch_store_errors") > 0 and metric(page, "inference_batch_store_up") == 1
    assert "batch store reachable again" in victim.log.read_text()
    print(f"\nlink of r1 cut with {len(held)} items leased; taken over; results: {len(done)} for 150 items")


@pytest.mark.timeout(300)
def test_a_database_restart_mid_job_loses_and_duplicates_nothing_and_generate_serves_meanwhile(
    hosts: ReplicaHosts,
) -> None:
    a = hosts.targets[0]
    job_id = submit(hosts, 1, "r", 60)
    until(lambda: done_count(hosts, job_id) >= 6, 120, "6 items done")
    outage: dict[str, Any] = {}

    def while_down() -> None:
        outage["get"] = hosts.cli.call(rc.get, a, T1, job_id)[0]
        outage["batch_health"] = until(
            lambda: hosts.cli.call(rc.health, a, "inference.v1.BatchService") == "NOT_SERVING" and "NOT_SERVING",
            30, "BatchService NOT_SERVING while the database is down")
        outage["generate_health"] = hosts.cli.call(rc.health, a, "inference.v1.InferenceService")
        outage["generate"] = hosts.cli.call(rc.generate, a, T1, "Hello", 8)

    assert hosts.pg is not None
    hosts.pg.restart(down=while_down)
    assert outage == {"get": "UNAVAILABLE", "batch_health": "NOT_SERVING", "generate_health": "SERVING",
                      "generate": ("OK", outage["generate"][1])} and outage["generate"][1] > 0
    job = final_via(hosts, 2, job_id)
    assert job.state == bpb.BATCH_STATE_COMPLETED and job.counts.completed == 60
    assert_one_clean_result_each(hosts, 0, job_id, ids("r", 60))
    for r in hosts.targets:
        assert hosts.cli.call(rc.wait_serving, r, "inference.v1.BatchService", 60.0, timeout=90) == "SERVING"
