"""The Grafana dashboard and the alert rules query only what the server really exports.

A dedicated in-process server with the Prometheus exporter on a free port gets
traffic of both tiers (completed, cancelled, preempted and queue-full
requests); its ``/metrics`` page is scraped and every metric name and label
used by a dashboard query (``deploy/grafana/inference.json``) or an alert rule
(``deploy/prometheus/alerts.yml``) must appear in it. ``up`` (and the
``instance``/``job`` labels) are made by Prometheus itself at scrape time.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from service.observability.setup import make_telemetry
from service.server import InferenceServer
from tests.support.helpers import preempt_reject_cancel, req, run_stream, wait_for
from tests.support.server import server_config

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "inference.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
SCRAPE_MADE = {"up"}  # series Prometheus makes itself for every target
SCRAPE_LABELS = {"instance", "job"}  # labels Prometheus adds at scrape time
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def promql_refs(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression refers to.

    Names are identifiers not followed by ``(`` (functions, aggregations)
    outside strings, label matchers, range selectors and grouping clauses;
    labels are those of grouping clauses and matchers.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = {x.strip() for _, group in re.findall(GROUPING, s) for x in group.split(",") if x.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", s):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    s = re.sub(GROUPING, " ", s)
    s = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", s)
    s = re.sub(r"(?<![A-Za-z0-9_:])\d[\w.]*", " ", s)  # numbers and durations (5m, 1e3)
    names = {
        m.group(0)
        for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s)
        if not s[m.end() :].lstrip().startswith("(") and m.group(0).lower() not in KEYWORDS
    }
    return names, labels


def test_promql_refs_finds_names_and_labels() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, inference_priority) (rate(ttft_bucket{instance=~"$i",'
        'x!="a(b)"}[$__rate_interval]))) > 3 * avg_over_time(steps:mean5m[1d] offset 1h) and on (job) up == 0'
    )
    names, labels = promql_refs(expr)
    assert names == {"ttft_bucket", "steps:mean5m", "up"}
    assert labels == {"le", "inference_priority", "instance", "x", "job"}


def dashboard_exprs() -> dict[str, list[str]]:
    """Panel title -> its query expressions (rows have none and are left out)."""
    doc = json.loads(DASHBOARD.read_text())
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])] for p in doc["panels"] if p["type"] != "row"
    }


def alert_exprs() -> tuple[dict[str, str], set[str]]:
    """(rule name -> expr, recording-rule names) read from alerts.yml without a YAML library.

    ``expr: |`` block scalars are joined; the file's rules keep ``record``/``alert`` before ``expr``.
    """
    lines = ALERTS.read_text().splitlines()
    exprs: dict[str, str] = {}
    records: set[str] = set()
    name = ""
    for i, line in enumerate(lines):
        m = re.match(r"\s*-?\s*(alert|record|expr):\s*(.*)$", line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip()
        if key in ("alert", "record"):
            name = value
            if key == "record":
                records.add(value)
            continue
        if value in ("|", ">", "|-", ">-"):
            indent = len(line) - len(line.lstrip()) + 1
            block = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) < indent:
                    break
                block.append(nxt.strip())
            value = " ".join(block)
        exprs[name] = value
    return exprs, records


class PromServer:
    """A server with the Prometheus exporter (``--prometheus-port``) on its own loop thread."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_port = int(s.getsockname()[1])
        # One running sequence and a batch queue of one: preemption and rejection are easy to provoke.
        cfg = server_config(prometheus_port=self.metrics_port, max_running=1, queue_limit_batch=1)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = InferenceServer(cfg, make_telemetry(cfg))
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def scrape(self) -> dict[str, set[str]]:
        """Sample name -> label names seen on it."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
        return out

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def _traffic(target: str) -> dict[str, Any]:
    """Completed, preempted, cancelled and queue-full requests of both tiers; the final events."""
    with grpc.insecure_channel(target) as ch:
        finals = preempt_reject_cancel(ch)
        done = run_stream(ch, [req("b-done", "Colours:", 4, ignore_eos=True, priority=pb.PRIORITY_BATCH)])
    assert done["b-done"].done is not None
    return finals


@pytest.fixture(scope="module")
def scraped() -> Iterator[dict[str, set[str]]]:
    srv = PromServer()
    try:
        finals = _traffic(srv.target)
        assert finals["refused"].error.status == "RESOURCE_EXHAUSTED"
        # the exporter reads a snapshot cached for otel_metrics.SNAPSHOT_TTL_S: wait for one with the
        # refused request in it
        key = "gen_ai_server_request_duration_seconds_count"
        assert wait_for(lambda: "error_type" in srv.scrape().get(key, set()), timeout=600), srv.scrape().get(key)
        yield srv.scrape()
    finally:
        srv.close()


def _missing(exprs: dict[str, list[str]], scraped: dict[str, set[str]], defined: set[str]) -> list[str]:
    """Names and labels of ``exprs`` that the scrape lacks (one message each)."""
    problems = []
    for title, queries in exprs.items():
        for expr in queries:
            names, labels = promql_refs(expr)
            for name in sorted(names - scraped.keys() - SCRAPE_MADE - defined):
                problems.append(f"{title}: metric {name} is not exported")
            if names & defined:
                continue  # labels of recorded series: checked on the recording rule's own expr
            seen = set().union(*(scraped.get(n, set()) for n in names)) | SCRAPE_LABELS
            for label in sorted(labels - seen):
                problems.append(f"{title}: label {label} is on none of {sorted(names)}")
    return problems


@pytest.mark.model
def test_dashboard_queries_name_exported_metrics(scraped: dict[str, set[str]]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    for title, queries in exprs.items():
        assert queries, f"panel {title} has no query"
        assert all(promql_refs(q)[0] for q in queries), f"panel {title}: a query names no metric"
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in scraped  # traffic reached the histograms
    assert "error_type" in scraped["gen_ai_server_request_duration_seconds_count"]  # the refused request
    problems = _missing(exprs, scraped, set())
    assert not problems, "\n".join(problems)


@pytest.mark.model
def test_alert_rules_name_exported_metrics(scraped: dict[str, set[str]]) -> None:
    exprs, records = alert_exprs()
    assert len(exprs) >= 6 and records
    for name, expr in exprs.items():
        assert promql_refs(expr)[0], f"rule {name} names no metric"
    problems = _missing({k: [v] for k, v in exprs.items()}, scraped, records)
    assert not problems, "\n".join(problems)


def test_dashboard_json_is_what_the_generator_makes() -> None:
    script = ROOT / "scripts" / "grafana_dashboard.py"
    out = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
