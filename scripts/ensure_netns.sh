#!/usr/bin/env bash
# Makes `ip` (Debian's iproute2) available for the replica tests, which put each server in its own
# network namespace (tests/support/netns.py): installs iproute2 when it is missing, then checks that
# this machine lets us create a namespace (root, CAP_SYS_ADMIN). Idempotent; needs root only to install.
set -euo pipefail

if ! command -v ip >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "ensure_netns: iproute2 is missing; as root run: apt-get install -y iproute2" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi
probe="ensure-netns-$$"
if ! ip netns add "$probe" 2>/dev/null; then
    echo "ensure_netns: cannot create a network namespace here (run as root, with CAP_SYS_ADMIN)" >&2
    exit 1
fi
ip netns del "$probe"
echo "ensure_netns: iproute2 present, network namespaces available"
