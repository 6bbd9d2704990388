#!/usr/bin/env bash
# Makes PostgreSQL 15's server binaries (initdb, pg_ctl, postgres) available to the tests (tests/support/pg.py
# starts a throwaway cluster from them): installs Debian's postgresql-15 when they are missing.
# Idempotent: does nothing when they are there. Needs root (apt-get) only when it installs.
set -euo pipefail
BIN=/usr/lib/postgresql/15/bin

have_server() {
    [ -x "$BIN/initdb" ] && [ -x "$BIN/pg_ctl" ] && [ -x "$BIN/postgres" ] && id postgres >/dev/null 2>&1
}

if have_server; then
    echo "ensure_postgres: PostgreSQL 15 present ($BIN)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "ensure_postgres: PostgreSQL 15 is missing; as root run: apt-get install -y postgresql-15" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# NOTE: postgresql-common first, told not to create (and start) the default cluster on :5432: the tests
# start their own, and a fresh machine needs no server running beside them.
apt-get install -y -qq --no-install-recommends postgresql-common >/dev/null
conf=/etc/postgresql-common/createcluster.conf
if [ -f "$conf" ] && ! grep -q '^create_main_cluster *= *false' "$conf"; then
    sed -i 's/^#\? *create_main_cluster *=.*/create_main_cluster = false/' "$conf"
    grep -q '^create_main_cluster' "$conf" || echo 'create_main_cluster = false' >> "$conf"
fi
apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
have_server || { echo "ensure_postgres: postgresql-15 installed but $BIN is incomplete" >&2; exit 1; }
echo "ensure_postgres: installed PostgreSQL 15 ($BIN)"
