"""Hardening round 2, numbers: every value an engine reports is checked against its family's domain
at the normalizer (non-negative, ratios at most 1, nothing above catalog.MAX_VALUE, a series printed
twice with two values dropped), derived values are never NaN or infinite, and every JSON answer is
finite by construction, so one target's extreme page degrades that target alone.

The last test drives `llm-exporter run` with an extreme engine beside a healthy one."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from types import MappingProxyType

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.catalog import engine as engine_catalog
from exporter.catalog.base import MAX_VALUE
from exporter.config import Config
from exporter.derive import build_deriver
from exporter.simulator import Twin, TwinConfig
from exporter.snapshot import Snapshot, SourceKind, SourceResult
from exporter.sources.engines.normalize import normalize as plain_normalize
from exporter.sources.engines.replay import normalize_with_memo
from exporter.sources.engines.state import NormalizerState
from exporter.sources.gpu.sim import samples_from_state
from tests.support import exporter_run, fake_engine, wait_until

CEILING = {f.name: f.ceiling for f in engine_catalog.FAMILIES}
EXTREMES = ["1e308", "-1e308", "1.5e18", "-0.5", "5.0", "1e-300", "0", "-0", "2.0", "NaN", "+Inf", "-Inf"]
PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} @a
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} @b
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} @c
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="@d"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} @e
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="@f",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 2
vllm:time_to_first_token_seconds_count{model_name="m"} 2
vllm:time_to_first_token_seconds_sum{model_name="m"} @g
"""


def family(sample_name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in CEILING:
            return sample_name[: -len(suffix)]
    return sample_name


def in_domain(result) -> None:
    for s in result.samples:
        ceiling = CEILING[family(s.name)]
        assert 0.0 <= s.value <= ceiling, (s.name, s.value)
        le = s.label("le") or None
        assert le is None or le == "+Inf" or abs(float(le)) <= MAX_VALUE, s


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({k: st.sampled_from(EXTREMES) for k in "abcdefg"}), min_size=1, max_size=5))
def test_every_output_value_is_in_its_family_domain_and_warm_equals_cold(pages):
    state = NormalizerState()
    for values in pages:
        text = PAGE
        for key, value in values.items():
            text = text.replace("@" + key, value)
        for _ in range(2):  # the repeat records a plan, the next page may replay it
            warm = normalize_with_memo(text, target="t", kind="vllm", state=state)
        cold = plain_normalize(text, target="t", kind="vllm")
        assert repr(warm) == repr(cold)
        in_domain(warm)


def test_out_of_range_values_are_dropped_by_reason_and_the_rest_stays():
    text = (PAGE.replace("@a", "3").replace("@b", "-4").replace("@c", "5.0").replace("@d", "1e308")
            .replace("@e", "1e300").replace("@f", "0.1").replace("@g", "0.3"))
    result = plain_normalize(text, target="t", kind="vllm")
    assert {s.name for s in result.samples} >= {"llm_requests_running", "llm_time_to_first_token_seconds_bucket"}
    assert not {"llm_requests_waiting", "llm_kv_cache_usage_ratio", "llm_kv_cache_capacity_tokens",
                "llm_prompt_tokens_total"} & {s.name for s in result.samples}
    assert dict(result.drops) == {"out_of_range": 4}
    assert any("llm_kv_cache_usage_ratio series outside [0, 1]" in note for note in result.notes)


def test_a_series_printed_twice_with_two_values_is_dropped_and_a_repeat_counts_once():
    text = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 9\nvllm:num_requests_running{model_name="m"} 3\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="m"} 2\nvllm:num_requests_waiting{model_name="m"} 2\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            'vllm:prompt_tokens_total{model_name="m"} 5\nvllm:prompt_tokens_total{model_name="m"} 5\n')
    result = plain_normalize(text, target="t", kind="vllm")
    values = {s.name: s.value for s in result.samples}
    assert "llm_requests_running" not in values  # 9 or 3: nobody can tell, so neither
    assert values["llm_requests_waiting"] == 2.0
    assert values["llm_prompt_tokens_total"] == 5.0  # not summed to 10
    assert dict(result.drops) == {"duplicate": 1}
    state = NormalizerState()
    for _ in range(3):  # never planned: each page takes the full pass and says so
        assert repr(normalize_with_memo(text, target="t", kind="vllm", state=state)) == repr(result)
    assert state.memo.plan is None


def _twin_cycles(mutate, cycles: int = 8) -> tuple[list, dict]:
    """The decode-heavy twin through the normalizer and a Deriver, its engine page rewritten by
    `mutate` and its GPU samples' values by the same rng: (derived samples, last diagnosis)."""
    twin = Twin(TwinConfig(scenario="decode-heavy", epoch=1_700_000_000.0))
    deriver = build_deriver(Config(interval_s=1.0, model="llama-3.1-8b"))
    state = NormalizerState()
    previous = None
    derived: list = []
    for _ in range(cycles):
        twin.fast_forward(1.0)
        scrape = normalize_with_memo(mutate(twin.metrics_text()), target="t", kind="vllm", state=state)
        gpu = tuple(s._replace(value=mutate.gpu(s.value)) for s in samples_from_state(twin.gpu_state()))
        engine = SourceResult("engine:t", True, 0.0, 0.0, scrape.samples, kind=SourceKind.ENGINE,
                              attrs=MappingProxyType({"kind": "engine", "target": "t", "engine": "vllm",
                                                      "model": scrape.model or ""}))
        snap = Snapshot(1_700_000_000.0 + twin.now, MappingProxyType(
            {"engine:t": engine, "gpu": SourceResult("gpu", True, 0.0, 0.0, gpu, kind=SourceKind.GPU)}))
        derived = list(deriver(snap, previous))
        previous = snap
    return derived, deriver.diagnosis()


class _Extreme:
    """Replaces about a third of an engine page's values with in-domain extremes (tiny, huge,
    exactly 0 or 1), and GPU values likewise: what may pass the normalizer on purpose."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, text: str) -> str:
        def swap(match: re.Match) -> str:
            if self.rng.random() < 0.35:
                return match.group(1) + self.rng.choice(["1e-300", "1e18", "0", "1", "4e-324"])
            return match.group(0)
        return re.sub(r"^([^#\n][^\n]* )\S+$", swap, text, flags=re.M)

    def gpu(self, value: float) -> float:
        return self.rng.choice([value, value, 0.0, 1e-300, 1e18, 5e-324]) if math.isfinite(value) else value


@pytest.mark.parametrize("seed", range(6))
def test_derived_values_and_the_diagnosis_stay_finite_on_extreme_inputs(seed):
    derived, diagnosis = _twin_cycles(_Extreme(seed))
    assert derived and all(math.isfinite(s.value) for s in derived)
    json.dumps(diagnosis, allow_nan=False)  # raises on NaN or Infinity anywhere
    assert diagnosis["targets"]["t"]["target"] == "t"


# ---------------------------------------------------------------------------------------------
# The same through `llm-exporter run`: one extreme engine beside a healthy one


HEALTHY = (b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"good\"} 2\n"
           b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"good\"} 0\n"
           b"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"good\"} 100\n"
           b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"good\"} 0.25\n")
EXTREME = (b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"bad\"} 3\n"
           b"vllm:num_requests_running{model_name=\"bad\"} 1e308\n"
           b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"bad\"} -50\n"
           b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"bad\"} 5.0\n"
           b"# TYPE vllm:cache_config_info gauge\n"
           b"vllm:cache_config_info{block_size=\"1e308\",num_gpu_blocks=\"1e308\"} 1.0\n"
           b"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"bad\"} 1e308\n"
           b"# TYPE vllm:time_to_first_token_seconds histogram\n"
           b"vllm:time_to_first_token_seconds_bucket{le=\"1e308\",model_name=\"bad\"} 1\n"
           b"vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"bad\"} 1\n"
           b"vllm:time_to_first_token_seconds_count{model_name=\"bad\"} 1\n"
           b"vllm:time_to_first_token_seconds_sum{model_name=\"bad\"} 1e308\n")




def _get(url: str) -> httpx.Response:
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return httpx.Response(599)


def _strict_json(body: bytes) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in a JSON answer")
    return json.loads(body, parse_constant=refuse)


def _dropped(text: str, reason: str) -> float:
    match = re.search(r'llm_exporter_series_dropped_total\{[^}]*reason="' + reason + r'"[^}]*source="engine:bad"'
                      r'[^}]*\} (\S+)|llm_exporter_series_dropped_total\{[^}]*source="engine:bad"[^}]*reason="'
                      + reason + r'"[^}]*\} (\S+)', text)
    return float(match.group(1) or match.group(2)) if match else 0.0


def test_run_answers_finite_json_for_every_target_when_one_engine_reports_extreme_numbers():
    with fake_engine(EXTREME, keep_alive=True) as (bad, _), fake_engine(HEALTHY, keep_alive=True) as (good, _), \
            exporter_run("--engine", f"{bad},kind=vllm,name=bad", "--engine", f"{good},kind=vllm,name=good") as (
                base, _process, stderr):
        assert wait_until(lambda: _dropped(_get(base + "/metrics").text, "out_of_range") > 0, timeout=15)
        assert wait_until(lambda: "good" in _get(base + "/api/v1/diagnosis").text
                          and _strict_json(_get(base + "/api/v1/diagnosis").content)["targets"]["good"]["verdict"],
                          timeout=20)
        metrics = _get(base + "/metrics").text
        answers = {path: _get(base + path) for path in ("/api/v1/diagnosis", "/api/v1/snapshot", "/")}
        doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base],
                                capture_output=True, text=True, timeout=60)
        stderr.seek(0)
        log = stderr.read().decode()
    assert {path: r.status_code for path, r in answers.items()} == dict.fromkeys(answers, 200)
    diagnosis = _strict_json(answers["/api/v1/diagnosis"].content)
    _strict_json(answers["/api/v1/snapshot"].content)
    assert set(diagnosis["targets"]) == {"bad", "good"}
    assert diagnosis["targets"]["good"]["verdict"] is not None
    assert diagnosis["targets"]["good"]["numbers"]["kv_usage_ratio"] == 0.25
    assert diagnosis["targets"]["bad"]["numbers"]["kv_usage_ratio"] is None  # 5.0 never got in
    for reason in ("out_of_range", "duplicate"):
        assert _dropped(metrics, reason) > 0, reason
    assert not re.search(r'^llm_kv_cache_usage_ratio\{[^}]*target="bad"', metrics, re.M)
    assert not re.search(r'^llm_requests_waiting\{[^}]*target="bad"[^}]*\} -', metrics, re.M)
    assert "target good" in doctor.stdout and "cannot tell" not in doctor.stdout.split("target good")[1]
    assert "Traceback" not in log and "OverflowError" not in log
