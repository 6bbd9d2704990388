"""How many messages, tools, stop strings and logit_bias entries one request may carry.

Each count is checked before any work that grows with it (rendering the chat,
validating the tools' schemas, tokenizing), by the front end that parses the
request (the HTTP API: a 400 naming the parameter) and again by the request
builder for every path (gRPC: INVALID_ARGUMENT). Every limit is a server flag
(docs/configuration.md); the defaults are far above what clients send.
"""

from __future__ import annotations

from dataclasses import dataclass

# NOTE: 10,000 turns is far more than fits the contexts this server runs (every turn costs a few
# tokens of chat markup) yet lets an agent loop of thousands of tool round trips through.
DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_TOOLS = 128  # OpenAI's documented maximum
DEFAULT_MAX_STOP = 16
DEFAULT_MAX_LOGIT_BIAS = 1024


@dataclass(frozen=True)
class InputLimits:
    """The counts one request may carry (flags --max-messages, --max-tools, --max-stop-strings, --max-logit-bias)."""

    max_messages: int = DEFAULT_MAX_MESSAGES
    max_tools: int = DEFAULT_MAX_TOOLS
    max_stop_strings: int = DEFAULT_MAX_STOP
    max_logit_bias: int = DEFAULT_MAX_LOGIT_BIAS

    def messages(self, count: int) -> str | None:
        return too_many("messages", count, self.max_messages, "max-messages")

    def tools(self, count: int) -> str | None:
        return too_many("tools", count, self.max_tools, "max-tools")

    def stop(self, count: int) -> str | None:
        return too_many("stop", count, self.max_stop_strings, "max-stop-strings")

    def logit_bias(self, count: int) -> str | None:
        return too_many("logit_bias", count, self.max_logit_bias, "max-logit-bias")


DEFAULTS = InputLimits()


def too_many(param: str, count: int, limit: int, flag: str) -> str | None:
    """The refusal of ``count`` entries of ``param`` past ``limit`` (its message starts with the
    parameter's name and names the server flag), or None when they are within it."""
    if count <= limit:
        return None
    return f"{param} has {count} entries; at most {limit} are accepted (server flag --{flag})"
