"""Fixtures for every test folder: the shared session server (real default model) and a channel to it.

The servers themselves (``RunningServer``, ``start_server``, ``server_config``, ``wait_idle``,
``assert_kv_clean``) are in tests/support/server.py.

Layout: ``tests/unit/<package>/`` holds the tests of one service package (or of the client, ``client``)
that need no model weights; ``tests/model/<area>/`` the tests that load the default model or start a
real server. ``tests/support/`` holds the shared helpers.

Markers (pyproject.toml): ``model`` (loads the default model's weights or starts a server with it),
``vocab`` (reads the default model's vocabulary only), ``may_skip`` (may skip in CI). The hooks
below enforce them (tests/support/guards.py): an unmarked test that loads ``models/*.gguf`` fails,
and under ``CI=true`` a skip of a test not marked ``may_skip`` fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import settings

from tests.support.guards import ModelGuard, in_ci
from tests.support.server import DEFAULT_MODEL, RunningServer, start_server
from tests.support.tiny_vocab import build as tiny_vocab_file

# NOTE: no per-example deadline for any property test: Hypothesis's default (200 ms) is a wall-clock race that a
# busy machine loses (a 0.2 ms example took 276 ms beside a benchmark); a verdict must not depend on the clock.
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")

# Server processes started by tests keep batch jobs in memory, not in ./data
# (tests/model/batch/test_batch.py passes files).
os.environ.setdefault("INFERENCE_BATCH_DB", ":memory:")
# ... and serve no HTTP API unless a test asks for one (several servers at once would all want :8000;
# tests/model/http/ start theirs on free ports).
os.environ.setdefault("INFERENCE_HTTP_PORT", "0")

pytest_plugins = ["pytester"]  # tests/unit/suite/test_guards.py
GUARD = ModelGuard()


def pytest_configure(config: pytest.Config) -> None:
    GUARD.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    with GUARD.running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    with GUARD.setting_up(fixturedef):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    rep: pytest.TestReport = yield
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        problems = GUARD.take(item.nodeid)
        if problems:
            rep.outcome, rep.longrepr = "failed", "\n".join(problems)
    if in_ci() and rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("may_skip") is None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome, rep.longrepr = "failed", f"skipped under CI=true, where it is required: {reason}"
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Under CI=true a module that skips itself (a missing required extra) fails the run."""
    rep: pytest.CollectReport = yield
    if in_ci() and rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome, rep.longrepr = "failed", f"module skipped under CI=true, where it is required: {reason}"
    return rep


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


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A llama.cpp ``Vocab`` of about 500 byte-level BPE tokens (tests/support/tiny_vocab.py): the
    tokenizer-facing unit tests run on it without the model file."""
    from service.model.runner import Vocab

    return Vocab.load(tiny_vocab_file(tmp_path_factory.mktemp("vocab") / "tiny.gguf"))


@pytest.fixture(scope="session")
def model_vocab() -> Any:
    """The default model's vocabulary (no weights run): for tests marked ``vocab``."""
    if not DEFAULT_MODEL.is_file():
        pytest.fail(f"{DEFAULT_MODEL} missing: run `make model`")
    from service.model.runner import Vocab

    return Vocab.load(DEFAULT_MODEL)
