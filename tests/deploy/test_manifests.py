"""deploy/k8s against Kubernetes' own schemas (kubernetes-validate, strict: unknown fields fail) and
against each other and the image (ports, probes, uid, grace period, advertised name); the compose
file; and the Grafana dashboard's structure. What the dashboard's queries return is checked against a
real Prometheus in test_prometheus.py."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import DEPLOY, load_yaml, load_yaml_all
from tests.kcoord_process import REPO

K8S = DEPLOY / "k8s"
MANIFESTS = ["statefulset.yaml", "services.yaml", "pdb.yaml"]
DASHBOARD = DEPLOY / "grafana" / "kcoord.json"


def resources() -> dict[tuple[str, str], Any]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for name in MANIFESTS for doc in load_yaml_all(K8S / name)}


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).parent / "kubernetes-validate"
    return subprocess.run([str(tool), "--strict", *map(str, paths)], capture_output=True, text=True, timeout=300)


def test_manifests_match_the_kubernetes_schemas() -> None:
    result = kubernetes_validate(*(K8S / name for name in MANIFESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == 4, result.stdout


def test_schema_validation_rejects_an_unknown_field(tmp_path: Path) -> None:
    bad = tmp_path / "statefulset.yaml"
    bad.write_text((K8S / "statefulset.yaml").read_text().replace("serviceName:", "servicename:"))
    result = kubernetes_validate(bad)
    assert result.returncode != 0 and "servicename" in result.stdout + result.stderr


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(MANIFESTS)
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == set(MANIFESTS)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_statefulset_fits_the_image_and_the_services() -> None:
    res = resources()
    sts = res[("StatefulSet", "kcoord")]
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    labels = pod["metadata"]["labels"]
    assert sts["spec"]["replicas"] == 1  # standalone: a second replica would be a second coordinator
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()

    # the headless Service names the pod; the advertised listener is that DNS name
    headless = res[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    env = env_of(container)
    assert env["KCOORD_ADVERTISED_LISTENER"] == \
        f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:9092"
    field_refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert field_refs == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    # $(VAR) only expands variables defined earlier in the list
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_NAME") < names.index("KCOORD_ADVERTISED_LISTENER")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"kafka": 9092, "metrics": 9404}
    assert env["KCOORD_LISTEN"].endswith(":9092") and env["KCOORD_METRICS_LISTEN"].endswith(":9404")
    for service in (headless, res[("Service", "kcoord")]):
        assert service["spec"]["selector"].items() <= labels.items()
        assert all(p["targetPort"] in ports for p in service["spec"]["ports"])

    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert annotations["prometheus.io/path"] == "/metrics"

    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}

    # SIGTERM finishes pending writes within the shutdown timeout; SIGKILL must come later
    assert spec["terminationGracePeriodSeconds"] > int(env["KCOORD_SHUTDOWN_TIMEOUT_MS"]) / 1000 + 5

    # the same unprivileged uid as the image's USER, and a volume it can write
    user = next(line.split()[1] for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("USER"))
    uid, gid = (int(x) for x in user.split(":"))
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (uid, gid, gid)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]

    claim = sts["spec"]["volumeClaimTemplates"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert mount["mountPath"] == env["KCOORD_DATA_DIR"] == "/var/lib/kcoord"

    pdb = res[("PodDisruptionBudget", "kcoord")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_compose_runs_both_on_loopback_with_host_networking() -> None:
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    kcoord, prom = compose["services"]["kcoord"], compose["services"]["prometheus"]
    assert kcoord["network_mode"] == prom["network_mode"] == "host"
    env = kcoord["environment"]
    for name in ("KCOORD_LISTEN", "KCOORD_ADVERTISED_LISTENER", "KCOORD_METRICS_LISTEN"):
        assert env[name].startswith("127.0.0.1:"), name
    assert "--web.listen-address=127.0.0.1:9090" in prom["command"]
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    targets = [t for job in scrape["scrape_configs"] if job["job_name"] == "kcoord"
               for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [env["KCOORD_METRICS_LISTEN"]]
    for mount in prom["volumes"][:2]:
        assert (DEPLOY / mount.split(":")[0]).is_file(), mount
    assert kcoord["stop_grace_period"] == "30s"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed "
                    "(apt-get install docker-compose); the YAML checks above still ran")
def test_docker_compose_accepts_the_file() -> None:
    result = subprocess.run(["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), "config", "-q"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
    for panel in dashboard_panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= {"job", "instance", "__rate_interval"}, (panel["title"], used)
            assert 'job=~"$job", instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])
