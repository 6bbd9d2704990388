"""Default llama.cpp thread count: the container's CPU quota, not the node's core count.

In a container with a 2-CPU limit on a 64-core node, ``os.cpu_count()`` says 64;
64 compute threads on 2 CPUs of quota thrash (every barrier waits for threads
the CFS throttles). The quota lives in the cgroup filesystem:

* cgroup v2: ``<cgroup>/cpu.max`` = ``"<quota_us> <period_us>"`` or ``"max <period_us>"``;
* cgroup v1: ``<cpu controller>/cpu.cfs_quota_us`` (-1 = none) and ``cpu.cfs_period_us``.

The process's own cgroup (``/proc/self/cgroup``) and its ancestors are read (the
tightest quota wins; in a container the namespaced root is the container's own
cgroup). The result is ``floor(quota / period)``, at least 1, and never more
than the CPUs this process may run on; without any quota it is that CPU count.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and each parent up to ``root`` itself."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _own_paths(proc_cgroup: str) -> tuple[str, str]:
    """The process's cgroup path in the v2 hierarchy and in the v1 ``cpu`` controller ('/' if unknown)."""
    v2 = v1 = "/"
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota (in CPUs) over the process's cgroup and its ancestors, or None."""
    if proc_cgroup is None:
        proc_cgroup = _read(PROC_SELF_CGROUP) or ""
    v2_path, v1_path = _own_paths(proc_cgroup)
    found: list[float] = []
    try:
        for d in _ancestors(root, v2_path):
            q = _v2_quota(d)
            if q is not None:
                found.append(q)
        for base in (root / "cpu", root / "cpu,cpuacct"):
            for d in _ancestors(base, v1_path):
                q = _v1_quota(d)
                if q is not None:
                    found.append(q)
    except ValueError:  # a malformed file: no quota rather than a crash at import
        return None
    return min(found) if found else None


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else the core count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None, cpus: int | None = None) -> int:
    """``floor(cgroup quota)``, at least 1 and at most the usable CPUs; the usable CPUs without a quota."""
    cpus = available_cpus() if cpus is None else cpus
    quota = cpu_quota(root, proc_cgroup)
    if quota is None:
        return max(1, cpus)
    return max(1, min(cpus, math.floor(quota)))
