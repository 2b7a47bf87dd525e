"""deploy/k8s-cluster: the base manifests made a cluster of pods (README, Cluster mode), rendered by
kustomize as `kubectl apply -k` renders them, checked against Kubernetes' schemas, and each pod's
environment, expanded as the kubelet expands it, read by kcoord's own configuration: pod i must be
node i advertising its own entry of one shared --cluster list."""

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.config import Config, add_serve_arguments, config_from_args
from tests.deploy.conftest import DEPLOY
from tests.deploy.test_manifests import kubernetes_validate

OVERLAY = DEPLOY / "k8s-cluster"
NAMESPACE = "payments"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: its kustomize renders deploy/k8s-cluster (apt-get install kubectl)")
    done = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = tmp_path_factory.mktemp("k8s-cluster") / "cluster.yaml"
    out.write_text(done.stdout)
    return out


def resources(path: Path) -> dict[tuple[str, str], Any]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}


def expand(value: str, defined: dict[str, str]) -> str:
    """The kubelet's $(VAR): a variable defined earlier in the list, else the text is left as it is;
    $$ is a literal $."""
    return _REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else defined.get(m.group(1), m.group(0)), value)


def pod_env(container: dict[str, Any], ordinal: int) -> dict[str, str]:
    """The environment of pod ``kcoord-<ordinal>`` in namespace NAMESPACE."""
    fields = {"metadata.name": f"kcoord-{ordinal}", "metadata.namespace": NAMESPACE,
              "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal)}
    env: dict[str, str] = {}
    for e in container["env"]:
        env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in e else \
            expand(e.get("value", ""), env)
    return env


def config_of(env: dict[str, str]) -> Config:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args([]), environ=env)


def test_the_cluster_overlay_matches_the_kubernetes_schemas(rendered: Path) -> None:
    result = kubernetes_validate(rendered)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == 4, result.stdout


def test_each_pod_is_the_node_its_own_entry_names(rendered: Path) -> None:
    res = resources(rendered)
    sts = res[("StatefulSet", "kcoord")]
    replicas = sts["spec"]["replicas"]
    assert replicas == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    configs = [config_of(pod_env(container, i)) for i in range(replicas)]
    shared = configs[0].cluster
    assert [n.node_id for n in shared] == list(range(replicas))  # one entry per pod, ids = ordinals
    for i, config in enumerate(configs):
        assert config.cluster == shared  # every pod is given the same list
        assert config.node_id == i
        host = f"kcoord-{i}.{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
        assert (shared[i].host, shared[i].port) == (host, 9092)  # its DNS name, namespace expanded
        assert config.advertised == (host, 9092)  # what it tells clients is its own entry
        assert config.owns(i) and not config.owns((i + 1) % replicas)
    assert sorted(p for p in range(configs[0].offsets_partitions) if any(c.owns(p) for c in configs)) == \
        list(range(configs[0].offsets_partitions))  # every partition has an owner among the pods


def test_a_variable_listed_after_its_use_is_not_expanded() -> None:
    """What the overlay's order of variables protects (the expansion above is the kubelet's)."""
    container = {"env": [{"name": "A", "value": "x-$(B)"}, {"name": "B", "value": "b"},
                         {"name": "C", "value": "$(B)$$"}]}
    assert pod_env(container, 0) == {"A": "x-$(B)", "B": "b", "C": "b$"}


def test_evicting_any_pod_waits_for_an_operator(rendered: Path) -> None:
    pdb = resources(rendered)[("PodDisruptionBudget", "kcoord")]
    assert pdb["spec"].get("maxUnavailable") == 0 and "minAvailable" not in pdb["spec"]


# What `kubectl apply` may change in an existing StatefulSet's spec; any other field is refused
# ("updates to statefulset spec for fields other than ... are forbidden").
UPDATABLE = {"replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
             "minReadySeconds"}


def test_the_readme_says_how_a_running_single_pod_becomes_the_cluster(rendered: Path) -> None:
    """Applying the overlay over the base's running StatefulSet is refused by the API server (the
    overlay sets podManagementPolicy, which no update may change), and once the StatefulSet is
    deleted, pod kcoord-0 mounts the retained volume data-kcoord-0, whose standalone data directory
    kcoord refuses in cluster mode (exit 2, a crash loop). An operator following deploy/README from
    the base needs both said."""
    base = resources(DEPLOY / "k8s" / "statefulset.yaml")[("StatefulSet", "kcoord")]["spec"]
    overlay = resources(rendered)[("StatefulSet", "kcoord")]["spec"]
    immutable = sorted(k for k in set(base) | set(overlay) if k not in UPDATABLE and base.get(k) != overlay.get(k))
    assert immutable == ["podManagementPolicy"]
    section = (DEPLOY / "README.md").read_text().split("### As a cluster of pods", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())
    assert "podManagementPolicy" in flat and "immutable" in flat
    assert "kubectl delete statefulset kcoord" in flat and "data-kcoord-0" in flat
