"""What a chat template renders, and which family it is, found by rendering probe conversations.

As llama.cpp does (``jinja::caps``), each capability is tried by rendering a small
conversation that needs it and looking for its text in the output: a system turn,
the tools, an assistant turn's call (arguments as an object, else as JSON text),
a tool message, two calls in one turn. A template that raises, or leaves the
probe's text out, lacks the capability. The family is the first of the table
whose markers the template holds and whose syntax is exactly what the template
writes for an earlier call (a family has several layouts: GLM 4.5's and 4.7's);
when the template writes no calls, the first whose markers it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from service.chat.calls import Function, ToolCall
from service.chat.conversation import Caps, Conversation, TemplateInput, Turn, template_input
from service.chat.families import FAMILIES, GENERIC, Family

Render = Callable[[TemplateInput], str]
PARAMS = {"type": "object", "properties": {"probe_argument": {"type": "string"}}, "required": ["probe_argument"]}
TOOL = Function("probe_function", PARAMS, "probe function description")
CALL = ToolCall("probe_function", '{"probe_argument": "probe_value"}', "probe0001")
CALL2 = ToolCall("other_function", '{"probe_argument": "other_value"}', "probe0002")
FAMILY_CALLS = (ToolCall("get_weather", '{"city": "Paris", "days": 2}', "call00001"),
                ToolCall("get_time", '{"zone": "CET"}', "call00002"))


def _same(text: str) -> str:
    return text


def _renders(render: Render, conv: Conversation, family: Family, caps: Caps, *texts: str) -> bool:
    try:
        out = render(template_input(conv, family, caps, _same))
    except Exception:  # NOTE: any failure of the template on the probe: it lacks the capability
        return False
    return all(t in out for t in texts)


def _calls_conv(*calls: ToolCall) -> Conversation:
    results = [Turn("tool", f"probe_result_{c.name}", call_id=c.id, name=c.name) for c in calls]
    return Conversation([Turn("user", "probe_user"), Turn("assistant", "", calls), *results,
                         Turn("assistant", "probe_answer"), Turn("user", "probe_again")])


def probe(render: Render, family: Family, base: Caps | None = None) -> Caps:
    """The capabilities of the template behind ``render`` (see the module doc); ``base``: what is known
    already (``empty_tools``)."""
    base = base or Caps()
    native = replace(base, calls=True, results=True, multi_calls=True)
    system = _renders(render, Conversation([Turn("system", "probe_system"), Turn("user", "probe_user")]), family,
                      native, "probe_system", "probe_user")
    tools = _renders(render, Conversation([Turn("user", "probe_user")], [TOOL]), family, replace(base, tools=True),
                     "probe_function", "probe function description")
    one = _calls_conv(CALL)
    calls, object_args = True, True
    if not _renders(render, one, family, native, "probe_function", "probe_value"):
        object_args = False
        calls = _renders(render, one, family, replace(native, object_args=False), "probe_function", "probe_value")
    caps = replace(base, system=system, tools=tools, calls=calls, object_args=object_args)
    results = _renders(render, one, family, replace(caps, results=True), "probe_result_probe_function")
    if not results:  # NOTE: a template may refuse the calls' shape yet render results after a plain answer
        plain = Conversation([Turn("user", "probe_user"), Turn("assistant", "probe_call"),
                              Turn("tool", "probe_result_plain", call_id="probe0001", name="probe_function"),
                              Turn("assistant", "probe_answer"), Turn("user", "probe_again")])
        results = _renders(render, plain, family, replace(caps, calls=False, results=True), "probe_result_plain")
    caps = replace(caps, results=results)
    multi = calls and _renders(render, _calls_conv(CALL, CALL2), family, replace(caps, multi_calls=True),
                               "probe_function", "other_function", "probe_value", "other_value")
    return replace(caps, multi_calls=multi)


def family_of(source: str | None, render: Render) -> Family:
    """The family of a template (see the module doc); ``GENERIC`` when no family's markers match, or when the
    template writes earlier calls in none of their syntaxes."""
    if not source:
        return GENERIC
    candidates = [f for f in FAMILIES if f.matches(source)]
    conv = Conversation([Turn("user", "probe_user"), Turn("assistant", "", FAMILY_CALLS[1:]),
                         Turn("tool", "probe_result", call_id=FAMILY_CALLS[1].id, name=FAMILY_CALLS[1].name),
                         Turn("assistant", "probe_answer"), Turn("user", "probe_again")])
    writes_calls = False
    for family in candidates:
        try:
            out = render(template_input(conv, family, Caps(calls=True, results=True, multi_calls=True), _same))
        except Exception:  # NOTE: a template that refuses the probe: judged by its markers alone
            continue
        if family.syntax.render(FAMILY_CALLS[1:]) in out:
            return family
        writes_calls = writes_calls or (FAMILY_CALLS[1].name in out and "CET" in out)
    return GENERIC if writes_calls or not candidates else candidates[0]
