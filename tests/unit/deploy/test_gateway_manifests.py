"""The router's plugins file agrees with the server it routes to (deploy/kustomize, docs/scale-out.md).

The gateway overlays render (``kubectl kustomize``) to two things written apart: the server pods'
flags (a ConfigMap, the container's env and ports) and llm-d's router's EndpointPickerConfig. Nothing
in a cluster reports a mismatch between them: a wrong port, model name or metric name only makes
routing quietly worse. These tests read both from the rendered overlays and hold the router's
parameters to what the server does (``service.config``, ``service.assembly``, the series
``ModelServerCollector`` exports), and hold the schema scripts/check_k8s.sh validates with to
refusing a misspelt plugin type or parameter.
"""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.assembly import kv_events_config, served_model_name
from service.observability.model_server import ModelServerCollector
from tests.support.kustomize import KUSTOMIZE, POD_IP, Manifests, plugin, render
from tests.support.metric_views import FakeEngine

SCHEMA = KUSTOMIZE / "components" / "inference-gateway" / "schemas" / "endpointpickerconfig.schema.json"
ENGINE_LABEL = "llm-d.ai/engine-type"
ROUTER_MIN_APPROX_BLOCK = 64  # llm-d-router raises a smaller approximate blockSizeTokens to this
SPECS = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec")


@pytest.fixture(scope="module")
def precise() -> Manifests:
    return render("overlays/prod-gateway")


@pytest.fixture(scope="module")
def approx() -> Manifests:
    return render("overlays/prod-gateway-approx")


def exported_series() -> dict[str, set[str]]:
    """Every series name the server's vLLM-named collector exports, with its label names."""
    registry = CollectorRegistry()
    registry.register(ModelServerCollector(FakeEngine(), "m"))
    return {
        s.name: set(s.labels)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def params(manifests: Manifests, name: str) -> dict[str, Any]:
    """The parameters of the router's plugin ``name``."""
    found: dict[str, Any] = plugin(manifests.router_config(), name)["parameters"]
    return found


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_precise_scorer_hashes_blocks_of_the_servers_block_size(precise: Manifests) -> None:
    producer = params(precise, "precise-prefix-cache-producer")
    assert producer["tokenProcessorConfig"]["blockSizeTokens"] == precise.server_config().block_size


def test_router_subscribes_to_the_ports_the_server_binds(precise: Manifests) -> None:
    config = precise.server_config()
    discovery = params(precise, "precise-prefix-cache-producer")["kvEventsConfig"]
    assert discovery["discoverPods"] is True and discovery["engineType"] == "vllm"
    pods = discovery["podDiscoveryConfig"]
    assert config.kv_events_endpoint.startswith("tcp://*:")  # bound on the pod IP the router dials
    assert config.kv_events_replay_endpoint.startswith("tcp://*:")
    assert pods["socketPort"] == port_of(config.kv_events_endpoint)
    assert pods["replaySocketPort"] == port_of(config.kv_events_replay_endpoint)
    declared = {p["containerPort"] for p in precise.container("inference", "server")["ports"]}
    assert {pods["socketPort"], pods["replaySocketPort"]} <= declared


def test_event_topic_names_the_pool_port_and_the_model_the_router_renders_for(
    precise: Manifests, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = precise.server_config()
    monkeypatch.setenv("POD_IP", precise.server_env()["POD_IP"])  # the assembly reads it from the process
    model = params(precise, "token-producer")["modelName"]
    assert model == served_model_name(config)
    server = precise.container("inference", "server")
    pod_ip = next(v for v in server["env"] if v["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    events = kv_events_config(config)
    assert events is not None
    pool_port = precise.get("InferencePool", "inference")["spec"]["targetPorts"][0]["number"]
    assert events.topic == f"kv@{POD_IP}:{pool_port}@{model}"
    events_config = params(precise, "precise-prefix-cache-producer")["kvEventsConfig"]
    assert events.topic.startswith(events_config["topicFilter"])


def test_render_url_reaches_the_server_pods_http_port(precise: Manifests) -> None:
    url = urlsplit(params(precise, "token-producer")["vllm"]["url"])
    service = precise.get("Service", str(url.hostname))
    port = next(p for p in service["spec"]["ports"] if p["port"] == url.port)
    server = precise.container("inference", "server")
    target = next(p for p in server["ports"] if p["name"] == port["targetPort"])
    assert target["containerPort"] == precise.server_config().http_port
    pod_labels = precise.get("Deployment", "inference")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", ["precise", "approx"])
def test_approximate_scorer_block_is_not_raised_and_outlasts_the_pool_cache(
    overlay: str, request: pytest.FixtureRequest
) -> None:
    manifests: Manifests = request.getfixturevalue(overlay)
    config = manifests.server_config()
    approx = params(manifests, "approx-prefix-cache-producer")
    assert approx["autoTune"] is False
    block = approx["blockSizeTokens"]
    assert block >= ROUTER_MIN_APPROX_BLOCK and block % config.block_size == 0
    assert approx["lruCapacityPerServer"] * block >= config.prefix_cache_tokens


@pytest.mark.parametrize("overlay", ["precise", "approx"])
def test_engine_label_maps_to_metric_names_the_server_exports(
    overlay: str, request: pytest.FixtureRequest
) -> None:
    manifests: Manifests = request.getfixturevalue(overlay)
    labels = manifests.get("Deployment", "inference")["spec"]["template"]["metadata"]["labels"]
    extractor = params(manifests, "core-metrics-extractor")
    assert extractor["engineLabelKey"] == ENGINE_LABEL
    engine = next(e for e in extractor["engineConfigs"] if e["name"] == labels[ENGINE_LABEL])
    assert extractor["defaultEngine"] == engine["name"]
    series = exported_series()
    named = {spec: engine[spec] for spec in SPECS if engine[spec]}
    assert named.keys() == {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"}
    assert {name for name in named.values() if name not in series} == set()
    # the router reads block size and capacity from these labels unless told other names
    assert {"block_size", "num_gpu_blocks"} <= series[engine["cacheInfoSpec"]]


def test_approximate_overlay_publishes_no_events(approx: Manifests) -> None:
    config = approx.server_config()
    assert (config.kv_events_endpoint, config.kv_events_replay_endpoint) == ("", "")
    types = {p["type"] for p in approx.router_config()["plugins"]}
    assert "precise-prefix-cache-producer" not in types and "token-producer" not in types


def misspelt(
    config: dict[str, Any], path: list[str | int], new_key: str | None = None, value: Any = None
) -> dict[str, Any]:
    """A copy of ``config`` with the key at ``path`` renamed to ``new_key`` (or its value replaced)."""
    bad = copy.deepcopy(config)
    parent: Any = bad
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if new_key is None:
        parent[last] = value
    else:
        parent[new_key] = parent.pop(last)
    return bad


def test_schema_accepts_both_configs_and_refuses_misspellings(precise: Manifests, approx: Manifests) -> None:
    schema = json.loads(SCHEMA.read_text())
    config = precise.router_config()
    for good in (config, approx.router_config()):
        jsonschema.validate(good, schema)
    index = {p.get("name", p["type"]): i for i, p in enumerate(config["plugins"])}
    producer: list[str | int] = ["plugins", index["precise-prefix-cache-producer"], "parameters"]
    approx: list[str | int] = ["plugins", index["approx-prefix-cache-producer"], "parameters"]
    wrong = [
        misspelt(config, ["plugins", index["queue-scorer"], "type"], value="queue-scorrer"),
        misspelt(config, [*producer, "tokenProcessorConfig", "blockSizeTokens"], "blocksizeTokens"),
        misspelt(config, [*producer, "kvEventsConfig", "podDiscoveryConfig", "socketPort"], "socketport"),
        misspelt(config, [*approx, "blockSizeTokens"], value=16),  # the router would raise it to 64
        misspelt(config, ["apiVersion"], value="inference.networking.x-k8s.io/v1alpha1"),
    ]
    for bad in wrong:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
