"""The Python client's and the CLI's tokenize / detokenize / count / info, against the real server."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest
from inference_client import AsyncInferenceClient, InferenceClient, InferenceError, model_info_to_dict

from tests.model.cli.test_cli import CLI, assert_clean_error, run
from tests.support.server import DEFAULT_MODEL

pytestmark = pytest.mark.model
CHAT = [("system", "Be brief."), ("user", "Hi 🎉")]


def test_sync_client_tokenize_count_detokenize_info(server: Any) -> None:
    with InferenceClient(server.target, timeout=30) as client:
        tok = client.tokenize("naïve 日本 🎉")
        assert client.detokenize(tok.token_ids).text == "naïve 日本 🎉"
        assert client.count_tokens("naïve 日本 🎉").count == len(tok.token_ids)
        chat = client.tokenize(messages=CHAT)
        assert client.count_tokens(messages=[{"role": r, "content": c} for r, c in CHAT]).count == len(
            chat.token_ids
        )
        unparsed = client.tokenize(messages=CHAT, parse_special=False, add_special=False)
        assert len(unparsed.token_ids) > len(chat.token_ids)
        info = model_info_to_dict(client.model_info())
        assert info["file_name"] == DEFAULT_MODEL.name and info["vocab_size"] > 0
        with pytest.raises(InferenceError) as err:
            client.tokenize("a", messages=CHAT)
        assert err.value.status == "INVALID_ARGUMENT"


def test_async_client_matches_the_sync_client(server: Any) -> None:
    async def calls() -> tuple[Any, ...]:
        async with AsyncInferenceClient(server.target, timeout=30) as client:
            tok = await client.tokenize(messages=CHAT)
            count = await client.count_tokens(messages=CHAT)
            text = await client.detokenize(tok.token_ids, render_special=True)
            info = await client.model_info()
            return tok, count, text, info

    tok, count, text, info = asyncio.run(calls())
    with InferenceClient(server.target, timeout=30) as client:
        assert list(tok.token_ids) == list(client.tokenize(messages=CHAT).token_ids)
        assert info == client.model_info()
    assert count.count == len(tok.token_ids) and text.text == tok.prompt


def test_cli_tokenize_table_ids_and_json(server: Any) -> None:
    proc = run("--target", server.target, "tokenize", "Hello 🎉")
    assert proc.returncode == 0, proc.stderr
    ids = run("--target", server.target, "tokenize", "Hello 🎉", "--ids")
    token_ids = [int(t) for t in ids.stdout.split()]
    assert len(proc.stdout.strip().splitlines()) == len(token_ids) and f"[tokens={len(token_ids)}]" in proc.stderr
    as_json = json.loads(run("--target", server.target, "tokenize", "Hello 🎉", "--json").stdout)
    assert as_json["token_ids"] == token_ids and as_json["prompt"] == "Hello 🎉"
    text = run("--target", server.target, "detokenize", *map(str, token_ids))
    assert (text.returncode, text.stdout) == (0, "Hello 🎉")


def test_cli_count_plain_and_chat_from_stdin(server: Any) -> None:
    proc = run("--target", server.target, "count", "Hello world")
    assert proc.returncode == 0 and int(proc.stdout) >= 2, proc.stderr
    assert "context=" in proc.stderr and "max_new_tokens=" in proc.stderr
    chat = subprocess.run(
        [*CLI, "--target", server.target, "count", "-", "--chat", "--system", "Be brief."],
        input="Hi 🎉",
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    with InferenceClient(server.target, timeout=30) as client:
        assert int(chat.stdout) == client.count_tokens(messages=CHAT).count
    parsed = run("--target", server.target, "count", "<|im_start|>", "--parse-special")
    plain = run("--target", server.target, "count", "<|im_start|>", "--no-parse-special")
    assert int(parsed.stdout) < int(plain.stdout)


def test_cli_info_table_and_json(server: Any) -> None:
    proc = run("--target", server.target, "info")
    assert proc.returncode == 0, proc.stderr
    for needle in (DEFAULT_MODEL.name, "context", "kv pool", "bytes per token", "sha256", "json_schema", "special: bos="):
        assert needle in proc.stdout, needle
    info = json.loads(run("--target", server.target, "info", "--json").stdout)
    assert info["limits"]["max_choices"] == 16 and info["metadata"]["general.architecture"] == info["architecture"]


def test_cli_bad_token_id_is_a_clean_error(server: Any) -> None:
    assert_clean_error(run("--target", server.target, "detokenize", "-5"), "INVALID_ARGUMENT")
    assert_clean_error(run("--target", server.target, "tokenize", ""), "INVALID_ARGUMENT")
