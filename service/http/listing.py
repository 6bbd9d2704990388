"""OpenAI's list endpoints: the ``limit`` / ``after`` / ``order`` query parameters and the list object.

``{"object": "list", "data": [...], "first_id", "last_id", "has_more"}``: a page of objects and
whether more follow; the next page is asked for with ``after=<last_id>``. A bad parameter is a 400
naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.http.errors import bad_param


@dataclass(frozen=True)
class ListQuery:
    limit: int
    after: str = ""
    ascending: bool = False  # order=asc (the default is newest first)


def list_query(params: Mapping[str, str], default: int, maximum: int, order: bool = False) -> ListQuery:
    """The page asked for: ``limit`` in 1..``maximum`` (unset: ``default``), ``after`` an id, and with
    ``order`` also OpenAI's ``order`` (``asc`` or ``desc``)."""
    raw = params.get("limit")
    limit = default
    if raw is not None:
        # NOTE: the length first: int() of more than 4,300 digits raises ValueError (CPython's limit)
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 9 or not 1 <= int(raw) <= maximum:
            raise bad_param("limit", f"limit must be an integer in 1..{maximum}, got {raw[:40]!r}")
        limit = int(raw)
    way = params.get("order", "desc") if order else "desc"
    if way not in ("asc", "desc"):
        raise bad_param("order", f"order must be asc or desc, got {way[:40]!r}")
    return ListQuery(limit, params.get("after", ""), way == "asc")


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object over ``data`` (already in order)."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
