"""The only module that imports ``llama_cpp``: model, vocabulary, one batched decode.

Everything else in the service talks to llama.cpp through ``ModelRunner`` and
``Vocab`` so that the scheduler, KV manager and grammar logic stay testable
without a model.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import llama_cpp as L
import numpy as np

from service.kv.blocks import KVOp

log = logging.getLogger("service.llama")


class ModelLoadError(RuntimeError):
    """The model file is missing, corrupt or cannot be loaded."""


# -- llama.cpp logging: forwarded to Python logging; KV buffer sizes and errors are captured ----
_KV_LINE = re.compile(r"KV buffer size\s*=\s*([\d.]+)\s*MiB")
_kv_buffer_mib: list[float] = []
_errors: list[str] = []  # llama.cpp's error lines since the last clear (why a context was refused)
_log_lock = threading.Lock()
_GGML_LOG_LEVEL_ERROR = 4


@L.llama_log_callback
def _on_llama_log(level: int, text: bytes, _user: Any) -> None:
    msg = text.decode("utf-8", "replace").rstrip()
    if m := _KV_LINE.search(msg):
        _kv_buffer_mib.append(float(m.group(1)))
    if level == _GGML_LOG_LEVEL_ERROR and msg:
        _errors.append(msg)
    if msg:
        log.debug("%s", msg)


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _log_lock:
        if not _backend_ready:
            L.llama_log_set(_on_llama_log, ctypes.c_void_p(0))
            L.llama_backend_init()
            _backend_ready = True


def _load_model(path: str | Path, vocab_only: bool) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"model file {path} not found: run `make model` (or `make bench-model`)")
    _init_backend()
    params = L.llama_model_default_params()
    params.vocab_only = vocab_only
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(f"cannot load {path}: corrupt or unsupported GGUF; re-run `make model`")
    return model


def _meta(model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _meta_scalars(model: Any) -> dict[str, str]:
    """Every scalar GGUF metadata entry (llama.cpp keeps no arrays here), as text."""
    out: dict[str, str] = {}
    for i in range(L.llama_model_meta_count(model)):
        key = _by_index(L.llama_model_meta_key_by_index, model, i)
        value = _by_index(L.llama_model_meta_val_str_by_index, model, i)
        if key is not None and value is not None:
            out[key] = value
    return out


def _by_index(fn: Any, model: Any, i: int) -> str | None:
    buf = ctypes.create_string_buffer(1 << 12)
    n = fn(model, i, buf, len(buf))
    if n >= len(buf):  # snprintf semantics: the full length; retry with room for it
        buf = ctypes.create_string_buffer(n + 1)
        n = fn(model, i, buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


# llama.cpp's file types (GGUF general.file_type) by number: "Q4_1", "Q4_K_M", "F16", ...
FILE_TYPES: dict[int, str] = {
    getattr(L, n): n.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    for n in dir(L)
    if n.startswith("LLAMA_FTYPE_") and n != "LLAMA_FTYPE_GUESSED"
}
# Named special tokens, as llama_vocab_<name> returns them (GetModelInfo's order).
SPECIAL_TOKEN_NAMES: tuple[str, ...] = ("bos", "eos", "eot", "sep", "pad", "mask")  # (llama_vocab_cls is BOS)
SPECIAL_TOKEN_NAMES += ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")


class SpecialText(NamedTuple):
    """A control token: one that caller text must never become (``service.model.prompt_tokens``).

    ``lstrip``/``rstrip``: llama.cpp drops the whitespace before / after it when it is parsed.
    ``in_any_text``: llama.cpp matches its text even without special parsing (a control token its
    loader retyped as user-defined, ``RETYPED_CONTROL``), so text must be kept from becoming it.
    """

    id: int
    text: str
    lstrip: bool = False
    rstrip: bool = False
    in_any_text: bool = False


# Tokens llama.cpp's tokenizer skips when parse_special is false (user-defined tokens are matched either way).
_PARSED_ONLY = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN
# NOTE: gpt-oss's harmony markers are control tokens in its GGUF (tokenizer.ggml.token_type), but
# llama.cpp's loader retypes them to user-defined, which it matches in any text: llama-vocab.cpp's
# "quick hack for gpt-oss, always render these tokens" (<|channel|>, <|message|>, <|start|>,
# <|constrain|>, by name) and its o200k_harmony workaround that takes <|end|> off the end-of-generation
# tokens when <|return|> and <|call|> are on them. They count as control tokens when llama.cpp reports
# them user-defined. A list, not the GGUF's own token_type array: the gguf package parses every
# metadata array to read one (5 s for SmolLM2's 49k tokens; gpt-oss has 201k tokens and 446k merges),
# at every load, while llama.cpp itself picks these by name; tests/unit/model/test_harmony_tokens.py
# fails if a llama.cpp upgrade retypes another of gpt-oss's control tokens. A model whose GGUF has one
# of these names as a user-defined token only gets it kept out of caller text, as a control token is.
RETYPED_CONTROL = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"})


class Vocab:
    """Tokenizer, token byte pieces, end-of-generation ids and the chat template."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.ptr = L.llama_model_get_vocab(model)
        self.n_vocab: int = L.llama_vocab_n_tokens(self.ptr)
        self.add_bos: bool = bool(L.llama_vocab_get_add_bos(self.ptr))
        self.add_eos: bool = bool(L.llama_vocab_get_add_eos(self.ptr))
        self.bos_id: int = L.llama_vocab_bos(self.ptr)
        self.eos_id: int = L.llama_vocab_eos(self.ptr)
        self.token_bytes: list[bytes] = [self._piece(t, special=False) for t in range(self.n_vocab)]
        self.eog_ids = frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.ptr, t))
        self.bos_text = (
            self._piece(self.bos_id, special=True).decode("utf-8", "replace") if self.bos_id >= 0 else ""
        )
        self.eos_text = (
            self._piece(self.eos_id, special=True).decode("utf-8", "replace") if self.eos_id >= 0 else ""
        )
        tmpl = L.llama_model_chat_template(model, None)
        self.chat_template: str | None = tmpl.decode("utf-8", "replace") if tmpl else None

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Load only the vocabulary of a GGUF file (fast; no weights)."""
        return cls(_load_model(path, vocab_only=True))

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        return bytes(buf.raw[:n])

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS when the model wants it."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.ptr, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.ptr, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def special_texts(self) -> list[SpecialText]:
        """The vocabulary's control tokens (chat markers, BOS/EOS, ...) and its unknown token, by id:
        those whose text llama.cpp turns into them only with ``parse_special``, and the control tokens
        its loader retyped to user-defined (``RETYPED_CONTROL``, ``in_any_text``)."""
        out = []
        for t, attr, text in self._marked():
            if attr & _PARSED_ONLY and text:
                lstrip, rstrip = bool(attr & L.LLAMA_TOKEN_ATTR_LSTRIP), bool(attr & L.LLAMA_TOKEN_ATTR_RSTRIP)
                out.append(SpecialText(t, text, lstrip, rstrip))
            elif text in RETYPED_CONTROL:
                out.append(SpecialText(t, text, in_any_text=True))
        return out

    def user_defined(self) -> list[SpecialText]:
        """Every token llama.cpp reports user-defined (``LLAMA_TOKEN_ATTR_USER_DEFINED``), by id, all
        ``in_any_text``: llama.cpp matches their text in any text it tokenizes, special parsing or not
        (Qwen's ``<tool_call>`` and ``<think>``; gpt-oss's ``RETYPED_CONTROL`` are among them)."""
        return [
            SpecialText(t, text, bool(attr & L.LLAMA_TOKEN_ATTR_LSTRIP), bool(attr & L.LLAMA_TOKEN_ATTR_RSTRIP), True)
            for t, attr, text in self._marked()
            if attr & L.LLAMA_TOKEN_ATTR_USER_DEFINED and text
        ]

    def _marked(self) -> list[tuple[int, int, str]]:
        """``(id, attributes, text)`` of the tokens llama.cpp's tokenizer matches by text (control,
        unknown, user-defined), by id."""
        out = []
        for t in range(self.n_vocab):
            attr = L.llama_vocab_get_attr(self.ptr, t)
            if attr & (_PARSED_ONLY | L.LLAMA_TOKEN_ATTR_USER_DEFINED):
                out.append((t, attr, (L.llama_vocab_get_text(self.ptr, t) or b"").decode("utf-8", "replace")))
        return out

    def ll_tokenizer(self) -> Any:
        """An llguidance tokenizer for this vocabulary (about 1 s; build once per model)."""
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self.ptr, eos_token=sorted(self.eog_ids) or self.eos_id)

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes of ``token``; ``special`` renders control tokens (BOS, chat markers) as their text.

        NOTE: llama.cpp renders a control token as nothing unless asked for its
        text, and every other token the same either way: only empty pieces differ.
        """
        data = self.token_bytes[token]
        return self._piece(token, special=True) if special and not data else data

    def special_tokens(self) -> list[tuple[str, int, bytes]]:
        """``(name, id, text)`` of the named special tokens the vocabulary has, then the other
        end-of-generation tokens as "eog"."""
        found = []
        for name in SPECIAL_TOKEN_NAMES:
            token = int(getattr(L, f"llama_vocab_{name}")(self.ptr))
            if 0 <= token < self.n_vocab:
                found.append((name, token, self.piece(token, special=True)))
        named = {t for _, t, _ in found}
        return found + [("eog", t, self.piece(t, special=True)) for t in sorted(self.eog_ids - named)]


# The KV cache's data types (--kv-cache-type): ggml type, and bytes per block of values per block.
# NOTE: ggml's q8_0 block is 32 int8 values and one f16 scale (34 bytes), q4_0's 32 4-bit values
# and one f16 scale (18 bytes); llama.cpp stores one row per token and layer for K and for V.
KV_CACHE_TYPES: dict[str, tuple[int, int, int]] = {
    "f16": (L.GGML_TYPE_F16, 2, 1),
    "q8_0": (L.GGML_TYPE_Q8_0, 34, 32),
    "q4_0": (L.GGML_TYPE_Q4_0, 18, 32),
}


def _nbytes(pieces: list[tuple[int, int, ctypes.Array[ctypes.c_uint8]]]) -> int:
    return sum(len(buf) for _a, _b, buf in pieces)


def kv_row_bytes(kv_cache_type: str, values: int) -> int:
    """Bytes of one cache row of ``values`` values in ``kv_cache_type`` (ggml_row_size)."""
    _, block_bytes, block_values = KV_CACHE_TYPES[kv_cache_type]
    if values % block_values:
        raise ValueError(f"{values} values per row do not split into {kv_cache_type} blocks of {block_values}")
    return values // block_values * block_bytes


# NOTE: ggml's CPU flash attention switches to a tiled kernel once a batch has
# 64 or more query rows. That kernel skips only KV tiles masked for *every* row
# of a query tile. Rows of one prompt share a few tiles, so a long single prompt
# is fastest there; but decode rows of many sequences in a unified pool touch
# every tile, and the kernel then computes attention over all n_kv cells for
# every row. Measured here (Gemma 3 270M, 32 decoding sequences ~250 tokens
# long): decode alone 191 ms, + 31 prompt tokens 254 ms, + 32 prompt tokens
# 670 ms. Hence the scheduler keeps steps that contain decode rows below 64
# tokens and gives long prefill steps of their own (see Scheduler).
MIXED_BATCH_MAX = 63
# Logits rows beyond one per lane: the scheduler's per-step bound on rows of
# prompt log-probabilities (``Scheduler.prompt_rows``).
PROMPT_ROWS = 32


def _context_params(n_ctx: int, step_tokens: int, n_lanes: int, n_threads: int, kv_cache_type: str) -> Any:
    """llama.cpp's context parameters of a ``ModelRunner``."""
    params = L.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = step_tokens
    params.n_seq_max = n_lanes + 2  # then the scratch lane of ``_save`` and the pin lane of cached blocks
    # NOTE: llama.cpp sizes its logits buffer as n_vocab x n_outputs_max rows and
    # requires n_outputs_max >= n_seq_max: one row per lane, plus PROMPT_ROWS for
    # steps that need logits at several positions of one sequence (prompt
    # log-probabilities). Extra rows cost n_vocab x 4 bytes each.
    params.n_outputs_max = max(n_lanes, 1) + PROMPT_ROWS
    params.n_threads = params.n_threads_batch = n_threads
    params.kv_unified = True
    # NOTE: full-size SWA cache so a shared prefix keeps every cell it needs
    # (a pruned sliding window would make prefix reuse incorrect).
    params.swa_full = True
    params.no_perf = True
    ggml_type = KV_CACHE_TYPES[kv_cache_type][0]
    params.type_k = params.type_v = ggml_type
    if ggml_type != L.GGML_TYPE_F16:
        # NOTE: llama.cpp reads a quantized V cache only in its flash-attention kernel and refuses the
        # context when that is off. The default (auto) turns it on where the backend supports it, as on
        # CPU; asked for explicitly, a backend that cannot run it refuses instead of silently falling back.
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return params


def _refusal(model_path: str | Path, n_ctx: int, kv_cache_type: str, errors: list[str]) -> str:
    """The start-up error when llama.cpp creates no context, with its own reason when it logged one."""
    why = "; ".join(e.split(": ", 1)[-1] for e in errors) or "no reason given"
    text = f"cannot create a llama.cpp context for {model_path} (n_ctx={n_ctx}, KV cache {kv_cache_type}): {why}"
    if kv_cache_type != "f16":
        text += (f" (a {kv_cache_type} KV cache needs llama.cpp's flash attention, and rows of whole "
                 f"{KV_CACHE_TYPES[kv_cache_type][2]}-value blocks; --kv-cache-type f16 needs neither)")
    return text


class ModelRunner:
    """A llama.cpp model + context with a unified KV pool, driven one batch per call.

    Not thread-safe: only the engine thread calls ``decode`` and ``apply_kv_ops``.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int,
        step_tokens: int,
        n_lanes: int,
        n_threads: int,
        kv_cache_type: str = "f16",
    ) -> None:
        """Load the model and create its context; ``kv_cache_type`` is a key of ``KV_CACHE_TYPES``.

        Raises ModelLoadError (with llama.cpp's reason) when the model or the context cannot be made.
        """
        if kv_cache_type not in KV_CACHE_TYPES:
            raise ModelLoadError(f"unknown KV cache type {kv_cache_type!r}: one of {', '.join(KV_CACHE_TYPES)}")
        self.model_path = Path(model_path)
        self.model = _load_model(model_path, vocab_only=False)
        self.vocab = Vocab(self.model)
        self.n_ctx_train: int = L.llama_model_n_ctx_train(self.model)
        self.sliding_window: int = int(L.llama_model_n_swa(self.model))  # 0: no sliding-window layers
        self.kv_cache_type = kv_cache_type
        self.ctx = None
        try:
            per_token = self._metadata_bytes_per_token()
        except ValueError as exc:  # NOTE: checked here: ggml would abort the process on such a row
            self.close()
            raise ModelLoadError(f"a {kv_cache_type} KV cache does not fit {model_path}: {exc}; use f16") from None
        _kv_buffer_mib.clear()
        _errors.clear()
        params = _context_params(n_ctx, step_tokens, n_lanes, n_threads, kv_cache_type)
        self.ctx = L.llama_init_from_model(self.model, params)
        if not self.ctx:
            self.close()
            raise ModelLoadError(_refusal(model_path, n_ctx, kv_cache_type, list(_errors)))
        self.n_ctx: int = L.llama_n_ctx(self.ctx)
        self.step_tokens = step_tokens
        self.n_lanes = n_lanes
        self.pin_lane = n_lanes + 1  # a second holder of full blocks' cells: service.kv.window_pins
        self._spilled: dict[int, list[tuple[int, int, ctypes.Array[ctypes.c_uint8]]]] = {}  # key -> (p0, p1, state)
        self.spilled_bytes = 0  # host memory they hold (read by other threads: a plain int)
        self.n_threads = n_threads
        self.mixed_batch_max = MIXED_BATCH_MAX
        self.prompt_rows = PROMPT_ROWS
        self.mem = L.llama_get_memory(self.ctx)
        self.kv_buffer_bytes = int(sum(_kv_buffer_mib) * 1024 * 1024)
        self.kv_bytes_per_token = self._checked_bytes_per_token(per_token)
        self._init_batch(step_tokens)

    def _metadata_bytes_per_token(self) -> int:
        """K+V bytes per token over all layers in the cache's data type, from the GGUF metadata (ValueError:
        a row does not split into whole blocks of the type)."""
        layers, k_values, v_values = self._kv_shape()
        return layers * (kv_row_bytes(self.kv_cache_type, k_values) + kv_row_bytes(self.kv_cache_type, v_values))

    def _kv_shape(self) -> tuple[int, int, int]:
        """(layers, K values per token and layer, V values per token and layer), from the GGUF metadata."""
        arch = _meta(self.model, "general.architecture") or ""
        layers = L.llama_model_n_layer(self.model)
        heads_kv = int(
            _meta(self.model, f"{arch}.attention.head_count_kv") or L.llama_model_n_head_kv(self.model)
        )
        n_embd, n_head = L.llama_model_n_embd(self.model), L.llama_model_n_head(self.model)
        k_len = int(_meta(self.model, f"{arch}.attention.key_length") or n_embd // n_head)
        v_len = int(_meta(self.model, f"{arch}.attention.value_length") or n_embd // n_head)
        return layers, heads_kv * k_len, heads_kv * v_len

    def _checked_bytes_per_token(self, per_token: int) -> int:
        """K+V bytes per token over all layers in the cache's data type: ``per_token`` (from the GGUF
        metadata) when the KV buffer llama.cpp reported allocating for ``n_ctx`` cells agrees.

        NOTE: the metadata's figure is exact for the usual layouts (every layer caches K and V rows of
        head_count_kv x key/value_length values). A model whose layers share or skip KV would make it
        wrong; llama.cpp's buffer size (logged in MiB to two decimals) then wins, to within a byte or two.
        """
        if not self.kv_buffer_bytes:
            return per_token
        measured = self.kv_buffer_bytes / self.n_ctx
        if abs(measured - per_token) * self.n_ctx > 0.01 * 2**20 + 0.005 * self.kv_buffer_bytes:
            log.warning("KV bytes per token: %d from the metadata, %.1f from llama.cpp's buffer; using the latter",
                        per_token, measured)
            return round(measured)
        return per_token

    def _init_batch(self, cap: int) -> None:
        # NOTE: our own llama_batch whose arrays are numpy buffers, so a step fills
        # them with a few vectorised assignments instead of per-token ctypes writes.
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._sid = np.zeros(cap, dtype=np.int32)
        self._want = np.zeros(cap, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self._sid.ctypes.data
        self._sid_ptrs = (i32p * cap)(*[ctypes.cast(base + 4 * i, i32p) for i in range(cap)])
        b: Any = L.llama_batch()  # NOTE: fields are typed as arrays in the stubs; we store pointers
        b.token = self._tok.ctypes.data_as(i32p)
        b.embd = None
        b.pos = self._pos.ctypes.data_as(i32p)
        b.n_seq_id = self._nseq.ctypes.data_as(i32p)
        b.seq_id = ctypes.cast(self._sid_ptrs, ctypes.POINTER(i32p))
        b.logits = self._want.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._batch = b

    def decode(
        self, tokens: np.ndarray, positions: np.ndarray, lanes: np.ndarray, want: np.ndarray
    ) -> np.ndarray:
        """Run ONE ``llama_decode`` over a mixed batch; return the logits rows of ``want`` tokens.

        The result is a (n_out, n_vocab) float32 view valid until the next call;
        rows follow the order of the tokens whose ``want`` flag is set.
        """
        n = len(tokens)
        if n == 0 or n > self.step_tokens:
            raise ValueError(f"batch of {n} tokens outside 1..{self.step_tokens}")
        self._tok[:n], self._pos[:n], self._sid[:n], self._want[:n] = tokens, positions, lanes, want
        self._batch.n_tokens = n
        del _errors[:]
        rc = L.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}: {self._why(positions, lanes)}")
        n_out = int(np.count_nonzero(want))
        ptr = L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.vocab.n_vocab))

    def _why(self, positions: np.ndarray, lanes: np.ndarray) -> str:
        """llama.cpp's error lines of the failed call, and each lane whose first position in the batch
        does not follow its last cell (what llama.cpp's batch check requires)."""
        gaps = []
        for lane in np.unique(lanes):
            first = int(positions[lanes == lane].min())
            last = int(L.llama_memory_seq_pos_max(self.mem, int(lane)))
            if last >= 0 and first != last + 1:
                gaps.append(f"lane {int(lane)} starts at {first} after cell {last}")
        return "; ".join([*_errors[-3:], *gaps[:8]]) or "no reason given"

    def apply_kv_ops(self, ops: Iterable[KVOp]) -> None:
        """Apply the KV manager's cell operations in order (``KVOp`` says what each kind does)."""
        for op in ops:
            if op.kind == "rm":
                L.llama_memory_seq_rm(self.mem, op.lane, op.p0, op.p1)
            elif op.kind == "cp":
                L.llama_memory_seq_cp(self.mem, op.src, op.lane, op.p0, op.p1)
            elif op.kind == "save":
                self._save(op)
            elif op.kind == "load":
                self._load(op)
            elif (pieces := self._spilled.pop(op.key, None)) is not None:  # drop
                self.spilled_bytes -= _nbytes(pieces)

    def _save(self, op: KVOp) -> None:
        """Copy ``op.lane``'s cells in [p0, p1) to host memory, through the scratch lane (no new cells).

        NOTE: llama.cpp writes a sliding-window layer's cells only within the window before the saved
        sequence's last cell, so such a model's cells go in pieces of one window each: every cell is
        saved, and a load of any prefix of them gets the cells its window needs.
        """
        scratch, step = self.n_lanes, self.sliding_window or op.p1 - op.p0
        pieces: list[tuple[int, int, ctypes.Array[ctypes.c_uint8]]] = []
        for a in range(op.p0, op.p1, max(step, 1)):
            b = min(a + step, op.p1)
            L.llama_memory_seq_cp(self.mem, op.lane, scratch, a, b)
            size = L.llama_state_seq_get_size(self.ctx, scratch)
            buf = (ctypes.c_uint8 * size)()
            ok = L.llama_state_seq_get_data(self.ctx, buf, size, scratch) == size
            L.llama_memory_seq_rm(self.mem, scratch, -1, -1)
            if not ok:
                return
            pieces.append((a, b, buf))
        old = self._spilled.get(op.key)
        self._spilled[op.key] = pieces
        self.spilled_bytes += _nbytes(pieces) - (_nbytes(old) if old is not None else 0)

    def _load(self, op: KVOp) -> None:
        """Put the cells saved under ``op.key`` into the empty ``op.lane``, keeping [p0, p1); those
        before ``op.pinned`` go to the pin lane too, piece by piece, as they land.

        NOTE: the saved cells are the computed ones, bit for bit. If they are gone (dropped) or do
        not fit, the tokens are computed instead: slower, never wrong.
        """
        pieces = self._spilled.get(op.key)
        done = self._restore(pieces, op) if pieces is not None else op.p0
        if done >= op.p1:
            return
        log.warning("a spilled prefix could not be restored; computing its %d tokens (from %d)", op.p1 - done, done)
        for i in range(done, op.p1, self.step_tokens):
            chunk = np.asarray(op.tokens[i : min(i + self.step_tokens, op.p1)])
            want = np.zeros(len(chunk), dtype=np.int8)
            want[-1] = 1
            self.decode(chunk, np.arange(i, i + len(chunk)), np.full(len(chunk), op.lane), want)
            self._pin_range(op.lane, i, min(i + len(chunk), op.pinned))

    def _restore(self, pieces: list[tuple[int, int, ctypes.Array[ctypes.c_uint8]]], op: KVOp) -> int:
        """Each saved piece into the scratch lane, then its cells before ``op.p1`` into ``op.lane``;
        returns the position restored up to (the pieces after one that does not fit are computed).

        NOTE: a failed piece leaves the pieces before it in place (and pinned): computing only the
        rest never leaves a pinned cell that no lane holds.
        """
        scratch = self.n_lanes
        for a, b, buf in pieces:
            if a >= op.p1:
                break
            ok = L.llama_state_seq_set_data(self.ctx, buf, len(buf), scratch) > 0
            if ok:
                L.llama_memory_seq_cp(self.mem, scratch, op.lane, a, min(b, op.p1))
                self._pin_range(scratch, a, min(b, op.pinned))
            L.llama_memory_seq_rm(self.mem, scratch, -1, -1)
            if not ok:
                return a
        return op.p1

    def _pin_range(self, src: int, p0: int, p1: int) -> None:
        if p1 > p0:
            L.llama_memory_seq_cp(self.mem, src, self.pin_lane, p0, p1)

    def set_threads(self, n: int) -> None:
        """Compute threads of the following decodes (engine thread only, between decodes)."""
        L.llama_set_n_threads(self.ctx, n, n)
        self.n_threads = n

    def clear_kv(self) -> None:
        L.llama_memory_clear(self.mem, True)

    def model_info(self) -> dict[str, Any]:
        """Facts about the loaded model for GetModelInfo, as plain values.

        Keys: architecture, name, parameter_count, quantization, description,
        embedding_length, layers, training_context, file_size_bytes, metadata
        (every scalar GGUF entry as text).
        """
        meta = _meta_scalars(self.model)
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, buf, len(buf))
        desc = buf.value.decode("utf-8", "replace")
        ftype = meta.get("general.file_type", "")
        quant = FILE_TYPES.get(int(ftype), "") if ftype.isdigit() else ""
        return {
            "architecture": meta.get("general.architecture", ""),
            "name": meta.get("general.name", ""),
            "parameter_count": int(L.llama_model_n_params(self.model)),
            "quantization": quant or desc.rsplit(" ", 1)[-1],  # no file_type: llama.cpp's guess
            "description": desc,
            "embedding_length": int(L.llama_model_n_embd(self.model)),
            "layers": int(L.llama_model_n_layer(self.model)),
            "training_context": int(self.n_ctx_train),
            "file_size_bytes": self.model_path.stat().st_size,
            "metadata": meta,
        }

    def close(self) -> None:
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None
