"""A tiny byte-level BPE vocabulary written as a vocabulary-only GGUF file (no weights, no download).

Unit tests of the tokenizer-facing code (grammars, masks, the duplicate-key guard, the request
builder) need a real llama.cpp vocabulary but not the default model's 49,152 tokens: ``build``
writes one of about 600 tokens, shaped like SmolLM2's (GPT-2 byte-level BPE without the bytes SmolLM2 lacks, the ``smollm``
pre-tokenizer, ChatML control tokens at ids 0-2, no BOS added; ``add_bos=True`` gives a vocabulary
that wants its BOS ``<s>``, id 3, like Gemma's), that ``Vocab.load`` reads as it
reads the default model's. The merges are learnt from ``CORPUS`` (JSON and short English), so
tokens span JSON punctuation and whole words, as real tokens do.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]  # "<s>": the BOS of add_bos=True
# gpt-oss's (o200k_harmony's) chat tokens, all control in its GGUF; llama.cpp's loader retypes five of them.
HARMONY_CONTROL = ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                   "<|constrain|>", "<|return|>", "<|call|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """Another model family's chat tokens for ``build``: its control tokens (``bos`` and ``eos`` among
    them), user-defined tokens (matched in any text, as llama.cpp does), GGUF name and chat template."""

    name: str
    control: list[str]
    bos: str
    eos: str
    template: str
    user_defined: list[str] = field(default_factory=list)


CORPUS = [
    '{"name":"Al","age":3}',
    '{"name": "Bo", "age": 7, "tags": ["a", "b"], "ok": true, "none": null}',
    '{"id":1,"items":[{"x":1.5},{"y":-2}],"format":"x","not":1}',
    '[{"key":"value"},{"type":"object","properties":{},"required":[]}]',
    "What is the primary function of the human brain? The brain controls the body.",
    "Once upon a time there was a small town by the sea, and the people were happy.",
    "The capital of France is Paris. The capital of Italy is Rome. yes no maybe",
    "Hello world! Count: one, two, three, four, five. 0123456789",
    "def main():\n    return 42\n",
]
MERGES = 400
# Bytes SmolLM2's vocabulary has no token for (never in UTF-8, or rare control characters): left out
# here too, so a constraint that needs one is refused as it is with the default model.
MISSING_BYTES = frozenset({4, 6, 19, 20, 22, 29, 192, 193, *range(241, 243), *range(245, 256)})


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value, as byte-level BPE vocabularies store tokens."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = _byte_chars()
WORDS = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def _learn_merges(corpus: list[str], n: int) -> list[tuple[str, str]]:
    """``n`` BPE merges of the corpus's pre-tokenized words, most frequent pair first (ties by pair)."""
    words = Counter(
        tuple(BYTE_CHARS[b] for b in w.encode()) for text in corpus for w in WORDS.findall(text)
    )
    merges: list[tuple[str, str]] = []
    while len(merges) < n:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def _weights(writer: Any, vocab: int, seed: int) -> None:
    """A llama model of the header's shape (64 wide, one layer), its matrices N(0, 0.02) from numpy's
    generator seeded per tensor, its norms ones: output that is random but the same on every run."""
    import numpy as np

    shapes = [("token_embd.weight", (vocab, 64)), ("blk.0.attn_norm.weight", (64,)),
              ("blk.0.attn_q.weight", (64, 64)), ("blk.0.attn_k.weight", (64, 64)), ("blk.0.attn_v.weight", (64, 64)),
              ("blk.0.attn_output.weight", (64, 64)), ("blk.0.ffn_norm.weight", (64,)),
              ("blk.0.ffn_gate.weight", (128, 64)), ("blk.0.ffn_up.weight", (128, 64)),
              ("blk.0.ffn_down.weight", (64, 128)), ("output_norm.weight", (64,)), ("output.weight", (vocab, 64))]
    for i, (name, dims) in enumerate(shapes):
        if len(dims) == 1:
            data = np.ones(dims, dtype=np.float32)
        else:
            data = np.random.default_rng([seed, i]).standard_normal(dims, dtype=np.float32) * np.float32(0.02)
        writer.add_tensor(name, data)


def _gemma3_weights(writer: Any, vocab: int, seed: int) -> None:
    """Gemma 3's tensors for two layers 64 wide (the first with the sliding window), seeded as ``_weights``."""
    import numpy as np

    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(2):
        names += [f"blk.{i}.{t}.weight" for t in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                  "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
                  "ffn_down", "post_ffw_norm")]
    for j, name in enumerate(names):
        kind = name.split(".")[-2]
        dims = {"token_embd": (vocab, 64), "ffn_gate": (128, 64), "ffn_up": (128, 64), "ffn_down": (64, 128)}.get(
            kind, (64, 64) if kind.startswith("attn_") and not kind.endswith("norm") else (64,))
        data = np.random.default_rng([seed, j]).standard_normal(dims, dtype=np.float32) * np.float32(0.02)
        writer.add_tensor(name, np.ones(dims, dtype=np.float32) if len(dims) == 1 else data)


def build(
    path: Path, add_bos: bool = False, family: Family | None = None, weights: int | None = None,
    window: int | None = None,
) -> Path:
    """Write the tiny vocabulary to ``path`` (a GGUF file llama.cpp loads with ``vocab_only``).

    ``family``: another model family's control and user-defined tokens, name and chat template
    instead of SmolLM2's (the byte tokens and merges stay the same). ``weights``: a seed, to write a
    whole model a server can run (random weights, ``_weights``; a context of 16,384 tokens).
    ``window``: with ``weights``, a Gemma 3 model instead, whose first layer attends to the last
    ``window`` positions only (llama.cpp then keeps a second cache for that layer).
    """
    import gguf

    merges = _learn_merges(CORPUS, MERGES)
    control = family.control if family else CONTROL
    user = family.user_defined if family else []
    tokens = [*control, *user, *(c for b, c in enumerate(BYTE_CHARS) if b not in MISSING_BYTES)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [gguf.TokenType.CONTROL] * len(control) + [gguf.TokenType.USER_DEFINED] * len(user)
    types += [gguf.TokenType.NORMAL] * (len(tokens) - len(types))
    arch = "gemma3" if window is not None and weights is not None else "llama"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(family.name if family else "tiny-vocab")
    writer.add_context_length(2048 if weights is None else 16384)  # NOTE: a model's long chat prompts fit
    writer.add_embedding_length(64)
    writer.add_block_count(2 if arch == "gemma3" else 1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    if family:
        writer.add_bos_token_id(tokens.index(family.bos))
        writer.add_eos_token_id(tokens.index(family.eos))
    else:
        writer.add_bos_token_id(3 if add_bos else 1)
        writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(family.template if family else CHAT_TEMPLATE)
    if weights is not None and arch == "gemma3":
        writer.add_key_length(64)
        writer.add_value_length(64)
        writer.add_sliding_window(window)
        writer.add_sliding_window_pattern(2)  # NOTE: llama.cpp's rule: layer i has the window when i % 2 < 1
        writer.add_rope_freq_base(10_000.0)
        _gemma3_weights(writer, len(tokens), weights)
    elif weights is not None:
        writer.add_rope_dimension_count(64)
        _weights(writer, len(tokens), weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
