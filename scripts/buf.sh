#!/usr/bin/env bash
# Runs buf (pinned) from a project-local install, installing it from npm on first use:
#   bash scripts/buf.sh lint
#   bash scripts/buf.sh breaking --against '.git#branch=main'
# buf.yaml (repo root) holds the module and lint/breaking configuration.
set -euo pipefail
BUF_VERSION=1.75.0
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.buf-tools"
BUF="$TOOLS/node_modules/.bin/buf"

if [[ ! -x "$BUF" ]] || [[ "$("$BUF" --version 2>/dev/null)" != "$BUF_VERSION" ]]; then
  command -v npm >/dev/null 2>&1 || { echo "scripts/buf.sh: npm is required to install buf" >&2; exit 1; }
  echo "scripts/buf.sh: installing @bufbuild/buf@$BUF_VERSION into .buf-tools/" >&2
  npm install --prefix "$TOOLS" --no-audit --no-fund --loglevel=error "@bufbuild/buf@$BUF_VERSION" >&2
fi
cd "$ROOT"
exec "$BUF" "$@"
