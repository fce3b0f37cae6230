"""What tests/deploy shares: podman with this host's settings (deploy/container.py), the image, the
rendered kustomizations, and the Prometheus Operator's translation of a PodMonitor into a scrape job.

Every container, pod, network and volume a test makes carries PREFIX in its name, and `cleanup`
removes them all, before a run (leftovers of a killed one) and after.

The `podman` fixture lives here, not in a conftest.py: a second conftest.py would take the module
name `conftest` that tests/test_*.py import their paths from.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from deploy import container
from tests.fullstack import ROOT

K8S = ROOT / "deploy" / "kubernetes"
IMAGE = os.environ.get("LLM_EXPORTER_IMAGE", container.DEFAULT_TAG)
PREFIX = "llmx-test"


class Podman:
    """podman with engine_env; every call's output captured, a failure raised with its stderr."""

    def __init__(self) -> None:
        self.tool = container.engine("podman")
        self.env = container.engine_env(self.tool)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.tool, *args], env=self.env, text=True, capture_output=True,
                                timeout=timeout, input=stdin)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr[-2000:]}")
        return result

    def inspect(self, name: str) -> dict:
        return json.loads(self("inspect", name).stdout)[0]

    def pod_ip(self, pod: str) -> str:
        infra = self("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout.strip()
        return self.container_ip(infra)

    def container_ip(self, name: str) -> str:
        networks = self.inspect(name)["NetworkSettings"]["Networks"]
        return next(n["IPAddress"] for n in networks.values() if n.get("IPAddress"))

    def kube_play(self, manifest: pathlib.Path, deployment: dict) -> None:
        """`podman kube play` of a manifest holding `deployment`, with the image tagged as kustomize
        names it. podman 4.3 also publishes every containerPort on the host at the same number (no
        flag turns that off; Kubernetes publishes nothing without hostPort), so a port in use on
        the host fails the play: said plainly here rather than as podman's bind error."""
        self("tag", IMAGE, kustomize_image())
        busy = []
        for spec in containers(deployment):
            for port in spec.get("ports", []):
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port["containerPort"])) == 0:
                        busy.append(f"{spec['name']} {port['containerPort']}")
        assert not busy, f"podman kube play publishes containerPorts on the host, and these are in use: {busy}"
        self("kube", "play", str(manifest), timeout=180)

    def fill_secret_volume(self, name: str, files: dict[str, bytes]) -> None:
        """Writes a Secret's files into the named volume podman mounts for it, as the kubelet would.
        podman 4.3's kube play writes a Secret's `data` into that volume still base64-encoded (the
        kubelet decodes it) and writes nothing for `stringData`, into a volume it reuses when one
        exists. So the test's Secret carries `stringData` (podman needs the Secret to exist) and its
        files are written here first; the Secret volume, its mount and the exporter reading it stay
        the manifest's."""
        self("volume", "rm", "-f", name, check=False)
        self("volume", "create", name)
        mountpoint = pathlib.Path(self("volume", "inspect", name, "--format", "{{.Mountpoint}}").stdout.strip())
        for key, value in files.items():
            (mountpoint / key).write_bytes(value)
            (mountpoint / key).chmod(0o444)

    def logs(self, name: str, lines: int = 30) -> str:
        result = self("logs", "--tail", str(lines), name, check=False)
        return f"--- {name}\n{result.stdout}{result.stderr}"

    def cleanup(self) -> None:
        pods = self("pod", "ps", "-q", "--filter", f"name={PREFIX}", check=False).stdout.split()
        if pods:
            self("pod", "rm", "-f", "-t", "2", *pods, check=False)
        names = self("ps", "-aq", "--filter", f"name={PREFIX}", check=False).stdout.split()
        if names:
            self("rm", "-f", "-t", "2", *names, check=False)
        for kind in ("network", "volume", "secret"):
            listed = self(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split()
            mine = [n for n in listed if n.startswith(PREFIX)]
            if mine:
                self(kind, "rm", "-f", *mine, check=False)


def kustomize(name: str) -> list[dict]:
    """The objects `kubectl kustomize deploy/kubernetes/<name>` renders."""
    out = subprocess.run(["kubectl", "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def kustomize_image() -> str:
    """The image name kustomize gives `llm-exporter` (base/kustomization.yaml `images:`)."""
    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    image = next(i for i in base["images"] if i["name"] == "llm-exporter")
    return f"{image['newName']}:{image['newTag']}"


def containers(deployment: dict) -> list[dict]:
    return deployment["spec"]["template"]["spec"]["containers"]


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def secret(name: str, files: dict[str, bytes]) -> dict:
    """A Secret of text files in `stringData`, for podman (see Podman.fill_secret_volume)."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "stringData": {k: v.decode() for k, v in files.items()}}


def container_port(deployment: dict, container_name: str, port: int | str) -> int:
    """A probe's or endpoint's port, resolved by name as the kubelet and the operator do."""
    spec = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == container_name)
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in spec.get("ports", []) if p.get("name") == port)


def _snake(key: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in key)


def podmonitor_scrape_config(monitor: dict, deployment: dict, pod_ip: str, pod_name: str,
                             secrets: dict[str, dict[str, bytes]], directory: pathlib.Path,
                             namespace: str = "default", node: str | None = None) -> list[dict]:
    """The scrape jobs the Prometheus Operator generates for `monitor`, with kubernetes_sd's target
    for the one pod replaced by a static target carrying the same __meta_ labels. What the operator
    prepends (namespace, container, pod, job, endpoint) comes first, the monitor's own relabelings
    after, in that order, as the operator writes them; secrets referenced by tlsConfig and basicAuth
    become files under `directory`."""
    name = monitor["metadata"]["name"]
    template = deployment["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(template["metadata"]["labels"].get(k) == v for k, v in selector.items()), \
        f"the PodMonitor's selector {selector} does not select the pod"

    def secret_file(ref: dict, label: str) -> str:
        path = directory / f"{name}-{label}"
        path.write_bytes(secrets[ref["name"]][ref["key"]])
        return str(path)

    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        owner = next(c["name"] for c in template["spec"]["containers"]
                     if any(p.get("name") == endpoint["port"] for p in c.get("ports", [])))
        port = container_port(deployment, owner, endpoint["port"])
        meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod_name,
                "__meta_kubernetes_pod_container_name": owner,
                "__meta_kubernetes_pod_container_port_name": endpoint["port"],
                "__meta_kubernetes_pod_node_name": node or socket.gethostname(),
                "__meta_kubernetes_pod_ip": pod_ip}
        meta.update({"__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in k): v
                     for k, v in template["metadata"]["labels"].items()})
        relabel = [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{namespace}/{name}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        relabel += [{_snake(k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])]
        job = {"job_name": f"podMonitor/{namespace}/{name}/{index}",
               "scrape_interval": endpoint.get("interval", "30s"),
               "scrape_timeout": endpoint.get("scrapeTimeout", "10s"),
               "metrics_path": endpoint.get("path", "/metrics"),
               "scheme": endpoint.get("scheme", "http"),
               "static_configs": [{"targets": [f"{pod_ip}:{port}"], "labels": meta}],
               "relabel_configs": relabel}
        tls = endpoint.get("tlsConfig")
        if tls:
            job["tls_config"] = {"server_name": tls["serverName"],
                                 "ca_file": secret_file(tls["ca"]["secret"], "ca.crt")}
        auth = endpoint.get("basicAuth")
        if auth:
            job["basic_auth"] = {"username": secrets[auth["username"]["name"]][auth["username"]["key"]].decode(),
                                 "password_file": secret_file(auth["password"], "password")}
        jobs.append(job)
    return jobs


def get(url: str, *, timeout: float = 3, context=None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of one GET; a refused or failed connection is status 0."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


def wait_for(url: str, timeout: float = 60, **kwargs) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    status, body = get(url, **kwargs)
    while status != 200 and time.monotonic() < deadline:
        time.sleep(0.25)
        status, body = get(url, **kwargs)
    return status, body


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """podman for the deploy tier: the image must exist (`make image`); leftovers go first and last."""
    tool = Podman()
    assert tool("image", "inspect", IMAGE, check=False).returncode == 0, \
        f"no image {IMAGE}: run `make image` (make test-deploy does)"
    tool.cleanup()
    try:
        yield tool
    finally:
        tool.cleanup()
