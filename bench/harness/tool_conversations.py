"""The fixed tool-calling conversations of scenario R (``bench.scenarios.r_tool_calls``) and how an answer is scored.

Four kinds, built from a seeded ``random.Random`` (the same set every run):

* ``single``: one question one tool answers (weather, time, a conversion, a search);
* ``parallel``: one question two calls answer (the weather, or the time, of two places);
* ``multi_turn``: an earlier call and its result in the history, then a follow-up that needs
  another call;
* ``irrelevant``: tools are offered, but the question needs none (the answer should be text).

Scoring an answer (an OpenAI chat completion): its calls, whether each one's arguments parse as a
JSON object and name an offered function, whether they validate against that function's
``parameters`` (``jsonschema``); a stream is folded into the same calls (each call's arguments the
concatenation of its deltas).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import jsonschema

SEED = 36
CITIES = ("Paris", "Lima", "Osaka", "Nairobi", "Oslo", "Denver", "Hanoi", "Cairo", "Perth", "Quito")
ZONES = ("Europe/Paris", "Asia/Tokyo", "America/Lima", "Africa/Cairo", "Australia/Perth", "America/Denver")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF")
TOPICS = ("solar panels", "sourdough bread", "the Rosetta stone", "electric bikes", "coral reefs")
CHATTER = ("Write a two-line poem about autumn.", "What is 12 times 11?", "Say hello in French.",
           "Name three primary colours.", "Tell me a short joke about cats.", "What is the capital of Italy?")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current local time in an IANA time zone.",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "pattern": "^[A-Za-z_]+/[A-Za-z_]+$"}},
            "required": ["timezone"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0},
            "from_currency": {"type": "string", "enum": list(CURRENCIES)},
            "to_currency": {"type": "string", "enum": list(CURRENCIES)}},
            "required": ["amount", "from_currency", "to_currency"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 80},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@dataclass(frozen=True)
class Conversation:
    name: str
    kind: str  # single | parallel | multi_turn | irrelevant
    messages: list[dict[str, Any]]

    @property
    def wants_call(self) -> bool:
        return self.kind != "irrelevant"


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a helpful assistant with tools. Call them when they help."},
            {"role": "user", "content": text}]


def _single(rng: random.Random, i: int) -> str:
    pick = i % 4
    if pick == 0:
        return f"What is the weather in {rng.choice(CITIES)} in {rng.choice(['celsius', 'fahrenheit'])}?"
    if pick == 1:
        return f"What time is it now in {rng.choice(ZONES)}?"
    if pick == 2:
        a, b = rng.sample(CURRENCIES, 2)
        return f"Convert {rng.randint(5, 900)} {a} to {b}."
    return f"Search the web for {rng.choice(TOPICS)}."


def _parallel(rng: random.Random, i: int) -> str:
    if i % 2 == 0:
        a, b = rng.sample(CITIES, 2)
        return f"What is the weather in {a} and in {b}, in celsius? Check both at once."
    a, b = rng.sample(ZONES, 2)
    return f"What time is it in {a} and in {b}? Look up both."


def _multi_turn(rng: random.Random, i: int) -> list[dict[str, Any]]:
    a, b = rng.sample(CITIES, 2)
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": a, "unit": "celsius"})}}
    result = json.dumps({"city": a, "temperature": rng.randint(-5, 35), "sky": rng.choice(["clear", "rain"])})
    return [*_user(f"What is the weather in {a} in celsius?"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
            {"role": "user", "content": f"Thanks. And what is the weather in {b}, in celsius?"}]


def conversations(n_per_kind: int = 7) -> list[Conversation]:
    """The fixed set: ``n_per_kind`` of each kind, interleaved by kind (the same every run)."""
    rng = random.Random(SEED)
    rows: list[Conversation] = []
    for i in range(n_per_kind):
        rows.append(Conversation(f"single-{i}", "single", _user(_single(rng, i))))
        rows.append(Conversation(f"parallel-{i}", "parallel", _user(_parallel(rng, i))))
        rows.append(Conversation(f"multi_turn-{i}", "multi_turn", _multi_turn(rng, i)))
        rows.append(Conversation(f"irrelevant-{i}", "irrelevant", _user(CHATTER[i % len(CHATTER)])))
    return rows


@dataclass
class Scored:
    """One answer's calls and their checks."""

    calls: list[tuple[str, str]]  # (name, arguments text), in order
    parsed: int = 0  # calls whose arguments are a JSON object and whose name is an offered function
    valid: int = 0  # of those, calls whose arguments validate against the function's parameters
    text: str = ""

    @classmethod
    def of(cls, calls: list[tuple[str, str]], text: str) -> Scored:
        out = cls(calls, text=text)
        for name, arguments in calls:
            try:
                args = json.loads(arguments)
            except ValueError:
                continue
            if not isinstance(args, dict) or name not in SCHEMAS:
                continue
            out.parsed += 1
            if jsonschema.Draft202012Validator(SCHEMAS[name]).is_valid(args):
                out.valid += 1
        return out


def score_message(body: dict[str, Any]) -> Scored:
    """An unstreamed chat completion's first choice."""
    msg = body["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return Scored.of(calls, msg.get("content") or "")


def score_chunks(chunks: list[dict[str, Any]]) -> Scored:
    """A streamed chat completion folded: each call's name and the concatenation of its argument deltas."""
    calls: dict[int, dict[str, str]] = {}
    text = ""
    for chunk in chunks:
        for row in chunk.get("choices") or []:
            delta = row.get("delta") or {}
            text += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                call = calls.setdefault(d.get("index", 0), {"name": "", "arguments": ""})
                fn = d.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
    return Scored.of([(c["name"], c["arguments"]) for _, c in sorted(calls.items())], text)
