"""The table of model families: how each is recognised from its chat template, and how it writes calls.

``detect(source)`` is the first family whose markers all occur in the template's
source (and none of its ``absent`` ones); the order puts the more specific first
(Mistral v11 with call ids before Mistral v11, both before Mistral Nemo; the
families built on Llama 3's markers before Llama 3.x). A template no family
matches is ``GENERIC``: its calls are Hermes-style ``<tool_call>`` JSON, described
to the model by the server's system turn when the template does not render tools
(``service.chat.conversation``).

``ids``: how a family's templates want earlier calls' ids (Mistral's are 9
alphanumeric characters; any other id is mapped to one, the same for a call and its
result). ``variables``: template variables a family's template needs besides
``tools`` (FireFunction's ``functions`` and ``datetime``). ``thought_key``: the
message field an earlier thought goes to (Hugging Face's ``reasoning_content``;
gpt-oss's template reads ``thinking``). ``answer_open``: the header a text answer
starts with when no call reader reads it (Functionary v3.2's ``all\\n``: its
prompt ends with ``>>>``, so the output names its recipient first): dropped from
the content and written by the answer's grammar (``header``, a
``service.chat.thinking.Header`` row).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.chat.calls import ToolCall
from service.chat.harmony import HarmonyCalls
from service.chat.recipient_calls import RecipientCalls
from service.chat.syntax import JsonCalls, Layout, NamedCalls, Syntax
from service.chat.thinking import Header
from service.chat.xml_calls import XmlCalls

_ALNUM9 = re.compile(r"^[A-Za-z0-9]{9}$")


def mistral_id(call_id: str, index: int) -> str:
    """A Mistral call id (9 alphanumeric characters): the id itself when it is one, else derived from it."""
    if _ALNUM9.match(call_id):
        return call_id
    return hashlib.sha256((call_id or f"call{index}").encode()).hexdigest()[:9]


def _mistral(call: ToolCall, index: int) -> str:
    return mistral_id(call.id, index)


def _dsml(block: str) -> XmlCalls:
    """DeepSeek V3.2's and V4's DSML calls, in a ``block`` ("function_calls", "tool_calls"); ``｜DSML｜`` is
    one special token of their vocabulary, and the templates write "\n\n" before the block."""
    d = "｜DSML｜"
    return XmlCalls(Layout(start=f"<{d}{block}>\n", call_open=f'<{d}invoke name="', call_close=f"</{d}invoke>\n",
                           end=f"</{d}{block}>"), name_close='">\n', param_open=f'<{d}parameter name="',
                    key_close='" string="true">', json_key_close='" string="false">',
                    param_close=f"</{d}parameter>\n", lead="\n\n")


def _firefunction(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    functions = json.dumps([t["function"] for t in tools], indent=4, ensure_ascii=False)
    return {"functions": functions, "datetime": time.strftime("%b %d %Y")}


@dataclass(frozen=True)
class Family:
    """One family's row of the table (see the module doc)."""

    name: str
    syntax: Syntax
    markers: tuple[str, ...] = ()  # all occur in the template's source
    absent: tuple[str, ...] = ()  # none occurs
    ids: Callable[[str, int], str] | None = None
    variables: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]] | None = None
    thought_key: str = "reasoning_content"
    answer_open: str = ""
    notes: str = field(default="", compare=False)

    def matches(self, source: str) -> bool:
        return all(m in source for m in self.markers) and not any(m in source for m in self.absent)

    def call_id(self, call_id: str, index: int) -> str:
        """The id a template is given for an earlier call (and its result)."""
        return self.ids(call_id, index) if self.ids else call_id

    def header(self) -> Header | None:
        """The row that reads and writes the family's answer header (None: its answers have none)."""
        return Header(self.name, answer_open=self.answer_open) if self.answer_open else None


FUNCTIONARY = RecipientCalls(Layout(call_open=">>>"), name_close="\n")
HERMES = JsonCalls(Layout(call_open="<tool_call>\n", call_close="\n</tool_call>", sep="\n"))
GENERIC = Family("generic", HERMES, notes="Hermes-style <tool_call> JSON, described by the server")

FAMILIES: tuple[Family, ...] = (
    Family("gpt-oss", HarmonyCalls(), ("<|channel|>", "<|message|>", "<|call|>"), thought_key="thinking",
           notes="gpt-oss (harmony): <|start|>assistant to=functions.name<|channel|>commentary json<|message|>{...}"),
    Family("mistral-v11-ids", NamedCalls(Layout(call_open="[TOOL_CALLS]"), name_close="[CALL_ID]{id}[ARGS]",
                                         id_of=_mistral), ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"), ids=mistral_id,
           notes="Mistral Small 3.2: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}"),
    Family("mistral-v11", NamedCalls(Layout(call_open="[TOOL_CALLS]"), name_close="[ARGS]"),
           ("[TOOL_CALLS]", "[ARGS]"), ids=mistral_id, notes="Devstral, Ministral 3, Magistral"),
    Family("mistral-nemo", JsonCalls(Layout(start="[TOOL_CALLS]", list_open="[", sep=", ", list_close="]"),
                                     id_key="id", id_of=_mistral), ("[TOOL_CALLS]",), ids=mistral_id),
    Family("kimi-k2", NamedCalls(Layout(start="<|tool_calls_section_begin|>", call_open="<|tool_call_begin|>functions.",
                                        call_close="<|tool_call_end|>", end="<|tool_calls_section_end|>"),
                                 name_close=":{index}<|tool_call_argument_begin|>"),
           ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    Family("deepseek-v3.2", _dsml("function_calls"), ("｜DSML｜", "function_calls>"), notes="DeepSeek V3.2 (DSML)"),
    Family("deepseek-v4", _dsml("tool_calls"), ("｜DSML｜", "tool_calls>"), notes="DeepSeek V4, V4 Flash (DSML)"),
    Family("deepseek-r1", NamedCalls(Layout(start="<｜tool▁calls▁begin｜>",
                                            call_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                                            call_close="\n```<｜tool▁call▁end｜>", sep="\n",
                                            end="<｜tool▁calls▁end｜>"), name_close="\n```json\n"),
           ("<｜tool▁calls▁begin｜>", "```json")),
    Family("deepseek-v3.1", NamedCalls(Layout(start="<｜tool▁calls▁begin｜>", call_open="<｜tool▁call▁begin｜>",
                                              call_close="<｜tool▁call▁end｜>", end="<｜tool▁calls▁end｜>"),
                                       name_close="<｜tool▁sep｜>"), ("<｜tool▁calls▁begin｜>",)),
    Family("command-r7b", JsonCalls(Layout(start="<|START_ACTION|>", list_open="[\n    ", sep=",\n    ",
                                           list_close="\n]", end="<|END_ACTION|>"),
                                    name_key="tool_name", args_key="parameters", id_key="tool_call_id",
                                    id_pattern="^[0-9]+$", order=("id", "name", "args"),
                                    id_of=lambda _call, index: str(index)), ("<|START_ACTION|>",)),
    Family("functionary-v3.2", FUNCTIONARY, (">>>all", "<|start_header_id|>"), answer_open=FUNCTIONARY.text_open,
           notes="Functionary v3.2: >>>all\\ntext, >>>name\\n{...}"),
    Family("functionary-v3.1", NamedCalls(Layout(call_open="<function=", call_close="</function>"),
                                          name_close=">"), ("<function=", "<|start_header_id|>")),
    Family("qwen3-coder", XmlCalls(Layout(call_open="<tool_call>\n<function=", call_close="</function>\n</tool_call>",
                                          sep="\n"), name_close=">\n", param_open="<parameter=",
                                   key_close=">\n", param_close="\n</parameter>\n"),
           ("<tool_call>", "<function=", "<parameter="), notes="Qwen3-Coder, Qwen3.5, Nemotron 3, StepFun 3.5"),
    Family("seed-oss", XmlCalls(Layout(call_open="<seed:tool_call>\n<function=",
                                       call_close="</function>\n</seed:tool_call>", sep="\n"), name_close=">\n",
                                param_open="<parameter=", key_close=">", param_close="</parameter>\n"),
           ("<seed:tool_call>", "<function=", "<parameter=")),
    Family("glm-4.5", XmlCalls(Layout(call_open="<tool_call>", call_close="</tool_call>", sep="\n"),
                               name_close="\n", param_open="<arg_key>", key_close="</arg_key>\n<arg_value>",
                               param_close="</arg_value>\n"), ("<tool_call>", "<arg_key>"),
           notes="GLM 4.5/4.6, Laguna XS 2.1, Ling 3"),
    Family("glm-4.7", XmlCalls(Layout(call_open="<tool_call>", call_close="</tool_call>"), name_close="",
                               param_open="<arg_key>", key_close="</arg_key><arg_value>",
                               param_close="</arg_value>"), ("<tool_call>", "<arg_key>"),
           notes="GLM 4.7, Spark 2.5, Laguna S 2.1"),
    Family("minimax-m2", XmlCalls(Layout(start="<minimax:tool_call>\n", call_open='<invoke name="',
                                         call_close="</invoke>\n", end="</minimax:tool_call>"), name_close='">\n',
                                  param_open='<parameter name="', key_close='">', param_close="</parameter>\n"),
           ("<minimax:tool_call>",)),
    Family("granite-3", JsonCalls(Layout(start="<|tool_call|>", list_open="[", sep=", ", list_close="]")),
           ("<|tool_call|>",)),
    Family("firefunction-v2", JsonCalls(Layout(start=" functools", list_open="[", sep=", ", list_close="]")),
           ("functools[",), variables=_firefunction),
    Family("apriel", JsonCalls(Layout(start="<tool_calls>", list_open="[", sep=", ", list_close="]",
                                      end="</tool_calls>"), id_key="id", id_pattern="^[A-Za-z0-9_-]{1,40}$"),
           ("<tool_calls>[",)),
    Family("minimax-m1", JsonCalls(Layout(start="<tool_calls>\n", sep="\n", end="\n</tool_calls>")),
           ("<tool_calls>",)),
    Family("nemotron-v2", JsonCalls(Layout(start="<TOOLCALL>", list_open="[", sep=", ", list_close="]",
                                           end="</TOOLCALL>")), ("<TOOLCALL>",)),
    Family("llama-3", JsonCalls(Layout(), args_key="parameters", parallel=False, lead="<|python_tag|>"),
           ("<|start_header_id|>", "ipython", '"parameters"'), notes="Llama 3.1-3.3: one bare JSON call"),
    Family("hermes", HERMES, ("<tool_call>",), notes="Hermes 2/3, Qwen 2.5/3, QwQ, Granite 4, MiMo, Bielik"),
    Family("smollm3", HERMES, ("SmolLM", "Reasoning Mode"), notes="SmolLM3 (its template does not render tools)"),
)


def detect(source: str | None) -> Family:
    """The family of a chat template's source (``GENERIC`` when none matches, or there is no template)."""
    if source:
        for family in FAMILIES:
            if family.matches(source):
                return family
    return GENERIC
