"""Typed reads of a JSON request body: every wrong type or range is a 400 naming the parameter.

``Body`` wraps the decoded object and the set of parameters the endpoint
knows; an unknown key is refused (OpenAI answers "Unrecognized request
argument supplied"), never silently ignored. JSON ``null`` reads as unset.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from service.http.errors import ApiError, bad_param

JsonObject = dict[str, Any]


def parse_json(raw: bytes) -> JsonObject:
    """The body as a JSON object; 400 for anything else."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    return value


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
