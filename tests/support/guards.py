"""The suite's guards, wired into pytest by tests/conftest.py's hooks.

``ModelGuard``: a test that loads a GGUF file from ``models/`` must say so with a marker:
``model`` for the weights (an in-process load, a server, or a child process given the file),
``vocab`` for a vocabulary-only load of the default model. ``make unit`` deselects both and so
runs without the model file; an unmarked test that loads it fails with the reason, whether it
loads the file itself or uses a fixture that did (a session server set up by an earlier test).

``ci_requires``: under ``CI=true`` a skipped test fails unless it is marked ``may_skip`` (it needs
something CI does not provide, such as the benchmark model); locally skips stay skips.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def fixture_key(fixturedef: Any) -> str:
    """One fixture definition: its name and the node (module, class, conftest folder) defining it."""
    return f"{fixturedef.argname} (defined in {fixturedef.baseid or 'a plugin'})"


def _model_file(arg: object) -> Path | None:
    """The GGUF under ``models/`` that ``arg`` names (a path or a ``--model=PATH`` argument), if any."""
    text = os.fspath(arg) if isinstance(arg, str | os.PathLike) else None
    if not text or not str(text).endswith(".gguf"):
        return None
    path = Path(str(text).split("=", 1)[-1])
    path = path if path.is_absolute() else ROOT / path
    try:
        path.resolve().relative_to(MODELS.resolve())
    except ValueError:
        try:
            path.relative_to(MODELS)
        except ValueError:
            return None
    return path


class ModelGuard:
    """Records, per test, loads of ``models/*.gguf`` its markers do not allow."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.fixture: str | None = None
        # NOTE: keyed by where the fixture is defined, not by its name alone: two modules may each
        # define a fixture `vocab`, one of the model's vocabulary and one of the tiny built one.
        self.model_fixtures: dict[str, str] = {}  # fixture key -> what it loaded ("model" or "vocab")
        self.violations: dict[str, list[str]] = {}

    def install(self) -> None:
        import service.model.runner as runner

        real_load = runner._load_model

        def guarded_load(path: str | Path, vocab_only: bool) -> Any:
            if _model_file(path) is not None:
                self.loaded("vocab" if vocab_only else "model", f"loads {Path(path).name}")
            return real_load(path, vocab_only)

        runner._load_model = guarded_load  # type: ignore[assignment]
        real_init = subprocess.Popen.__init__

        def guarded_init(popen: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
            argv = [args] if isinstance(args, str | os.PathLike) else list(args)
            if any(_model_file(x) is not None for x in argv):
                self.loaded("model", "starts a process with the model file")
            real_init(popen, args, *a, **kw)

        subprocess.Popen.__init__ = guarded_init  # type: ignore[method-assign]

    @staticmethod
    def allowed(item: pytest.Item, kind: str) -> bool:
        if item.get_closest_marker("model") is not None:
            return True
        return kind == "vocab" and item.get_closest_marker("vocab") is not None

    def loaded(self, kind: str, what: str) -> None:
        if self.fixture is not None:
            self.model_fixtures.setdefault(self.fixture, kind)
        item = self.item
        if item is not None and not self.allowed(item, kind):
            where = f" (in fixture {self.fixture!r})" if self.fixture else ""
            self.violations.setdefault(item.nodeid, []).append(
                f"{what}{where} but is not marked `{kind}`: mark it @pytest.mark.{kind} "
                "(`make unit` runs without the model file)"
            )

    def check_fixtures(self, item: pytest.Item) -> None:
        """A fixture that loaded the model for an earlier test still stands for a load here."""
        info = getattr(item, "_fixtureinfo", None)
        defs: dict[str, Any] = dict(info.name2fixturedefs) if info is not None else {}
        for name in getattr(item, "fixturenames", ()):
            chosen = defs.get(name)
            kind = self.model_fixtures.get(fixture_key(chosen[-1])) if chosen else None
            if kind is not None and not self.allowed(item, kind):
                self.violations.setdefault(item.nodeid, []).append(
                    f"uses fixture {name!r}, which loads the {kind}, but is not marked `{kind}`"
                )

    @contextmanager
    def running(self, item: pytest.Item) -> Iterator[None]:
        self.item = item
        self.check_fixtures(item)
        try:
            yield
        finally:
            self.item = None

    @contextmanager
    def setting_up(self, fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
        outer, self.fixture = self.fixture, fixture_key(fixturedef)
        try:
            yield
        finally:
            self.fixture = outer

    def take(self, nodeid: str) -> list[str]:
        return self.violations.pop(nodeid, [])
