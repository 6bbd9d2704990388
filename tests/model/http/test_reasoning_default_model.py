"""Reasoning with the real default model's weights: a copy of its GGUF (written to a temporary folder, never
committed) that carries QwQ's chat template (ChatML, as SmolLM2's own; its generation prompt opens the thought with
``enable_thinking``), so the markers are plain text in this vocabulary. Through the ``openai`` SDK: the thought is
``reasoning_content`` and never in ``content``, the answer is the schema's document, streamed pieces are the
unstreamed answer, and the thought ends within the budget (counted in tokens of the output)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.chat_templates import TEMPLATES
from tests.support.family_models import openai_client
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[3]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 24}}, "required": ["answer"],
          "additionalProperties": False}
BUDGET = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("qwq-template") / "smollm2-qwq.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--force", "--chat-template-file",
                    str(TEMPLATES / "Qwen-QwQ-32B.jinja"), str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"),
                    str(path)], check=True, capture_output=True)
    srv = start_server(model=str(path), http_port=free_port())
    try:
        yield srv
    finally:
        srv.close()


def ask(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 80,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            "extra_body": {"thinking_budget_tokens": BUDGET}, **extra}


def test_the_thought_is_apart_and_ends_within_the_budget(served: RunningServer) -> None:
    c, model = openai_client(served)
    assert (c.models.retrieve(model).model_extra or {})["chat_format"]["reasoning"]["close"] == "</think>"
    whole = c.chat.completions.create(model=model, logprobs=True, **ask())
    choice = whole.choices[0]
    thought = (choice.message.model_extra or {}).get("reasoning_content") or ""
    assert choice.finish_reason == "stop", whole
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    assert "</think>" not in thought and "</think>" not in (choice.message.content or "")
    tokens = [e.token for e in (choice.logprobs and choice.logprobs.content) or []]
    text = "".join(tokens)
    marker = text.index("</think>")
    before = next(i for i in range(len(tokens) + 1) if len("".join(tokens[:i + 1])) > marker)
    assert before <= BUDGET, tokens  # the thought's tokens before its end marker
    usage = whole.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert before <= usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens
    chunks = list(c.chat.completions.create(model=model, stream=True, **ask()))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == choice.message.content
    assert_kv_clean(served)


def test_without_a_budget_or_an_effort_the_template_writes_no_thought(served: RunningServer) -> None:
    c, model = openai_client(served)
    reply = c.chat.completions.create(model=model, **{**ask(), "extra_body": {}})
    assert not (reply.choices[0].message.model_extra or {}).get("reasoning_content")
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)

