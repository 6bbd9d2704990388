#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests and the Containerfile (no cluster, no container engine):
#  1. `kubectl kustomize` renders the base and every overlay;
#  2. kubernetes-validate --strict checks every built-in object against the bundled Kubernetes
#     schemas (unknown fields fail); it has no CRD schemas, so KEDA's ScaledObject is checked
#     against deploy/kustomize/components/autoscale-keda/scaledobject.schema.json instead, and any
#     other kind without a schema fails the check;
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
if ! command -v kubectl >/dev/null; then
    apt-get update -q && apt-get install -y -q kubectl
fi

status=0
for dir in base overlays/dev overlays/prod overlays/prod-keda overlays/prod-tls; do
    name=${dir//\//-}
    kubectl kustomize "$KUSTOMIZE_DIR/$dir" > "$OUT/$name.yaml"
    log="$OUT/$name.log"
    if ! .venv/bin/kubernetes-validate --strict --quiet "$OUT/$name.yaml" > "$log" 2>&1; then
        cat "$log"; echo "FAIL: $dir does not validate"; status=1; continue
    fi
    # warnings name kinds without a schema: only ScaledObject is allowed (checked below)
    if grep -v "kind ScaledObject with api version keda.sh/v1alpha1" "$log" | grep -q .; then
        cat "$log"; echo "FAIL: $dir: unexpected warnings"; status=1; continue
    fi
    "$PY" - "$OUT/$name.yaml" "$KUSTOMIZE_DIR/components/autoscale-keda/scaledobject.schema.json" "$dir" <<'PYEOF' || status=1
import json, sys
import jsonschema, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
schema = json.load(open(sys.argv[2]))
for d in docs:
    if d["kind"] == "ScaledObject":
        jsonschema.validate(d, schema)
    if d["kind"] == "Deployment":
        server = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "server")
        env = {e["name"]: e.get("valueFrom", {}) for e in server.get("env", [])}
        assert env["INFERENCE_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}, env
        if sys.argv[3].startswith("overlays/prod"):
            ref = env["INFERENCE_BATCH_DB"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("inference-batch-db", "url"), ref
            assert any(o["kind"] == "Secret" and o["metadata"]["name"] == "inference-batch-db" for o in docs)
print(f"ok: {sys.argv[1].rsplit('/', 1)[-1]} ({len(docs)} objects: {', '.join(sorted({d['kind'] for d in docs}))})")
PYEOF
done

.venv/bin/hadolint --failure-threshold warning Containerfile && echo "ok: Containerfile (hadolint)" || status=1
exit $status
