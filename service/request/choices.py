"""Several choices of one request (``SamplingParams.n``): n sequences that share one prompt.

Each choice is an ordinary ``Sequence`` (own sampling state, KV lane, grammar
matcher and text stream). Choices 1..n-1 wait until choice 0 has computed the
prompt (``Sequence.after``), then are admitted onto its KV blocks through the
prefix cache, so the prompt is prefilled once: each further choice computes
only the prompt's last partial block (fewer than ``block_size`` tokens).

With a seed, choice i samples with ``seed + i`` (mod 2**64), so a request is
reproducible choice by choice. Only choice 0 reports prompt log-probabilities.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from service.request.sequence import Sequence


def members(seq: Sequence) -> tuple[Sequence, ...]:
    """All choices of ``seq``'s request (just ``seq`` when n == 1)."""
    return seq.group or (seq,)


def link_choices(seqs: list[Sequence]) -> list[Sequence]:
    """Make ``seqs`` (prepared alike, ``len == params.n``) the choices of one request; returns them."""
    if len(seqs) == 1:
        return seqs
    first = seqs[0]
    group = tuple(seqs)
    for i, seq in enumerate(seqs):
        seed = None if first.params.seed is None else (first.params.seed + i) % 2**64
        seq.params = dataclasses.replace(seq.params, seed=seed, echo_prompt_logprobs=i == 0 and seq.params.echo_prompt_logprobs)
        seq.rng = np.random.default_rng(seed)
        seq.choice_index = i
        seq.group = group
        seq.after = first if i else None
    return seqs
