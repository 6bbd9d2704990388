"""Requests and readable forms for Tokenize, Detokenize, CountTokens and GetModelInfo.

Shared by the sync and asyncio clients and by the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from inference.v1 import inference_pb2 as pb

from .spec import MessageLike, chat_messages
from .tools import ToolChoiceLike, ToolLike, tool_choice_fields, tool_protos


def _text_fields(
    text: str | None, messages: Sequence[MessageLike] | None, add_special: bool | None, parse_special: bool | None,
    tools: Sequence[ToolLike] | None = None, tool_choice: ToolChoiceLike | None = None,
) -> dict[str, Any]:
    """The fields TokenizeRequest and CountTokensRequest share; unset flags stay unset (server defaults).
    ``tools`` and ``tool_choice`` are rendered as Generate renders them (a named function's name is not sent:
    it does not change the prompt)."""
    choice = tool_choice_fields(tool_choice).get("tool_choice", pb.TOOL_CHOICE_UNSPECIFIED)
    fields: dict[str, Any] = {"text": text or "", "messages": chat_messages(messages), "tools": tool_protos(tools),
                              "tool_choice": choice}
    if add_special is not None:
        fields["add_special"] = add_special
    if parse_special is not None:
        fields["parse_special"] = parse_special
    return fields


def tokenize_request(
    text: str | None = None,
    messages: Sequence[MessageLike] | None = None,
    add_special: bool | None = None,
    parse_special: bool | None = None,
    tools: Sequence[ToolLike] | None = None,
    tool_choice: ToolChoiceLike | None = None,
) -> pb.TokenizeRequest:
    """A TokenizeRequest: exactly one of ``text`` and ``messages`` (the server checks)."""
    return pb.TokenizeRequest(**_text_fields(text, messages, add_special, parse_special, tools, tool_choice))


def count_request(
    text: str | None = None,
    messages: Sequence[MessageLike] | None = None,
    add_special: bool | None = None,
    parse_special: bool | None = None,
    tools: Sequence[ToolLike] | None = None,
    tool_choice: ToolChoiceLike | None = None,
) -> pb.CountTokensRequest:
    """A CountTokensRequest: exactly one of ``text`` and ``messages`` (the server checks)."""
    return pb.CountTokensRequest(**_text_fields(text, messages, add_special, parse_special, tools, tool_choice))


def detokenize_request(token_ids: Sequence[int], render_special: bool = False) -> pb.DetokenizeRequest:
    return pb.DetokenizeRequest(token_ids=list(token_ids), render_special=render_special)


def model_info_to_dict(info: pb.GetModelInfoResponse) -> dict[str, Any]:
    """All fields (defaults included) under their proto names, uint64 as ints."""
    return json_format.MessageToDict(
        info,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )


def format_model_info(info: pb.GetModelInfoResponse) -> str:
    """A short table of what a caller needs to build requests (``--json`` gives every field)."""
    lim = info.limits
    special = ", ".join(f"{s.name}={s.token_id} {s.text!r}" for s in info.special_tokens)
    rows = [
        ("model", f"{info.name} ({info.file_name})"),
        ("architecture", f"{info.architecture}, {info.parameter_count:,} parameters, {info.quantization}"),
        ("file", f"{info.file_size_bytes:,} bytes, sha256 {info.sha256 or '-'}"),
        ("context", f"{lim.context_size} tokens per request (trained {info.training_context})"),
        ("kv pool", f"{info.kv_pool_tokens} tokens in blocks of {info.kv_block_size}{_kv_type(info)}; "
                    f"max running {info.max_running}"),
        ("vocabulary", f"{info.vocab_size} tokens; special: {special or '-'}"),
        ("defaults", f"max_tokens {lim.default_max_tokens} (JSON {lim.default_json_max_tokens})"),
        (
            "limits",
            f"{lim.max_stop_strings} stop strings, top_logprobs <= {lim.max_top_logprobs}, n <= {lim.max_choices}",
        ),
        ("formats", ", ".join(info.response_formats)),
        ("server", info.server_version),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_tokens(resp: pb.TokenizeResponse) -> str:
    """One line per token: id and piece (bytes shown as Python escapes where not UTF-8)."""
    lines = []
    for token, piece in zip(resp.token_ids, resp.pieces, strict=True):
        try:
            shown = repr(piece.decode("utf-8"))
        except UnicodeDecodeError:
            shown = repr(piece)
        lines.append(f"{token:>8}  {shown}")
    return "\n".join(lines)


def _kv_type(info: pb.GetModelInfoResponse) -> str:
    """`` (q8_0, 12,240 bytes per token)``, or nothing from a server that does not say."""
    if not info.kv_cache_type:
        return ""
    return f" ({info.kv_cache_type}, {info.kv_bytes_per_token:,} bytes per token)"
