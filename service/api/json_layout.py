"""Indenting a compact JSON document without re-serialising it (GenerateJSONRequest.pretty).

Generation stays compact (no tokens spent on whitespace); the validated
document is then laid out here lexically: a newline and two spaces per level
after ``{``, ``[`` and ``,``, before ``}`` and ``]``, and ``": "`` after a key.
Strings and numbers are copied byte for byte (a parse and ``json.dumps`` would
respell numbers such as ``1E+2``), and empty containers stay ``{}`` / ``[]``:
the layout of ``json.dumps(doc, indent=2)``.
"""

from __future__ import annotations

INDENT = "  "


def pretty_json(text: str) -> str:
    """``text`` (compact JSON, as the grammar writes it) indented; other whitespace is kept as it is."""
    out: list[str] = []
    depth, in_string, escape = 0, False, False
    for i, c in enumerate(text):
        if in_string:
            out.append(c)
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
            out.append(c)
        elif c in "{[":
            depth += 1
            empty = i + 1 < len(text) and text[i + 1] in "}]"
            out.append(c if empty else c + "\n" + INDENT * depth)
        elif c in "}]":
            depth -= 1
            opened = i > 0 and text[i - 1] in "{["
            out.append(c if opened else "\n" + INDENT * depth + c)
        elif c == ",":
            out.append(",\n" + INDENT * depth)
        elif c == ":":
            out.append(": ")
        else:
            out.append(c)
    return "".join(out)
