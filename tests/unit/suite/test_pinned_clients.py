"""The suite imports only what `make setup` installs: `httpx2` (pinned), never `httpx`.

NOTE: a developer's environment may carry `httpx` (pulled in by other tools), so a test importing it
passes locally and fails to collect in CI's clean environment; this check fails first, everywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ABSENT_IN_A_CLEAN_ENVIRONMENT = {"httpx": "httpx2"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_or_service_module_imports_a_package_a_clean_setup_lacks() -> None:
    found = [
        f"{path.relative_to(ROOT)} imports {name} (use {ABSENT_IN_A_CLEAN_ENVIRONMENT[name]})"
        for folder in ("tests", "service")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in imported_modules(path) & ABSENT_IN_A_CLEAN_ENVIRONMENT.keys()
    ]
    assert found == []
