"""Tokenize, Detokenize, CountTokens and GetModelInfo against the real server and model.

GetModelInfo is checked against the GGUF file read independently with the
``gguf`` package (not llama.cpp), and the SHA-256 against hashlib.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.api.input_limits import DEFAULT_MAX_STOP
from service.api.model_rpcs import MAX_DETOKENIZE_TOKENS, MAX_TOKENIZE_BYTES
from service.api.request_builder import DEFAULT_JSON_MAX_TOKENS, DEFAULT_MAX_TOKENS
from tests.support.helpers import req, run_stream
from tests.support.server import DEFAULT_MODEL

pytestmark = pytest.mark.model
TEXTS = [
    "Hello, world!",
    "Grüße aus Köln: naïve café",
    "日本語のテキストと中文文本",
    "emoji 🎉👩‍👩‍👧 and flags 🇫🇷 ✓",
    "  leading spaces, tabs\tand\nnewlines  ",
]
CHAT = [pb.ChatMessage(role="system", content="Be brief."), pb.ChatMessage(role="user", content="Hi 🎉")]


@pytest.fixture()
def stub(channel: grpc.Channel) -> Any:
    return pb_grpc.InferenceServiceStub(channel)


def status_of(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value.code(), info.value.details()


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_round_trip_utf8(stub: Any, text: str) -> None:
    tok = stub.Tokenize(pb.TokenizeRequest(text=text))
    assert tok.token_ids and len(tok.pieces) == len(tok.token_ids)
    assert tok.prompt == text
    assert b"".join(tok.pieces) == text.encode()  # pieces are the exact bytes, split anywhere
    back = stub.Detokenize(pb.DetokenizeRequest(token_ids=tok.token_ids))
    assert back.text == text and back.raw == text.encode()


def test_detokenize_part_of_a_character_gives_raw_bytes_and_replacement(stub: Any) -> None:
    tok = stub.Tokenize(pb.TokenizeRequest(text="🎉"))
    partial = [i for i, p in zip(tok.token_ids, tok.pieces, strict=True) if len(p) < 4]
    assert partial, "the emoji is one token here; the test needs a multi-token character"
    back = stub.Detokenize(pb.DetokenizeRequest(token_ids=partial[:1]))
    assert back.raw == tok.pieces[0] and "\ufffd" in back.text


def test_special_tokens_parsed_only_when_asked(stub: Any) -> None:
    bos = next(s for s in stub.GetModelInfo(pb.GetModelInfoRequest()).special_tokens if s.name == "bos")
    text = f"{bos.text}user"
    plain = stub.Tokenize(pb.TokenizeRequest(text=text))  # as Generate tokenizes a raw prompt
    parsed = stub.Tokenize(pb.TokenizeRequest(text=text, parse_special=True))
    assert bos.token_id not in plain.token_ids and len(plain.token_ids) > len(parsed.token_ids)
    assert parsed.token_ids[0] == bos.token_id and parsed.pieces[0] == bos.text.encode()
    hidden = stub.Detokenize(pb.DetokenizeRequest(token_ids=parsed.token_ids))
    shown = stub.Detokenize(pb.DetokenizeRequest(token_ids=parsed.token_ids, render_special=True))
    assert hidden.text == "user" and shown.text == text
    explicit = stub.Tokenize(pb.TokenizeRequest(text=text, parse_special=False))
    assert list(explicit.token_ids) == list(plain.token_ids)


def test_chat_messages_tokenize_as_the_rendered_template(stub: Any) -> None:
    tok = stub.Tokenize(pb.TokenizeRequest(messages=CHAT))
    assert tok.prompt.count("Be brief.") == 1 and "Hi 🎉" in tok.prompt
    assert tok.prompt.endswith("assistant\n")  # the generation prompt, as Generate renders it
    again = stub.Tokenize(pb.TokenizeRequest(text=tok.prompt, parse_special=True))
    assert list(again.token_ids) == list(tok.token_ids)
    assert b"".join(tok.pieces).decode() == tok.prompt  # special tokens rendered as their text
    unparsed = stub.Tokenize(pb.TokenizeRequest(messages=CHAT, parse_special=False))
    assert len(unparsed.token_ids) > len(tok.token_ids)


def test_count_tokens_equals_generate_prompt_tokens(stub: Any, channel: grpc.Channel) -> None:
    requests = [req(f"t{i}", text, 1) for i, text in enumerate(TEXTS)] + [req("chat", "", 1, messages=CHAT)]
    results = run_stream(channel, requests, timeout=600)
    for i, text in enumerate(TEXTS):
        count = stub.CountTokens(pb.CountTokensRequest(text=text))
        done = results[f"t{i}"].done
        assert done is not None, results[f"t{i}"].error
        assert count.count == done.usage.prompt_tokens
        assert count.count == len(stub.Tokenize(pb.TokenizeRequest(text=text)).token_ids)
        assert count.max_new_tokens == count.context_size - count.count
    chat = stub.CountTokens(pb.CountTokensRequest(messages=CHAT))
    done = results["chat"].done
    assert done is not None and chat.count == done.usage.prompt_tokens


def test_count_tokens_reports_a_prompt_longer_than_the_context(stub: Any, channel: grpc.Channel) -> None:
    text = "hello " * 5000
    count = stub.CountTokens(pb.CountTokensRequest(text=text))
    assert count.count > count.context_size and count.max_new_tokens == 0
    refused = run_stream(channel, [req("long", text, 1)], timeout=600)["long"]
    assert refused.error is not None and refused.error.status == "INVALID_ARGUMENT"
    assert str(count.count) in refused.error.message


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Tokenize", pb.TokenizeRequest()),
        ("Tokenize", pb.TokenizeRequest(text="a", messages=CHAT)),
        ("Tokenize", pb.TokenizeRequest(messages=[pb.ChatMessage(role="robot", content="hi")])),
        ("Tokenize", pb.TokenizeRequest(text="x" * (MAX_TOKENIZE_BYTES + 1))),
        ("CountTokens", pb.CountTokensRequest()),
        ("CountTokens", pb.CountTokensRequest(text="a", messages=CHAT)),
        ("CountTokens", pb.CountTokensRequest(text="é" * (MAX_TOKENIZE_BYTES // 2 + 1))),
        ("Detokenize", pb.DetokenizeRequest(token_ids=[5, -1])),
        ("Detokenize", pb.DetokenizeRequest(token_ids=[10**6])),
        ("Detokenize", pb.DetokenizeRequest(token_ids=[0] * (MAX_DETOKENIZE_TOKENS + 1))),
    ],
)
def test_bad_input_is_invalid_argument(stub: Any, method: str, request_: Any) -> None:
    code, details = status_of(getattr(stub, method), request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details


def test_detokenize_names_the_bad_token(stub: Any) -> None:
    n = stub.GetModelInfo(pb.GetModelInfoRequest()).vocab_size
    code, details = status_of(stub.Detokenize, pb.DetokenizeRequest(token_ids=[1, 2, n]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"token_ids[2] = {n}" in details and str(n - 1) in details
    assert stub.Detokenize(pb.DetokenizeRequest()).raw == b""


def _gguf_fields(path: Path) -> tuple[dict[str, Any], int]:
    """Scalar GGUF metadata and the parameter count (sum of tensor sizes), read by the gguf package."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(path)
    scalars = {k: f.contents() for k, f in reader.fields.items() if len(f.types) == 1 and f.types[0] != 9}
    params = sum(int(t.n_elements) for t in reader.tensors)
    scalars["tokenizer.ggml.tokens.length"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    scalars["file_type_name"] = gguf.LlamaFileType(scalars["general.file_type"]).name
    return scalars, params


def test_model_info_matches_the_gguf_file(stub: Any) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    meta, params = _gguf_fields(DEFAULT_MODEL)
    arch = meta["general.architecture"]
    assert info.file_name == DEFAULT_MODEL.name
    assert info.file_size_bytes == DEFAULT_MODEL.stat().st_size
    assert info.sha256 == hashlib.sha256(DEFAULT_MODEL.read_bytes()).hexdigest()
    assert (info.architecture, info.name) == (arch, meta["general.name"])
    assert info.parameter_count == params
    assert info.quantization == meta["file_type_name"].removeprefix("MOSTLY_").removeprefix("ALL_")
    assert info.training_context == meta[f"{arch}.context_length"]
    assert info.embedding_length == meta[f"{arch}.embedding_length"]
    assert info.layers == meta[f"{arch}.block_count"]
    assert info.vocab_size == meta["tokenizer.ggml.tokens.length"]
    assert info.chat_template == meta["tokenizer.chat_template"]
    special = {s.name: s.token_id for s in info.special_tokens}
    assert special["bos"] == meta["tokenizer.ggml.bos_token_id"]
    assert special["eos"] == meta["tokenizer.ggml.eos_token_id"]
    assert special["pad"] == meta["tokenizer.ggml.padding_token_id"]
    for key in ("general.name", "general.architecture", "tokenizer.ggml.model", f"{arch}.block_count"):
        assert info.metadata[key] == str(meta[key])
    assert "tokenizer.chat_template" not in info.metadata  # it has its own field


def test_model_info_reports_the_server_and_request_limits(stub: Any, server: Any) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    engine = server.engine
    assert info.kv_pool_tokens == engine.kv.num_blocks * engine.kv.block_size
    assert (info.kv_block_size, info.max_running) == (engine.kv.block_size, server.config.max_running)
    assert list(info.response_formats) == ["json_schema", "regex", "lark_grammar", "gbnf_grammar"]
    assert info.server_version
    limits = info.limits
    assert limits.context_size == stub.CountTokens(pb.CountTokensRequest(text="a")).context_size
    assert limits.context_size == min(info.kv_pool_tokens, info.training_context)
    assert (limits.default_max_tokens, limits.default_json_max_tokens) == (DEFAULT_MAX_TOKENS, DEFAULT_JSON_MAX_TOKENS)
    assert (limits.max_stop_strings, limits.max_top_logprobs, limits.max_choices) == (DEFAULT_MAX_STOP, 20, 16)


def test_add_special_adds_bos_only_for_models_that_want_it(stub: Any, tmp_path: Path) -> None:
    """SmolLM2's GGUF says add_bos_token false; a built vocabulary that says true (as Gemma's does)
    gets exactly one BOS, with or without a chat template."""
    flags = [pb.TokenizeRequest(text="Hi", add_special=v) for v in (True, False)]
    with_bos, without = (stub.Tokenize(r).token_ids for r in flags)
    assert list(with_bos) == list(without) == list(stub.Tokenize(pb.TokenizeRequest(text="Hi")).token_ids)
    from service.api.request_builder import PromptLimits, RequestBuilder
    from service.model.chat import ChatTemplate
    from service.model.runner import Vocab
    from tests.support.tiny_vocab import build

    vocab = Vocab.load(build(tmp_path / "bos.gguf", add_bos=True))
    builder = RequestBuilder(vocab, ChatTemplate(None), PromptLimits(max_context=4096))
    default, no_bos = (builder.render_tokens("Hi", [], add_special=v)[1] for v in (None, False))
    assert vocab.add_bos and default == [vocab.bos_id, *no_bos]
    chat = builder.render_tokens("", [pb.ChatMessage(role="user", content="Hi")])[1]
    assert chat[0] == vocab.bos_id and chat.count(vocab.bos_id) == 1  # one BOS, template or not


ROLES = st.sampled_from(["system", "user", "assistant", "robot", ""])
MESSAGES = st.lists(st.builds(pb.ChatMessage, role=ROLES, content=st.text(max_size=40)), max_size=3)
FLAG = st.one_of(st.none(), st.booleans())
# NOTE: llama.cpp's tokenizer loses these six control characters and the bytes of many unassigned
# code points (category Cn) with SmolLM2's vocabulary (found by scanning every code point; Generate
# sees the same tokens): no round trip for them. Every assigned character round-trips.
LOST = "\x04\x06\x13\x14\x16\x1d"
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cn"), blacklist_characters=LOST), max_size=80)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, messages=MESSAGES, add=FLAG, parse=FLAG)
def test_any_tokenize_request_is_answered_or_invalid_and_text_round_trips(
    stub: Any, text: str, messages: list[pb.ChatMessage], add: bool | None, parse: bool | None
) -> None:
    flags = {k: v for k, v in (("add_special", add), ("parse_special", parse)) if v is not None}
    request = pb.TokenizeRequest(text=text, messages=messages, **flags)
    try:
        tok = stub.Tokenize(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        assert bool(text) == bool(messages) or any(m.role not in ("system", "user", "assistant") for m in messages)
        return
    count = stub.CountTokens(pb.CountTokensRequest(text=text, messages=messages, **flags), timeout=30)
    assert count.count == len(tok.token_ids)
    if text and not parse:
        assert stub.Detokenize(pb.DetokenizeRequest(token_ids=tok.token_ids), timeout=30).text == text


def test_model_info_says_how_the_server_speaks_the_models_chat_language(stub: Any) -> None:
    """SmolLM2's template renders a system turn and nothing of tools: the generic family, described by the server."""
    chat = stub.GetModelInfo(pb.GetModelInfoRequest()).chat
    assert (chat.family, chat.tools, list(chat.renders), chat.parallel_tool_calls) == (
        "generic", "system_turn", ["system"], True)


ADD = pb.Tool(name="add", description="Add two integers",
              parameters='{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}')
ROUND_TRIP = [pb.ChatMessage(role="user", content="3 plus 4?"),
              pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="c1", name="add", arguments='{"a":3,"b":4}')]),
              pb.ChatMessage(role="tool", content="7", tool_call_id="c1", name="add")]


def test_generate_renders_tools_calls_and_results_given_as_fields(channel: grpc.Channel) -> None:
    plain = req("plain", max_tokens=1, messages=[ROUND_TRIP[0]])
    tools = req("tools", max_tokens=1, messages=[ROUND_TRIP[0]])
    tools.tools.append(ADD)
    history = req("history", max_tokens=1, messages=ROUND_TRIP)
    history.tools.append(ADD)
    out = run_stream(channel, [plain, tools, history])
    counts = {rid: r.done.usage.prompt_tokens for rid, r in out.items() if r.done is not None}
    assert counts["plain"] < counts["tools"] < counts["history"], out  # the tools, then the call and its result


@pytest.mark.parametrize(("change", "needle"), [
    ({"tools": [pb.Tool(name="add", parameters="{not json")]}, "tools[0].parameters"),
    ({"tools": [pb.Tool(name="a b")]}, "tools[0].name"),
    ({"tools": [ADD, ADD]}, "unique"),
    ({"chat_template_kwargs": '{"messages": []}'}, "chat_template_kwargs"),
    ({"chat_template_kwargs": "[1]"}, "chat_template_kwargs"),
    ({"messages": [pb.ChatMessage(role="user", content="x", tool_calls=[pb.ToolCall(name="add")])]}, "tool_calls"),
    ({"prompt": "raw", "messages": []}, "need messages"),
])
def test_bad_chat_fields_are_invalid_argument_naming_them(channel: grpc.Channel, change: dict[str, Any],
                                                          needle: str) -> None:
    r = req("bad", max_tokens=1, messages=[ROUND_TRIP[0]])
    for name, value in change.items():
        r.ClearField(name)
        if isinstance(value, list):
            getattr(r, name).extend(value)
        else:
            setattr(r, name, value)
    if "prompt" in change:
        r.tools.append(ADD)
    err = run_stream(channel, [r])["bad"].error
    assert err is not None and err.status == "INVALID_ARGUMENT" and needle in err.message, err
