"""The verdict rules, hysteresis, family isolation, omissions and cost of the Deriver."""

from __future__ import annotations

import dataclasses
import logging
from types import MappingProxyType

import pytest

from exporter.catalog import family_of
from exporter.catalog.derived import RESOURCES
from exporter.config import Config
from exporter.derive import STAGES, Deriver, assign_gpus, build_deriver
from exporter.derive.bottleneck import Hysteresis, Signals, assess, raw_verdict, settle
from exporter.derive.view import GpuView
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of

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
    (dict(hbm_gpm=0.1, mfu=0.05), "headroom"),  # work, but no resource near a limit
    (dict(hbm_gpm=0.1, kv_usage=0.95), "headroom"),  # a constraint below its threshold is not the verdict
])
def test_rules(signals, expected):
    assert verdict_of(**signals) == expected


def test_idle_means_no_work_and_headroom_means_serving_with_room():
    """idle only without work; serving with nothing near a limit is headroom (issue 19: ~6 req/s on
    a healthy engine read as idle, which users take for "not serving")."""
    quiet = Signals(running=0.0, mean_batch=0.0, decode_tps=0.0, prefill_tps=0.0)
    scores = assess(quiet).scores
    assert (scores["idle"], scores["headroom"]) == (1.0, 0.0)
    assert raw_verdict(quiet, scores, None) == ("idle", "no work")
    light = Signals(**{**BUSY, "running": 3.0, "mean_batch": 3.0, "decode_tps": 120.0, "prefill_tps": 300.0,
                       "hbm_gpm": 0.38, "mfu": 0.02})
    a = assess(light)
    assert a.scores["idle"] == 0.0
    assert a.scores["headroom"] == pytest.approx(1 - 2 * a.scores["memory_bandwidth"], abs=1e-4)
    assert raw_verdict(light, a.scores, None)[0] == "headroom"
    assert a.evidence["headroom"] == (
        "serving, and no resource near its limit: the highest score is memory_bandwidth 0.20 "
        "(a roof verdict needs 0.35)",)
    assert not assess(Signals(**{**BUSY, "hbm_gpm": 0.9})).evidence["headroom"]  # no words against a roof


def test_the_probe_alone_is_not_work_but_the_probe_beside_traffic_is_not_hidden():
    """A client probe (--probe) against an otherwise idle engine: the engine's tokens/s and its one
    running request are the probe's own, so the verdict is idle, not headroom. Anything beyond the
    probe's part is work."""
    probe = dict(probe_tps=24.0, probe_running=1.0, probe_mean_running=0.2)
    alone = Signals(running=1.0, mean_batch=0.2, waiting=0.0, decode_tps=8.0, prefill_tps=16.0, **probe)
    assert not alone.work
    a = assess(alone)
    assert raw_verdict(alone, a.scores, None) == ("idle", "no work")
    assert a.evidence["idle"] == ("no requests running or waiting and no tokens generated but the probe's own",)
    assert Signals(running=1.0, mean_batch=0.2, decode_tps=8.0, prefill_tps=16.0).work  # no probe: work
    assert Signals(running=2.0, mean_batch=0.2, decode_tps=8.0, prefill_tps=16.0, **probe).work  # one more
    assert Signals(running=0.0, mean_batch=0.2, decode_tps=8.0, prefill_tps=17.0, **probe).work  # 1 tok/s more
    assert Signals(running=0.0, mean_batch=0.2, waiting=1.0, decode_tps=8.0, prefill_tps=16.0, **probe).work


def test_headroom_has_words_and_remedies_and_is_healthy():
    from exporter.derive.bottleneck import REMEDIES, VERDICT_WORDS, is_degraded

    assert set(VERDICT_WORDS) == set(REMEDIES) == set(RESOURCES)
    assert VERDICT_WORDS["headroom"][1] == "headroom (serving, no resource near its limit)"
    assert any("llm_kv_cache_headroom_sequences" in r for r in REMEDIES["headroom"])
    assert is_degraded("headroom", Signals(**BUSY)) == [] == is_degraded("idle", Signals())


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
    for phrase in ("HBM at 84% of peak by GPM; modelled 80% agrees within 10%", "decode is 91% of engine time",
                   "batch 32", "KV cache 62% used", "no throttling"):
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


def test_hysteresis_replaces_a_verdict_that_keeps_losing_to_alternating_winners():
    """Live llama.cpp over its slot cap: scheduler and host_cpu took turns as the raw winner while
    headroom stood. Losing HOLD cycles in a row replaces the standing verdict, whoever won them."""
    state = settle(Hysteresis(), "headroom", 0.0)
    for i, raw in enumerate(["scheduler", "host_cpu"]):
        state = settle(state, raw, 1.0 + i, hold_cycles=3)
        assert state.verdict == "headroom"
    state = settle(state, "scheduler", 3.0, hold_cycles=3)
    assert state.verdict == "scheduler" and state.since == 3.0
    # One win of the standing verdict starts the count again.
    for i, raw in enumerate(["host_cpu", "host_cpu", "scheduler", "host_cpu", "host_cpu"]):
        state = settle(state, raw, 10.0 + i, hold_cycles=3)
    assert state.verdict == "scheduler"


def test_sticky_margin_keeps_a_close_standing_verdict():
    s = Signals(**{**BUSY, "hbm_gpm": 0.62, "mfu": 0.43})  # bandwidth 0.80 vs compute 0.77
    scores = assess(s).scores
    assert raw_verdict(s, scores, None)[0] == "memory_bandwidth"
    assert raw_verdict(s, scores, "compute")[0] == "compute"


# --- the Deriver on synthetic snapshots ----------------------------------------------------------

def engine_samples(target: str, t: float, model: str = "llama-3.1-8b") -> tuple[Sample, ...]:
    labels = labels_of(target=target, engine="vllm", model=model)
    out = [Sample("llm_prompt_tokens_total", labels, 1000.0 * t),
           Sample("llm_generation_tokens_total", labels, 500.0 * t),
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
        results[name] = SourceResult(name, True, 0.0, t, engine_samples(target, t, model), kind=SourceKind.ENGINE,
                                     attrs=MappingProxyType({"kind": "engine", "target": target, "engine": "vllm",
                                                             "model": model}))
    results["gpu"] = SourceResult("gpu", True, 0.0, t, gpu_samples(gpus, t), kind=SourceKind.GPU)
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
    def broken(ctx, state):
        raise ZeroDivisionError("boom")

    deriver = Deriver(Config(), stages=[dataclasses.replace(s, compute=broken) if s.name == "kv" else s
                                        for s in STAGES])
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
    state = deriver.state
    assert len(state["throughput"].windows) <= 10 and len(state["quantiles"].windows) <= 10
    assert len(state["bottleneck"].by_target) <= 1


# --- review fixes -------------------------------------------------------------------------------

def test_two_roofs_at_full_score_are_told_apart_by_how_far_past_their_ramp_they_are():
    # MFU 0.55 -> compute position (0.55 - 0.20) / 0.30 = 1.17; HBM 0.90 -> (0.90 - 0.30) / 0.40
    # = 1.50. Both scores clamp to 1.0; the HBM roof is further past its ramp (by order: compute).
    s = Signals(**{**BUSY, "mfu": 0.55, "hbm_gpm": 0.90})
    scores = assess(s).scores
    assert scores["compute"] == scores["memory_bandwidth"] == 1.0
    assert raw_verdict(s, scores, None)[0] == "memory_bandwidth"
    # MFU 0.80 (position 2.0) vs HBM 0.75 (1.125): compute.
    s = Signals(**{**BUSY, "mfu": 0.80, "hbm_gpm": 0.75})
    assert raw_verdict(s, assess(s).scores, None)[0] == "compute"
    # The sticky margin still comes first: a standing verdict keeps a tie.
    s = Signals(**{**BUSY, "mfu": 0.55, "hbm_gpm": 0.90})
    assert raw_verdict(s, assess(s).scores, "compute")[0] == "compute"


def test_decode_at_the_hbm_roof_with_prefix_hits_is_not_called_compute():
    # The reviewer's case: 40,000 prompt tok/s of which 90% are prefix-cache hits, HBM at 78%.
    # MFU on computed tokens: 2 x 8.03e9 x 4,000 / 989.5e12 = 0.065 -> compute score 0,
    # bandwidth ramp(0.78, 0.30, 0.70) = 1.0 -> memory_bandwidth (MFU 0.649 said compute).
    from exporter.derive import roofline
    from exporter.derive import throughput as thr_mod
    from exporter.specs.gpus import lookup_gpu
    from exporter.specs.models import BUILTIN

    spec = lookup_gpu("h100-sxm")
    gpu = GpuView("0", "GPU-0", spec.nvml_name, {}, {}, ())
    thr = thr_mod.Throughput(prefill_tps=40_000.0, prefill_computed_tps=4_000.0, prefix_hit_share=0.9)
    mfu = roofline.compute([gpu], [spec], BUILTIN["llama-3.1-8b"], 1, thr, None).mfu
    assert mfu == pytest.approx(0.0649, abs=5e-5)
    s = Signals(running=64, mean_batch=64, prefill_tps=40_000, decode_tps=3_000, mfu=mfu, hbm_gpm=0.78,
                hbm_model=0.7, prefix_hit_share=0.9)
    assert raw_verdict(s, assess(s).scores, None)[0] == "memory_bandwidth"
    assert any("prefix cache served 90%" in e for e in assess(s).evidence["compute"])


def ranked_snapshot(t: float, ranks: dict[str, float], gpus: int = 2) -> Snapshot:
    """One vLLM target with data-parallel ranks: rank -> generation tokens counted so far."""
    samples = []
    for rank, generated in ranks.items():
        labels = labels_of(target="a", engine="vllm", model="llama-3.1-8b", rank=rank)
        samples += [Sample("llm_generation_tokens_total", labels, generated),
                    Sample("llm_prompt_tokens_total", labels, generated),
                    Sample("llm_requests_running", labels, 32.0),
                    Sample("llm_kv_cache_usage_ratio", labels, 0.4),
                    Sample("llm_kv_cache_capacity_tokens", labels, 100_000.0),
                    # vLLM's own estimates: 1 GFLOP and 1 MB per generated token, per GPU
                    Sample("llm_engine_estimated_flops_total", labels, generated * 1e9),
                    Sample("llm_engine_estimated_read_bytes_total", labels, generated * 1e6)]
    results = {"engine:a": SourceResult("engine:a", True, 0.0, t, tuple(samples), kind=SourceKind.ENGINE,
                                        attrs=MappingProxyType({"kind": "engine", "target": "a", "engine": "vllm",
                                                                "model": "llama-3.1-8b"})),
               "gpu": SourceResult("gpu", True, 0.0, t, gpu_samples(gpus, t), kind=SourceKind.GPU)}
    return Snapshot(1_000.0 + t, MappingProxyType(results))


def test_deriver_handles_a_reset_of_one_data_parallel_rank():
    # Each rank generates 1,000 tok/s; rank 1 restarts at t=20 (115,000 -> 5,000). The decode
    # rate stays 2,000 tok/s (a reset of the summed counter read 9,666.7 tok/s).
    deriver = build_deriver(Config(interval_s=5.0))
    rates = []
    for t, r0, r1 in ((0, 100_000, 100_000), (5, 105_000, 105_000), (10, 110_000, 110_000),
                      (15, 115_000, 115_000), (20, 120_000, 5_000), (25, 125_000, 10_000)):
        out = deriver(ranked_snapshot(float(t), {"0": float(r0), "1": float(r1)}), None)
        rates += [s.value for s in out if s.name == "llm_decode_tokens_per_second"]
    assert rates == [pytest.approx(2_000.0)] * 5


def test_deriver_counts_data_parallel_ranks_in_the_modelled_bandwidth():
    # DP=2 on 2 GPUs (no --tensor-parallel): TP = 2 GPUs / 2 ranks = 1. Each rank: batch 32 at
    # 1,000 tok/s -> 31.25 steps/s, 40,000 KV tokens (0.4 x 100,000). Per GPU:
    # 31.25 x (15,009,849,344 + 40,000 x 131,072) = 6.329e11 B/s.
    deriver = build_deriver(Config(interval_s=5.0))
    out: tuple[Sample, ...] = ()
    for t in range(4):
        out = deriver(ranked_snapshot(5.0 * t, {"0": 5_000.0 * t, "1": 5_000.0 * t}), None)
    model = [s.value for s in out if s.name == "llm_hbm_bandwidth_bytes_per_second" and s.label("source") == "model"]
    assert model == [pytest.approx(31.25 * (15_009_849_344 + 40_000 * 131_072))] * 2


def test_kv_cache_dtype_setting_next_to_the_model():
    # --kv-cache-dtype fp8: 2 x 32 layers x 8 KV heads x 128 x 1 byte = 65,536 B/token (BF16: 131,072).
    def bytes_per_token(deriver: Deriver) -> float:
        out = run(deriver, 2)
        return next(s.value for s in out if s.name == "llm_kv_cache_bytes_per_token")

    assert bytes_per_token(build_deriver(Config())) == 131_072
    assert bytes_per_token(build_deriver(Config(kv_cache_dtype="fp8"))) == 65_536
    deriver = build_deriver(Config(kv_cache_dtype="fp7"))
    assert bytes_per_token(deriver) == 131_072
    assert any("kv_cache_dtype ignored" in o for o in deriver.diagnosis()["targets"]["a"]["omitted"])


def restarting_snapshot(t: float, served: float) -> Snapshot:
    """One vLLM target that has served `served` requests so far (each 3 s to first token, over a
    2.5 s SLO), with token counters to match: 0 after a restart."""
    labels = labels_of(target="a", engine="vllm", model="llama-3.1-8b")
    samples = [Sample("llm_prompt_tokens_total", labels, 100.0 * served),
               Sample("llm_generation_tokens_total", labels, 50.0 * served),
               Sample("llm_requests_running", labels, 0.0), Sample("llm_requests_waiting", labels, 0.0)]
    for le, count in (("0.5", 0.0), ("2.5", 0.0), ("5", served), ("+Inf", served)):
        samples.append(Sample("llm_time_to_first_token_seconds_bucket", labels + (("le", le),), count))
    results = {"engine:a": SourceResult("engine:a", True, 0.0, t, tuple(samples), kind=SourceKind.ENGINE,
                                        attrs=MappingProxyType({"kind": "engine", "target": "a", "engine": "vllm",
                                                                "model": "llama-3.1-8b"}))}
    return Snapshot(1_000.0 + t, MappingProxyType(results))


def test_after_a_restart_the_window_is_one_window_for_the_tails_the_slo_and_the_rules():
    """Issue: after a restart the quantiles counted the requests from before it and the SLO line did
    not, so doctor printed a p99 of seconds beside 100% within the SLO. One window now, as Prometheus'
    rate() and the burn-rate rules read it: the requests before the restart count in both until they
    leave the window, the words say the restart and how many came after it; once the window has none,
    "no recent traffic" and nothing degraded."""
    deriver = build_deriver(Config(interval_s=5.0))
    for i in range(12):  # one minute of slow requests: the TTFT SLO is missed
        out = deriver(restarting_snapshot(5.0 * i, 10.0 * i), None)
    before = deriver.diagnosis()["targets"]["a"]
    assert before["status"] == "degraded" and "only 0% of requests meet the TTFT SLO" in before["degraded_because"]
    assert before["slo"]["ttft"]["state"] == "missed" and not before["notes"]
    assert [s.value for s in out if s.name == "llm_ttft_slo_attainment_ratio"] == [0.0]
    for i in range(12, 16):  # the engine restarted: counters from 0, and nothing served since
        out = deriver(restarting_snapshot(5.0 * i, 0.0), None)
    after = deriver.diagnosis()["targets"]["a"]
    ttft = after["numbers"]["ttft"]
    assert ttft["window_count"] == ttft["slo_window_count"] == 110  # the same requests behind both lines
    assert ttft["window_count_since_restart"] == 0 and ttft["restarted_seconds_ago"] == 15
    assert after["slo"]["ttft"]["state"] == "missed" and after["status"] == "degraded"
    assert after["slo"]["ttft"]["words"] == (
        "TTFT SLO: 0% of 110 requests in the last 5 minutes within 2.5 s (under 90%: missed); the engine "
        "restarted 15 seconds ago and 0 of them came after it (the others leave the window, as in Prometheus' "
        "rate())")
    assert [s.value for s in out if s.name == "llm_ttft_slo_attainment_ratio"] == [0.0]
    assert [s for s in out if s.name == "llm_ttft_window_seconds"]
    for i in range(16, 16 + 62):  # five minutes more, nothing served: the window holds nothing
        out = deriver(restarting_snapshot(5.0 * i, 0.0), None)
    diag = deriver.diagnosis()
    idle = diag["targets"]["a"]
    assert idle["status"] == "healthy" and diag["status"] == "healthy", idle["degraded_because"]
    assert idle["slo"]["ttft"]["state"] == "no_recent_traffic" and idle["slo"]["ttft"]["attainment"] is None
    assert idle["notes"] == ["TTFT SLO: no recent traffic (no requests finished in the last 5 minutes)"]
    assert not [s for s in out if s.name in ("llm_ttft_slo_attainment_ratio", "llm_ttft_window_seconds")]


def llamacpp_page(t: float, *, slots_busy: int = 4, deferred: int = 0, spec: bool = True,
                  processing: int | None = None) -> str:
    """A llama.cpp /metrics page (build 11434's names) after `t` seconds of steady decoding on
    `slots_busy` slots: 20 tokens/s per slot, 10 llama_decode() calls/s, 40 computed and 60 cached
    prompt tokens/s, and (with `spec`) 100 draft tokens/s of which 30 accepted. `processing`: the
    requests_processing gauge when this sample caught another count (default `slots_busy`)."""
    counters = {"prompt_tokens_total": 40 * t, "prompt_tokens_cached_total": 60 * t, "prompt_seconds_total": 0.1 * t,
                "tokens_predicted_total": 20 * slots_busy * t,
                "tokens_predicted_seconds_total": slots_busy * 0.9 * t, "n_decode_total": 10 * t,
                "n_tokens_max": 700}
    if spec:
        counters |= {"spec_decode_num_draft_tokens_total": 100 * t, "spec_decode_num_accepted_tokens_total": 30 * t,
                     "spec_decode_num_drafts_total": 25 * t}
    gauges = {"prompt_tokens_seconds": 400.0, "predicted_tokens_seconds": 22.0,
              "requests_processing": slots_busy if processing is None else processing,
              "requests_deferred": deferred, "n_busy_slots_per_decode": 3.9}
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, value in items.items():
            lines += [f"# HELP llamacpp:{name} .", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
    return "\n".join(lines) + "\n"


def llamacpp_snapshot(t: float, state, **page) -> Snapshot:
    """llamacpp_page normalized by the real normalizer, as the engine source would pass it on."""
    from exporter.sources.engines.normalize import normalize

    scrape = normalize(llamacpp_page(t, **page), target="a", state=state)
    results = {"engine:a": SourceResult("engine:a", True, 0.0, t, scrape.samples, kind=SourceKind.ENGINE,
                                        attrs=MappingProxyType({"kind": "engine", "target": "a",
                                                                "engine": "llamacpp", "model": ""}))}
    return Snapshot(1_000.0 + t, MappingProxyType(results))


def test_two_constraints_scoring_alike_are_both_named_with_both_remedies():
    """Issue 26: KV full and the GPU throttled both scored 1.00 and doctor named KV only, with KV's
    advice only, while listing the GPU at 88 C and 50% clocks. The verdict gauge keeps one resource;
    the diagnosis names the other as co-equal, with its evidence and remedies."""
    from exporter.derive.bottleneck import REMEDIES, co_equal

    s = Signals(**{**BUSY, "hbm_gpm": 0.8, "kv_usage": 0.99, "preemptions_per_s": 0.5, "waiting": 20.0,
                   "throttles": ("GPU0 hw_thermal_slowdown",), "clock_ratio": 0.5})
    scores = assess(s).scores
    verdict = raw_verdict(s, scores, None)[0]
    assert scores["kv_capacity"] >= 0.95 and scores["power_thermal"] >= 0.95
    assert verdict == "kv_capacity" and co_equal(verdict, scores) == ["power_thermal"]
    # a constraint well below the verdict's score is not co-equal, nor is anything beside a roof
    assert co_equal("kv_capacity", {**scores, "power_thermal": 0.7}) == []
    assert co_equal("memory_bandwidth", scores) == []
    from exporter.derive.diagnosis import target_diagnosis  # noqa: F401 - the words come from there
    assert set(REMEDIES["power_thermal"]) and set(REMEDIES["kv_capacity"])
