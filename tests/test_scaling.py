"""The SLO-aware scaling signal (issue 45 item 4, docs/scaling.md): llm_slo_max_request_rate against the
planner's own rate search on the same twin windows, on the real `llm-exporter demo`'s /metrics, and the
shipped KEDA and prometheus-adapter/HPA examples against their published schemas."""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import sys

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.derive import scaling
from tests import scaling_agreement
from tests.support import background_process, free_port, wait_until
from tests.test_deploy import K8S_VERSION, SCHEMAS, published_crd_validator

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "kubernetes" / "examples" / "scaling"
KEDA = ("keda.sh/v1alpha1", "ScaledObject")
KEDA_CRD = SCHEMAS / "keda-v2.20.2-scaledobjects.yaml.gz"
ADAPTER_SCHEMA = SCHEMAS / "prometheus-adapter-config.schema.json"
# The prometheus trigger's metadata keys, from KEDA v2.20.2 pkg/scalers/prometheus_scaler.go
# (prometheusMetadata's `keda:"name=..."` tags): the CRD types trigger metadata as a string map, so
# it cannot catch a misspelt key there; KEDA would refuse a missing required one at run time.
PROMETHEUS_TRIGGER_KEYS = {"serverAddress", "query", "queryParameters", "threshold", "activationThreshold",
                           "namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout",
                           "identityOwner"}
PROMETHEUS_TRIGGER_REQUIRED = {"serverAddress", "query", "threshold"}
TOLERANCE = 0.15  # issue 45: the signal agrees with the planner's max rate within 15%


# --- agreement with the planner -------------------------------------------------------------------

@pytest.mark.parametrize("case", scaling_agreement.GATED, ids=lambda c: f"{c.scenario}-{c.gpu}-{c.model}")
def test_the_signal_agrees_with_the_planners_max_rate(case):
    row = scaling_agreement.run(case)
    assert row.runtime is not None and row.planner, row
    assert abs(row.diff) <= TOLERANCE, scaling_agreement.table([row])


def test_the_gated_cases_differ_in_load_gpu_and_model():
    cases = scaling_agreement.GATED
    assert len(cases) >= 3
    assert len({c.gpu for c in cases}) >= 2 and len({c.model for c in cases}) >= 2


# --- the formula's parts --------------------------------------------------------------------------

def test_erlang_c_is_the_textbook_value():
    # M/M/2 at 1 Erlang: C = 1/3; M/M/1 at rho: C = rho.
    assert scaling.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert scaling.erlang_c(1, 0.7) == pytest.approx(0.7)
    assert scaling.erlang_c(256, 256.0) == 1.0
    assert scaling.wait_quantile(256, 100.0, 10.0) == 0.0  # far below the slots: nobody waits
    assert scaling.wait_quantile(4, 3.9, 10.0) > scaling.wait_quantile(4, 3.0, 10.0) > 0


def test_short_answers_catch_the_prefill_lumps():
    # A decode step of 10 ms, a prompt adding 150 ms to the step it rides on: one prompt in a 2-token
    # answer's steps breaks a 100 ms TPOT; a 200-token answer absorbs many.
    few = scaling.tpot_violations(0.01, 0.15, 0.05, 4.0, 0.1)
    many = scaling.tpot_violations(0.01, 0.15, 0.05, 400.0, 0.1)
    assert few > 0.01 > many
    assert scaling.tpot_violations(0.2, 0.0, 0.0, 100.0, 0.1) == 1.0  # the decode step alone is over
    assert scaling.busy_tail(2.0, 0.0, 3) == scaling.poisson_tail(2.0, 3)
    # Busy periods: the same arrivals with each prompt's step bringing more have a longer tail, and
    # P(K = 0) is still the chance that none arrives.
    assert scaling.busy_tail(2.0, 0.5, 6) > scaling.poisson_tail(2.0, 6)
    assert 1 - scaling.busy_tail(2.0, 0.5, 0) == pytest.approx(math.exp(-2))
    # One cluster (j = 1) of Borel(0.5): P(K = 1) = e^-2 x 2 x e^-0.5.
    assert scaling.busy_tail(2.0, 0.5, 0) - scaling.busy_tail(2.0, 0.5, 1) == pytest.approx(
        math.exp(-2) * 2 * math.exp(-0.5))
    assert scaling.busy_tail(0.5, 0.5, 10_000) == 0.0  # far past the mean
    assert scaling.poisson_tail(2.0, -1) == 1.0
    assert scaling.poisson_tail(2.0, 2) == pytest.approx(1 - math.exp(-2) * (1 + 2 + 2))


def test_no_traffic_or_no_shape_gives_no_sample():
    from tests.test_derive_twin import Harness

    idle = Harness("idle")
    out, diag = idle.run(20)[-1]
    assert not [s for s in out if s.name.startswith("llm_slo_")]
    busy = Harness("decode-heavy", model="no-such-model")
    out, diag = busy.run(20)[-1]
    assert not [s for s in out if s.name.startswith("llm_slo_")]
    busy = Harness("decode-heavy")
    out, diag = busy.run(30)[-1]
    rate = next(s for s in out if s.name == "llm_slo_max_request_rate")
    ratio = next(s for s in out if s.name == "llm_slo_load_ratio")
    assert dict(rate.labels)["target"] == "t" and rate.value > 0 and 0 < ratio.value < 1
    assert diag["numbers"]["slo_max_rate_limit"] in scaling.LIMITS


def test_lengths_an_engine_reports_bound_the_search_not_break_it():
    """The lengths, the running cap and the KV capacity come from the engine's page: absurd ones give
    an answer or none, never an exception or a search without end (the terms are bounded)."""
    from exporter.specs.gpus import lookup_gpu
    from exporter.specs.models import load_model

    gpu, shape = lookup_gpu("h100-sxm"), load_model("llama-3.1-8b")
    assert gpu is not None
    for prompt, output, uncached, cap, capacity in (
            (1e9, 1.0, 1.0, 256.0, None), (1.0, 1e9, 1.0, 256.0, None), (1.0, 1.0, 1e-9, 1e6, 1.0),
            (600.0, 300.0, 0.8, 1.0, 1e12), (5e5, 2.0, 1.0, 65536.0, 1e7)):
        found = scaling.search(gpu, shape, 1, 1, prompt, output, uncached, cap, capacity, 2.5, 0.1)
        assert found is None or (math.isfinite(found.max_rate) and found.max_rate > 0 and found.limit in scaling.LIMITS)
    # Past MAX_TAIL_TERMS the normal tail: at its mean a half, far past it none.
    assert scaling.busy_tail(1e6, 0.999, 10**9) == pytest.approx(0.5, abs=1e-6)
    assert scaling.busy_tail(1e6, 0.999, 10**12) == 0.0 and 0.0 <= scaling.busy_tail(30.0, 0.9, 39) <= 1.0


# --- the real process -----------------------------------------------------------------------------

def test_the_demo_serves_the_signal_on_metrics():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}", "--interval", "500ms",
               "--scenario", "decode-heavy"]

    def signal() -> dict[str, dict[str, float]]:
        try:
            text = httpx.get(base + "/metrics", timeout=2).text
        except httpx.HTTPError:
            return {}
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in ("llm_slo_max_request_rate", "llm_slo_load_ratio"):
                    out.setdefault(s.labels["target"], {})[s.name] = s.value
        return out

    with background_process(command, base + "/healthz", timeout=60):
        assert wait_until(lambda: any(len(v) == 2 for v in signal().values()), timeout=90), signal()
        for target, values in signal().items():
            assert values["llm_slo_max_request_rate"] > 0, target
            assert 0 < values["llm_slo_load_ratio"] < 1, (target, values)  # decode-heavy runs at 85% of capacity


# --- the scaler examples --------------------------------------------------------------------------

def _yaml(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def validate_scaledobject(doc: dict) -> None:
    published_crd_validator(*KEDA).validate(doc)
    for trigger in doc["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        keys = set(trigger["metadata"])
        if keys - PROMETHEUS_TRIGGER_KEYS or PROMETHEUS_TRIGGER_REQUIRED - keys:
            raise jsonschema.ValidationError(f"prometheus trigger metadata {sorted(keys)}: unknown "
                                             f"{sorted(keys - PROMETHEUS_TRIGGER_KEYS)}, missing "
                                             f"{sorted(PROMETHEUS_TRIGGER_REQUIRED - keys)}")
        float(trigger["metadata"]["threshold"])


def validate_adapter(doc: dict) -> None:
    jsonschema.Draft7Validator(json.loads(ADAPTER_SCHEMA.read_text())).validate(doc)


def test_the_keda_scaledobject_matches_the_published_crd_and_reads_the_rule():
    from tests import test_deploy

    assert test_deploy.PUBLISHED_CRDS[KEDA] == KEDA_CRD
    crd = yaml.safe_load(gzip.decompress(KEDA_CRD.read_bytes()))
    assert crd["metadata"]["name"] == "scaledobjects.keda.sh"
    doc = _yaml("keda-scaledobject.yaml")
    validate_scaledobject(doc)
    assert "model:llm_replicas_needed:ratio" in doc["spec"]["triggers"][0]["metadata"]["query"]


def test_the_adapter_config_and_hpa_validate():
    adapter = _yaml("prometheus-adapter-config.yaml")
    validate_adapter(adapter)
    hpa = _yaml("hpa.yaml")
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    # The HPA reads the metric the adapter serves.
    served = {rule["name"]["as"] for rule in adapter["externalRules"]}
    assert {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]} <= served
    assert adapter["externalRules"][0]["seriesQuery"].startswith("model:llm_replicas_needed:ratio")


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["triggers"][0].update(metdata=d["spec"]["triggers"][0].pop("metadata")),
    lambda d: d["spec"]["triggers"][0]["metadata"].update(treshold="1"),
    lambda d: d["spec"]["triggers"][0]["metadata"].pop("query"),
    lambda d: d["spec"].update(maxReplicaCount="eight"),
    lambda d: d["spec"]["scaleTargetRef"].pop("name"),
    lambda d: d["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"].update(
        stabilisationWindowSeconds=600),
], ids=["trigger-metdata", "metadata-treshold", "no-query", "replicas-text", "no-target", "behavior-typo"])
def test_a_planted_mistake_in_the_scaledobject_fails(mutate):
    doc = _yaml("keda-scaledobject.yaml")
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate_scaledobject(doc)


@pytest.mark.parametrize("which,mutate", [
    ("adapter", lambda d: d["externalRules"][0].update(seriesQeury=d["externalRules"][0].pop("seriesQuery"))),
    ("adapter", lambda d: d["externalRules"][0]["name"].update(match="x")),
    ("adapter", lambda d: d["externalRules"][0]["resources"]["overrides"]["namespace"].pop("resource")),
    ("hpa", lambda d: d["spec"]["metrics"][0]["external"]["target"].update(avgValue="1")),
    ("hpa", lambda d: d["spec"].update(maxReplicas="8")),
], ids=["seriesQeury", "name-match", "override-no-resource", "hpa-avgValue", "hpa-replicas-text"])
def test_a_planted_mistake_in_the_adapter_or_hpa_fails(which, mutate):
    doc = _yaml("prometheus-adapter-config.yaml" if which == "adapter" else "hpa.yaml")
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate_adapter(doc) if which == "adapter" else kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- the rule's headroom ----------------------------------------------------------------------------

def test_the_headroom_is_declared_once_and_checked():
    from exporter.mixin.alerts import scaling as rules
    from exporter.mixin.config import CONFIG

    def needed(cfg: dict) -> str:
        return next(r["expr"] for r in rules.groups(cfg)[0]["rules"] if r["record"] == rules.REPLICAS_NEEDED)

    assert CONFIG["scaling_headroom"] == 0.2 and "/ 0.8\n" in needed(CONFIG)
    assert "/ 0.5\n" in needed({**CONFIG, "scaling_headroom": 0.5})
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="scaling_headroom"):
            rules.groups({**CONFIG, "scaling_headroom": bad})
