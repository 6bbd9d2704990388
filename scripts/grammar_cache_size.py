"""Measure the resident memory of compiled grammars per byte of llguidance grammar text.

Compiles the first N JSONSchemaBench dev schemas (default 600) with the service's
compiler, keeping every result alive, and divides the growth of RssAnon by the
total grammar text length. The figure sizes ``json_grammar.BYTES_PER_GRAMMAR_BYTE``
(the compiled-grammar cache's byte bound). Usage::

    .venv/bin/python scripts/grammar_cache_size.py [N]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def main(n: int) -> None:
    from service import json_grammar as jg
    from service.model.runner import Vocab

    vocab = Vocab.load(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    compiler = jg.GrammarCompiler(vocab.ll_tokenizer(), cache_size=n + 10, cache_bytes=1 << 40)
    schemas = []
    with open(ROOT.parent / "shared" / "jsonschemabench" / "dev.jsonl") as f:
        for line in f:
            schemas.append(json.dumps(json.loads(line)["schema"]))
            if len(schemas) >= n:
                break
    compiler.compile("regex", "warm")
    before = rss_anon_kib()
    kept, text = [], 0
    for src in schemas:
        try:
            compiled, _, _ = compiler.compile("json_schema", src)
        except jg.GrammarError:
            continue
        kept.append(compiled)
        text += len(compiled.grammar)
    grown = (rss_anon_kib() - before) * 1024
    print(f"{len(kept)} grammars, {text / 1e6:.2f} MB of grammar text, RssAnon +{grown / 1e6:.1f} MB")
    print(f"bytes per grammar byte: {grown / max(text, 1):.1f}; mean per grammar: {grown / max(len(kept), 1) / 1e3:.0f} kB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 600)
