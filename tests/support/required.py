"""Tools some tests need from the machine (PostgreSQL, iproute2, kubectl): skipped without them, failed in CI.

``.ci/run`` installs them (``make postgres``, ``make netns``, ``make kubectl``), so in CI (``CI=true``) a missing tool
is a broken setup, not a reason to skip: ``missing`` fails the test there.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str, why: str) -> NoReturn:
    """Skip the test (``what`` is absent: ``why``), or fail it in CI."""
    if in_ci():
        pytest.fail(f"{what} is required in CI: {why}", pytrace=False)
    pytest.skip(f"no {what}: {why}")
