"""`llm-exporter run` with a target's `model=` option, on loopback: an engine whose page names no
model (llama.cpp) gets the declared one on every engine and derived series that has a `model`
label, so the fleet's per-model rules do not group it under an empty model; a page that names its
model keeps it."""

from __future__ import annotations

import pathlib
from contextlib import ExitStack

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalog import FAMILIES, family_of
from tests.support import exporter_run, fake_engine, wait_until

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"
LLAMA = "unsloth/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"


def _samples(base: str) -> list:
    return [s for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text)
            for s in fam.samples]


def test_run_gives_a_modelless_page_the_declared_model_and_keeps_a_page_s_own():
    llama = (FIXTURES / "llamacpp-b11434__crafted_from_source.prom").read_bytes()
    vllm = (FIXTURES / "vllm-v0.34.0__crafted_from_source.prom").read_bytes()
    with ExitStack() as stack:
        llama_url = stack.enter_context(fake_engine(llama))[0]
        bare_url = stack.enter_context(fake_engine(llama))[0]
        vllm_url = stack.enter_context(fake_engine(vllm))[0]
        base, _process, _stderr = stack.enter_context(exporter_run(
            "--engine", f"{llama_url},name=llama,model={LLAMA}",
            "--engine", f"{bare_url},name=bare",
            "--engine", f"{vllm_url},name=vllm,model=declared/elsewhere"))

        def derived_for_all() -> bool:
            return {s.labels.get("target") for s in _samples(base) if s.name == "llm_decode_tokens_per_second"} \
                >= {"llama", "bare", "vllm"}

        assert wait_until(derived_for_all, timeout=20)
        samples = _samples(base)

    def models(target: str, source: str) -> dict[str, set[str | None]]:
        """family -> the model labels its series of `target` carry, for families of `source`."""
        out: dict[str, set[str | None]] = {}
        for s in samples:
            family = family_of(s.name)
            if s.labels.get("target") == target and family is not None and family.source == source:
                out.setdefault(family.name, set()).add(s.labels.get("model"))
        return out

    engine_llama, derived_llama = models("llama", "engine"), models("llama", "derived")
    assert engine_llama and derived_llama
    for name, seen in {**engine_llama, **derived_llama}.items():
        expected = {LLAMA} if "model" in FAMILIES[name].labels else {None}
        assert seen == expected, (name, seen)
    # Without the option the page's lack stays visible: no model label on engine series.
    assert all(seen == {None} for seen in models("bare", "engine").values())
    assert models("bare", "derived")["llm_decode_tokens_per_second"] == {""}
    # A page that names its model wins over the option.
    assert models("vllm", "engine")["llm_requests_running"] == {"Qwen/Qwen3-8B"}
    assert models("vllm", "derived")["llm_decode_tokens_per_second"] == {"Qwen/Qwen3-8B"}
