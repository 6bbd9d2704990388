"""docs/configuration.md is generated from service/config.py (scripts/config_doc.py, `make docs`)."""

from __future__ import annotations

import importlib.util
from dataclasses import fields
from pathlib import Path
from types import ModuleType

from service import config

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_doc", ROOT / "scripts" / "config_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_doc_is_what_make_docs_writes() -> None:
    expected = _generator().render()
    actual = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""
    assert actual == expected, (
        "docs/configuration.md is stale: it differs from what scripts/config_doc.py makes from "
        "service/config.py; run `make docs` and commit the result"
    )


def test_every_flag_is_documented_with_its_environment_variable() -> None:
    text = _generator().render()
    for f in fields(config.ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        assert f"`{flag}`" in text, flag
        assert f"`{config.ENV_PREFIX}{f.name.upper()}`" in text, f.name
