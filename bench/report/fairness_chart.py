"""Chart of scenario H (``bench/scenarios/h_fairness.py``): fair share between two tenants, and the cost of TLS/auth.

Left: each tenant's tokens/s per time bin over the measured window, fair
share on (solid) and off (dashed), with B's share and Jain's index. Right:
tok/s of every alternating cost run (plaintext, token auth, TLS + token
auth) with their medians.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

TENANTS = (("tenant-a", "tab:blue"), ("tenant-b", "tab:orange"))


def _share_panel(ax: Axes, r: dict[str, Any]) -> None:
    bin_s = float(r.get("bin_s") or 1.0)
    load = r.get("load", {})
    streams = {"tenant-a": load.get("a_streams", "?"), "tenant-b": load.get("b_streams", "?")}
    notes, top = [], 1.0
    for label, ls in (("on", "-"), ("off", "--")):
        run = r["fairness"].get(label)
        if not run:
            continue
        for tenant, colour in TENANTS:
            tok = run["bins"][tenant]
            xs = (np.arange(len(tok)) + 0.5) * bin_s
            name = f"{tenant} ({streams[tenant]} streams), fair share {label}"
            ys = np.asarray(tok, dtype=float) / bin_s
            ax.plot(xs, ys, ls, color=colour, marker=".", label=name)
            top = max(top, float(ys.max(initial=0.0)))
        share, jain = run.get("b_share"), run.get("jain_window")
        if share is not None and jain is not None:
            notes.append(f"fair share {label}: B gets {share:.0%}, Jain {jain:.3f}")
    ax.set_xlabel(f"time in the measured window (s; {bin_s:g}-s bins)")
    ax.set_ylabel("tokens received per second (tok/s)")
    ax.set_ylim(0, top * 1.45)  # room for the legend above the curves
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper center", ncol=2)
    ax.set_title("; ".join(notes) or "fair share", fontsize=9)


def _cost_panel(ax: Axes, cost: dict[str, Any]) -> None:
    labels = [("plaintext", "plaintext"), ("auth", "token\nauth"), ("tls_auth", "TLS +\ntoken auth")]
    runs, med = cost.get("runs_tok_s", {}), cost.get("median_tok_s", {})
    for i, (key, _) in enumerate(labels):
        vals = runs.get(key, [])
        ax.scatter([i] * len(vals), vals, color="tab:gray", s=30)
        if med.get(key) is not None:
            ax.hlines(med[key], i - 0.3, i + 0.3, color="tab:purple", linewidth=2.5)
    ax.set_xticks(range(len(labels)), [name for _, name in labels], fontsize=9)
    ax.set_xlim(-0.7, len(labels) - 0.3)
    ax.set_ylabel("generated tokens per second (tok/s)")
    ax.set_xlabel("dots: runs; bar: median (axis not from 0)")
    ax.grid(True, axis="y", alpha=0.3)
    parts = [
        f"{name}: {cost[k] * 100 - 100:+.1f}%"
        for k, name in (("auth_vs_plaintext", "auth"), ("tls_auth_vs_plaintext", "TLS+auth"))
        if cost.get(k) is not None
    ]
    ax.set_title("cost vs plaintext: " + ", ".join(parts) if parts else "cost", fontsize=9)


def fairness(fig: Figure, data: dict[str, dict[str, Any]]) -> None:
    """Per-tenant tok/s over time (fair share on/off) and the TLS/auth cost runs."""
    r = data["fairness"]
    if "cost" in r:
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
        _share_panel(left, r)
        _cost_panel(right, r["cost"])
    else:
        _share_panel(fig.add_subplot(1, 1, 1), r)
