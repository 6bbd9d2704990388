#!/usr/bin/env bash
# Build llama.cpp's own tools from the llama.cpp that the pinned llama-cpp-python vendors.
#
# Usage: scripts/build_llama_tools.sh            (make llama-tools)
#
# What: llama-server (the peer the benchmarks compare against), llama-batched-bench (decode
# ceilings) and llama-quantize (make bench-model-1b), CPU only, into .llama-tools/bin/.
# Why from the sdist: the peer must run the same llama.cpp revision as our libllama, so the
# llama-cpp-python sdist pinned in requirements.lock is downloaded from PyPI (never GitHub or a
# model hub), its sha256 checked, and vendor/llama.cpp built with the options llama-cpp-python's
# own CMakeLists.txt uses for libllama: Release, GGML_NATIVE at its default (ON: -march=native),
# OpenMP and llamafile kernels at their defaults, curl off. Differences, none of which touch the
# compute kernels' flags: static libraries (self-contained binaries; the pip build is shared),
# no OpenSSL, and no web UI (LLAMA_USE_PREBUILT_UI=OFF: it would download assets from a hub).
#
# Idempotent: .llama-tools/stamp records the version, sdist sha256 and cmake options; when it
# matches and the binaries exist nothing is done. Sources and build tree are deleted after.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LLAMA_TOOLS_DIR:-$ROOT/.llama-tools}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
TOOLS=(llama-server llama-batched-bench llama-quantize)

# shellcheck source=scripts/llama_sdist.sh
source "$ROOT/scripts/llama_sdist.sh"

# LLAMA_CURL is accepted but deprecated (a no-op) in this llama.cpp: downloading is gone from it.
CMAKE_ARGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
)
# The Makefile's LLAMA_CMAKE_ARGS (x86-64: no AMX backend; see the Makefile's NOTE), as the pip build gets them.
read -r -a EXTRA <<< "${LLAMA_CMAKE_ARGS:-}"
CMAKE_ARGS+=("${EXTRA[@]}")
STAMP_TEXT="llama-cpp-python==$VERSION sdist-sha256=$SHA cmake: ${CMAKE_ARGS[*]}"

all_built() {
    local tool
    for tool in "${TOOLS[@]}"; do
        [[ -x "$OUT/bin/$tool" ]] || return 1
    done
}

if [[ -f "$OUT/stamp" && "$(cat "$OUT/stamp")" == "$STAMP_TEXT" ]] && all_built; then
    echo "llama-tools: present ($OUT/bin, llama-cpp-python==$VERSION)"
    exit 0
fi

rm -rf "$OUT/src" "$OUT/build" "$OUT/stamp"
mkdir -p "$OUT/src" "$OUT/bin"
start=$SECONDS

fetch_sdist "$OUT/src"
tar -xzf "$TARBALL" -C "$OUT/src"
LLAMA_SRC="$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"

# SOURCE_DATE_EPOCH in the environment would turn GGML_NATIVE's default off in the pip build;
# it is forced ON here, so unset it to keep the two configurations alike either way.
env -u SOURCE_DATE_EPOCH cmake -S "$LLAMA_SRC" -B "$OUT/build" "${CMAKE_ARGS[@]}"
cmake --build "$OUT/build" --config Release -j "$JOBS" --target "${TOOLS[@]}"

for tool in "${TOOLS[@]}"; do
    install -m 0755 "$OUT/build/bin/$tool" "$OUT/bin/$tool"
done
rm -rf "$OUT/src" "$OUT/build"
echo "$STAMP_TEXT" > "$OUT/stamp"
echo "llama-tools: built ${TOOLS[*]} into $OUT/bin in $((SECONDS - start)) s"
