#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests and the Containerfile (no cluster, no container engine):
#  1. `kubectl kustomize` renders the base and every overlay;
#  2. kubernetes-validate --strict checks every built-in object against the bundled Kubernetes
#     schemas (unknown fields fail); it has no CRD schemas, so the custom kinds we use are checked
#     against hand-written schema subsets with jsonschema instead (SCHEMAS below: KEDA's ScaledObject,
#     the Inference Extension's InferencePool, the Gateway API's HTTPRoute), and so is llm-d's router's
#     EndpointPickerConfig carried in a ConfigMap (its plugin types and parameters; every pluginRef
#     and prefixMatchInfoProducerName must name one of its plugins); any other kind without a schema
#     fails;
#  3. every server container takes its replica id from the pod name (downward API), and the prod
#     overlays take the shared batch store's URL from the Secret inference-batch-db (docs/batch.md);
#  4. hadolint lints the Containerfile.
# The tools are pinned in deploy/requirements-check.txt and installed into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
KUSTOMIZE_DIR=deploy/kustomize
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

"$PY" -m pip install -q -r deploy/requirements-check.txt
bash scripts/ensure_kubectl.sh

# "kind apiVersion" lines kubernetes-validate may warn about (it has no schema for them)
CUSTOM_KINDS="kind ScaledObject with api version keda.sh/v1alpha1
kind InferencePool with api version inference.networking.k8s.io/v1
kind HTTPRoute with api version gateway.networking.k8s.io/v1"

status=0
for dir in base overlays/dev overlays/prod overlays/prod-keda overlays/prod-tls overlays/prod-gateway \
           overlays/prod-gateway-approx; do
    name=${dir//\//-}
    kubectl kustomize "$KUSTOMIZE_DIR/$dir" > "$OUT/$name.yaml"
    log="$OUT/$name.log"
    if ! .venv/bin/kubernetes-validate --strict --quiet "$OUT/$name.yaml" > "$log" 2>&1; then
        cat "$log"; echo "FAIL: $dir does not validate"; status=1; continue
    fi
    # warnings name kinds without a schema: only the custom kinds above are allowed (checked below)
    if grep -v -F "$CUSTOM_KINDS" "$log" | grep -q .; then
        cat "$log"; echo "FAIL: $dir: unexpected warnings"; status=1; continue
    fi
    "$PY" - "$OUT/$name.yaml" "$KUSTOMIZE_DIR/components" "$dir" <<'PYEOF' || status=1
import json, sys
from pathlib import Path
import jsonschema, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
components = Path(sys.argv[2])
SCHEMAS = {
    "ScaledObject": components / "autoscale-keda/scaledobject.schema.json",
    "InferencePool": components / "inference-gateway/schemas/inferencepool.schema.json",
    "HTTPRoute": components / "inference-gateway/schemas/httproute.schema.json",
}
EPP = components / "inference-gateway/schemas/endpointpickerconfig.schema.json"
for d in docs:
    if d["kind"] in SCHEMAS:
        jsonschema.validate(d, json.loads(SCHEMAS[d["kind"]].read_text()))
    for key, text in (d.get("data") or {}).items() if d["kind"] == "ConfigMap" else ():
        if "kind: EndpointPickerConfig" not in text:
            continue
        config = yaml.safe_load(text)
        jsonschema.validate(config, json.loads(EPP.read_text()))
        types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
        refs = {r["pluginRef"] for prof in config["schedulingProfiles"] for r in prof["plugins"]}
        for source in (config.get("dataLayer") or {}).get("sources", []):
            refs |= {source["pluginRef"]} | {e["pluginRef"] for e in source.get("extractors", [])}
        assert refs <= types.keys(), f"{d['metadata']['name']}/{key}: pluginRef without a plugin: {sorted(refs - types.keys())}"
        for p in config["plugins"]:
            producer = (p.get("parameters") or {}).get("prefixMatchInfoProducerName")
            assert producer is None or types.get(producer, "").endswith("prefix-cache-producer"), \
                f"{d['metadata']['name']}/{key}: prefixMatchInfoProducerName {producer!r} names no prefix producer"
    server = next((c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "server"), None) \
        if d["kind"] == "Deployment" else None
    if server is not None:  # NOTE: the inference server's pods (not e.g. the gateway's endpoint picker)
        env = {e["name"]: e.get("valueFrom", {}) for e in server.get("env", [])}
        assert env["INFERENCE_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}, env
        if sys.argv[3].startswith("overlays/prod"):
            ref = env["INFERENCE_BATCH_DB"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("inference-batch-db", "url"), ref
            assert any(o["kind"] == "Secret" and o["metadata"]["name"] == "inference-batch-db" for o in docs)
kinds = {d["kind"] for d in docs}
print(f"ok: {sys.argv[1].rsplit('/', 1)[-1]} ({len(docs)} objects: {', '.join(sorted(kinds))})")
PYEOF
done

.venv/bin/hadolint --failure-threshold warning Containerfile && echo "ok: Containerfile (hadolint)" || status=1
exit $status
