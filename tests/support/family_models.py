"""Small GGUFs of other model families served for real: the tiny vocabulary with the family's control and
user-defined tokens and its real chat template (``tests.support.chat_templates``), seeded random weights, built at
test time (never committed), and an ``openai`` client of the server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from tests.support.chat_templates import chat_template
from tests.support.server import RunningServer, free_port, start_server
from tests.support.tiny_vocab import Family, build


@contextmanager
def family_server(path: Path, template: str, control: list[str], bos: str, eos: str, user: list[str],
                  weights: int, **overrides: Any) -> Iterator[RunningServer]:
    """A server of a tiny model written to ``path`` with ``template``'s chat template and these tokens (the
    user-defined ones follow the control ones in the vocabulary: ``tiny_vocab.build``); ``overrides``: further
    server settings (``start_server``'s)."""
    build(path, family=Family(f"{template}-tiny", control, bos, eos, chat_template(template), user), weights=weights)
    srv = start_server(model=str(path), http_port=free_port(), ctx=16384, **overrides)
    try:
        yield srv
    finally:
        srv.close()


def openai_client(srv: RunningServer) -> tuple[openai.OpenAI, str]:
    """An ``openai`` client of the server's HTTP port, and the served model's id."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server.http_port}/v1", api_key="unused", max_retries=0,
                           timeout=600)
    return client, client.models.list().data[0].id
