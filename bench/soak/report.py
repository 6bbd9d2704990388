"""Plain-text report of a soak run (the document ``bench/soak/run.py`` writes to soak.json)."""

from __future__ import annotations

from typing import Any

from bench.harness.tables import fmt

_ORDER = [
    "STOP",
    "LENGTH",
    "OK",
    "CANCELLED",
    "aborted",
    "DEADLINE_EXCEEDED",
    "OUT_OF_RANGE",
    "RESOURCE_EXHAUSTED",
]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(out)


def outcome_table(by_action: dict[str, dict[str, int]]) -> str:
    """Requests by action (rows) and outcome (columns), with totals."""
    seen = {o for counts in by_action.values() for o in counts}
    cols = [o for o in _ORDER if o in seen] + sorted(seen - set(_ORDER))
    rows = [[a, *(str(c.get(o, 0)) for o in cols), str(sum(c.values()))] for a, c in by_action.items()]
    totals = [sum(c.get(o, 0) for c in by_action.values()) for o in cols]
    rows.append(["total", *(str(t) for t in totals), str(sum(totals))])
    return _table(["action", *cols, "all"], rows)


def render(doc: dict[str, Any]) -> str:
    rss, met, after = doc["rss_anon"], doc["target_met"], doc["after_load"]
    m = doc["machine"]
    slope = rss["slope_mib_per_min_after_1min"]
    parts = [
        "",
        f"== Soak: {doc['config']['minutes']:g} min, {doc['config']['workers']} workers, {m['model']}, "
        f"git {m['git_rev']}{' (service/ modified)' if m.get('git_dirty_service') else ''}, "
        f"load average {m['loadavg_at_start'][0]:.1f} at start, {m['loadavg_at_end'][0]:.1f} at end",
        _table(
            ["RssAnon", "value", "target", "met"],
            [
                [
                    "slope after 1 min (MiB/min)",
                    fmt(slope, 3),
                    f"< {rss['target_mib_per_min']:g}",
                    _yes(met["slope"]),
                ],
                ["slope over the whole run (MiB/min)", fmt(rss["slope_mib_per_min_all"], 3), "", ""],
                [
                    "first / last / max (MiB)",
                    f"{fmt(rss['first_mib'])} / {fmt(rss['last_mib'])} / {fmt(rss['max_mib'])}",
                    "",
                    "",
                ],
                ["samples", str(len(doc["samples"])), "", ""],
            ],
        ),
        "",
        f"{doc['requests']['total']} requests in {doc['load_s']:.0f} s; server: "
        f"{after.get('prompt_tokens_total', '-')} prompt tokens, {after.get('generated_tokens_total', '-')} generated",
        outcome_table(doc["requests"]["by_action"]),
        "",
        f"unexpected errors: {doc['unexpected_errors']['count']} (target 0: {_yes(met['no_unexpected_errors'])})",
        *(
            f"  t={u['t_s']:>6}s {u['action']}: {u['status']}: {u['message']}"
            for u in doc["unexpected_errors"]["kept"][:30]
        ),
        f"slow (client gave up after {doc['slow']['limit_s']:.0f} s; answered later or cancelled, not hung): "
        f"{doc['slow']['count']}",
        *(f"  {x.get('t_s', '')} {x['action']}: {x['message']}" for x in doc["slow"]["events"][:20]),
        f"after the load: {_after(after)} (idle: {_yes(met['idle_after_load'])})",
        f"TARGET {'MET' if met['all'] else 'MISSED'}",
    ]
    return "\n".join(parts)


def _after(after: dict[str, Any]) -> str:
    if not after.get("server_alive"):
        return f"SERVER EXITED with code {after.get('server_exit_code')}"
    keys = [
        "health",
        "running",
        "waiting",
        "blocks_used",
        "blocks_cached",
        "rejections_total",
        "preemptions_total",
    ]
    return ", ".join(f"{k} {after[k]}" for k in keys)


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"
