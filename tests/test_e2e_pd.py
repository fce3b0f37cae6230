"""`llm-exporter run` scraping prefill/decode (PD) disaggregated engines on loopback: the KV-transfer
families in base units and the `role` of llm_engine_info, from the page or from the target's option."""

from __future__ import annotations

import pathlib
from contextlib import ExitStack

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import exporter_run, fake_engine, wait_until

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"
PAGES = {
    "sgl-decode": "sglang-v0.5.23_pd_decode__crafted_from_source.prom",
    "sgl-prefill": "sglang-v0.5.23_pd_prefill__crafted_from_source.prom",
    "vllm-decode": "vllm-v0.34.0_nixl_decode__crafted_from_source.prom",
}
OPTIONS = {"sgl-decode": "", "sgl-prefill": ",role=decode", "vllm-decode": ",role=decode"}


def _samples(base: str) -> dict[tuple[str, str], list]:
    """(sample name, target) -> samples."""
    found: dict[tuple[str, str], list] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for sample in fam.samples:
            found.setdefault((sample.name, sample.labels.get("target", "")), []).append(sample)
    return found


def _one(samples: dict, name: str, target: str) -> float:
    (sample,) = samples[(name, target)]
    return sample.value


def test_run_exports_kv_transfer_families_in_base_units_and_the_role():
    with ExitStack() as stack:
        urls = {name: stack.enter_context(fake_engine((FIXTURES / page).read_bytes()))[0]
                for name, page in PAGES.items()}
        args = [a for name, url in urls.items() for a in ("--engine", f"{url},name={name}{OPTIONS[name]}")]
        base, _process, stderr = stack.enter_context(exporter_run(*args))
        assert wait_until(lambda: all(("llm_engine_info", t) in _samples(base) for t in PAGES), timeout=15)
        samples = _samples(base)
        stderr.seek(0)
        log = stderr.read().decode()

    roles = {t: samples[("llm_engine_info", t)][0].labels["role"] for t in PAGES}
    # SGLang names its role (engine_type), and the page wins over a contradicting option (logged);
    # vLLM's page cannot tell a decode instance from a kv_both one: the option says it.
    assert roles == {"sgl-decode": "decode", "sgl-prefill": "prefill", "vllm-decode": "decode"}
    assert "target sgl-prefill: the page says role prefill, the target's role option decode" in log

    # A decode instance whose requests all wait for their KV: nothing running or in SGLang's waiting queue.
    assert _one(samples, "llm_requests_running", "sgl-decode") == 0.0
    assert _one(samples, "llm_requests_waiting", "sgl-decode") == 0.0
    assert _one(samples, "llm_requests_waiting_kv_transfer", "sgl-decode") == 14.0
    assert _one(samples, "llm_requests_waiting_kv_transfer", "sgl-prefill") == 8.0
    assert _one(samples, "llm_requests_waiting_kv_transfer", "vllm-decode") == 4.0
    assert _one(samples, "llm_requests_waiting", "vllm-decode") == 6.0  # vLLM's includes them
    assert _one(samples, "llm_kv_transfer_failures_total", "sgl-decode") == 5.0
    assert _one(samples, "llm_kv_transfer_failures_total", "vllm-decode") == 4.0

    # Base units: SGLang's ms and MiB become seconds and bytes (bounds and sums).
    seconds = {s.labels["le"] for s in samples[("llm_kv_transfer_seconds_bucket", "sgl-prefill")]}
    assert {"0.025", "0.05", "0.25", "+Inf"} <= seconds
    assert abs(_one(samples, "llm_kv_transfer_seconds_sum", "sgl-prefill") - 127.0935) < 1e-9
    mib = {s.labels["le"] for s in samples[("llm_kv_transfer_bytes_bucket", "sgl-prefill")]}
    assert "1.048576e+06" in mib
    assert _one(samples, "llm_kv_transfer_bytes_sum", "sgl-prefill") == 1002147.75 * 2**20
    assert _one(samples, "llm_kv_transfer_seconds_count", "vllm-decode") == 3337.0
    assert {s.labels["le"] for s in samples[("llm_kv_transfer_bytes_bucket", "vllm-decode")]} >= {"2048.0", "+Inf"}
    assert ("llm_kv_transfer_seconds_count", "sgl-decode") not in samples  # the prefill side records them
