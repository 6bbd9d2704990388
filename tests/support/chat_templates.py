"""Real chat templates of other model families, read where ``make templates`` put them.

``scripts/fetch_chat_templates.sh`` extracts llama.cpp's ``models/templates/*.jinja`` from the
llama.cpp tree vendored in the pinned llama-cpp-python sdist (PyPI) into ``.chat-templates/``
(git-ignored): each template is its model vendor's file, read at test time, never committed.
``make setup`` and ``make unit`` run it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / ".chat-templates"


def chat_template(name: str) -> str:
    """The template ``name`` (a file name in llama.cpp's ``models/templates/`` without ``.jinja``)."""
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make templates` (scripts/fetch_chat_templates.sh)")
    return path.read_text(encoding="utf-8")
