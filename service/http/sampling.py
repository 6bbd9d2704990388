"""Parameters Chat Completions and Completions share: sampling, stop, n, seed, priority, streaming.

They become an ``inference.v1.SamplingParams`` and a ``Priority``; the
intake's request builder then validates them exactly as for gRPC (its
``BadRequest`` comes back as a 400). What is refused here is only what the
proto cannot say, or says differently:

* ``frequency_penalty`` and ``presence_penalty`` (-2 .. 2), ``logit_bias``
  (token ids as decimal strings -> a bias in -100 .. 100, at most ``--max-logit-bias`` entries)
  and the extension ``repetition_penalty`` (llama.cpp's, (0, 10], 1 = off) map
  onto the ``SamplingParams`` fields of the same names; a value out of range
  is a 400 naming the parameter here (a token id outside the vocabulary is
  refused by the intake, its message naming ``logit_bias``);
* accepted and ignored (documented in docs/openai.md): ``user``, ``metadata``,
  ``store`` (false), ``safety_identifier``, ``prompt_cache_key`` and
  ``prompt_cache_retention`` (prefix caching is automatic), ``parallel_tool_calls``;
* the scheduling tier: ``x-priority: interactive|batch`` header, the body
  extension ``priority`` (same values), or ``service_tier: "flex"`` (batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.input_limits import InputLimits
from service.api.request_builder import MAX_BIAS, MAX_REPETITION_PENALTY, PENALTY_RANGE
from service.http.body import Body
from service.http.errors import bad_param

MAX_SEED = 2**64 - 1
IGNORED = ("user", "metadata", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
           "parallel_tool_calls")
SHARED = (
    "model", "stream", "stream_options", "n", "stop", "seed", "temperature", "top_p", "max_tokens",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "store", "service_tier",
    "top_k", "min_p", "ignore_eos", "priority", *IGNORED,
)
PRIORITY: dict[str, pb.Priority] = {"interactive": pb.PRIORITY_INTERACTIVE, "batch": pb.PRIORITY_BATCH}
TIERS: dict[str, pb.Priority] = {"auto": pb.PRIORITY_UNSPECIFIED, "default": pb.PRIORITY_UNSPECIFIED,
         "priority": pb.PRIORITY_INTERACTIVE, "flex": pb.PRIORITY_BATCH}


@dataclass(frozen=True)
class Streaming:
    stream: bool = False
    include_usage: bool = False


def streaming(body: Body) -> Streaming:
    stream = bool(body.bool_("stream"))
    opts = body.obj("stream_options", ("include_usage", "include_obfuscation", "continuous_usage_stats"))
    if opts is not None and not stream:
        raise bad_param("stream_options", "stream_options is only allowed when stream is true")
    include = bool(opts.bool_("include_usage")) if opts is not None else False
    if opts is not None:
        opts.bool_("include_obfuscation")  # accepted and ignored: nothing is obfuscated here
        # NOTE: vLLM's extension, sent by load tools (guidellm): accepted and ignored; the usage comes in
        # the last chunk (include_usage), which is what those tools read.
        opts.bool_("continuous_usage_stats")
    return Streaming(stream, include)


def _penalties(body: Body, sp: pb.SamplingParams) -> None:
    """frequency / presence penalties (OpenAI's -2 .. 2) and repetition_penalty ((0, 10], 1 = off)."""
    for name in ("frequency_penalty", "presence_penalty"):
        if (value := body.num(name, -PENALTY_RANGE, PENALTY_RANGE)) is not None:
            setattr(sp, name, value)
    if (rep := body.num("repetition_penalty", -math.inf, math.inf)) is not None:
        if not 0.0 < rep <= MAX_REPETITION_PENALTY:
            raise bad_param("repetition_penalty",
                            f"'repetition_penalty' must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = off), got {rep:g}")
        sp.repetition_penalty = rep


def _bias_value(token: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_param("logit_bias", f"'logit_bias' value for token {token} must be a number, got {value!r}")
    if not -MAX_BIAS <= value <= MAX_BIAS:
        raise bad_param("logit_bias", f"'logit_bias' value for token {token} must be in "
                                      f"[-{MAX_BIAS:g}, {MAX_BIAS:g}], got {value}")
    return float(value)


def logit_bias(body: Body, limits: InputLimits) -> dict[int, float]:
    """OpenAI's ``logit_bias``: token ids (decimal strings) -> bias in [-100, 100]; {} when unset."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad_param("logit_bias", "'logit_bias' must be an object mapping token ids to a bias in [-100, 100]")
    if problem := limits.logit_bias(len(bias)):
        raise bad_param("logit_bias", problem)
    out: dict[int, float] = {}
    for token, value in bias.items():
        # NOTE: the length first: int() of more than 4,300 digits raises ValueError (CPython's limit)
        if not (token.isascii() and token.isdigit()) or len(token) > 10 or int(token) >= 2**31:
            shown = token if len(token) <= 24 else f"{token[:12]}... ({len(token)} characters)"
            raise bad_param("logit_bias", f"'logit_bias' keys must be token ids (integers in 0..2147483647), "
                                          f"got {shown!r}")
        out[int(token)] = _bias_value(token, value)
    return out


def _store(body: Body) -> None:
    if body.bool_("store"):
        raise bad_param("store", "store is not supported: this server keeps no completions (use store: false)")


def _stops(body: Body, limits: InputLimits) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and (problem := limits.stop(len(stop))):
        raise bad_param("stop", problem)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise bad_param("stop", "'stop' must be a string or an array of strings")


def sampling_params(body: Body, max_tokens: int | None, limits: InputLimits) -> pb.SamplingParams:
    """The shared parameters as a proto (``max_tokens``: the endpoint's resolved limit, or None)."""
    _store(body)
    sp = pb.SamplingParams(stop=_stops(body, limits), ignore_eos=bool(body.bool_("ignore_eos")))
    _penalties(body, sp)
    for token, bias in logit_bias(body, limits).items():
        sp.logit_bias[token] = bias
    if max_tokens is not None:
        sp.max_tokens = max_tokens
    if (t := body.num("temperature", 0.0, 2.0)) is not None:
        sp.temperature = t
    if (p := body.num("top_p", 0.0, 1.0)) is not None:
        if p == 0.0:
            sp.top_k = 1  # NOTE: top_p 0 keeps only the most likely token (greedy), as OpenAI treats it
        else:
            sp.top_p = p
    if (k := body.int_("top_k", 0, 1 << 30)) is not None and not sp.HasField("top_k"):
        sp.top_k = k
    if (m := body.num("min_p", 0.0, 1.0)) is not None:
        sp.min_p = m
    if (seed := body.int_("seed", -(2**63), MAX_SEED)) is not None:
        sp.seed = seed % 2**64  # NOTE: a negative seed (allowed by OpenAI) maps to its two's complement
    if (n := body.int_("n", 1, 1 << 30)) is not None:
        sp.n = n
    return sp


def priority(body: Body, header: str | None) -> pb.Priority:
    """The tier from ``x-priority``, the body's ``priority`` or ``service_tier`` ("flex" = batch)."""
    tier = body.str_("service_tier")
    if tier is not None and tier not in TIERS:
        raise bad_param("service_tier", f"service_tier must be one of {', '.join(TIERS)}")
    value = TIERS.get(tier or "auto", pb.PRIORITY_UNSPECIFIED)
    named = [v for v in (header, body.str_("priority")) if v is not None]
    for name in named:
        if name not in PRIORITY:
            raise bad_param("priority", f"priority (x-priority header or body) must be interactive or batch, got {name!r}")
    if len({*named}) > 1:
        raise bad_param("priority", "the x-priority header and the body's priority disagree")
    return PRIORITY[named[0]] if named else value


def max_tokens(body: Body, default: int | None) -> int | None:
    """``max_completion_tokens`` or ``max_tokens`` (both: they must agree); None: the server's default."""
    a = body.int_("max_tokens", 1, 1 << 30)
    b = body.int_("max_completion_tokens", 1, 1 << 30) if "max_completion_tokens" in body.raw else None
    if a is not None and b is not None and a != b:
        raise bad_param("max_completion_tokens", "max_tokens and max_completion_tokens disagree; set one")
    return b if b is not None else a if a is not None else default
