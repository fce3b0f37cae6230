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

import asyncio
import functools
import gzip
import hashlib
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
from exporter.endpoints import HealthEndpoints
from exporter.mixin.alerts import generate as alerts_generate
from tests.support import free_port, free_ports

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER_YML = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/vllm", "overlays/sglang", "variants/servicemonitor", "variants/web-config",
                  "daemonset", "cluster", "examples/production-stack", "examples/llm-d", "examples/kserve",
                  "examples/leaderworkerset")
EXAMPLES = tuple(k for k in KUSTOMIZATIONS if k.startswith("examples/"))
# The published schemas of the projects the examples run on, as fetched (README.md there: version,
# source URL and checksum of each).
SCHEMAS = ROOT / "tests" / "fixtures" / "k8s-schemas"
PUBLISHED_CRDS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): SCHEMAS / "lws-v0.10.0-leaderworkersets.yaml.gz",
    ("serving.kserve.io/v1beta1", "InferenceService"): SCHEMAS / "kserve-v0.20.0-inferenceservices.yaml.gz",
    ("keda.sh/v1alpha1", "ScaledObject"): SCHEMAS / "keda-v2.20.2-scaledobjects.yaml.gz",
}
CHART_VALUES = {  # example values file -> the chart's values.schema.json
    K8S / "examples" / "production-stack" / "values.yaml": SCHEMAS / "production-stack-0.1.12-values.schema.json",
    K8S / "examples" / "llm-d" / "values.yaml": SCHEMAS / "llm-d-modelservice-v0.4.12-values.schema.json",
}
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
        # Not objects: the components' one container declaration, the charts' values files, the
        # scaling example's prometheus-adapter config (tests/test_scaling.py validates it).
        if path.name in ("kustomization.yaml", "container.yaml", "values.yaml",
                         "prometheus-adapter-config.yaml") or patch:
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
            "labelLimit": {"type": "integer", "minimum": 0},
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {"port": {"type": "string"}, "portNumber": {"type": "integer"}, **_ENDPOINT_COMMON}}}}}),
    "ServiceMonitor": _crd("ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR, "namespaceSelector": {"type": "object"}, "jobLabel": {"type": "string"},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}}, "sampleLimit": {"type": "integer"},
            "labelLimit": {"type": "integer", "minimum": 0},
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


def _closed(schema: object) -> object:
    """A CRD's OpenAPI schema made strict, as kubeconform's --strict does: every object that lists its
    properties refuses others (the API server would prune them silently), unless it says it keeps
    unknown fields."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def published_crd_schema(api_version: str, kind: str) -> dict:
    """The openAPIV3Schema of the published CRD's version, closed; the root's metadata checked as
    the API server does (the CRD leaves it to the server)."""
    # libyaml's loader where built in: the KServe CRD (1.9 MB) takes 4 s in pure Python, 0.6 s in C.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(gzip.decompress(PUBLISHED_CRDS[(api_version, kind)].read_bytes()), Loader=loader)  # noqa: S506
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version and v["served"])
    schema = _closed(served["schema"]["openAPIV3Schema"])
    assert isinstance(schema, dict)
    schema["properties"]["metadata"] = _METADATA
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    return schema


@functools.cache
def published_crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """The schema checked once: jsonschema.validate checks the schema itself on every call, and
    KServe's closed CRD schema is large (that check was most of 25 s per test)."""
    schema = published_crd_schema(api_version, kind)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _embedded_pods(doc: dict) -> list[dict]:
    """The pod templates a custom resource holds, for Kubernetes' own Pod schema."""
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt[t] for t in ("leaderTemplate", "workerTemplate") if t in lwt]
    return []


def validate(doc: dict) -> None:
    """Kubernetes' own schemas for core kinds (strict: unknown fields fail), ours for the Prometheus
    Operator's CRDs, the published CRDs (closed) for LeaderWorkerSet and KServe, with the pods they
    hold checked against Kubernetes' Pod schema as well."""
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
    elif (doc["apiVersion"], doc["kind"]) in PUBLISHED_CRDS:
        published_crd_validator(doc["apiVersion"], doc["kind"]).validate(doc)
        for template in _embedded_pods(doc):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template", **template.get("metadata", {})},
                   "spec": template["spec"]}
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
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
    # Per namespace apart from cluster-wide: the rules and dashboards only in `cluster`.
    if source in ("base", "overlays/vllm", "overlays/sglang", "variants/web-config"):
        assert kinds == {"Deployment", "PodMonitor", "NetworkPolicy"}
    if source == "variants/servicemonitor":
        assert kinds == {"Deployment", "Service", "ServiceMonitor", "NetworkPolicy"}
    if source == "daemonset":
        assert kinds == {"DaemonSet", "PodMonitor"}
    if source == "cluster":
        assert kinds == {"PrometheusRule", "ConfigMap"}
    if source in EXAMPLES:
        assert {"PodMonitor", "NetworkPolicy"} < kinds and not kinds & {"PrometheusRule", "ConfigMap"}


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


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "LeaderWorkerSet", "InferenceService")


def pod_of(doc: dict) -> dict:
    """The pod spec a workload runs the exporter in: a template's, a LeaderWorkerSet leader's, a
    KServe predictor's (its pod spec inline)."""
    if doc["kind"] == "LeaderWorkerSet":
        return doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    if doc["kind"] == "InferenceService":
        return doc["spec"]["predictor"]
    return doc["spec"]["template"]["spec"]


def exporter_of(pod: dict) -> dict | None:
    found = [c for key in ("containers", "initContainers") for c in pod.get(key, []) if c["name"] == "llm-exporter"]
    assert len(found) <= 1, found
    return found[0] if found else None


def _workloads() -> list[tuple[str, dict]]:
    return [(w, d) for w, d in all_objects() if d["kind"] in WORKLOAD_KINDS and exporter_of(pod_of(d))]


def test_exporter_containers_are_hardened_probed_and_sized():
    seen = 0
    for where, doc in _workloads():
        pod = pod_of(doc)
        exporter = exporter_of(pod)
        assert exporter is not None
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
        # Probes on the exporter's own port, on /healthz (the HTTP loop answers, nothing else checked).
        # A sidecar has no readiness probe: it is ready while it runs, so it never takes a healthy
        # engine out of its Service; the DaemonSet (no engine beside it) may wait for a collection.
        probe = exporter["livenessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/healthz", "metrics") and set(probe) <= {"path", "port", "scheme"}, \
            where
        if doc["kind"] == "DaemonSet":
            assert exporter["readinessProbe"]["httpGet"]["path"] == "/readyz", where
        else:
            assert "readinessProbe" not in exporter and "startupProbe" not in exporter, where
        resources = exporter["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"cpu", "memory"}, where
        assert exporter["ports"] == [{"name": "metrics", "containerPort": 9480}], where
        assert {"name": "LLM_EXPORTER_LISTEN", "value": "0.0.0.0:9480"} in exporter["env"], where
        if doc["kind"] in ("Deployment", "DaemonSet") and not where.startswith("kustomize examples/"):
            assert pod.get("automountServiceAccountToken") is False, where
        if where.startswith("kustomize"):
            assert exporter["image"] == "ghcr.io/llm-exporter/llm-exporter:0.1.0", where
    assert seen >= 2 + len(EXAMPLES)


def test_the_probed_paths_are_the_exporters_own_and_need_nothing_else():
    """/healthz is answered by HealthEndpoints from the HTTP loop alone: before any collection (a
    collector that never finished one) it is 200 where /readyz is still 503."""
    class NeverCollected:
        ready = False

    async def status(path: str) -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await HealthEndpoints(NeverCollected())({"path": path, "method": "GET"}, None, send)  # type: ignore[arg-type]
        return next(m["status"] for m in sent if m["type"] == "http.response.start")

    assert asyncio.run(status("/healthz")) == 200
    assert asyncio.run(status("/readyz")) == 503


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
    rule = yaml.safe_load((K8S / "cluster" / "prometheusrule.yaml").read_text())
    groups = [g for path in sorted((ROOT / "alerts" / "rules").glob("*.yaml"))
              for g in yaml.safe_load(path.read_text())["groups"]]
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    assert len(by_name) == len(rule["spec"]["groups"]), "duplicate group names"
    assert by_name == {g["name"]: g for g in groups}
    for docs in built().values():
        for doc in docs:
            if doc["kind"] == "PrometheusRule":
                assert doc["metadata"]["namespace"] == "monitoring"  # cluster/kustomization.yaml's
                metadata = {k: v for k, v in doc["metadata"].items() if k != "namespace"}
                assert {**doc, "metadata": metadata} == rule


def test_dashboard_configmaps_equal_the_dashboards():
    assert k8s_generate.main(["--check"]) == 0, "run `python deploy/kubernetes/generate.py`"
    dashboards = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert dashboards, "dashboards/*.json missing: run dashboards/generate.py"
    sources = [("files", [d for _, d in standalone_objects()]), ("cluster", built()["cluster"])]
    # Only the cluster-wide kustomization carries them: applied once, never once per namespace.
    for name, docs in built().items():
        assert name == "cluster" or not any(d["kind"] in ("ConfigMap", "PrometheusRule") for d in docs), name
    for where, docs in sources:
        configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
        found = {}
        for cm in configmaps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", where
            assert len(cm["data"]) == 1, where
            found.update(cm["data"])
        assert found == dashboards, f"{where}: ConfigMaps differ from dashboards/*.json"


def test_kustomize_images_and_generated_files_are_not_hand_edited():
    generated = [K8S / "cluster" / "prometheusrule.yaml", *(K8S / "cluster" / "dashboards").glob("*.yaml"),
                 *(K8S / "components").glob("*/*.yaml")]
    assert len(generated) > 12
    for path in generated:
        assert path.read_text().startswith("# Generated by "), path
    assert alerts_generate.PROMETHEUSRULE == K8S / "cluster" / "prometheusrule.yaml"


# The plain workloads a user already runs: each kind the components select, labelled or not.
_PLAIN = {
    "Deployment": {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {
        "selector": {"matchLabels": {"app": "x"}},
        "template": {"metadata": {"labels": {"app": "x"}},
                     "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.10.1"}]}}}},
    "StatefulSet": {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {
        "serviceName": "x", "selector": {"matchLabels": {"app": "x"}},
        "template": {"metadata": {"labels": {"app": "x"}},
                     "spec": {"initContainers": [{"name": "fetch-model", "image": "busybox"}],
                              "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.10.1"}]}}}},
    "LeaderWorkerSet": {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "spec": {
        "leaderWorkerTemplate": {"size": 2,
                                 "leaderTemplate": {"spec": {"containers": [{"name": "vllm-leader", "image": "v"}]}},
                                 "workerTemplate": {"spec": {"containers": [{"name": "vllm-worker", "image": "v"}]}}}}},
}


def inject(tmp_path: pathlib.Path, component: str, labelled: dict[str, bool]) -> dict[str, dict]:
    """`kubectl kustomize` of the plain workloads (name: kind lower-cased, + "-plain" when unlabelled)
    with the component; name -> rendered object."""
    docs = []
    for kind, with_label in labelled.items():
        doc = json.loads(json.dumps(_PLAIN[kind]))
        doc["metadata"] = {"name": kind.lower() + ("" if with_label else "-plain")}
        if with_label:
            doc["metadata"]["labels"] = {"llm-exporter.io/inject": "true"}
        docs.append(doc)
    tmp_path.mkdir()
    (tmp_path / "workloads.yaml").write_text(yaml.safe_dump_all(docs))
    relative = os.path.relpath(K8S / "components" / component, tmp_path)  # kustomize refuses absolute roots
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["workloads.yaml"],
                                                                 "components": [relative]}))
    result = run(tool("kubectl"), "kustomize", tmp_path)
    assert result.returncode == 0, result.stderr
    out = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout) if d}
    for doc in out.values():
        validate(doc)
    return out


@pytest.mark.parametrize("component", ["sidecar", "native-sidecar"])
def test_the_component_injects_labelled_workloads_and_leaves_the_rest(tmp_path, component):
    kinds = {"Deployment": True, "StatefulSet": True, "LeaderWorkerSet": True}
    out = inject(tmp_path / "labelled", component, kinds)
    plain = inject(tmp_path / "plain", component, dict.fromkeys(kinds, False))
    container = yaml.safe_load((K8S / "components" / "container.yaml").read_text())
    for kind in kinds:
        doc = out[kind.lower()]
        pod = pod_of(doc)
        exporter = exporter_of(pod)
        assert exporter is not None, kind
        key = "initContainers" if component == "native-sidecar" else "containers"
        assert exporter in pod[key], kind
        assert exporter == {**container, "image": "ghcr.io/llm-exporter/llm-exporter:0.1.0",
                            **({"restartPolicy": "Always"} if component == "native-sidecar" else {})}, kind
        assert pod["shareProcessNamespace"] is True, kind
        labels = (doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"] if kind == "LeaderWorkerSet"
                  else doc["spec"]["template"])["metadata"]["labels"]
        assert labels["llm-exporter/scrape"] == "true", kind
        # The workload's own containers are all still there, the engine first.
        original = pod_of({**_PLAIN[kind], "metadata": {}})
        for field in ("containers", "initContainers"):
            names = [c["name"] for c in pod.get(field, [])]
            assert [c["name"] for c in original.get(field, [])] == [n for n in names if n != "llm-exporter"], kind
        # Where it goes: last of the containers (the engine stays containers[0], the one `kubectl
        # logs` and tools take by default); first of the init containers (started before all).
        assert pod[key].index(exporter) == (0 if component == "native-sidecar" else len(pod[key]) - 1), kind
        if kind == "LeaderWorkerSet":  # workers run no server: no sidecar there
            worker = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
            assert exporter_of(worker) is None and "shareProcessNamespace" not in worker
        # Unlabelled, the same workload comes out as it went in.
        untouched = plain[kind.lower() + "-plain"]
        assert untouched["spec"] == _PLAIN[kind]["spec"], kind
    # The per-namespace monitoring objects come with it, once.
    assert sorted(d["kind"] for d in out.values() if d["kind"] not in kinds) == \
        ["NetworkPolicy", "NetworkPolicy", "PodMonitor"]


def test_the_native_sidecar_starts_first_and_restarts_always():
    """Kubernetes starts init containers in order: the exporter, listed first, runs before the
    StatefulSet's own init container and the engine, and stops after them."""
    native = []
    for where, doc in _workloads():
        pod = pod_of(doc)
        if any(c["name"] == "llm-exporter" for c in pod.get("initContainers", [])):
            assert pod["initContainers"][0]["name"] == "llm-exporter", where
            assert pod["initContainers"][0]["restartPolicy"] == "Always", where
            assert all(c["name"] != "llm-exporter" for c in pod["containers"]), where
            native.append(where)
    # llm-d's (beside its own native sidecar, the routing proxy) and the LeaderWorkerSet's leader.
    assert sorted(native) == ["kustomize examples/leaderworkerset", "kustomize examples/llm-d"]


def test_the_examples_point_the_sidecar_at_their_engine():
    """Each example's pod annotations name the engine's loopback port that its engine container
    (or, for llm-d, vLLM behind the routing proxy) listens on, and the annotations reach the
    exporter's environment through the downward API."""
    expected = {"examples/production-stack": 8000, "examples/llm-d": 8200, "examples/kserve": 8080,
                "examples/leaderworkerset": 8080}
    for name, port in expected.items():
        doc = next(d for d in built()[name] if d["kind"] in WORKLOAD_KINDS)
        annotations = (doc["spec"]["predictor"]["annotations"] if doc["kind"] == "InferenceService" else
                       (doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"] if doc["kind"] == "LeaderWorkerSet"
                        else doc["spec"]["template"])["metadata"]["annotations"])
        assert annotations["llm-exporter.io/engines"].startswith(f"http://127.0.0.1:{port},kind=vllm"), name
        pod = pod_of(doc)
        ports = {p["containerPort"] for c in pod["containers"] if c["name"] != "llm-exporter"
                 for p in c.get("ports", [])}
        assert port in ports, name
        env = {e["name"]: e for e in exporter_of(pod)["env"]}
        assert env["LLM_EXPORTER_ENGINES"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['llm-exporter.io/engines']", name


def test_the_chart_values_match_their_published_schemas():
    for values, schema in CHART_VALUES.items():
        doc = yaml.safe_load(values.read_text())
        errors = [e.message for e in jsonschema.Draft7Validator(json.loads(schema.read_text())).iter_errors(doc)]
        assert errors == [], values
    # The labels and annotations the sidecar needs are the chart's own settings, not extra keys the
    # chart would ignore: the production-stack schema lists them.
    stack = json.loads(CHART_VALUES[K8S / "examples" / "production-stack" / "values.yaml"].read_text())
    model = stack["properties"]["servingEngineSpec"]["properties"]["modelSpec"]["items"]["properties"]
    assert {"labels", "podAnnotations"} <= set(model)
    broken = yaml.safe_load((K8S / "examples" / "production-stack" / "values.yaml").read_text())
    broken["servingEngineSpec"]["modelSpec"][0]["replicaCount"] = "one"
    assert list(jsonschema.Draft7Validator(stack).iter_errors(broken))


def test_the_published_crds_refuse_mistakes():
    lws = next(d for d in built()["examples/leaderworkerset"] if d["kind"] == "LeaderWorkerSet")
    isvc = next(d for d in built()["examples/kserve"] if d["kind"] == "InferenceService")
    validate(lws)
    validate(isvc)
    for doc, mutate in (
            (lws, lambda d: d["spec"]["leaderWorkerTemplate"].update(sise=2)),
            (lws, lambda d: d["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0].update(
                imag="x")),
            (lws, lambda d: d["spec"].update(replicas="one")),
            (isvc, lambda d: d["spec"]["predictor"].update(minReplica=1)),
            (isvc, lambda d: d["spec"]["predictor"]["containers"][1]["ports"][0].update(containerPort="metrics"))):
        broken = json.loads(json.dumps(doc))
        mutate(broken)
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(broken)


def test_the_schema_fixtures_are_documented_with_version_and_source():
    readme = (SCHEMAS / "README.md").read_text()
    for path in [*PUBLISHED_CRDS.values(), *CHART_VALUES.values()]:
        assert path.name in readme, path
        row = next(line for line in readme.splitlines() if path.name in line)
        assert "https://" in row and re.search(r"[0-9a-f]{64}", row), row
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        assert hashlib.sha256(data).hexdigest() in row, path


def _ports(rule: dict) -> set[tuple[str, int]]:
    """(protocol, port) pairs a NetworkPolicy ingress rule admits; a rule without ports admits all."""
    out = set()
    for port in rule.get("ports", []):
        protocol = port.get("protocol", "TCP")
        if "port" not in port:
            out |= {(protocol, n) for n in range(1, 65536)}
        else:
            out |= {(protocol, n) for n in range(port["port"], port.get("endPort", port["port"]) + 1)}
    return out


def test_the_metrics_port_admits_only_the_monitoring_namespace():
    for name in ("base", *EXAMPLES):
        policies = [d for d in built()[name] if d["kind"] == "NetworkPolicy"]
        assert len(policies) == 2, name
        admitted_from_anywhere: set[tuple[str, int]] = set()
        from_monitoring: set[tuple[str, int]] = set()
        for policy in policies:
            assert policy["spec"]["podSelector"] == {"matchLabels": {"llm-exporter/scrape": "true"}}, name
            assert policy["spec"]["policyTypes"] == ["Ingress"], name
            for rule in policy["spec"]["ingress"]:
                if "from" not in rule:
                    admitted_from_anywhere |= _ports(rule)
                else:
                    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": "monitoring"}}}], name
                    from_monitoring |= _ports(rule)
        assert from_monitoring == {("TCP", 9480)}, name
        # Every other port stays as open as it was without a policy; 9480 is not among them.
        assert ("TCP", 9480) not in admitted_from_anywhere, name
        for protocol in ("TCP", "UDP", "SCTP"):
            expected = {(protocol, n) for n in range(1, 65536)} - {("TCP", 9480)}
            assert expected <= admitted_from_anywhere, (name, protocol)


def test_monitors_bound_samples_and_labels():
    monitors = [(w, d) for w, d in all_objects() if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert len(monitors) >= 5
    for where, doc in monitors:
        # docs/deploy.md "Scrape limits": 925 series measured for an 8-GPU replica; 15 labels on the
        # widest series plus 7 from the operator's relabelings.
        assert doc["spec"]["sampleLimit"] >= 4 * 925, where
        assert doc["spec"]["labelLimit"] >= 15 + 7, where


def test_a_cluster_label_from_the_mixin_config_reaches_rules_alertmanager_and_boards(tmp_path):
    """`llm-exporter mixin --config` with cluster_label: k8s_cluster, then generate.py --mixin: the
    cluster kustomization renders, and its rules, the Alertmanager grouping and every board's
    $cluster variable use k8s_cluster, never `cluster`."""
    (tmp_path / "mixin.yaml").write_text("cluster_label: k8s_cluster\n")
    cli = pathlib.Path(sys.executable).parent / "llm-exporter"
    result = run(cli, "mixin", "--config", tmp_path / "mixin.yaml", "--out", tmp_path / "mixin")
    assert result.returncode == 0, result.stderr
    assert k8s_generate.main(["--mixin", str(tmp_path / "mixin"), "--out", str(tmp_path / "cluster")]) == 0
    rendered = run(tool("kubectl"), "kustomize", tmp_path / "cluster")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for doc in docs:
        validate(doc)
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("k8s_cluster" in e for e in exprs)
    assert not any(re.search(r"(?<![a-z_])cluster(?![a-z_])\s*(=|,|\))", e) for e in exprs)
    boards = [json.loads(text) for d in docs if d["kind"] == "ConfigMap" for text in d["data"].values()]
    assert len(boards) == len(list((ROOT / "dashboards").glob("*.json")))
    for board in boards:
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["cluster"]["query"] == "label_values(llm_exporter_build_info, k8s_cluster)"
    alertmanager = yaml.safe_load((tmp_path / "mixin" / "alertmanager.yml").read_text())
    assert "k8s_cluster" in alertmanager["route"]["group_by"] and "cluster" not in alertmanager["route"]["group_by"]


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


def test_the_documented_pod_resources_patch_gives_the_injected_sidecar_the_socket_and_nothing_else(tmp_path):
    """docs/deploy.md's patch, beside the sidecar component on the production-stack example, renders and
    validates: the exporter gets the kubelet's socket read-only as uid 0 with every capability still
    dropped, the downward API names its pod, and the engine container is untouched."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    snippet = doc[doc.index("# patches: [{path: pod-resources.yaml"):]
    snippet = snippet[:snippet.index("```")]
    shutil.copytree(K8S, tmp_path / "k")
    example = tmp_path / "k" / "examples" / "production-stack"
    (example / "pod-resources.yaml").write_text(snippet)
    kustomization = yaml.safe_load((example / "kustomization.yaml").read_text())
    documented = yaml.safe_load(snippet.splitlines()[0].removeprefix("# patches: "))
    kustomization["patches"] = [*kustomization.get("patches", []), *documented]
    (example / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = run(tool("kubectl"), "kustomize", example)
    assert result.returncode == 0, result.stderr
    deployments = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        validate(d)
        pod = pod_of(d)
        exporter = exporter_of(pod)
        assert exporter is not None
        sc = exporter["securityContext"]
        assert sc["runAsUser"] == 0 and sc["capabilities"]["drop"] == ["ALL"]
        assert sc["allowPrivilegeEscalation"] is False
        assert exporter["volumeMounts"] == [{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                             "readOnly": True}]
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in exporter["env"]}
        assert env["LLM_EXPORTER_POD_NAME"] == "metadata.name"
        assert env["LLM_EXPORTER_POD_NAMESPACE"] == "metadata.namespace"
        for c in pod["containers"]:
            if c is not exporter:
                assert "pod-resources" not in {m["name"] for m in c.get("volumeMounts", [])}, c["name"]
