"""Fixtures for every test folder: the shared session server (real default model) and a channel to it.

The servers themselves (``RunningServer``, ``start_server``, ``server_config``, ``wait_idle``,
``assert_kv_clean``) are in tests/support/server.py.

Layout: ``tests/unit/<package>/`` holds the tests of one service package (or of the client, ``client``)
that need no model weights; ``tests/model/<area>/`` the tests that load the default model or start a
real server. ``tests/support/`` holds the shared helpers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from tests.support.server import RunningServer, start_server

# Server processes started by tests keep batch jobs in memory, not in ./data
# (tests/model/batch/test_batch.py passes files).
os.environ.setdefault("INFERENCE_BATCH_DB", ":memory:")


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    srv = start_server()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def _kv_integrity_of_this_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A KV integrity violation on the shared server fails the test that caused it."""
    yield
    if "server" in request.fixturenames:
        srv: RunningServer = request.getfixturevalue("server")
        found, srv.violations[:] = list(srv.violations), []
        assert not found, f"KV integrity violated during this test: {found[:3]}"


@pytest.fixture()
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as ch:
        yield ch
