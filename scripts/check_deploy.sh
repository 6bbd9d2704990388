#!/usr/bin/env bash
# Checks deploy/: the Prometheus alert rules (`promtool check rules`, then their unit tests with
# `promtool test rules`). Called by .ci/run after `make test` (which checks the Grafana dashboard's
# metric names against a live server: tests/model/deploy/test_dashboard.py).
#
# promtool comes from Debian's `prometheus` package. NOTE: the package is downloaded and only its
# promtool binary is unpacked into .deploy-tools/ (no install: installing would also set up a
# Prometheus daemon). Needs root for `apt-get update`; without promtool the check is SKIPPED, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.deploy-tools"

find_promtool() {
  if command -v promtool >/dev/null 2>&1; then
    command -v promtool
  elif [ -x "$TOOLS/promtool" ]; then
    echo "$TOOLS/promtool"
  fi
}

fetch_promtool() {
  command -v apt-get >/dev/null 2>&1 || return 1
  local tmp
  tmp=$(mktemp -d)
  chmod 777 "$tmp"  # apt's sandbox user (_apt) downloads into it
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null || return 1
  fi
  (cd "$tmp" && apt-get download -q prometheus >/dev/null) || { rm -rf "$tmp"; return 1; }
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" && mkdir -p "$TOOLS" && cp "$tmp/x/usr/bin/promtool" "$TOOLS/"
  local ok=$?
  rm -rf "$tmp"
  return $ok
}

PROMTOOL=$(find_promtool)
if [ -z "$PROMTOOL" ]; then
  echo "check_deploy: promtool not found; fetching Debian's prometheus package"
  fetch_promtool || true
  PROMTOOL=$(find_promtool)
fi
if [ -z "$PROMTOOL" ]; then
  echo "=================================================================="
  echo "check_deploy: SKIPPED: promtool is not available and could not be"
  echo "fetched (apt-get download prometheus failed): the alert rules in"
  echo "deploy/prometheus/ were NOT checked."
  echo "=================================================================="
  exit 0
fi
echo "check_deploy: $("$PROMTOOL" --version 2>&1 | head -1)"
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && "$PROMTOOL" test rules alerts_test.yml)
