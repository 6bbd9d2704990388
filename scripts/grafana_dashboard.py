"""Builds the Grafana dashboard ``deploy/grafana/inference.json`` from ``scripts/dashboard_panels.py``.

Usage: ``python scripts/grafana_dashboard.py [--check]`` writes the JSON (``--check``:
exit 1 if the committed file differs). Every query names metrics the server
exports for Prometheus (``--prometheus-port``); ``tests/model/deploy/test_dashboard.py``
checks them against a live server's scrape and that the file is up to date.

The dashboard has a ``datasource`` variable (any Prometheus) and an
``instance`` variable (the scrape targets that export ``inference_uptime_seconds``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dashboard_panels import DS, ROWS, Panel  # NOTE: scripts/ is sys.path[0] when run as a script

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "inference.json"


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    height = 4 if p.kind == "stat" else 8
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if p.stack else 0}
    if p.stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": p.unit, **({"custom": custom} if p.kind == "timeseries" else {})},
            "overrides": [],
        },
        "options": p.options
        or (
            {"legend": {"displayMode": "list", "placement": "bottom"}}
            if p.kind == "timeseries"
            else {"reduceOptions": {"calcs": ["lastNotNull"]}}
        ),
        "targets": [
            {"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(p.targets)
        ],
    }


def panels() -> list[dict[str, Any]]:
    """Rows and their panels, laid out left to right on a 24-column grid."""
    out: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        out.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for p in row:
            if x + p.width > 24:
                x, y, line_h = 0, y + line_h, 0
            out.append(_panel(p, pid, x, y))
            pid, x, line_h = pid + 1, x + p.width, max(line_h, out[-1]["gridPos"]["h"])
        y += line_h
    return out


def dashboard() -> dict[str, Any]:
    """The whole dashboard model (Grafana 10+ JSON; import it or provision it from a file)."""
    instance = {
        "name": "instance",
        "label": "instance",
        "type": "query",
        "datasource": DS,
        "query": "label_values(inference_uptime_seconds, instance)",
        "definition": "label_values(inference_uptime_seconds, instance)",
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }
    datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    return {
        "uid": "inference-server",
        "title": "Inference server",
        "description": "llama.cpp gRPC inference server: traffic, latency per tier, engine, KV cache, structured output, tenants.",
        "tags": ["inference", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource, instance]},
        "annotations": {"list": []},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--check", action="store_true", help="fail if the committed JSON is not what this script makes"
    )
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/grafana_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
