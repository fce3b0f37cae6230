"""The deployable stack: container image, docker-compose.yml, Prometheus/Alertmanager config, the
Kubernetes manifests, the systemd unit, docs/configuration.md, and `make stack` end to end.

Tools: promtool, amtool and prometheus come from the Debian packages `make test` installs; a missing
one fails these tests (as in test_alerts.py). Two tools are not installed by the project and only
narrow what is checked when absent:
- `docker compose config` needs the compose CLI plugin, which no registry this project uses ships
  (Debian's docker-compose 1.29 predates the spec's top-level `name`). The compose file is
  validated against the Compose Specification's own JSON schema (tests/fixtures/deploy), plus the
  profile and volume references the schema cannot see; `docker compose config` runs as well where
  it is installed. Image builds are tested in the deploy tier (tests/deploy), under podman.
- `kubectl kustomize` renders the base, overlays and variants; `make debs` installs kubectl and
  systemd-analyze, and a missing one fails these tests, never skips them.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy import configuration_docs as config_docs
from deploy import stack
from deploy.kubernetes import generate as k8s_generate
from exporter.mixin.alerts import generate as alerts_generate
from tests.support import free_port, free_ports

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER_YML = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/vllm", "overlays/sglang", "variants/servicemonitor", "variants/web-config",
                  "daemonset")
K8S_VERSION = "1.32.0"
SYSTEMD_UNIT = ROOT / "deploy" / "systemd" / "llm-exporter.service"
CONFIG_DOC = ROOT / "docs" / "configuration.md"




def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH; `make debs` installs it. These tests never skip it.")
    return path


def run(*args: str | pathlib.Path, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kwargs)


# ------------------------------------------------------------------------------------------------
# docker-compose.yml
# ------------------------------------------------------------------------------------------------
@functools.cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def test_compose_has_the_stack_and_its_profiles():
    profiles = {name: tuple(svc.get("profiles", ())) for name, svc in services().items()}
    assert profiles == {
        "twin": ("demo",), "exporter": ("demo",),
        "vllm": ("gpu",), "exporter-gpu": ("gpu",),
        "prometheus": (), "alertmanager": (), "grafana": (),
    }


def test_every_compose_service_has_a_healthcheck():
    for name, svc in services().items():
        check = svc.get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        for key in ("interval", "timeout", "retries"):
            assert key in check, f"{name} healthcheck lacks {key}"


def test_compose_exporters_are_hardened_and_answer_to_the_scraped_name():
    for name in ("exporter", "exporter-gpu"):
        svc = services()[name]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert svc["environment"]["LLM_EXPORTER_LISTEN"] == "0.0.0.0:9480", name
    # Prometheus scrapes `exporter:9480`; the gpu profile's exporter carries that name as an alias.
    assert services()["exporter-gpu"]["networks"]["default"]["aliases"] == ["exporter"]
    demo_env = services()["exporter"]["environment"]
    assert demo_env["LLM_EXPORTER_GPU_BACKEND"] == "sim" and demo_env["LLM_EXPORTER_SIM_URL"] == "http://twin:8000"
    assert services()["twin"]["entrypoint"] == ["python", "-m", "exporter.simulator"]


def test_gpu_profile_reserves_nvidia_gpus():
    for name in ("vllm", "exporter-gpu"):
        devices = services()[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
    assert services()["exporter-gpu"]["environment"]["LLM_EXPORTER_GPU_BACKEND"] == "nvml"
    assert services()["vllm"]["image"].startswith("${VLLM_IMAGE:-vllm/vllm-openai:")


def test_every_mounted_config_file_exists():
    checked = 0
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
                checked += 1
            else:
                assert source in compose()["volumes"], f"{name}: named volume {source} is not declared"
    assert checked >= 5


def test_compose_variables_are_all_in_env_example():
    """Ports, credentials and images are configurable through .env; .env.example lists every knob."""
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", COMPOSE.read_text()))
    example = stack.read_env_file(ROOT / ".env.example")
    assert used - set(example) == set()
    for port in ("EXPORTER_PORT", "PROMETHEUS_PORT", "ALERTMANAGER_PORT", "GRAFANA_PORT", "TWIN_PORT"):
        assert port in used
    assert {"GRAFANA_ADMIN_USER", "GRAFANA_ADMIN_PASSWORD"} <= used
    # The defaults in .env.example are the compose file's own defaults.
    defaults = dict(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):-([^}]*)\}", COMPOSE.read_text()))
    for key, value in defaults.items():
        assert example[key] == value, f"{key}: .env.example {example[key]!r} != compose default {value!r}"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def _docker_compose() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            return cmd
    return None


COMPOSE_SPEC = ROOT / "tests" / "fixtures" / "deploy" / "compose-spec.json"  # README.md there: source, licence


def _interpolated(text: str, env: dict[str, str]) -> dict:
    """The compose file as `compose config` reads it: `${VAR}`, `${VAR:-default}` and `${VAR-default}`
    replaced from `env` (an unset variable without a default becomes "", as compose does)."""
    def value(match: re.Match) -> str:
        name, sep, default = match.group(1), match.group(2), match.group(3) or ""
        if name in env and (env[name] != "" or sep != ":-"):
            return env[name]
        return default if sep else ""
    return yaml.safe_load(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}", value, text.replace("$$", "\0"))
                          .replace("\0", "$"))


def compose_problems(doc: dict, profile: str) -> list[str]:
    """What `docker compose --profile PROFILE config` refuses, checked without compose: the Compose
    Specification's schema, then what the schema cannot say (a service of the profile that depends
    on one the profile leaves out; a named volume or network not declared at the top level)."""
    schema = json.loads(COMPOSE_SPEC.read_text())
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    active = {name for name, svc in doc.get("services", {}).items()
              if not svc.get("profiles") or profile in svc["profiles"]}
    for name in sorted(active):
        svc = doc["services"][name]
        needs = svc.get("depends_on", [])
        for dep in needs if isinstance(needs, list) else list(needs):
            if dep not in active:
                problems.append(f"{name} depends on {dep}, which profile {profile} does not enable")
        for volume in svc.get("volumes", []):
            source = volume.get("source") if isinstance(volume, dict) else str(volume).split(":")[0]
            named = source and not source.startswith((".", "/", "~", "$"))
            if named and source not in (doc.get("volumes") or {}):
                problems.append(f"{name}: volume {source} is not declared")
        networks = svc.get("networks", [])
        for network in networks if isinstance(networks, list) else list(networks):
            if network not in (doc.get("networks") or {}) and network != "default":
                problems.append(f"{name}: network {network} is not declared")
    return problems


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_docker_compose_config_parses_every_profile(profile):
    """Checked against the Compose Specification's schema everywhere; `docker compose config` too
    where a compose CLI that reads the spec is installed."""
    doc = _interpolated(COMPOSE.read_text(), stack.read_env_file(ROOT / ".env.example"))
    assert compose_problems(doc, profile) == []
    cmd = _docker_compose()
    if cmd is not None:
        result = run(*cmd, "-f", COMPOSE, "--profile", profile, "config", "--quiet",
                     env={**os.environ, "COMPOSE_PROFILES": ""})
        assert result.returncode == 0, result.stderr


def test_the_compose_check_refuses_what_compose_refuses():
    doc = _interpolated(COMPOSE.read_text(), stack.read_env_file(ROOT / ".env.example"))
    assert compose_problems(doc, "demo") == []
    bad = json.loads(json.dumps(doc))
    bad["services"]["exporter"]["restart_policy"] = "always"  # a misspelt key
    bad["services"]["twin"]["ports"] = "8000:8000"  # a string where a list belongs
    bad["services"]["prometheus"]["depends_on"] = ["vllm"]  # a gpu-profile service
    bad["services"]["alertmanager"]["volumes"] = ["undeclared-data:/alertmanager"]
    problems = "\n".join(compose_problems(bad, "demo"))
    for expected in ("services/exporter: 'restart_policy' does not match any of the regexes",
                     "services/twin/ports", "prometheus depends on vllm, which profile demo does not enable",
                     "alertmanager: volume undeclared-data is not declared"):
        assert expected in problems, problems
    assert _interpolated("a: ${X:-1}\nb: ${Y}\nc: $${Z}\nd: ${X-2}\n", {"X": ""}) == {
        "a": 1, "b": None, "c": "${Z}", "d": None}


# ------------------------------------------------------------------------------------------------
# Dockerfile
# ------------------------------------------------------------------------------------------------
def _dockerfile_stages() -> list[list[str]]:
    stages: list[list[str]] = []
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_is_multi_stage_slim_non_root_with_healthcheck():
    stages = _dockerfile_stages()
    assert len(stages) == 2
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE.read_text()
    build, final = stages
    assert "pip wheel" in " ".join(build)
    final_text = "\n".join(final)
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    assert "COPY --from=build /opt/venv /opt/venv" in final_text
    # No compiler, package manager install or source tree in the runtime image.
    assert not re.search(r"apt-get|gcc|build-essential|COPY (?!--from)", final_text)
    user = next(line.split()[1] for line in final if line.startswith("USER "))
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    assert re.search(r"PYTHONDONTWRITEBYTECODE=1", final_text)
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in final_text
    assert 'ENTRYPOINT ["llm-exporter"]' in final and 'CMD ["run"]' in final
    health = next(line for line in final if line.startswith("HEALTHCHECK"))
    assert '"python"' in health and "/healthz" in health and "curl" not in health


def test_dockerignore_keeps_the_context_to_what_the_build_copies():
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert patterns[0] == "*"
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.M))
    sources = {s.rstrip("/") for line in copied for s in line.split()}
    assert sources == {"pyproject.toml", "constraints.txt", "README.md", "exporter"}
    for source in sources:
        assert (ROOT / source).exists() and (f"!{source}" in patterns or f"!{source}/" in patterns), source


def _healthcheck_argv() -> list[str]:
    health = next(line for line in _dockerfile_stages()[1] if line.startswith("HEALTHCHECK"))
    argv = json.loads(health[health.index("CMD") + 3:].strip())
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]  # the image's `python`


# ------------------------------------------------------------------------------------------------
# Prometheus and Alertmanager config
# ------------------------------------------------------------------------------------------------
def test_promtool_accepts_the_prometheus_config():
    result = run(tool("promtool"), "check", "config", PROMETHEUS_YML)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_scrapes_the_job_the_rules_select(tmp_path):
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert alerts_generate.CONFIG["exporter_selector"] == 'job="llm-exporter"'
    assert jobs["llm-exporter"]["static_configs"][0]["targets"] == ["exporter:9480"]
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yaml"]
    assert "./alerts/rules:/etc/prometheus/rules:ro" in services()["prometheus"]["volumes"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # The loopback rendering (make stack) loads the real rule files: promtool checks them through it.
    rendered = stack.plan(tmp_path, {}, None, {}).prometheus_config
    (tmp_path / "prometheus.yml").write_text(rendered)
    result = run(tool("promtool"), "check", "config", tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (len(re.findall(r"SUCCESS: \d+ rules found", result.stdout))
            == len(list((ROOT / "alerts/rules").glob("*.yaml"))))


def test_amtool_accepts_the_alertmanager_config():
    result = run(tool("amtool"), "check-config", ALERTMANAGER_YML)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------------
# Kubernetes
# ------------------------------------------------------------------------------------------------
@functools.cache
def built() -> dict[str, list[dict]]:
    """kustomization -> its rendered objects (`kubectl kustomize`; `make debs` installs kubectl)."""
    kubectl = tool("kubectl")
    out = {}
    for name in KUSTOMIZATIONS:
        result = run(kubectl, "kustomize", K8S / name)
        assert result.returncode == 0, f"kustomize {name}: {result.stderr}"
        out[name] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return out


def standalone_objects() -> list[tuple[str, dict]]:
    """Every manifest file that is a whole object (not a patch, not a kustomization)."""
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        patch = path.parent.parent.name == "overlays" or path.name.endswith("-patch.yaml")
        if path.name == "kustomization.yaml" or patch:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(ROOT)), doc))
    return out


def all_objects() -> list[tuple[str, dict]]:
    objects = standalone_objects()
    for name, docs in built().items():
        objects += [(f"kustomize {name}", doc) for doc in docs]
    return objects


DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "namespace": {"type": "string"}, "labels": _LABELS, "annotations": _LABELS}}
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": _LABELS,
    "matchExpressions": {"type": "array", "items": {"type": "object", "required": ["key", "operator"]}}}}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                        "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer"}, "replacement": {"type": "string"}}}
_SECRET_KEY = {"type": "object", "required": ["name", "key"], "additionalProperties": False,
               "properties": {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}}}
_SECRET_OR_CONFIGMAP = {"type": "object", "additionalProperties": False, "maxProperties": 1,
                        "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY}}
_ENDPOINT_COMMON = {
    "tlsConfig": {"type": "object", "additionalProperties": False, "properties": {
        "ca": _SECRET_OR_CONFIGMAP, "cert": _SECRET_OR_CONFIGMAP, "keySecret": _SECRET_KEY,
        "serverName": {"type": "string"}, "insecureSkipVerify": {"type": "boolean"}}},
    "basicAuth": {"type": "object", "additionalProperties": False, "required": ["username", "password"],
                  "properties": {"username": _SECRET_KEY, "password": _SECRET_KEY}},
    "path": {"type": "string", "pattern": "^/"}, "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": {"type": "string", "pattern": DURATION}, "scrapeTimeout": {"type": "string", "pattern": DURATION},
    "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL}, "params": {"type": "object"}}


def _crd(kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                           "metadata": _METADATA, "spec": spec}}


# Prometheus Operator v0.93 CRD fields this project uses (a subset, with additionalProperties closed
# so that a misspelt field fails here instead of being pruned silently by the API server).
CRD_SCHEMAS = {
    "PodMonitor": _crd("PodMonitor", {
        "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR, "namespaceSelector": {"type": "object"}, "jobLabel": {"type": "string"},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}}, "sampleLimit": {"type": "integer"},
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {"port": {"type": "string"}, "portNumber": {"type": "integer"}, **_ENDPOINT_COMMON}}}}}),
    "ServiceMonitor": _crd("ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR, "namespaceSelector": {"type": "object"}, "jobLabel": {"type": "string"},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}}, "sampleLimit": {"type": "integer"},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {"port": {"type": "string"}, "targetPort": {"type": ["string", "integer"]},
                               **_ENDPOINT_COMMON}}}}}),
    "PrometheusRule": _crd("PrometheusRule", {
        "type": "object", "required": ["groups"], "additionalProperties": False,
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "required": ["name", "rules"], "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "minLength": 1}, "interval": {"type": "string", "pattern": DURATION},
                "query_offset": {"type": "string", "pattern": DURATION}, "limit": {"type": "integer"},
                "partial_response_strategy": {"type": "string"}, "labels": _LABELS,
                "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False,
                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                    "properties": {
                        "record": {"type": "string"}, "alert": {"type": "string"},
                        "expr": {"type": ["string", "integer"]}, "for": {"type": "string", "pattern": DURATION},
                        "keep_firing_for": {"type": "string", "pattern": DURATION},
                        "labels": _LABELS, "annotations": _LABELS}}}}}}}}),
}


def validate(doc: dict) -> None:
    """Kubernetes' own schemas for core kinds (strict: unknown fields fail), ours for the CRDs."""
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("source", ["files", *KUSTOMIZATIONS])
def test_kubernetes_manifests_match_the_schemas(source):
    objects = standalone_objects() if source == "files" else [(source, doc) for doc in built()[source]]
    assert objects
    kinds = set()
    for where, doc in objects:
        try:
            validate(doc)
        except Exception as error:  # noqa: BLE001 - reported with its origin
            pytest.fail(f"{where}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: {error}")
        kinds.add(doc["kind"])
    if source in ("base", "overlays/vllm", "overlays/sglang"):
        assert kinds == {"Deployment", "PodMonitor", "PrometheusRule", "ConfigMap"}
    if source == "variants/servicemonitor":
        assert kinds == {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    if source == "daemonset":
        assert kinds == {"DaemonSet", "PodMonitor"}


def test_the_validators_reject_mistakes():
    deployment = next(doc for _, doc in standalone_objects() if doc["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][1]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    podmonitor = next(doc for _, doc in standalone_objects() if doc["kind"] == "PodMonitor")
    for mutate in (lambda d: d["spec"].pop("podMetricsEndpoints"),
                   lambda d: d["spec"]["podMetricsEndpoints"][0].update(intervall="15s"),
                   lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval="15 seconds")):
        broken = json.loads(json.dumps(podmonitor))
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


_LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                         r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_kubernetes_labels_are_valid():
    """The JSON schemas only say labels are strings; the API server also checks their syntax."""
    for where, doc in all_objects():
        label_sets = [doc["metadata"].get("labels", {})]
        template = doc.get("spec", {}).get("template", {})
        if template:
            label_sets.append(template["metadata"]["labels"])
        for labels in label_sets:
            for key, value in labels.items():
                assert _LABEL_NAME.match(key) and len(key.split("/")[-1]) <= 63, f"{where}: label key {key}"
                assert isinstance(value, str) and _LABEL_VALUE.match(value) and len(value) <= 63, \
                    f"{where}: label {key}={value!r}"


def _workloads() -> list[tuple[str, dict]]:
    return [(w, d) for w, d in all_objects() if d["kind"] in ("Deployment", "DaemonSet")]


def test_exporter_containers_are_hardened_probed_and_sized():
    seen = 0
    for where, doc in _workloads():
        pod = doc["spec"]["template"]["spec"]
        exporter = next(c for c in pod["containers"] if c["name"] == "llm-exporter")
        seen += 1
        sc = exporter["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
        assert "add" not in sc["capabilities"], where
        if doc["kind"] == "DaemonSet":
            # The one exception: the kubelet's pod-resources socket is root's only (connecting needs write
            # permission on it), so the DaemonSet that maps GPUs to pods runs as uid 0, without any
            # capability, and only while it mounts that socket and nothing else writable.
            mounts = {m["mountPath"]: m for m in exporter["volumeMounts"]}
            assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True, where
            assert all(m.get("readOnly") is True for m in mounts.values()), where
            assert {"name": "LLM_EXPORTER_KUBERNETES_GPU_MAPPING", "value": "true"} in exporter["env"], where
            assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False, where
        else:
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, where
        assert exporter["livenessProbe"]["httpGet"]["path"] == "/healthz", where
        assert exporter["readinessProbe"]["httpGet"]["path"] == "/readyz", where
        resources = exporter["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"cpu", "memory"}, where
        assert exporter["ports"] == [{"name": "metrics", "containerPort": 9480}], where
        assert {"name": "LLM_EXPORTER_LISTEN", "value": "0.0.0.0:9480"} in exporter["env"], where
        assert pod.get("automountServiceAccountToken") is False, where
        if where.startswith("kustomize"):
            assert exporter["image"] == "ghcr.io/llm-exporter/llm-exporter:0.1.0", where
    assert seen >= 2


def test_overlays_run_real_engines_with_nvml_sidecars():
    for overlay, kind in (("overlays/vllm", "vllm"), ("overlays/sglang", "sglang")):
        deployment = next(d for d in built()[overlay] if d["kind"] == "Deployment")
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        assert containers["engine"]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "command" not in containers["engine"] or kind == "sglang"
        env = {e["name"]: e.get("value") for e in containers["llm-exporter"]["env"]}
        assert env["LLM_EXPORTER_GPU_BACKEND"] == "nvml" and "LLM_EXPORTER_SIM_URL" not in env
        assert env["LLM_EXPORTER_ENGINES"] == f"http://127.0.0.1:8000,kind={kind},name={kind}"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
        assert "nvidia.com/gpu" not in containers["llm-exporter"]["resources"]["limits"]
        assert deployment["spec"]["template"]["spec"]["shareProcessNamespace"] is True


def test_monitors_select_the_pods_relabel_the_job_and_carry_the_release_label():
    objects = [d for _, d in standalone_objects()]
    releases = set()
    pod_labels = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
                  for d in objects if d["kind"] in ("Deployment", "DaemonSet")}
    for doc in objects:
        if doc["kind"] not in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
            continue
        releases.add(doc["metadata"]["labels"].get("release"))
        if doc["kind"] == "PrometheusRule":
            continue
        endpoints = doc["spec"].get("podMetricsEndpoints") or doc["spec"]["endpoints"]
        for endpoint in endpoints:
            assert endpoint["port"] == "metrics"
            assert {"action": "replace", "targetLabel": "job", "replacement": "llm-exporter"} in endpoint["relabelings"]
        wanted = doc["spec"]["selector"]["matchLabels"]
        if doc["kind"] == "PodMonitor":
            assert any(wanted.items() <= labels.items() for labels in pod_labels.values()), doc["metadata"]["name"]
        else:
            service = next(d for d in objects if d["kind"] == "Service")
            assert wanted.items() <= service["metadata"]["labels"].items()
            assert any(service["spec"]["selector"].items() <= labels.items() for labels in pod_labels.values())
    assert releases == {alerts_generate.CONFIG["prometheusrule"]["labels"]["release"]}


def test_prometheusrule_equals_the_alert_rule_files():
    rule = yaml.safe_load((K8S / "base" / "prometheusrule.yaml").read_text())
    groups = [g for path in sorted((ROOT / "alerts" / "rules").glob("*.yaml"))
              for g in yaml.safe_load(path.read_text())["groups"]]
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    assert len(by_name) == len(rule["spec"]["groups"]), "duplicate group names"
    assert by_name == {g["name"]: g for g in groups}
    for docs in built().values():
        for doc in docs:
            if doc["kind"] == "PrometheusRule":
                assert doc == rule


def test_dashboard_configmaps_equal_the_dashboards():
    assert k8s_generate.main(["--check"]) == 0, "run `python deploy/kubernetes/generate.py`"
    dashboards = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert dashboards, "dashboards/*.json missing: run dashboards/generate.py"
    sources = [("files", [d for _, d in standalone_objects()])]
    sources += [(name, docs) for name, docs in built().items() if name != "daemonset"]
    for where, docs in sources:
        configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
        found = {}
        for cm in configmaps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", where
            assert len(cm["data"]) == 1, where
            found.update(cm["data"])
        assert found == dashboards, f"{where}: ConfigMaps differ from dashboards/*.json"


def test_kustomize_images_and_generated_files_are_not_hand_edited():
    for path in [K8S / "base" / "prometheusrule.yaml", *(K8S / "base" / "dashboards").glob("*.yaml")]:
        assert path.read_text().startswith("# Generated by "), path
    assert alerts_generate.PROMETHEUSRULE == K8S / "base" / "prometheusrule.yaml"


# ------------------------------------------------------------------------------------------------
# systemd unit
# ------------------------------------------------------------------------------------------------
def test_systemd_unit_verifies(tmp_path):
    text = SYSTEMD_UNIT.read_text()
    assert "ExecStart=/opt/llm-exporter/bin/llm-exporter run" in text
    assert re.search(r"^User=llm-exporter$", text, re.M) and "NoNewPrivileges=yes" in text
    assert "PrivateDevices=yes" not in text  # would hide /dev/nvidia*
    analyze = tool("systemd-analyze")
    unit = tmp_path / "llm-exporter.service"
    unit.write_text(text.replace("/opt/llm-exporter/bin/llm-exporter",
                                 str(pathlib.Path(sys.executable).parent / "llm-exporter")))
    result = run(analyze, "verify", unit, timeout=30)
    problems = [line for line in result.stderr.splitlines()
                if re.search(r"Unknown (key|section)|Invalid|Failed to parse|not executable|bad-setting", line)]
    assert result.returncode == 0 and not problems, result.stderr


# ------------------------------------------------------------------------------------------------
# docs/configuration.md
# ------------------------------------------------------------------------------------------------
def test_configuration_doc_is_generated_and_current():
    assert CONFIG_DOC.read_text() == config_docs.render(), "run `python deploy/configuration_docs.py`"


def test_configuration_doc_covers_every_flag_setting_and_option():
    import dataclasses

    from exporter import config as config_module
    from exporter.cli import build_parser

    text = CONFIG_DOC.read_text()
    subparsers = config_docs._subparsers(build_parser())
    for name in ("run", "demo", "doctor"):
        for action in config_docs._actions(subparsers[name]):
            assert f"`{max(action.option_strings, key=len)}" in text, f"{name} {action.option_strings}"
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for field in dataclasses.fields(config_module.Config):
        if field.name in config_docs.SKIP_FIELDS:
            continue
        key = config_docs._key(field.name)
        env = f"`{config_module.ENV_PREFIX}{key.upper()}"
        row = next((r for r in rows if env in r), None)
        assert row is not None, f"setting {field.name} ({env}) is not documented"
        assert row.rstrip(" |").rsplit("|", 1)[-1].strip(), f"setting {field.name} has no meaning in the doc"
    for option in getattr(config_module, "_TARGET_OPTIONS", ()):
        assert f"| `{option}` |" in text, option


# ------------------------------------------------------------------------------------------------
# deploy/stack.py and `make stack`
# ------------------------------------------------------------------------------------------------
def test_stack_interpolates_like_compose_and_maps_services_to_loopback(tmp_path):
    variables = {"SET": "x", "EMPTY": ""}
    assert stack.interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${SET} $$ ${UNSET:-}", variables) == \
        "x d  d x $ "
    with pytest.raises(stack.StackError):
        stack.interpolate("${UNSET:?needed}", {})
    the_plan = stack.plan(tmp_path, {"exporter": 1001, "twin": 1002, "prometheus": 1003, "alertmanager": 1004},
                          None, {"DEMO_MODEL": "llama-3.1-70b"})
    procs = {p.name: p for p in the_plan.procs}
    assert procs["exporter"].env["LLM_EXPORTER_ENGINES"] == "http://127.0.0.1:1002,name=twin"
    assert procs["exporter"].env["LLM_EXPORTER_LISTEN"] == "127.0.0.1:1001"
    assert procs["exporter"].env["LLM_EXPORTER_MODEL"] == "llama-3.1-70b"
    assert "--port=1002" in procs["twin"].argv and "--host=127.0.0.1" in procs["twin"].argv
    assert f"--config.file={ROOT / 'deploy/alertmanager/alertmanager.yml'}" in procs["alertmanager"].argv
    assert "--web.listen-address=127.0.0.1:1003" in procs["prometheus"].argv
    rendered = yaml.safe_load(the_plan.prometheus_config)
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in rendered["scrape_configs"]}
    assert targets == {"llm-exporter": ["127.0.0.1:1001"], "prometheus": ["127.0.0.1:1003"],
                       "alertmanager": ["127.0.0.1:1004"]}
    assert rendered["rule_files"] == [str(ROOT / "alerts" / "rules" / "*.yaml")]


def test_stack_refuses_one_port_for_two_services_and_starts_nothing(tmp_path, capsys):
    """Alertmanager would answer Prometheus's readiness check on a shared port while Prometheus exits
    on its bind: the stack would look up with Prometheus missing."""
    ports = free_ports(("exporter", "twin", "shared"))
    argv = ["up", "--dir", str(tmp_path / "stack"), "--exporter-port", str(ports["exporter"]),
            "--twin-port", str(ports["twin"]), "--prometheus-port", str(ports["shared"]),
            "--alertmanager-port", str(ports["shared"])]
    assert stack.main(argv, env={}) == 1
    assert f"alertmanager and prometheus on {ports['shared']}" in capsys.readouterr().err
    assert not list((tmp_path / "stack" / "pids").glob("*.pid"))
    assert all(pid is None for _, pid, _ in stack.status(tmp_path / "stack"))


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_make_stack_scrapes_the_exporter_with_rules_loaded(tmp_path):
    """deploy/stack.py up (what `make stack` runs) on free ports, then down."""
    for binary in ("prometheus", "promtool"):
        tool(binary)
    if not (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")):
        tool("prometheus-alertmanager")
    ports = free_ports(("exporter", "prometheus", "alertmanager", "twin"))
    argv = ["--dir", str(tmp_path / "stack"), *[a for n, p in ports.items() for a in (f"--{n}-port", str(p))]]
    prometheus = f"http://127.0.0.1:{ports['prometheus']}"
    try:
        assert stack.main(["up", *argv, "--scrape-interval", "1s"], env={}) == 0
        assert stack.main(["status", *argv], env={}) == 0
        deadline = time.monotonic() + 20
        while True:
            targets = _get_json(prometheus + "/api/v1/targets")["data"]["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in targets}
            if set(health.values()) == {"up"} and len(health) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert health == {"llm-exporter": "up", "prometheus": "up", "alertmanager": "up"}, targets
        groups = _get_json(prometheus + "/api/v1/rules")["data"]["groups"]
        expected = {g["name"] for p in (ROOT / "alerts" / "rules").glob("*.yaml")
                    for g in yaml.safe_load(p.read_text())["groups"]}
        assert {g["name"] for g in groups} == expected
        assert all(r["health"] != "err" for g in groups for r in g["rules"])
        alertmanagers = _get_json(prometheus + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        assert [a["url"] for a in alertmanagers] == [f"http://127.0.0.1:{ports['alertmanager']}/api/v2/alerts"]
        query = _get_json(prometheus + "/api/v1/query?query=llm_engine_up")["data"]["result"]
        assert [r["value"][1] for r in query] == ["1"]
        # The image's HEALTHCHECK command works against a live exporter and fails without one.
        env = {**os.environ, "LLM_EXPORTER_LISTEN": f"127.0.0.1:{ports['exporter']}"}
        assert subprocess.run(_healthcheck_argv(), env=env, timeout=10).returncode == 0
        env["LLM_EXPORTER_LISTEN"] = f"127.0.0.1:{free_port()}"
        assert subprocess.run(_healthcheck_argv(), env=env, capture_output=True, timeout=10).returncode != 0
        # So do the compose healthchecks of the twin and the exporter, pointed at the loopback ports.
        for name, port in (("twin", 8000), ("exporter", 9480)):
            check = services()[name]["healthcheck"]["test"]
            assert check[:2] == ["CMD", "python"], name
            command = [sys.executable, *(a.replace(f":{port}/", f":{ports[name]}/") for a in check[2:])]
            assert subprocess.run(command, timeout=10).returncode == 0, name
    finally:
        assert stack.main(["down", *argv], env={}) == 0
    assert stack.main(["status", *argv], env={}) == 3
    assert not list((tmp_path / "stack" / "pids").glob("*.pid"))
