"""Validation of request protos into engine inputs; every problem is a ``BadRequest``.

Runs in the lifecycle's prepare stage (``service.api.preparer``: a worker
thread, never the event loop) before admission, so the engine thread never
sees bad input.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inference.v1 import inference_pb2 as pb

from service.api.chat_input import chars, conversation
from service.api.input_limits import InputLimits
from service.chat.markup import Markup, bind
from service.chat.thought import Reasoning
from service.chat.tool_format import ToolFormat
from service.model.chat import ChatTemplate, ChatTemplateError
from service.model.logprobs import MAX_TOP_LOGPROBS
from service.model.prompt_tokens import PromptTokenizer, Rendered
from service.model.runner import Vocab
from service.request.errors import BadRequest
from service.request.sequence import Priority, SamplingParams

DEFAULT_MAX_TOKENS = 256
DEFAULT_JSON_MAX_TOKENS = 1024
MAX_STOP_BYTES = 256
MAX_CHOICES = 16
# Request ids are echoed on every event and kept per stream: bounded like any identifier.
MAX_REQUEST_ID_BYTES = 256
PENALTY_RANGE = 2.0  # frequency / presence penalties in -2 .. 2 (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0
MAX_BIAS = 100.0
MAX_JSON_REPEAT_PENALTY = 5.0


PRIORITIES: dict[int, Priority] = {
    pb.PRIORITY_UNSPECIFIED: Priority.INTERACTIVE,
    pb.PRIORITY_INTERACTIVE: Priority.INTERACTIVE,
    pb.PRIORITY_BATCH: Priority.BATCH,
}


@dataclass(frozen=True)
class PromptLimits:
    max_context: int  # prompt + generated tokens one sequence may hold
    inputs: InputLimits = field(default_factory=InputLimits)  # counts of messages, stop strings, logit_bias entries


@dataclass(frozen=True)
class JsonDefaults:
    """Server defaults for JSON output (flags --json-finish and --json-repeat-penalty)."""

    close_within_budget: bool = True  # JSON_FINISH_UNSPECIFIED means CLOSE_WITHIN_BUDGET (--json-finish close)
    repeat_penalty: float = 0.8  # GenerateJSON's json_repeat_penalty when unset (Generate: 0)


class RequestBuilder:
    """Turns prompt/messages/sampling/priority fields into validated engine inputs."""

    def __init__(
        self, vocab: Vocab, template: ChatTemplate, limits: PromptLimits, json: JsonDefaults | None = None,
        is_special: Callable[[int], bool] | None = None,
    ) -> None:
        self.vocab = vocab
        self.template = template
        self.limits = limits
        self.json = json or JsonDefaults()
        # NOTE: which tokens llguidance treats as special (the grammar service's tokenizer says); without it,
        # the vocabulary's control tokens
        self._is_special = is_special or (lambda t: t in self._control_ids)

    @functools.cached_property
    def _control_ids(self) -> frozenset[int]:
        return frozenset(s.id for s in self.vocab.special_texts())

    @functools.cached_property
    def tool_format(self) -> ToolFormat:
        """The model's tool-call family, its markers placed in this vocabulary (``service.chat.tool_format``)."""
        family = self.template.family
        return ToolFormat(family, self._bind(family.syntax.markers()), self.template.caps)

    def _bind(self, markers: Sequence[str]) -> Markup:
        return bind(markers, lambda text: self.vocab.tokenize(text, False, True), self._is_special,
                    lambda t: self.vocab.piece(t, special=True).decode("utf-8", "replace"))

    @functools.cached_property
    def reasoning(self) -> Reasoning | None:
        """The model's reasoning markers in this vocabulary (None: it does not reason in markers)."""
        thinking = self.template.thinking
        return None if thinking is None else Reasoning(thinking, self._bind(thinking.markers()))

    @functools.cached_property
    def header(self) -> Reasoning | None:
        """The family's answer header in this vocabulary, for a model that does not reason in markers (None:
        its answers have none, or its reasoning row reads them: ``service.chat.thinking.Header``)."""
        row = self.template.family.header() if self.template.thinking is None else None
        return None if row is None else Reasoning(row, self._bind(row.markers()))

    @functools.cached_property
    def shown_bytes(self) -> list[bytes]:
        """Each token's bytes as a chat request sees them: the family's call and thought markers as their text."""
        out = list(self.vocab.token_bytes)
        shown = dict(self.tool_format.markup.shown())
        if self.reasoning is not None:
            shown.update(self.reasoning.markup.shown())
        for token, text in shown.items():
            out[token] = text
        return out

    def priority(self, value: int) -> Priority:
        if value not in PRIORITIES:
            raise BadRequest(f"priority {value} is not a known Priority value (0, 1 or 2)")
        return PRIORITIES[value]

    @functools.cached_property
    def tokenizer(self) -> PromptTokenizer:
        """Caller text as text, the template's markers as control tokens (``service.model.prompt_tokens``)."""
        return PromptTokenizer(self.vocab, self.template)

    def prompt_ids(self, prompt: str, messages: list[pb.ChatMessage], tools: Sequence[pb.Tool] = (),
                   kwargs: str = "") -> list[int]:
        """Token ids of the raw prompt or the rendered chat; exactly one must be given.

        Sizes are checked before the work that grows with them: the number of
        messages and a prompt whose text is too long for any tokenization to
        fit the context before anything is rendered, a rendered chat whose
        control tokens and runs of text alone exceed the context before it is
        tokenized. Caller text never becomes control tokens (docs/security.md).
        """
        self._count(messages)
        self._fits(len(prompt) + chars(messages, tools, kwargs))
        if messages:
            rendered = self._render(prompt, messages, tools, kwargs)
            self._fits(len(rendered.text))
            self._fits_parts(rendered)
            ids = self.tokenizer.ids(rendered.parts, add_special=not self.tokenizer.starts_with_bos(rendered))
        else:
            _chat_only(tools, kwargs)
            ids = self.tokenizer.text_ids(self._raw(prompt), add_special=True, parse_special=False)
        if not ids:
            raise BadRequest("prompt is empty after tokenization")
        if len(ids) >= self.limits.max_context:
            raise BadRequest(
                f"prompt is {len(ids)} tokens; the context limit is {self.limits.max_context} tokens "
                "(prompt plus generated tokens)"
            )
        return ids

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The most bytes one token of this model stands for (control tokens as their text)."""
        v = self.vocab
        return max(len(v.piece(t, special=True)) for t in range(v.n_vocab))

    def _count(self, messages: list[pb.ChatMessage]) -> None:
        if problem := self.limits.inputs.messages(len(messages)):
            raise BadRequest(problem)

    def _fits(self, chars: int) -> None:
        """Refuse text of ``chars`` characters that no tokenization can fit into the context.

        NOTE: a lower bound, so never a false refusal: a character is at least one
        UTF-8 byte and no token covers more than ``max_piece_bytes`` bytes.
        """
        least = chars // max(self.max_piece_bytes, 1)
        if least >= self.limits.max_context:
            raise BadRequest(
                f"prompt is at least {least} tokens ({chars} characters; no token of this model is longer "
                f"than {self.max_piece_bytes} bytes); the context limit is {self.limits.max_context} tokens "
                "(prompt plus generated tokens)"
            )

    def _fits_parts(self, rendered: Rendered) -> None:
        """Refuse a rendered chat whose control tokens and runs of text (at least a token each) exceed the
        context: a lower bound known before the tokenizer runs, so a chat of many short turns costs no
        tokenizing."""
        if len(rendered.parts) >= self.limits.max_context:
            raise BadRequest(
                f"prompt is at least {len(rendered.parts)} tokens (its chat markup alone); the context limit "
                f"is {self.limits.max_context} tokens (prompt plus generated tokens)"
            )

    def _render(self, prompt: str, messages: list[pb.ChatMessage], tools: Sequence[pb.Tool] = (), kwargs: str = "",
                field: str = "prompt") -> Rendered:
        """The chat rendered by the template (caller text escaped); set either ``field`` or messages."""
        if prompt:
            raise BadRequest(f"set either {field} or messages, not both")
        conv = conversation(messages, tools, kwargs, self.limits.inputs)
        try:
            return self.tokenizer.render(conv)
        except ChatTemplateError as exc:
            raise BadRequest(str(exc)) from exc

    @staticmethod
    def _raw(prompt: str, field: str = "prompt") -> str:
        if not prompt:
            raise BadRequest(f"{field} is empty (set {field} or messages)")
        return prompt

    def render_tokens(
        self,
        prompt: str,
        messages: list[pb.ChatMessage],
        add_special: bool | None = None,
        parse_special: bool | None = None,
        field: str = "prompt",
        tools: Sequence[pb.Tool] = (),
        kwargs: str = "",
    ) -> tuple[str, list[int]]:
        """The text Generate tokenizes and its token ids, as Generate does unless a flag says otherwise.

        Generate's choice: a raw prompt gets BOS (if the model wants one) and no special-token
        parsing; a chat gets BOS unless the template wrote it, and only the template's own markers
        are control tokens. ``parse_special`` True parses every control token's text, message
        content included; False parses none (the template's markers become text too).
        """
        self._count(messages)
        if not messages:
            _chat_only(tools, kwargs)
            text = self._raw(prompt, field)
            add = True if add_special is None else add_special
            return text, self.tokenizer.text_ids(text, add, bool(parse_special))
        rendered = self._render(prompt, messages, tools, kwargs, field)
        add = not self.tokenizer.starts_with_bos(rendered) if add_special is None else add_special
        if parse_special is None:
            return rendered.text, self.tokenizer.ids(rendered.parts, add)
        return rendered.text, self.tokenizer.text_ids(rendered.text, add, parse_special)

    def sampling(
        self, sp: pb.SamplingParams, num_prompt: int, json_mode: bool = False, json_output: bool = False
    ) -> SamplingParams:
        """Validated sampling parameters; unset fields take the documented defaults.

        ``json_mode``: a GenerateJSON request; ``json_output``: the output is a
        JSON document (GenerateJSON or a json_schema response format).
        """
        max_tokens = self._max_tokens(sp, num_prompt, json_mode)
        json_finish, repeat_penalty = self._json_fields(sp, json_mode, json_output or json_mode)
        defaults = SamplingParams()
        temperature = sp.temperature if sp.HasField("temperature") else defaults.temperature
        top_p = sp.top_p if sp.HasField("top_p") else defaults.top_p
        top_k = sp.top_k if sp.HasField("top_k") else defaults.top_k
        min_p = sp.min_p if sp.HasField("min_p") else defaults.min_p
        if not math.isfinite(temperature) or temperature < 0:
            raise BadRequest(f"temperature must be >= 0, got {temperature}")
        if not (0.0 < top_p <= 1.0):
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise BadRequest(f"top_k must be >= 0 (0 disables), got {top_k}")
        if not (0.0 <= min_p <= 1.0):
            raise BadRequest(f"min_p must be in [0, 1], got {min_p}")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            seed=sp.seed if sp.HasField("seed") else None,
            stop=_stops(sp, self.limits.inputs),
            ignore_eos=sp.ignore_eos,
            logprobs=sp.logprobs,
            top_logprobs=_top_logprobs(sp),
            n=_choices(sp),
            echo_prompt_logprobs=sp.echo_prompt_logprobs,
            **_penalties(sp),
            logit_bias=_logit_bias(sp, self.vocab.n_vocab, self.limits.inputs),
            json_finish=json_finish,
            json_repeat_penalty=repeat_penalty,
        )

    def _json_fields(self, sp: pb.SamplingParams, json_mode: bool, json_output: bool) -> tuple[bool, float]:
        """json_finish and json_repeat_penalty: only for JSON output; unset takes the server defaults."""
        finish = sp.json_finish
        if finish not in (
            pb.JSON_FINISH_UNSPECIFIED,
            pb.JSON_FINISH_CUT_OFF,
            pb.JSON_FINISH_CLOSE_WITHIN_BUDGET,
        ):
            raise BadRequest(f"json_finish {finish} is not a known JsonFinish value (0, 1 or 2)")
        if finish == pb.JSON_FINISH_CLOSE_WITHIN_BUDGET and not json_output:
            raise BadRequest(
                "json_finish CLOSE_WITHIN_BUDGET needs JSON output: GenerateJSON or a json_schema response_format"
            )
        close = finish == pb.JSON_FINISH_CLOSE_WITHIN_BUDGET or (
            finish == pb.JSON_FINISH_UNSPECIFIED and json_output and self.json.close_within_budget
        )
        if not sp.HasField("json_repeat_penalty"):
            return close, self.json.repeat_penalty if json_mode else 0.0
        value = sp.json_repeat_penalty
        if not (math.isfinite(value) and 0.0 <= value <= MAX_JSON_REPEAT_PENALTY):
            raise BadRequest(f"json_repeat_penalty must be in [0, {MAX_JSON_REPEAT_PENALTY:g}], got {value}")
        if value and not json_output:
            raise BadRequest(
                "json_repeat_penalty needs JSON output: GenerateJSON or a json_schema response_format"
            )
        return close, value

    def _max_tokens(self, sp: pb.SamplingParams, num_prompt: int, json_mode: bool) -> int:
        limit = self.limits.max_context
        room = limit - num_prompt
        if sp.HasField("max_tokens"):
            max_tokens = sp.max_tokens
            if max_tokens == 0 and sp.echo_prompt_logprobs:
                return 0  # score the prompt only
            if max_tokens < 1:
                raise BadRequest(
                    f"max_tokens must be >= 1 (0 only with echo_prompt_logprobs), got {max_tokens}"
                )
            if max_tokens > limit:
                raise BadRequest(f"max_tokens {max_tokens} exceeds the context limit of {limit} tokens")
            if max_tokens > room:
                raise BadRequest(
                    f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds the context limit "
                    f"of {limit} tokens"
                )
            return max_tokens
        return min(DEFAULT_JSON_MAX_TOKENS if json_mode else DEFAULT_MAX_TOKENS, room)


def _chat_only(tools: Sequence[pb.Tool], kwargs: str) -> None:
    if tools or kwargs:
        raise BadRequest("tools and chat_template_kwargs need messages (a chat), not a raw prompt")


def _penalties(sp: pb.SamplingParams) -> dict[str, float]:
    """frequency / presence / repetition penalties, range-checked; unset means off."""
    out: dict[str, float] = {}
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(sp, name) if sp.HasField(name) else 0.0
        if not (math.isfinite(value) and -PENALTY_RANGE <= value <= PENALTY_RANGE):
            raise BadRequest(f"{name} must be in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}], got {value}")
        out[name] = value
    rep = sp.repetition_penalty if sp.HasField("repetition_penalty") else 1.0
    if not (math.isfinite(rep) and 0.0 < rep <= MAX_REPETITION_PENALTY):
        raise BadRequest(
            f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = off), got {rep}"
        )
    out["repetition_penalty"] = rep
    return out


def _logit_bias(sp: pb.SamplingParams, n_vocab: int, limits: InputLimits) -> tuple[tuple[int, float], ...]:
    """The logit_bias map as sorted (id, bias) pairs; ids in the vocabulary, biases in [-100, 100]."""
    if problem := limits.logit_bias(len(sp.logit_bias)):
        raise BadRequest(problem)
    for token, bias in sp.logit_bias.items():
        if not 0 <= token < n_vocab:
            raise BadRequest(f"logit_bias token id {token} is outside the vocabulary (0..{n_vocab - 1})")
        if not (math.isfinite(bias) and -MAX_BIAS <= bias <= MAX_BIAS):
            raise BadRequest(
                f"logit_bias for token {token} must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {bias}"
            )
    return tuple(sorted((int(t), float(b)) for t, b in sp.logit_bias.items() if b != 0.0))


def _stops(sp: pb.SamplingParams, limits: InputLimits) -> tuple[str, ...]:
    if problem := limits.stop(len(sp.stop)):
        raise BadRequest(problem)
    stops = tuple(sp.stop)
    for s in stops:
        if not s or len(s.encode()) > MAX_STOP_BYTES:
            raise BadRequest(f"stop strings must be 1..{MAX_STOP_BYTES} bytes, got {len(s.encode())}")
    return stops


def _top_logprobs(sp: pb.SamplingParams) -> int:
    k = sp.top_logprobs
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {k}")
    if k and not sp.logprobs:
        raise BadRequest("top_logprobs needs logprobs: set logprobs to true")
    return k


def _choices(sp: pb.SamplingParams) -> int:
    if not sp.HasField("n"):
        return 1
    if not 1 <= sp.n <= MAX_CHOICES:
        raise BadRequest(f"n must be in 1..{MAX_CHOICES}, got {sp.n}")
    return sp.n
