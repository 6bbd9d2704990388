#!/usr/bin/env bash
# The real chat templates of other model families, for tests: llama.cpp's models/templates/*.jinja
# from the llama.cpp tree vendored in the pinned llama-cpp-python sdist (PyPI, sha256-checked),
# extracted into $CHAT_TEMPLATES_DIR (default .chat-templates/, git-ignored). Never committed: each
# template is its model vendor's file. Idempotent: a stamp records the sdist's version and sha256.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${CHAT_TEMPLATES_DIR:-$ROOT/.chat-templates}"
# shellcheck source=scripts/llama_sdist.sh
source "$ROOT/scripts/llama_sdist.sh"

STAMP_TEXT="llama-cpp-python==$VERSION sdist-sha256=$SHA"
if [[ -f "$OUT/stamp" && "$(cat "$OUT/stamp")" == "$STAMP_TEXT" ]]; then
    exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# NOTE: the sdist that `make llama-tools` downloaded is reused when it is there.
if [[ -f "$ROOT/.llama-tools/src/llama_cpp_python-$VERSION.tar.gz" ]]; then
    cp "$ROOT/.llama-tools/src/llama_cpp_python-$VERSION.tar.gz" "$WORK/"
fi
fetch_sdist "$WORK"
rm -rf "$OUT"
mkdir -p "$OUT"
tar -xzf "$TARBALL" -C "$WORK" --wildcards "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/*"
cp "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/"* "$OUT/"
echo "$STAMP_TEXT" > "$OUT/stamp"
echo "chat templates: $(ls "$OUT" | grep -c '\.jinja$') from llama-cpp-python==$VERSION's llama.cpp ($OUT)"
