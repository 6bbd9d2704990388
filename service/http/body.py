"""Typed reads of a JSON request body: every wrong type or range is a 400 naming the parameter.

``parse_json`` refuses, with a 400, what decodes but cannot be used: a document nested more than
``MAX_DEPTH`` levels (it would end in a RecursionError wherever it is walked again: a tool's
schema, a grammar) and a string holding a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON
syntax but not Unicode text: protobuf, the tokenizer and UTF-8 cannot carry it), naming where.

``Body`` wraps the decoded object and the set of parameters the endpoint
knows; an unknown key is refused (OpenAI answers "Unrecognized request
argument supplied"), never silently ignored. JSON ``null`` reads as unset.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from service.http.errors import ApiError, bad_param

JsonObject = dict[str, Any]
MAX_DEPTH = 100  # NOTE: a tool or response schema 40 levels deep still fits; the JSON decoder stops near 1,000
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # how a surrogate gets into decoded text
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes) -> JsonObject:
    """The body as a JSON object; 400 for anything else (see the module docstring)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    check_json(value, raw)
    return value


def check_json(value: Any, raw: bytes) -> None:
    """400 naming the parameter if ``value`` (decoded from ``raw``) is nested too deeply or holds a
    lone surrogate. NOTE: ``raw`` rules out both cheaply (few brackets, no escaped surrogate), so
    the walk runs only for bodies that could fail it."""
    surrogates = _ESCAPED_SURROGATE.search(raw) is not None
    if not surrogates and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_DEPTH:
            raise bad_param(str(path[0]), f"'{path[0]}' is nested more than {MAX_DEPTH} levels deep")
        for key, item in node.items() if isinstance(node, dict) else enumerate(node):
            if surrogates and isinstance(key, str) and _SURROGATE.search(key):
                name = _name((*path, key.encode("utf-8", "backslashreplace").decode()))
                raise bad_param(name, f"the key '{name}' {_NOT_TEXT}")
            if isinstance(item, dict | list):
                stack.append((item, (*path, key)))
            elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                raise bad_param(_name((*path, key)), f"'{_name((*path, key))}' {_NOT_TEXT}")


_NOT_TEXT = "is not valid Unicode text: it holds a lone UTF-16 surrogate (such as \\ud800 without its pair)"


def _name(path: tuple[str | int, ...]) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else f".{key}" if out else key
    return out


class Body:
    """A request object with typed getters (see the module docstring)."""

    def __init__(self, raw: JsonObject, known: Iterable[str], where: str = "") -> None:
        self.raw = raw
        self.where = where  # prefix of parameter names in messages, e.g. "stream_options."
        for key in raw:
            if key not in known:
                raise bad_param(where + key, f"Unrecognized request argument supplied: {where + key}")

    def has(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def get(self, name: str) -> Any:
        return self.raw.get(name)

    def _name(self, name: str) -> str:
        return self.where + name

    def str_(self, name: str, required: bool = False) -> str | None:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise bad_param(self._name(name), f"'{self._name(name)}' is a required property")
            return None
        if not isinstance(value, str):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be a string")
        return value

    def bool_(self, name: str) -> bool | None:
        value = self.raw.get(name)
        if value is not None and not isinstance(value, bool):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be a boolean")
        return value

    def int_(self, name: str, lo: int, hi: int) -> int | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be an integer")
        if not lo <= value <= hi:
            raise bad_param(self._name(name), f"'{self._name(name)}' must be in {lo}..{hi}, got {value}")
        return value

    def num(self, name: str, lo: float, hi: float) -> float | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be a number")
        if not lo <= value <= hi:
            raise bad_param(self._name(name), f"'{self._name(name)}' must be in [{lo:g}, {hi:g}], got {value}")
        return float(value)

    def obj(self, name: str, known: Iterable[str]) -> Body | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be an object")
        return Body(value, known, self._name(name) + ".")

    def list_(self, name: str) -> list[Any] | None:
        value = self.raw.get(name)
        if value is not None and not isinstance(value, list):
            raise bad_param(self._name(name), f"'{self._name(name)}' must be an array")
        return value
