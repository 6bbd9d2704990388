"""Tool-call formats for tests that need no vocabulary: a family's syntax with its markers as plain text."""

from __future__ import annotations

from service.chat.conversation import Caps
from service.chat.families import GENERIC, Family
from service.chat.markup import Markup
from service.chat.tool_format import ToolFormat


def plain_format(family: Family = GENERIC) -> ToolFormat:
    """``family``'s format in a vocabulary where none of its markers is a special token."""
    return ToolFormat(family, Markup(), Caps())


GENERIC_FORMAT = plain_format()
