"""The suite's own guards (tests/support/guards.py, wired in tests/conftest.py), run on generated tests.

Each case runs pytest in a child process on a small test file that uses the suite's conftest hooks;
no model file is needed: the guard judges the path a test loads before llama.cpp opens it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONFTEST = """
from tests.conftest import (  # noqa: F401  (the suite's hooks and fixtures)
    pytest_configure, pytest_fixture_setup, pytest_make_collect_report, pytest_runtest_makereport,
    pytest_runtest_protocol, tiny_vocab,
)
"""
LOADS = f"""
import subprocess, sys
import pytest
from service.model.runner import ModelRunner, Vocab

MODEL = {str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")!r}

def load_weights():
    try:
        ModelRunner(MODEL, n_ctx=64, step_tokens=8, n_lanes=1, n_threads=1).close()
    except Exception:
        pass

def load_vocab():
    try:
        Vocab.load(MODEL)
    except Exception:
        pass

@pytest.fixture(scope="session")
def weights():
    load_weights()

def test_unmarked_weights():
    load_weights()

def test_unmarked_vocab():
    load_vocab()

def test_unmarked_child_process():
    subprocess.run([sys.executable, "-c", "pass", "--model", MODEL], check=True)

@pytest.mark.vocab
def test_vocab_marked_vocab():
    load_vocab()

@pytest.mark.vocab
def test_vocab_marked_weights():
    load_weights()

@pytest.mark.model
def test_model_marked_fixture(weights):
    pass

def test_unmarked_reuses_the_fixture(weights):
    pass

def test_unmarked_tiny_vocabulary(tiny_vocab):
    assert tiny_vocab.n_vocab > 256
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_generated=source)
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nmarkers = ["model", "vocab", "may_skip"]\n'
        'asyncio_default_fixture_loop_scope = "session"\n'
    )
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


@pytest.fixture()
def pytester_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    paths = [str(ROOT), str(ROOT / "clients" / "python"), *sys.path]
    monkeypatch.setenv("PYTHONPATH", ":".join(paths))
    monkeypatch.delenv("CI", raising=False)
    return pytester


def test_a_test_that_loads_the_model_without_its_marker_fails(pytester_env: pytest.Pytester) -> None:
    result = run(pytester_env, LOADS)
    outcomes = {
        line.split()[1].split("::")[-1]: line.split()[0]
        for line in result.outlines
        if line.split()[:1] in (["PASSED"], ["FAILED"], ["ERROR"])
    }
    assert outcomes == {
        "test_unmarked_weights": "FAILED",
        "test_unmarked_vocab": "FAILED",
        "test_unmarked_child_process": "FAILED",
        "test_vocab_marked_vocab": "PASSED",
        "test_vocab_marked_weights": "FAILED",
        "test_model_marked_fixture": "PASSED",
        "test_unmarked_reuses_the_fixture": "FAILED",
        "test_unmarked_tiny_vocabulary": "PASSED",
    }, result.stdout.str()
    out = result.stdout.str()
    assert "loads SmolLM2-135M-Instruct.Q4_1.gguf but is not marked `model`" in out
    assert "loads SmolLM2-135M-Instruct.Q4_1.gguf but is not marked `vocab`" in out
    assert "starts a process with the model file but is not marked `model`" in out
    assert "uses fixture 'weights', which loads the model, but is not marked `model`" in out


MODEL_VOCAB_FIXTURE = f"""
import pytest
from service.model.runner import Vocab

@pytest.fixture(scope="module")
def vocab():
    return Vocab.load({str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")!r})

@pytest.mark.vocab
def test_a_marked_test_loads_the_model_vocabulary(vocab):
    pass
"""
TINY_VOCAB_FIXTURE = """
import pytest

@pytest.fixture()
def vocab(tiny_vocab):
    return tiny_vocab

def test_an_unmarked_test_uses_its_own_fixture_of_the_same_name(vocab):
    assert vocab.n_vocab > 256
"""


@pytest.mark.vocab  # its child process reads the default model's vocabulary
def test_a_fixture_is_judged_by_its_definition_not_its_name(pytester_env: pytest.Pytester) -> None:
    """A module's own `vocab` fixture over the tiny vocabulary is not another module's model `vocab`."""
    pytester_env.makeconftest(CONFTEST)
    pytester_env.makepyfile(test_a_model=MODEL_VOCAB_FIXTURE, test_b_tiny=TINY_VOCAB_FIXTURE)
    pytester_env.makepyprojecttoml('[tool.pytest.ini_options]\nmarkers = ["model", "vocab", "may_skip"]\n')
    result = pytester_env.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2)


SKIPS = """
import pytest

def test_required():
    pytest.skip("the dataset is missing")

@pytest.mark.may_skip
def test_optional():
    pytest.skip("needs the benchmark model")
"""


def test_under_ci_a_skip_fails_unless_the_test_may_skip(
    pytester_env: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = run(pytester_env, SKIPS)
    local.assert_outcomes(skipped=2)
    monkeypatch.setenv("CI", "true")
    ci = run(pytester_env, SKIPS)
    ci.assert_outcomes(failed=1, skipped=1)
    ci.stdout.fnmatch_lines(["*skipped under CI=true, where it is required: *the dataset is missing*"])


def test_under_ci_a_module_that_skips_itself_fails_the_run(
    pytester_env: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = 'import pytest\npytest.importorskip("no_such_extra_module")\n\ndef test_x():\n    pass\n'
    assert run(pytester_env, source).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    monkeypatch.setenv("CI", "true")
    ci = run(pytester_env, source)
    assert ci.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the run
    ci.stdout.fnmatch_lines(["*module skipped under CI=true, where it is required*no_such_extra_module*"])
