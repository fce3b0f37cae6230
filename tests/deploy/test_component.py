"""components/sidecar injected into a plain Deployment, under `podman kube play`, scraped by Prometheus.

The Deployment is what a user already runs: the engine alone (the twin, the base's engine
container), labelled llm-exporter.io/inject and annotated with where its engine listens. kustomize
adds the sidecar from the component; the exporter learns its engine from the annotations through
the downward API, and a real Prometheus scrapes it with the job the Prometheus Operator would
generate from the component's PodMonitor. A module of its own: podman 4.3 publishes every
containerPort on the host (Podman.kube_play), so no other pod of the tier may run beside it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import urllib.parse

import pytest
import yaml

from tests.deploy.harness import (
    K8S,
    PREFIX,
    Podman,
    container_port,
    containers,
    get,
    kustomize,
    one,
    podman,
    podmonitor_scrape_config,
    wait_for,
)
from tests.fullstack import _binary, launcher
from tests.support import free_ports, wait_until

pytestmark = pytest.mark.deploy
__all__ = ["podman"]  # the session fixture, from the harness

NAME = f"{PREFIX}-injected"
POD = f"{NAME}-pod-0"  # podman kube play's name for a Deployment's one replica


def injected(directory: pathlib.Path) -> list[dict]:
    """The objects kustomize renders for a plain twin Deployment plus components/sidecar."""
    twin = next(c for c in containers(one(kustomize("base"), "Deployment")) if c["name"] == "engine")
    plain = {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": NAME, "labels": {"llm-exporter.io/inject": "true"}},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": NAME}}, "template": {
                 "metadata": {"labels": {"app": NAME}, "annotations": {
                     "llm-exporter.io/engines": "http://127.0.0.1:8000,name=twin",
                     "llm-exporter.io/model": "llama-3.1-8b",
                     "llm-exporter.io/engine-process": "exporter.simulator"}},
                 "spec": {"containers": [twin]}}}}
    (directory / "workload.yaml").write_text(yaml.safe_dump(plain))
    component = os.path.relpath(K8S / "components" / "sidecar", directory)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["workload.yaml"],
                                                                  "components": [component]}))
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_component_in_a_plain_deployment_runs_and_is_scraped(podman: Podman, tmp_path: pathlib.Path):
    objects = injected(tmp_path)
    deployment, monitor = one(objects, "Deployment"), one(objects, "PodMonitor")
    assert [c["name"] for c in containers(deployment)] == ["engine", "llm-exporter"]
    # podman 4.3's kube play resolves a Deployment's `metadata.annotations[...]` fieldRef against
    # the Deployment's own annotations, not its pod template's (labels it takes from the template);
    # the kubelet reads the pod's, which the template gives it. So the play gets the template's
    # annotations on the Deployment as well; the manifest's env, the downward API path, is unchanged.
    deployment["metadata"]["annotations"] = dict(deployment["spec"]["template"]["metadata"]["annotations"])
    # podman 4.3's kube play refuses the fieldRef metadata.namespace ("not valid or not supported"),
    # which every kubelet resolves; the play gets the namespace it would give the pod, as a value.
    exporter = next(c for c in containers(deployment) if c["name"] == "llm-exporter")
    for env in exporter["env"]:
        if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env.pop("valueFrom")
            env["value"] = "default"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    ports = free_ports(("prometheus",))
    try:
        podman.kube_play(manifest, deployment)
        ip = podman.pod_ip(POD)
        port = container_port(deployment, "llm-exporter", "metrics")
        # The one probe the sidecar has answers on the port it names.
        probe = next(c for c in containers(deployment) if c["name"] == "llm-exporter")["livenessProbe"]["httpGet"]
        status, _ = wait_for(f"http://{ip}:{container_port(deployment, 'llm-exporter', probe['port'])}{probe['path']}",
                             timeout=90)
        assert status == 200, podman.logs(f"{POD}-llm-exporter")
        # The engine target's name came from the pod annotation, through the downward API.
        assert wait_until(lambda: 'llm_engine_up{engine="vllm",target="twin"} 1.0'
                          in get(f"http://{ip}:{port}/metrics")[1], timeout=30, interval=0.5), \
            podman.logs(f"{POD}-llm-exporter")

        jobs = podmonitor_scrape_config(monitor, deployment, ip, POD, {}, tmp_path)
        plan = launcher.Plan(tmp_path, [launcher.Proc(
            "prometheus", [_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'data'}",
                           f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"],
            {}, ports["prometheus"], f"http://127.0.0.1:{ports['prometheus']}")], json.dumps({"scrape_configs": jobs}))
        launcher.start(plan, timeout_s=30)
        up = f'llm_engine_up{{job="llm-exporter",pod="{POD}",container="llm-exporter",target="twin"}} == 1'
        api = f"http://127.0.0.1:{ports['prometheus']}/api/v1/query?query=" + urllib.parse.quote(up)

        def scraped() -> bool:
            status, body = get(api)
            return status == 200 and bool(json.loads(body)["data"]["result"])

        assert wait_until(scraped, timeout=60, interval=1), \
            launcher._tail(tmp_path / "logs" / "prometheus.log")
    finally:
        launcher.stop(tmp_path)
        podman("kube", "down", str(manifest), check=False, timeout=120)
