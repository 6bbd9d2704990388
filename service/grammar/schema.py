"""JSON Schema preparation for llguidance: meta-validation and safe approximations.

llguidance compiles a large subset of JSON Schema exactly and refuses the rest
(``not``, ``if/then/else``, ``uniqueItems``, unknown ``format`` values, ...).
``relax`` turns one such refusal into a *superset* schema: it only removes
assertions, so every document valid under the original schema is still
accepted by the grammar, and the final ``jsonschema`` validation of the
generated document (``json_grammar.validate_document``) restores exactness.

NOTE: llguidance's own ``lenient`` option does the same in one pass but has
bugs in 1.9.1 (``minProperties: 1`` on an object with optional properties
compiles to a grammar that accepts no object at all), and it does not say
exactly what it dropped; doing it here keeps every approximation explicit.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing.exceptions
from jsonschema_specifications import REGISTRY as METASCHEMAS

from service.request.strict_json import unique_keys

# Keywords whose removal can only widen the set of valid documents (pure
# assertions, or applicators that only ever restrict, such as ``not``).
DROPPABLE = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "additionalItems",
        "minProperties",
        "maxProperties",
    }
)
# Values that are data, not subschemas: never walked.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "example", "required"})
# Maps from names (not keywords) to subschemas (or, for the dependency keywords, lists of names).
_NAME_MAPS = frozenset(
    {
        "properties",
        "patternProperties",
        "definitions",
        "$defs",
        "dependentSchemas",
        "dependencies",
        "dependentRequired",
    }
)

ONE_OF = "oneOf->anyOf"
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[[^\]]*\])")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: ([^\n]*?)(?: \(\d+ times\))?$", re.M)
_OVERLAP = re.compile(r"patternProperty regexes /(.*)/ and /(.*)/ are not disjoint")


class SchemaProblem(Exception):
    """The schema is not valid JSON or not a valid JSON Schema (always INVALID_ARGUMENT)."""


def parse_schema(source: str) -> tuple[dict[str, Any], type[jsonschema.protocols.Validator]]:
    """Parse and meta-validate ``source``; returns the schema and its draft's validator class.

    Raises ``SchemaProblem`` with a message naming what is wrong.
    """
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as exc:
        raise SchemaProblem(f"json_schema is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise SchemaProblem("json_schema is nested too deeply") from exc
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise SchemaProblem("a JSON Schema must be a JSON object (or `true`)")
    with warnings.catch_warnings():  # unknown "$schema" URIs fall back to draft 2020-12
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise SchemaProblem(f"invalid JSON Schema at {where}: {exc.message}") from exc
    except RecursionError as exc:
        raise SchemaProblem("json_schema is nested too deeply") from exc
    return schema, cls


_JSON_POINTER = re.compile(r"(/([^~/]|~[01])*)*")
_REL_JSON_POINTER = re.compile(r"(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)")
_IRI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>\"{}|\\^`\x7f]*")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>\"{}|\\^`\x7f-\U0010ffff]*")
_IRI_REF = re.compile(r"[^\x00-\x20<>\"{}|\\^`\x7f]*")
# Minimal checks for formats jsonschema cannot check without optional packages (rfc3987,
# jsonpointer): used only when an unknown-to-llguidance format was dropped from the grammar.
_EXTRA_FORMATS: dict[str, re.Pattern[str]] = {
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _REL_JSON_POINTER,
    "iri": _IRI,
    "uri": _URI,
    "iri-reference": _IRI_REF,
    "uri-reference": _IRI_REF,
}
_checkers: dict[type[Any], jsonschema.FormatChecker] = {}


def _format_checker(cls: type[Any]) -> jsonschema.FormatChecker:
    """The draft's format checker plus ``_EXTRA_FORMATS`` it lacks (built once per draft)."""
    if cls not in _checkers:
        checker = jsonschema.FormatChecker(formats=())
        checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
        for name, rx in _EXTRA_FORMATS.items():
            if name not in checker.checkers:
                checker.checks(name)(lambda v, rx=rx: not isinstance(v, str) or rx.fullmatch(v) is not None)
        _checkers[cls] = checker
    return _checkers[cls]


def make_validator(schema: dict[str, Any], cls: type[Any]) -> Any:
    """A validator that checks formats (as assertions) and never fetches remote ``$ref``s.

    NOTE: jsonschema's default registry still retrieves remote references over
    HTTP (deprecated, with a warning); a registry holding only the bundled
    metaschemas turns that off (no SSRF from a client's ``$ref``).
    """
    return cls(schema, format_checker=_format_checker(cls), registry=METASCHEMAS)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class Violation:
    """Where and how a document breaks its schema: ``keyword`` is the JSON Schema keyword it breaks
    (``uniqueItems``, ``not``, ...), or ``JSON`` when the text is not a strict JSON document (a key
    given twice, NaN, cut off); ``path`` is where (a JSON Pointer, ``""`` for the root)."""

    keyword: str
    path: str
    detail: str

    def __str__(self) -> str:
        if self.keyword == "JSON":
            return f"document is not valid JSON: {self.detail}"
        return f"document breaks {self.keyword!r} at {self.path or '(root)'}: {self.detail}"


def _pointer(parts: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def document_problem(validator: Any, text: str) -> Violation | None:
    """What is wrong with the JSON document ``text`` under ``validator`` (the first violation), or None.

    NOTE: stricter than json.loads: duplicate keys (llguidance does not enforce unique keys
    for additionalProperties, and json.loads would silently keep the last) and NaN/Infinity
    are errors.
    """
    try:
        doc = json.loads(text, object_pairs_hook=unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        return Violation("JSON", "", str(exc))
    try:
        err = next(iter(validator.iter_errors(doc)), None)
    except RecursionError:
        return Violation("JSON", "", "document is nested too deeply to validate")
    except referencing.exceptions.Unresolvable as exc:
        return Violation("$ref", "", f"cannot validate the document: unresolvable $ref {exc}")
    if err is None:
        return None
    return Violation(str(err.validator), _pointer(err.absolute_path), err.message)


def _walk(node: Any, visit: Callable[[dict[str, Any]], None]) -> None:
    """Call ``visit`` on every subschema (dict in a schema position) under ``node``."""
    if isinstance(node, list):
        for item in node:
            _walk(item, visit)
        return
    if not isinstance(node, dict):
        return
    visit(node)
    for key, value in list(node.items()):
        if key in _DATA_KEYS:
            continue
        if key in _NAME_MAPS:
            if isinstance(value, dict):
                for sub in value.values():  # the keys are names, not keywords
                    _walk(sub, visit)
        else:
            _walk(value, visit)


def _drop(schema: dict[str, Any], pred: Callable[[dict[str, Any], str], bool]) -> bool:
    """Delete every keyword ``k`` of every subschema ``s`` with ``pred(s, k)``; True if any was."""
    changed = False

    def visit(s: dict[str, Any]) -> None:
        nonlocal changed
        for k in [k for k in s if pred(s, k)]:
            del s[k]
            changed = True

    _walk(schema, visit)
    return changed


def _lark_regex(pattern: str) -> str:
    return "/" + pattern.replace("/", "\\/") + "/"


def relax(schema: dict[str, Any], error: str) -> str | None:
    """Approximate ``schema`` in place so that llguidance's ``error`` goes away.

    Returns the label recorded in ``approximations`` (``ONE_OF`` means "compile
    with coerce_one_of"; the schema is unchanged), or None when no safe
    approximation exists or nothing could be changed.
    """
    if "oneOf constraints are not supported" in error:
        return ONE_OF
    if m := _UNIMPLEMENTED.search(error):
        keys = json.loads(m.group(1))
        bad = [k for k in keys if k not in DROPPABLE]
        if bad or not _drop(schema, lambda s, k: k in keys):
            return None
        return "ignored: " + ", ".join(keys)
    if m := _UNKNOWN_FORMAT.search(error):
        fmt = m.group(1)
        if _drop(schema, lambda s, k: k == "format" and s[k] == fmt):
            return f"format:{fmt} ignored"
        return None
    if "min/maxProperties only supported" in error:
        if _drop(schema, lambda s, k: k in ("minProperties", "maxProperties")):
            return "ignored: minProperties/maxProperties"
        return None
    if m := _OVERLAP.search(error):
        pair = {m.group(1), m.group(2)}

        def overlapping(s: dict[str, Any], k: str) -> bool:
            pp = s.get("patternProperties")
            in_pair = isinstance(pp, dict) and bool(pair & set(pp))
            return in_pair and k in ("patternProperties", "additionalProperties")

        if _drop(schema, overlapping):
            return "ignored: overlapping patternProperties"
        return None
    return _relax_pattern(schema, error)


def _relax_pattern(schema: dict[str, Any], error: str) -> str | None:
    """Drop the ``pattern``s named in a regex error (lookarounds, backreferences, intersections)."""
    if "regex" not in error:
        return None

    def named(s: dict[str, Any], k: str) -> bool:
        if k != "pattern" or not isinstance(s[k], str):
            return False
        # llguidance quotes a pattern as /.../ (slashes escaped); the regex crate's parse
        # errors show it on its own indented line.
        return _lark_regex(s[k]) in error or f"\n    {s[k]}\n" in error

    if _drop(schema, named):
        return "ignored: pattern unsupported by the grammar engine"
    return None


def patterns(schema: dict[str, Any]) -> list[str]:
    """Every ``pattern`` string of ``schema``'s subschemas, in document order."""
    found: list[str] = []

    def visit(s: dict[str, Any]) -> None:
        if isinstance(s.get("pattern"), str):
            found.append(s["pattern"])

    _walk(schema, visit)
    return found


def loosen(schema: dict[str, Any]) -> dict[str, Any]:
    """A private copy of ``schema`` without the keywords llguidance does not compile that only ever
    restrict (``DROPPABLE``) and without ``x-guidance``: a superset, for a grammar whose documents are
    validated against the original afterwards (a tool call's arguments)."""
    work = prepare(schema)
    _drop(work, lambda s, k: k in DROPPABLE)
    return work


def prepare(schema: dict[str, Any]) -> dict[str, Any]:
    """A private copy of ``schema`` for llguidance, without a client ``x-guidance`` key.

    NOTE: the service fixes the JSON layout (compact) and the approximation
    policy itself; a client's top-level ``x-guidance`` must not override them.
    """
    work = copy.deepcopy(schema)
    work.pop("x-guidance", None)
    return work
