# Sourced by scripts that need the llama.cpp tree vendored in the pinned llama-cpp-python sdist.
# Defines VERSION (from requirements.lock), SHA (the sdist's pinned sha256) and fetch_sdist DIR,
# which downloads the sdist from PyPI into DIR (never GitHub or a model hub) and checks its sha256.
VERSION="$(sed -n 's/^llama_cpp_python==//p' "$ROOT/requirements.lock")"
# sha256 of llama_cpp_python-<version>.tar.gz on PyPI; update together with requirements.lock.
declare -A SDIST_SHA256=(
    [0.3.36]=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
)
SHA="${SDIST_SHA256[$VERSION]:-}"
if [[ -z "$SHA" ]]; then
    echo "$0: no sdist sha256 pinned for llama-cpp-python==$VERSION; add it to SDIST_SHA256 in" \
        "scripts/llama_sdist.sh" >&2
    exit 1
fi

fetch_sdist() {
    local dir="$1"
    mkdir -p "$dir"
    TARBALL="$dir/llama_cpp_python-$VERSION.tar.gz"
    if [[ ! -f "$TARBALL" ]] || ! echo "$SHA  $TARBALL" | sha256sum --check --quiet 2>/dev/null; then
        "${PYTHON:-python3}" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$dir"
    fi
    echo "$SHA  $TARBALL" | sha256sum --check --quiet
}
