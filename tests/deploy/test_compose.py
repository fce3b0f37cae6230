"""docker-compose.yml's demo profile run as containers under podman, where no compose runs it.

Debian's podman-compose (1.0.3) ignores `profiles:` (it would start vLLM on a GPU too), so each
service of the profile is run here as compose would run it: its image, entrypoint, command,
environment, read_only, cap_drop, security_opt, ports and volumes as written, on one network where
every service answers to its name. Prometheus and Alertmanager mount the shipped prometheus.yml,
alerts/rules and alertmanager.yml as compose does.

No registry answers here, so prom/prometheus and prom/alertmanager are replaced by the local base
image with the Debian package's binary mounted as its entrypoint (same flags, same mounted
configs); where the image is present or a registry answers, the image itself runs. Grafana's image
cannot be made here: it is left out and said so.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse

import pytest
import yaml

from tests.deploy.harness import IMAGE, PREFIX, Podman, container, get, podman, wait_for
from tests.fullstack import ROOT, launcher
from tests.support import free_ports, wait_until

pytestmark = pytest.mark.deploy
__all__ = ["podman"]  # the session fixture, from the harness

PROFILE = "demo"
NETWORK = f"{PREFIX}-compose"
# The Debian binary standing in for an image no registry here serves: service -> (binary names), and
# the package data it reads (Alertmanager's default templates, Prometheus's console libraries).
DEBIAN_STANDINS = {"prometheus": ("prometheus",), "alertmanager": ("prometheus-alertmanager", "alertmanager")}
DEBIAN_DATA = "/usr/share/prometheus"
SKIPPED = ("grafana",)  # no image, no Debian package


def _services(ports: dict[str, int]) -> dict[str, dict]:
    variables = {"EXPORTER_PORT": str(ports["exporter"]), "PROMETHEUS_PORT": str(ports["prometheus"]),
                 "ALERTMANAGER_PORT": str(ports["alertmanager"]), "TWIN_PORT": str(ports["twin"]),
                 "LLM_EXPORTER_IMAGE": IMAGE, "BIND_ADDRESS": "127.0.0.1"}
    compose = launcher.load_compose(variables)
    return {name: svc for name, svc in compose["services"].items()
            if name not in SKIPPED and (not svc.get("profiles") or PROFILE in svc["profiles"])}


def _order(services: dict[str, dict]) -> list[str]:
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        for dep in services[name].get("depends_on") or {}:
            visit(dep)
        done.append(name)

    for name in services:
        visit(name)
    return done


def _run_args(podman: Podman, name: str, svc: dict) -> list[str]:
    args = ["run", "-d", "--name", f"{PREFIX}-{name}", "--network", NETWORK, "--network-alias", name]
    if svc.get("read_only"):
        args.append("--read-only")
    for cap in svc.get("cap_drop", []):
        args += ["--cap-drop", cap]
    for opt in svc.get("security_opt", []):
        args += ["--security-opt", opt.replace(":true", "")]
    for entry in svc.get("ports", []):
        args += ["-p", str(entry)]
    for key, value in launcher.environment(svc).items():
        args += ["-e", f"{key}={value}"]
    for entry in svc.get("volumes", []):
        source, _, rest = str(entry).partition(":")
        # A path in the checkout, or a named volume (made by podman on first use).
        source = str((ROOT / source).resolve()) if source.startswith(".") else f"{PREFIX}-{source}"
        args += ["-v", f"{source}:{rest}"]
    image = svc["image"]
    entrypoint = svc.get("entrypoint")
    if name in DEBIAN_STANDINS and podman("image", "inspect", image, check=False).returncode != 0 \
            and not container.registry_answers(podman.tool, image, timeout=30):
        binary = next(shutil.which(b) for b in DEBIAN_STANDINS[name] if shutil.which(b))
        args += ["-v", f"{binary}:/bin/{name}:ro", "-v", f"{DEBIAN_DATA}:{DEBIAN_DATA}:ro"]
        image, entrypoint = container.BASE_TAG, [f"/bin/{name}"]
    if entrypoint:
        args += ["--entrypoint", json.dumps(entrypoint)]
    return [*args, image, *[str(a) for a in svc.get("command", [])]]


@pytest.fixture(scope="module")
def stack(podman: Podman):
    ports = free_ports(("exporter", "prometheus", "alertmanager", "twin"))
    services = _services(ports)
    assert set(services) == {"twin", "exporter", "prometheus", "alertmanager"}, sorted(services)
    podman("network", "create", NETWORK)
    for name in _order(services):
        podman(*_run_args(podman, name, services[name]))
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    for name, path in (("twin", "/health"), ("exporter", "/readyz"), ("alertmanager", "/-/ready"),
                       ("prometheus", "/-/ready")):
        status, _ = wait_for(urls[name] + path, timeout=60)
        assert status == 200, podman.logs(f"{PREFIX}-{name}")
    yield services, urls
    for name in reversed(_order(services)):
        podman("rm", "-f", "-t", "5", f"{PREFIX}-{name}", check=False)


def _query(url: str, expr: str) -> list[dict]:
    status, body = get(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}")
    return json.loads(body)["data"]["result"] if status == 200 else []


def test_prometheus_scrapes_the_exporter_by_its_service_name(stack, podman: Podman):
    services, urls = stack
    ok = 'llm_engine_up{job="llm-exporter",instance="exporter:9480",target="twin"} == 1'
    assert wait_until(lambda: bool(_query(urls["prometheus"], ok)), timeout=60, interval=1), \
        f"{_query(urls['prometheus'], 'up')}\n" + podman.logs(f"{PREFIX}-exporter")
    # The exporter reads the twin's simulated GPU by the twin's service name too.
    assert _query(urls["prometheus"], 'llm_gpu_up{job="llm-exporter"} == 1')


def test_prometheus_loads_every_shipped_rule_file_and_finds_alertmanager(stack):
    services, urls = stack
    _, body = get(urls["prometheus"] + "/api/v1/rules")
    loaded = {g["file"].rsplit("/", 1)[-1] for g in json.loads(body)["data"]["groups"]}
    assert loaded == {p.name for p in (ROOT / "alerts" / "rules").glob("*.yaml")}
    assert wait_until(lambda: bool(json.loads(get(urls["prometheus"] + "/api/v1/alertmanagers")[1])
                                   ["data"]["activeAlertmanagers"]), timeout=30, interval=1)
    _, status = get(urls["alertmanager"] + "/api/v2/status")
    receivers = {r["name"] for r in yaml.safe_load(json.loads(status)["config"]["original"])["receivers"]}
    assert {"pager", "ticket"} <= receivers


def test_our_services_run_as_compose_says_and_their_healthchecks_pass(stack, podman: Podman):
    services, _ = stack
    for name in ("twin", "exporter"):
        svc = services[name]
        status = podman("exec", f"{PREFIX}-{name}", "cat", "/proc/self/status").stdout
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert fields["CapEff"].strip() == "0000000000000000"
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Uid"].split()[0] == "10001"
        assert podman.inspect(f"{PREFIX}-{name}")["HostConfig"]["ReadonlyRootfs"] is bool(svc["read_only"])
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD"
        result = podman("exec", f"{PREFIX}-{name}", *test[1:], check=False)
        assert result.returncode == 0, f"{name}'s compose healthcheck fails: {result.stderr[-1000:]}"
