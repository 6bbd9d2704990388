"""The server's own words for what a chat template cannot say: the tools, earlier calls and their results.

A template that renders no tools gets them described in its system turn by the
server (``tools_text``), with the family's call syntax as the example; earlier
calls it does not render are written into the assistant's text in that syntax
(``Syntax.render``), and results it does not render become user turns
(``result_text``). Caller text in them is escaped like any message content; the
server's wording and the family's markers are not (the markers are the model's
own control tokens, as a template would write them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from service.chat.calls import Function, ToolCall
from service.chat.syntax import Syntax, deep

EXAMPLE = ToolCall("function_name", '{"argument": "value"}', "abcdefghi")


def tools_text(functions: Sequence[Function], syntax: Syntax, esc: Callable[[str], str]) -> str:
    """The tools and how to call them, for the system turn."""
    listing = "\n".join(
        json.dumps({"name": esc(f.name), "description": esc(f.description), "parameters": deep(f.parameters, esc)},
                   ensure_ascii=False)
        for f in functions
    )
    return (f"You can call these functions (JSON Schema of the arguments of each):\n<tools>\n{listing}\n</tools>\n"
            f"To call a function, answer only {syntax.render([EXAMPLE])}")


def result_text(text: str) -> str:
    """A tool's result as the user-turn text the model reads."""
    return f"<tool_response>\n{text}\n</tool_response>"
