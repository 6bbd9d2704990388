"""Scenario O (replicas) — one batch job on replicas sharing PostgreSQL vs what a user does today (SQLite each).

One job of 300 short items (prompts of 8-24 tokens, 16 output tokens, greedy, ignore_eos), on
server replicas with 1 llama.cpp thread each (``--no-adaptive-threads``), on this machine's loopback:

* ``pg_3``: 3 replicas sharing one PostgreSQL store (a throwaway cluster, tests/support/pg.py), the
  job uploaded through the first; every replica's worker takes items;
* ``pg_1``: 1 replica alone on the same kind of store;
* ``sqlite_3``: 3 independent replicas, each on its own SQLite file, each given a third (100 items);
* ``pg_3_kill``: ``pg_3`` with one replica killed (SIGKILL) after a third of the items: its leased
  items run again elsewhere after ``--batch-lease-s``.

Items/s is the job's store-side span: items / (last ``completed_at`` - first ``in_progress_at``)
(for ``sqlite_3`` over the three jobs), so the upload is not counted. The database's share: the
seconds the replicas' store threads spent in store calls (``inference.batch.store_time{op}`` from each
replica's /metrics; wall time, so it includes waits for the CPU and the GIL on a busy machine), per
item and as a share of the replicas' time (replicas x span), and the CPU the PostgreSQL server
(postmaster and backends) used per item. Fresh servers
and a fresh database for every run; the arms alternate and repeat (``BENCH_REPLICAS_REPEATS``,
default 3), ``uptime`` is recorded before each. Target: ``pg_3`` >= 0.9x ``sqlite_3`` items/s.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2 as bpb

from bench.harness.batch_jobs import get, item, submit, wait
from bench.harness.config import BenchConfig, say
from bench.harness.procs import GrpcServer, cpu_seconds, free_port
from bench.harness.prompts import PromptMaker
from bench.harness.stats import ratio
from bench.harness.tables import fmt, table, verdict

ARMS = ("pg_3", "sqlite_3", "pg_1", "pg_3_kill")
# NOTE: 3, not 2: on this shared machine one run of an arm went from 24 s to 81 s when other work started
REPEATS = int(os.environ.get("BENCH_REPLICAS_REPEATS", "3"))
FLAGS = ("--no-adaptive-threads",)
BATCH = "inference.v1.BatchService"
STORE_TIME = re.compile(r'^inference_batch_store_time\w*\{([^}]*)\} (\S+)$', re.M)


@dataclass(frozen=True)
class Plan:
    items: int
    out_tokens: int
    repeats: int


FULL, QUICK = Plan(300, 16, REPEATS), Plan(30, 4, 1)


def _items(prompts: list[str], out_tokens: int, prefix: str) -> list[bpb.BatchItem]:
    return [item(f"{prefix}{n:04d}", p, out_tokens) for n, p in enumerate(prompts)]


class Replica(GrpcServer):
    """A server with 1 compute thread on ``--batch-db db`` as ``replica_id``, with Prometheus metrics."""

    def __init__(self, cfg: BenchConfig, label: str, db: str, replica_id: str) -> None:
        self.metrics_port = free_port()
        super().__init__(label, cfg.model, "--batch-db", db, "--replica-id", replica_id, "--prometheus-port",
                         str(self.metrics_port), *FLAGS, threads=1)

    def __enter__(self) -> Replica:
        self.start()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """BatchService SERVING: a PostgreSQL store opens just after the server itself is SERVING."""
        with grpc.insecure_channel(self.target) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=BATCH), timeout=1.0)
            except grpc.RpcError:
                return False
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def _pg_cpu_s(pg: Any) -> float:
    """CPU seconds of the PostgreSQL server so far: the postmaster and its children (the backends)."""
    postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(stat.parent.name))
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            total += cpu_seconds(pid)
    return total


def _store_seconds(servers: list[Replica]) -> dict[str, float]:
    """Seconds spent in store calls by method, summed over the replicas still up."""
    out: dict[str, float] = {}
    for srv in servers:
        if not srv.alive():
            continue
        url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            page = resp.read().decode()
        for labels, value in STORE_TIME.findall(page):
            op = re.search(r'op="(\w+)"', labels)
            if op:
                out[op.group(1)] = out.get(op.group(1), 0.0) + float(value)
    return out


def _span(jobs: list[bpb.Batch]) -> float:
    start = min(j.in_progress_at.ToNanoseconds() for j in jobs)
    end = max(j.completed_at.ToNanoseconds() for j in jobs)
    return (end - start) / 1e9


def _kill_after(target: str, job_id: str, victim: Replica, done: int) -> dict[str, Any]:
    """SIGKILL ``victim`` once ``done`` items of the job finished; what the job looked like then."""
    seen = wait(target, job_id, lambda b: b.counts.completed >= done)
    assert victim.proc is not None
    victim.proc.kill()
    return {"completed": seen.counts.completed, "running": seen.counts.running, "at": time.time()}


def _shared(cfg: BenchConfig, pg: Any, arm: str, run: int, items: list[bpb.BatchItem]) -> dict[str, Any]:
    """``pg_3``, ``pg_1`` or ``pg_3_kill``: one job on replicas sharing a fresh database."""
    n = 1 if arm == "pg_1" else 3
    dbname = f"bench_{arm}_{run}"
    pg.create_database(dbname)
    with ExitStack() as stack:
        servers = [stack.enter_context(Replica(cfg, f"O-{arm}-{run}-r{i}", pg.url(dbname), f"r{i}"))
                   for i in range(n)]
        cpu0 = _pg_cpu_s(pg)
        job_id = submit(servers[0].target, items, f"{arm}-{run}")
        kill = _kill_after(servers[0].target, job_id, servers[-1], len(items) // 3) if arm == "pg_3_kill" else {}
        if kill:  # NOTE: after the kill: exactly the items the dead replica held (its leases)
            kill["leased"] = _sql(pg, dbname, f"SELECT count(*) FROM batch_items WHERE state = 'running' "
                                              f"AND owner = 'r{n - 1}'")[0][0]
        final = wait(servers[0].target, job_id)
        pg_cpu = _pg_cpu_s(pg) - cpu0
        store = _store_seconds(servers)
        visible = [get(s.target, job_id).id == job_id for s in servers if s.alive()]
    rows = _sql(pg, dbname, "SELECT replica, count(*), sum(attempts) FROM batch_results GROUP BY replica")
    out = _summary([final], store, n, len(items))
    out |= {"split": {r: int(c) for r, c, _ in rows}, "attempts": int(sum(a for _, _, a in rows)),
            "visible_on_all_live_replicas": all(visible), "pg_cpu_ms_per_item": 1000 * pg_cpu / len(items)}
    if kill:
        out["kill"] = kill
    return out


def _independent(cfg: BenchConfig, arm: str, run: int, items: list[bpb.BatchItem], tmp: Path) -> dict[str, Any]:
    """``sqlite_3``: 3 replicas with a SQLite file each, each given a third of the items."""
    thirds = [items[i::3] for i in range(3)]
    with ExitStack() as stack:
        servers = [stack.enter_context(Replica(cfg, f"O-{arm}-{run}-r{i}", str(tmp / f"{arm}-{run}-{i}.db"), "solo"))
                   for i in range(3)]
        jobs: list[bpb.Batch | None] = [None] * 3

        def submit_and_wait(i: int) -> None:
            jobs[i] = wait(servers[i].target, submit(servers[i].target, thirds[i], f"{arm}-{run}-{i}"))

        threads = [threading.Thread(target=submit_and_wait, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        store = _store_seconds(servers)
    done = [j for j in jobs if j is not None]
    assert len(done) == 3, "a SQLite replica's job did not finish"
    out = _summary(done, store, 3, len(items))
    return out | {"split": {f"r{i}": j.counts.completed for i, j in enumerate(done)},
                  "job_spans_s": [_span([j]) for j in done]}


def _summary(jobs: list[bpb.Batch], store: dict[str, float], replicas: int, items: int) -> dict[str, Any]:
    span = _span(jobs)
    completed = sum(j.counts.completed for j in jobs)
    db_s = sum(store.values())
    return {
        "states": [bpb.BatchState.Name(j.state) for j in jobs], "completed": completed, "span_s": span,
        "items_per_s": completed / span if span > 0 else None, "replicas": replicas,
        "store_s": store, "db_ms_per_item": 1000 * db_s / items,
        "claim_finish_ms_per_item": 1000 * (store.get("claim", 0.0) + store.get("finish", 0.0)) / items,
        "db_share": db_s / (replicas * span) if span > 0 else None,
    }


def _sql(pg: Any, dbname: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg.admin_dsn(dbname), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query).fetchall()]


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run(cfg: BenchConfig) -> dict[str, Any]:
    from tests.support.pg import PgCluster, find_bindir

    plan = QUICK if cfg.quick else FULL
    prompts = PromptMaker(cfg.model, seed=2600).unique(plan.items, 8, 24)
    items = _items(prompts, plan.out_tokens, "o")
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    pg = PgCluster(find_bindir()).start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
            for rep in range(plan.repeats):
                for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:  # NOTE: alternate the order between repeats
                    load = _uptime()
                    say(f"  {arm} run {rep + 1}: {load}")
                    r = (_independent(cfg, arm, rep, items, Path(tmp)) if arm == "sqlite_3"
                         else _shared(cfg, pg, arm, rep, items))
                    r["uptime_before"] = load
                    runs[arm].append(r)
                    say(f"    {r['completed']} items in {r['span_s']:.1f} s = {r['items_per_s']:.2f} items/s; "
                        f"split {r['split']}; store {r['db_ms_per_item']:.2f} ms/item ({100 * r['db_share']:.2f}%), "
                        f"PostgreSQL CPU {r.get('pg_cpu_ms_per_item', 0):.2f} ms/item")
    finally:
        pg.stop()
    return _conclude(plan, runs)


def _median(values: list[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _conclude(plan: Plan, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per arm and the ratios the issue asks for (pg_3 vs sqlite_3, pg_3 vs pg_1)."""
    med = {arm: _median([r["items_per_s"] for r in rs]) for arm, rs in runs.items()}
    kills = runs["pg_3_kill"]
    rework = [r["attempts"] - r["completed"] for r in kills]
    return {
        "plan": plan.__dict__, "runs": runs, "items_per_s": med,
        "db_ms_per_item": {arm: _median([r["db_ms_per_item"] for r in rs]) for arm, rs in runs.items()},
        "claim_finish_ms_per_item": {
            arm: _median([r["claim_finish_ms_per_item"] for r in rs]) for arm, rs in runs.items()
        },
        "db_share": {arm: _median([r["db_share"] for r in rs]) for arm, rs in runs.items()},
        "pg_cpu_ms_per_item": {arm: _median([r.get("pg_cpu_ms_per_item") for r in rs]) for arm, rs in runs.items()},
        "checks": {
            "pg_3_vs_sqlite_3": ratio(med["pg_3"], med["sqlite_3"]), "target_pg_3_vs_sqlite_3": 0.9,
            "pg_3_vs_pg_1": ratio(med["pg_3"], med["pg_1"]),
            "kill_rework": rework, "kill_leased": [r.get("kill", {}).get("leased") for r in kills],
            "all_completed": all(s == "BATCH_STATE_COMPLETED" for rs in runs.values() for r in rs for s in r["states"]),
        },
    }


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario O."""
    p, c = r["plan"], r["checks"]
    rows = []
    for arm, rs in r["runs"].items():
        rows.append([arm, " / ".join(fmt(x["items_per_s"], 2) for x in rs), fmt(r["items_per_s"][arm], 2),
                     fmt(r["claim_finish_ms_per_item"][arm], 2), fmt(r["db_ms_per_item"][arm], 2),
                     fmt(100 * (r["db_share"][arm] or 0), 2),
                     fmt(r["pg_cpu_ms_per_item"][arm], 2), "; ".join(str(x["split"]) for x in rs)])
    return "\n".join([
        f"One job of {p['items']} items (8-24-token prompts, {p['out_tokens']} output tokens), replicas of 1 "
        f"thread each, {p['repeats']} alternating runs per arm; items/s over the job's store-side span.",
        "",
        table(["arm", "items/s per run", "median", "claim + finish ms/item", "all store calls ms/item",
               "store share %", "PostgreSQL CPU ms/item", "split"], rows),
        "",
        f"- 3 replicas on PostgreSQL vs 3 independent SQLite replicas: **{fmt(c['pg_3_vs_sqlite_3'], 3)}x** "
        f"(target >= 0.9: {verdict(c['pg_3_vs_sqlite_3'], 0.9)}); vs 1 replica alone: {fmt(c['pg_3_vs_pg_1'], 2)}x",
        f"- kill -9 of one replica after a third: extra runs {c['kill_rework']} (the items it held leased: "
        f"{c['kill_leased']}); every job completed: {c['all_completed']}",
    ])
