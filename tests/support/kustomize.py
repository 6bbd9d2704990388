"""Rendered Kubernetes manifests (``kubectl kustomize``) and the server configuration they give.

``render(overlay)`` runs ``kubectl kustomize deploy/kustomize/<overlay>`` (kubectl from
scripts/ensure_kubectl.sh: skipped without it, failed in CI) and returns a ``Manifests``: the objects,
looked up by kind and name, plus what the server pods would run with (``server_config``: the
ServerConfig ``service.config.load_config`` makes of the ConfigMap and the container's literal env).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from service.config import ServerConfig, load_config
from tests.support.required import missing

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
# what the downward API would give the server container (status.podIP) in these tests
POD_IP = "10.1.2.3"


@dataclass(frozen=True)
class Manifests:
    """One overlay's rendered objects."""

    objects: list[dict[str, Any]]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The object of ``kind`` named ``name``, or generated from ``name`` (``name-<hash>``)."""
        pattern = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?")
        found = [o for o in self.objects if o["kind"] == kind and pattern.fullmatch(o["metadata"]["name"])]
        assert len(found) == 1, f"{kind}/{name}: {[o['metadata']['name'] for o in found]}"
        return found[0]

    def container(self, deployment: str, name: str) -> dict[str, Any]:
        spec = self.get("Deployment", deployment)["spec"]["template"]["spec"]
        return next(c for c in spec["containers"] if c["name"] == name)

    def server_env(self) -> dict[str, str]:
        """The server container's environment: its ConfigMap, then its own ``env`` (which wins), the
        downward API's pod IP as ``POD_IP``; secret references are left out."""
        server = self.container("inference", "server")
        env: dict[str, str] = {}
        for source in server.get("envFrom", []):
            env |= self.get("ConfigMap", source["configMapRef"]["name"])["data"]
        for var in server.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[var["name"]] = POD_IP
        return env

    def server_config(self) -> ServerConfig:
        return load_config([], env=self.server_env())

    def router_config(self) -> dict[str, Any]:
        """The router's EndpointPickerConfig (the ConfigMap its Deployment mounts)."""
        volumes = self.get("Deployment", "inference-epp")["spec"]["template"]["spec"]["volumes"]
        name = next(v["configMap"]["name"] for v in volumes if v["name"] == "plugins")
        config: dict[str, Any] = yaml.safe_load(self.get("ConfigMap", name)["data"]["plugins.yaml"])
        return config


def plugin(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The plugin named ``name`` (a plugin without a name is named by its type)."""
    return next(p for p in config["plugins"] if p.get("name", p["type"]) == name)


def render(overlay: str) -> Manifests:
    if shutil.which("kubectl") is None:
        missing("kubectl", "`kubectl` not found (scripts/ensure_kubectl.sh installs it)")
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZE / overlay)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return Manifests([o for o in yaml.safe_load_all(done.stdout) if o])
