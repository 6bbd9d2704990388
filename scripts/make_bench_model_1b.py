"""Build the 1.1B-class benchmark model: TinyLlama-1.1B's shape, seeded random weights.

Usage: python scripts/make_bench_model_1b.py [--dest models] [--quantize .llama-tools/bin/llama-quantize]
(``make bench-model-1b`` builds llama-quantize first with ``make llama-tools``.)

Why: the benchmark model (Gemma 3 270M) is small enough to hide costs that grow with the model;
peers and this server must also be compared on a 1B-class model, and no such model may come
from a model hub. The shape is what decides speed, not the weights, so the model is synthetic:

- llama architecture at TinyLlama-1.1B's shape (hidden 2048, 22 layers, FFN 5632, 32 heads,
  4 KV heads, context 2048, rope theta 10000, RMS eps 1e-5; untied output matrix);
- the default model's tokenizer and chat template (every ``tokenizer.*`` key copied from
  models/SmolLM2-135M-Instruct.Q4_1.gguf), so the vocabulary is 49,152 rows;
- weights N(0, 0.02) from numpy's default_rng seeded per tensor (norms are ones), written as F16
  with the gguf package's GGUFWriter into a temporary directory, then quantized to Q4_K_M with
  llama-quantize built from the vendored llama.cpp.

Both the F16 file and the final file are checked against pinned sha256 values. The F16 file
depends only on numpy and gguf (both pinned in requirements.lock); the Q4_K_M file also on the
quantizer, whose float code is compiled with -march=native, so a different CPU could in principle
change it: a mismatch there names which of the two differs.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_SOURCE = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "tinyllama-shape-1.1b-q4_k_m.gguf"
SEED = 20250128
F16_SHA256 = "361b01aeb045b89a36a4fe3adc3dbb39f7b91d4fc59df53b6417d7eef90eabf4"
Q4_K_M_SHA256 = "db317d9eff404fa7ec909a5d255de7b5d166f9371c0472a27625ac6c361d3f86"


@dataclass(frozen=True)
class Shape:
    """TinyLlama-1.1B's hyperparameters (vocab_size comes from the tokenizer)."""

    hidden: int = 2048
    layers: int = 22
    ffn: int = 5632
    heads: int = 32
    kv_heads: int = 4
    context: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_shapes(shape: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Tensor names and numpy shapes (rows, columns) in llama.cpp's llama layout and order."""
    kv = shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (vocab, shape.hidden)
    for i in range(shape.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (shape.hidden,)
        yield f"{b}.attn_q.weight", (shape.hidden, shape.hidden)
        yield f"{b}.attn_k.weight", (kv, shape.hidden)
        yield f"{b}.attn_v.weight", (kv, shape.hidden)
        yield f"{b}.attn_output.weight", (shape.hidden, shape.hidden)
        yield f"{b}.ffn_norm.weight", (shape.hidden,)
        yield f"{b}.ffn_gate.weight", (shape.ffn, shape.hidden)
        yield f"{b}.ffn_up.weight", (shape.ffn, shape.hidden)
        yield f"{b}.ffn_down.weight", (shape.hidden, shape.ffn)
    yield "output_norm.weight", (shape.hidden,)
    yield "output.weight", (vocab, shape.hidden)


def tensor_data(index: int, dims: tuple[int, ...]) -> np.ndarray:
    """Norm vectors are ones (F32); matrices N(0, 0.02) in F16, seeded by (SEED, index)."""
    if len(dims) == 1:
        return np.ones(dims, dtype=np.float32)
    rng = np.random.default_rng([SEED, index])
    data = rng.standard_normal(dims, dtype=np.float32)
    data *= np.float32(0.02)
    return data.astype(np.float16)


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """Copy every tokenizer.* key (vocabulary, merges, special ids, chat template); return vocab size."""
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main = field.types[0]
        if main == GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), main, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), main)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def write_f16(path: Path, shape: Shape) -> None:
    """Write the F16 model tensor by tensor (about 2.3 GB; never all in memory)."""
    reader = GGUFReader(TOKENIZER_SOURCE)
    writer = GGUFWriter(path, "llama")
    writer.add_name(f"tinyllama-shape-1.1b (synthetic weights, seed {SEED})")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(vocab)

    layout = list(tensor_shapes(shape, vocab))
    for name, dims in layout:
        f32 = len(dims) == 1
        dtype = np.dtype(np.float32 if f32 else np.float16)
        nbytes = int(np.prod(dims)) * dtype.itemsize
        raw = GGMLQuantizationType.F32 if f32 else GGMLQuantizationType.F16
        writer.add_tensor_info(name, dims, dtype, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (_, dims) in enumerate(layout):
        writer.write_tensor_data(tensor_data(index, dims))
    writer.close()


def check(path: Path, expected: str, what: str, verify: bool) -> None:
    digest = sha256_of(path)
    print(f"{what}: sha256 {digest}")
    if verify and expected != digest:
        sys.exit(f"{what}: sha256 {digest} != pinned {expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "models")
    parser.add_argument("--quantize", type=Path, default=ROOT / ".llama-tools" / "bin" / "llama-quantize")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-verify", action="store_true",
                        help="print the sha256 values without checking them (to update the pins)")
    args = parser.parse_args()

    target = args.dest / FILENAME
    if target.exists() and sha256_of(target) == Q4_K_M_SHA256:
        print(f"{target}: present, sha256 ok")
        return
    if not TOKENIZER_SOURCE.exists():
        sys.exit(f"{TOKENIZER_SOURCE} is missing: run `make model`")
    if not args.quantize.exists():
        sys.exit(f"{args.quantize} is missing: run `make llama-tools`")

    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-model-1b-") as tmp:
        f16 = Path(tmp) / "tinyllama-shape-1.1b-f16.gguf"
        write_f16(f16, Shape())
        check(f16, F16_SHA256, "F16 (gguf writer)", not args.no_verify)
        partial = Path(tmp) / FILENAME
        subprocess.run(
            [str(args.quantize), str(f16), str(partial), "Q4_K_M", str(args.threads)],
            check=True,
        )
        check(partial, Q4_K_M_SHA256, "Q4_K_M (llama-quantize)", not args.no_verify)
        shutil.move(partial, target)
    print(f"{target}: written")


if __name__ == "__main__":
    main()
