"""The verdict rules, hysteresis, family isolation, omissions and cost of the Deriver."""

from __future__ import annotations

import logging
from types import MappingProxyType

import pytest

from exporter.catalog import family_of
from exporter.catalog.derived import RESOURCES
from exporter.config import Config
from exporter.derive import Deriver, assign_gpus, build_deriver
from exporter.derive.bottleneck import Hysteresis, Signals, assess, raw_verdict, settle
from exporter.derive.view import GpuView
from exporter.snapshot import Sample, Snapshot, SourceResult, labels_of

BUSY = dict(running=32.0, mean_batch=32.0, decode_tps=2_000.0, prefill_tps=5_000.0, gpus_known=True)


def verdict_of(**signals) -> str:
    s = Signals(**{**BUSY, **signals})
    return raw_verdict(s, assess(s).scores, None)[0]


@pytest.mark.parametrize(("signals", "expected"), [
    (dict(running=0.0, mean_batch=0.0, decode_tps=0.0, prefill_tps=0.0), "idle"),
    (dict(hbm_gpm=0.82, mfu=0.15), "memory_bandwidth"),
    (dict(hbm_model=0.75, mfu=0.1), "memory_bandwidth"),
    (dict(mfu=0.55, hbm_gpm=0.2), "compute"),
    (dict(hbm_gpm=0.8, kv_usage=0.99, preemptions_per_s=0.5, waiting=20.0), "kv_capacity"),
    (dict(hbm_gpm=0.3, busiest_thread=0.98), "host_cpu"),
    (dict(hbm_gpm=0.3, tp=2, degraded_links=("GPU0 gen3 x8 (max gen5 x16)",)), "interconnect"),
    (dict(hbm_gpm=0.8, throttles=("GPU0 hw_thermal_slowdown",), clock_ratio=0.5), "power_thermal"),
    (dict(hbm_gpm=0.1, mfu=0.05), "idle"),  # work, but no resource near a limit: headroom
])
def test_rules(signals, expected):
    assert verdict_of(**signals) == expected


def test_full_kv_without_queue_or_preemption_is_not_a_constraint():
    assert verdict_of(kv_usage=0.97, hbm_gpm=0.8) == "memory_bandwidth"


def test_busy_cpu_next_to_a_saturated_gpu_is_not_the_bottleneck():
    assert verdict_of(busiest_thread=0.8, hbm_gpm=0.95) == "memory_bandwidth"


def test_single_gpu_with_a_downtrained_link_is_only_noted():
    assert verdict_of(hbm_gpm=0.8, tp=1, degraded_links=("GPU0 gen3 x16 (max gen4 x16)",)) == "memory_bandwidth"


def test_power_cap_alone_at_full_clocks_is_not_throttling():
    assert verdict_of(hbm_gpm=0.8, power_capped=("GPU0",), clock_ratio=0.98) == "memory_bandwidth"


def test_first_cycle_without_rates_gives_no_verdict():
    s = Signals(running=3.0)
    assert raw_verdict(s, assess(s).scores, None)[0] == ""


def test_evidence_is_in_words():
    s = Signals(**{**BUSY, "hbm_gpm": 0.84, "hbm_model": 0.8, "kv_usage": 0.62, "prefill_share": 0.09,
                   "time_source": "engine time counters"})
    a = assess(s)
    words = " | ".join(a.evidence["memory_bandwidth"] + a.context + a.evidence["kv_capacity"]
                       + a.evidence["power_thermal"])
    for phrase in ("HBM at 84% of peak by GPM; modelled 80%", "decode is 91% of engine time", "batch 32",
                   "KV cache 62% used", "no throttling"):
        assert phrase in words


def test_hysteresis_does_not_flap():
    """Raw winners that alternate every cycle or two never change the standing verdict; a change
    that persists HOLD cycles does."""
    state = Hysteresis()
    seen = []
    pattern = ["memory_bandwidth", "compute", "memory_bandwidth", "compute", "compute", "memory_bandwidth"] * 10
    for i, raw in enumerate(pattern):
        state = settle(state, raw, float(i), hold_cycles=3)
        seen.append(state.verdict)
    assert set(seen) == {"memory_bandwidth"}
    for i in range(3):
        state = settle(state, "kv_capacity", 100.0 + i, hold_cycles=3)
    assert state.verdict == "kv_capacity" and state.since == 102.0


def test_sticky_margin_keeps_a_close_standing_verdict():
    s = Signals(**{**BUSY, "hbm_gpm": 0.62, "mfu": 0.43})  # bandwidth 0.80 vs compute 0.77
    scores = assess(s).scores
    assert raw_verdict(s, scores, None)[0] == "memory_bandwidth"
    assert raw_verdict(s, scores, "compute")[0] == "compute"


# --- the Deriver on synthetic snapshots ----------------------------------------------------------

def engine_samples(target: str, t: float, model: str = "llama-3.1-8b") -> tuple[Sample, ...]:
    labels = labels_of(target=target, engine="vllm", model=model)
    out = [Sample("llm_prompt_tokens_total", labels, 1000.0 * t), Sample("llm_generation_tokens_total", labels, 500.0 * t),
           Sample("llm_requests_running", labels, 10.0), Sample("llm_requests_waiting", labels, 0.0),
           Sample("llm_kv_cache_usage_ratio", labels, 0.5), Sample("llm_kv_cache_capacity_tokens", labels, 100_000.0)]
    total = 0.0
    for le, per_second in (("0.1", 2.0), ("0.5", 1.0), ("+Inf", 0.5)):
        total += per_second * t
        out.append(Sample("llm_time_to_first_token_seconds_bucket", labels + (("le", le),), total))
    return tuple(out)


def gpu_samples(n: int, t: float) -> tuple[Sample, ...]:
    out = []
    for i in range(n):
        labels = labels_of(gpu=str(i), uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3")
        out += [Sample("llm_gpu_utilization_ratio", labels, 0.9), Sample("llm_gpu_power_watts", labels, 500.0),
                Sample("llm_gpu_energy_joules_total", labels, 500.0 * t),
                Sample("llm_gpu_dram_bandwidth_utilization_ratio", labels, 0.6)]
    return tuple(out)


def snapshot(t: float, targets=("a",), gpus: int = 1, model: str = "llama-3.1-8b") -> Snapshot:
    results = {}
    for target in targets:
        name = f"engine:{target}"
        results[name] = SourceResult(name, True, 0.0, t, engine_samples(target, t, model),
                                     attrs=MappingProxyType({"kind": "engine", "target": target, "engine": "vllm",
                                                             "model": model}))
    results["gpu"] = SourceResult("gpu", True, 0.0, t, gpu_samples(gpus, t))
    return Snapshot(1_000.0 + t, MappingProxyType(results))


def run(deriver: Deriver, cycles: int, **kwargs) -> tuple[Sample, ...]:
    out: tuple[Sample, ...] = ()
    previous = None
    for i in range(cycles):
        snap = snapshot(float(i), **kwargs)
        out = deriver(snap, previous)
        previous = snap
    return out


def test_every_derived_sample_is_in_the_catalogue_and_input_is_unchanged():
    deriver = build_deriver(Config(gpu_price_per_hour=2.0))
    snap = snapshot(0.0)
    before = (snap.results, snap.derived, snap.taken_at)
    deriver(snap, None)
    assert (snap.results, snap.derived, snap.taken_at) == before
    out = run(deriver, 5)
    names = {s.name for s in out}
    assert all(family_of(n) is not None and family_of(n).source == "derived" for n in names)
    assert {"llm_prefill_tokens_per_second", "llm_decode_tokens_per_second", "llm_kv_cache_used_bytes",
            "llm_hbm_bandwidth_efficiency_ratio", "llm_energy_joules_per_token", "llm_cost_per_million_tokens",
            "llm_ttft_window_seconds", "llm_ttft_slo_attainment_ratio", "llm_bottleneck",
            "llm_bottleneck_score"} <= names
    verdicts = [s for s in out if s.name == "llm_bottleneck"]
    assert len(verdicts) == len(RESOURCES) and sum(s.value for s in verdicts) == 1.0


def test_a_failing_family_drops_only_itself_and_is_logged_once(caplog):
    deriver = build_deriver(Config())

    def broken(ctx):
        raise ZeroDivisionError("boom")

    deriver.stages["kv"] = broken
    with caplog.at_level(logging.WARNING, logger="llm_exporter.derive"):
        out = run(deriver, 4)
    names = {s.name for s in out}
    assert not any(n.startswith("llm_kv_cache") for n in names)
    assert {"llm_decode_tokens_per_second", "llm_ttft_window_seconds", "llm_bottleneck"} <= names
    assert sum("kv failed" in r.getMessage() for r in caplog.records) == 1
    assert any("kv failed this cycle: ZeroDivisionError" in o for o in deriver.diagnosis()["targets"]["a"]["omitted"])


def test_unknown_model_omits_bytes_and_says_why():
    deriver = build_deriver(Config())
    out = run(deriver, 3, model="my-private-model")
    names = {s.name for s in out}
    assert "llm_kv_cache_used_tokens" in names
    assert not names & {"llm_kv_cache_used_bytes", "llm_kv_cache_bytes_per_token", "llm_prefill_mfu_ratio"}
    assert not [s for s in out if s.name == "llm_hbm_bandwidth_efficiency_ratio" and s.label("source") == "model"]
    assert [s for s in out if s.name == "llm_hbm_bandwidth_efficiency_ratio" and s.label("source") == "gpm"]
    omitted = " ".join(deriver.diagnosis()["targets"]["a"]["omitted"])
    assert "model shape unknown" in omitted and "set --model" in omitted
    # The config's shape wins over the engine's name.
    deriver = build_deriver(Config(model="llama-3.1-8b"))
    assert "llm_kv_cache_used_bytes" in {s.name for s in run(deriver, 3, model="my-private-model")}


def test_gpu_assignment():
    gpus = [GpuView(str(i), f"u{i}", "g", {}, {}, ()) for i in range(8)]
    out, note = assign_gpus(["a", "b", "c", "d"], gpus, None)
    assert [g.gpu for g in out["c"]] == ["4", "5"] and "target_gpus" in note
    out, _ = assign_gpus(["a"], gpus, None)
    assert len(out["a"]) == 8
    out, note = assign_gpus(["a", "b"], gpus[:1], 2)
    assert out["a"] == out["b"] == tuple(gpus[:1]) and "all GPUs" in note
    out, _ = assign_gpus(["a", "b"], gpus, None, {"a": ["7"]})
    assert [g.gpu for g in out["a"]] == ["7"] and len(out["b"]) == 8


def test_state_is_bounded_when_targets_come_and_go():
    deriver = build_deriver(Config(quantile_window_s=10.0, interval_s=1.0))
    for i in range(200):
        deriver(snapshot(float(i), targets=(f"t{i // 5}",)), None)
    assert len(deriver._rates) <= 10 and len(deriver._hists) <= 10 and len(deriver._verdicts) <= 1
