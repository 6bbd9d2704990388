#!/usr/bin/env bash
# Makes `kubectl` available for the manifest checks (scripts/check_k8s.sh renders every overlay with
# `kubectl kustomize`; tests/unit/deploy/ renders the gateway overlays): installs Debian's kubectl
# when it is missing. Idempotent; needs root only to install.
set -euo pipefail

if ! command -v kubectl >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "ensure_kubectl: kubectl is missing; as root run: apt-get install -y kubectl" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends kubectl >/dev/null
fi
echo "ensure_kubectl: $(kubectl version --client 2>/dev/null | head -1)"
