"""The sidecar pod from deploy/kubernetes under `podman kube play`, as rendered by kustomize.

The web-config variant (the base + TLS and basic auth from a Secret) is played as rendered, with the
image tagged as kustomize names it. Then, as in a cluster:
- the exporter reaches the engine (the twin, the base's engine) over the pod's loopback and sees its
  process through the shared PID namespace;
- every probe of the manifest answers on the port it names, with the scheme it names;
- the runtime applied the manifest's user, read-only root, capabilities and resource limits;
- a real Prometheus scrapes the pod with the job the Prometheus Operator would generate from the
  PodMonitor (its relabelings, TLS and basic auth from the scrape Secret), loads the PrometheusRule's
  groups, and the engine's death pages through the shipped Alertmanager config to a webhook.
"""

from __future__ import annotations

import base64
import json
import pathlib
import ssl
import time
import urllib.parse

import bcrypt
import pytest
import trustme
import yaml

from tests.deploy.harness import (
    PREFIX,
    Podman,
    container_port,
    containers,
    get,
    kustomize,
    one,
    podman,
    podmonitor_scrape_config,
    secret,
    wait_for,
)
from tests.fullstack import WebhookReceiver, _binary, launcher
from tests.support import free_ports, wait_until

pytestmark = pytest.mark.deploy
__all__ = ["podman"]  # the session fixture, from the harness

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
# What a user replaces in the shipped Alertmanager config: its two webhook URLs.
PAGER_URL = "http://alert-pager.example.invalid/llm-exporter"
TICKET_URL = "http://alert-tickets.example.invalid/llm-exporter"
PASSWORD = "scrape-" + "s3cret"
DEPLOYMENT = f"{PREFIX}-llm-engine"
POD = f"{DEPLOYMENT}-pod-0"  # podman kube play's name for a Deployment's one replica
# LLMEngineDown's `for` (2m) + one PodMonitor interval (15s) + Alertmanager's group_wait (30s) + slack.
PAGE_TIMEOUT_S = 300


class Sidecar:
    def __init__(self, podman: Podman, directory: pathlib.Path) -> None:
        self.podman = podman
        self.directory = directory
        objects = kustomize("variants/web-config")
        self.deployment = one(objects, "Deployment")
        self.deployment["metadata"]["name"] = DEPLOYMENT
        self.monitor = one(objects, "PodMonitor")
        self.rule = one(kustomize("cluster"), "PrometheusRule")  # cluster-wide, applied once
        ca = trustme.CA()
        cert = ca.issue_cert("llm-exporter")
        self.ca_pem = ca.cert_pem.bytes()
        web_config = {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
                      "basic_auth_users": {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()}}
        self.secrets = {
            "llm-exporter-web": {"web-config.yml": yaml.safe_dump(web_config).encode(),
                                 "tls.crt": b"".join(b.bytes() for b in cert.cert_chain_pems),
                                 "tls.key": cert.private_key_pem.bytes()},
            "llm-exporter-scrape": {"ca.crt": self.ca_pem, "username": b"prometheus", "password": PASSWORD.encode()},
        }
        # Only the exporter's Secret goes to the pod; the scrape Secret is Prometheus's.
        self.secret_manifest = directory / "secret.yaml"
        self.secret_manifest.write_text(yaml.safe_dump(secret("llm-exporter-web", self.secrets["llm-exporter-web"])))
        self.manifest = directory / "pod.yaml"
        self.manifest.write_text(yaml.safe_dump(self.deployment))
        self.tls = ssl.create_default_context(cadata=self.ca_pem.decode())
        self.tls.check_hostname = False  # the pod is reached by IP; the chain is still verified
        self.ip = ""

    def play(self) -> None:
        self.podman("kube", "play", str(self.secret_manifest))
        self.podman.fill_secret_volume("llm-exporter-web", self.secrets["llm-exporter-web"])
        self.podman.kube_play(self.manifest, self.deployment)
        self.ip = self.podman.pod_ip(POD)

    def down(self) -> None:
        self.podman("kube", "down", str(self.manifest), check=False, timeout=120)
        self.podman("secret", "rm", "llm-exporter-web", check=False)
        self.podman("volume", "rm", "-f", "llm-exporter-web", check=False)

    def container(self, name: str) -> str:
        return f"{POD}-{name}"

    def url(self, container: str, port: int | str, path: str, scheme: str = "http") -> str:
        return f"{scheme.lower()}://{self.ip}:{container_port(self.deployment, container, port)}{path}"

    def metrics(self) -> tuple[int, str]:
        token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        return get(self.url("llm-exporter", "metrics", "/metrics", "https"), context=self.tls,
                   headers={"Authorization": f"Basic {token}"})

    def logs(self) -> str:
        return "\n".join(self.podman.logs(self.container(c["name"]))
                         for c in self.deployment["spec"]["template"]["spec"]["containers"])


@pytest.fixture(scope="module")
def sidecar(podman: Podman, tmp_path_factory: pytest.TempPathFactory):
    pod = Sidecar(podman, tmp_path_factory.mktemp("pod"))
    pod.down()
    try:
        pod.play()
        status, _ = wait_for(pod.url("llm-exporter", "metrics", "/readyz", "https"), timeout=90, context=pod.tls)
        assert status == 200, pod.logs()
        yield pod
    finally:
        pod.down()


def test_every_probe_answers_where_the_manifest_points(sidecar: Sidecar):
    probes = [(c["name"], kind, c[kind]["httpGet"]) for c in containers(sidecar.deployment)
              for kind in ("livenessProbe", "readinessProbe", "startupProbe") if kind in c]
    assert len(probes) >= 2  # the engine's readiness, the exporter's liveness
    for name, kind, http_get in probes:
        url = sidecar.url(name, http_get["port"], http_get["path"], http_get.get("scheme", "HTTP"))
        status, _ = wait_for(url, timeout=30, context=sidecar.tls)
        assert status == 200, f"{name} {kind} {url}: {status}\n{sidecar.logs()}"


def test_the_exporter_reaches_its_engine_over_the_pods_loopback(sidecar: Sidecar):
    assert wait_until(lambda: 'llm_engine_up{engine="vllm",target="engine"} 1.0' in sidecar.metrics()[1],
                      timeout=30, interval=0.5), sidecar.logs()
    _, body = sidecar.metrics()
    assert "llm_engine_process_found 1.0" in body  # shareProcessNamespace: the twin's process is seen
    assert 'llm_exporter_web_config_last_reload_successful 1.0' in body


def test_the_web_config_from_the_secret_holds(sidecar: Sidecar):
    url = sidecar.url("llm-exporter", "metrics", "/metrics", "https")
    assert get(url, context=sidecar.tls)[0] == 401  # no credentials
    assert get(sidecar.url("llm-exporter", "metrics", "/metrics", "http"))[0] == 0  # TLS only
    listing = sidecar.podman("exec", sidecar.container("llm-exporter"), "sh", "-c",
                             "stat -L -c '%a %U %G %n' /etc/llm-exporter/web/*").stdout
    assert "web-config.yml" in listing and "tls.key" in listing, listing


def test_the_runtime_applied_the_manifests_security_and_limits(sidecar: Sidecar):
    for spec in containers(sidecar.deployment):
        name = sidecar.container(spec["name"])
        host = sidecar.podman.inspect(name)["HostConfig"]
        context = spec["securityContext"]
        assert host["ReadonlyRootfs"] is context["readOnlyRootFilesystem"]
        status = sidecar.podman("exec", name, "cat", "/proc/self/status").stdout
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert fields["Uid"].split()[0] == str(context["runAsUser"])
        assert fields["CapEff"].strip() == "0000000000000000"
        limits = spec["resources"]["limits"]
        assert host["Memory"] == int(limits["memory"].removesuffix("Mi")) * 2**20
        if "cpu" in limits:
            assert host["CpuQuota"] / host["CpuPeriod"] == int(limits["cpu"].removesuffix("m")) / 1000


@pytest.mark.timeout(PAGE_TIMEOUT_S + 180)
def test_prometheus_scrapes_through_the_podmonitor_and_the_rules_page(sidecar: Sidecar, tmp_path: pathlib.Path):
    receiver = WebhookReceiver()
    ports = free_ports(("alertmanager", "prometheus"))
    am_config = ALERTMANAGER.read_text()
    assert PAGER_URL in am_config and TICKET_URL in am_config
    (tmp_path / "alertmanager.yml").write_text(am_config.replace(PAGER_URL, receiver.url + "/pager")
                                               .replace(TICKET_URL, receiver.url + "/ticket"))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": sidecar.rule["spec"]["groups"]}))
    jobs = podmonitor_scrape_config(sidecar.monitor, sidecar.deployment, sidecar.ip, POD, sidecar.secrets, tmp_path)
    prometheus_config = json.dumps({
        "global": {"evaluation_interval": "5s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": jobs,
    })
    Proc = launcher.Proc
    procs = [
        Proc("alertmanager", [_binary("prometheus-alertmanager", "alertmanager"),
                              f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
                              f"--web.listen-address=127.0.0.1:{ports['alertmanager']}", "--cluster.listen-address=",
                              "--log.level=warn"], {}, ports["alertmanager"], f"http://127.0.0.1:{ports['alertmanager']}"),
        Proc("prometheus", [_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                            f"--storage.tsdb.path={tmp_path / 'data'}",
                            f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"],
             {}, ports["prometheus"], f"http://127.0.0.1:{ports['prometheus']}"),
    ]
    api = f"http://127.0.0.1:{ports['prometheus']}/api/v1/query?query="

    def query(expr: str) -> list[dict]:
        status, body = get(api + urllib.parse.quote(expr))
        return json.loads(body)["data"]["result"] if status == 200 else []

    try:
        launcher.start(launcher.Plan(tmp_path, procs, prometheus_config), timeout_s=30)
        # The relabelled target: the job the rules select, the node, the operator's own labels.
        up = f'llm_engine_up{{job="llm-exporter",namespace="default",pod="{POD}",container="llm-exporter",' \
             f'endpoint="metrics",target="engine",kubernetes_node!=""}} == 1'
        assert wait_until(lambda: bool(query(up)), timeout=60, interval=1), \
            f"Prometheus never scraped the pod as the PodMonitor says: {query('up')}\n" + launcher._tail(
                tmp_path / "logs" / "prometheus.log")
        rules_status, rules_body = get(f"http://127.0.0.1:{ports['prometheus']}/api/v1/rules")
        loaded = {g["name"] for g in json.loads(rules_body)["data"]["groups"]}
        assert loaded == {g["name"] for g in sidecar.rule["spec"]["groups"]}

        killed = time.monotonic()
        sidecar.podman("stop", "-t", "5", sidecar.container("engine"))
        # The sidecar stays ready and keeps serving while its engine is gone.
        assert wait_until(lambda: 'target="engine"} 0.0' in sidecar.metrics()[1], timeout=30, interval=0.5)
        assert get(sidecar.url("llm-exporter", "metrics", "/readyz", "https"), context=sidecar.tls)[0] == 200
        assert wait_until(lambda: bool(receiver.pages("LLMEngineDown", since=killed, receiver="/pager")),
                          timeout=PAGE_TIMEOUT_S, interval=2), \
            f"no page for LLMEngineDown; alerts: {query('ALERTS')}\n" + sidecar.logs()
        page = receiver.pages("LLMEngineDown", since=killed, receiver="/pager")[0]
        alert = receiver.alerts("LLMEngineDown", since=killed)[0]
        assert page.group["target"] == "engine"
        assert alert.labels["pod"] == POD and alert.labels["kubernetes_node"] and alert.labels["job"] == "llm-exporter"
    finally:
        launcher.stop(tmp_path)
        receiver.close()

