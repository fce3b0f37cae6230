"""Each scenario, fast-forwarded, shows the signature a human would recognise (docs/simulator.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.simulator import SCENARIOS, Twin, TwinConfig
from exporter.simulator.gpu import Thermal


@dataclass
class Trace:
    twin: Twin
    states: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)  # /sim/host beside each /sim/gpu

    def gpu(self, key: str, i: int = -1) -> float:
        return float(self.states[i]["gpus"][0][key])

    def series(self, key: str) -> list[float]:
        return [float(s["gpus"][0][key]) for s in self.states]

    def engine(self, key: str, i: int = -1) -> float:
        return float(self.states[i]["engine"][key])


def run(scenario: str, seconds: float, *, every: float = 5.0, **cfg: Any) -> Trace:
    twin = Twin(TwinConfig(scenario=scenario, epoch=0.0, **cfg))
    trace = Trace(twin)
    while twin.now < seconds:
        twin.fast_forward(every)
        trace.states.append(twin.gpu_state())
        trace.hosts.append(twin.host_state())
    return trace


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_every_scenario_is_documented() -> None:
    doc = (__import__("pathlib").Path(__file__).parent.parent / "docs" / "simulator.md").read_text()
    for name, sc in SCENARIOS.items():
        assert f"`{name}`" in doc
        assert sc.bottleneck and sc.what_moves


def test_idle() -> None:
    t = run("idle", 30)
    assert t.gpu("utilization_ratio") == 0.0
    assert t.states[-1]["gpus"][0]["clock_event_reasons"]["gpu_idle"] == 1
    assert t.gpu("power_watts") == pytest.approx(0.1 * t.twin.hw.gpu.tdp_watts)
    assert t.states[-1]["gpus"][0]["pcie"]["gen_current"] == 1  # idle links train down
    assert t.engine("requests_finished_total") == 0


def test_decode_heavy_sits_at_the_memory_roof() -> None:
    t = run("decode-heavy", 90)
    late = slice(6, None)
    dram = mean(t.series("dram_bandwidth_utilization_ratio")[late])
    tensor = mean(t.series("tensor_active_ratio")[late])
    assert dram > 0.55 and tensor < dram
    assert mean([s["engine"]["running"] for s in t.states[late]]) > 32
    assert max(s["engine"]["waiting"] for s in t.states[late]) < 20
    assert t.engine("preemptions_total") == 0


def test_prefill_heavy_is_compute_bound() -> None:
    t = run("prefill-heavy", 90)
    late = slice(6, None)
    assert mean(t.series("tensor_active_ratio")[late]) > 0.4
    assert mean(t.series("tensor_active_ratio")[late]) > mean(t.series("dram_bandwidth_utilization_ratio")[late])
    assert t.engine("prompt_tokens_total") > 50 * t.engine("generation_tokens_total") / 2


def test_kv_pressure_fills_the_pool_and_preempts() -> None:
    t = run("kv-pressure", 90)  # the pool fills within ~30 s (the live demo shows it in under a minute)
    usage = [s["engine"]["kv_blocks_used"] / s["engine"]["kv_blocks_total"] for s in t.states]
    assert max(usage) > 0.95
    assert t.engine("preemptions_total") > 0
    waiting = [s["engine"]["waiting"] for s in t.states]
    assert waiting[-1] > 10 and waiting[-1] > waiting[len(waiting) // 2]
    assert max(s["engine"]["running"] for s in t.states) < t.engine("max_num_seqs") / 2  # KV, not slots


def test_cpu_bound_saturates_the_engine_core_thread_while_the_gpu_idles_between_steps() -> None:
    t = run("cpu-bound", 90)
    late, hosts = t.states[6:], t.hosts[6:]
    assert mean([s["gpus"][0]["utilization_ratio"] for s in late]) < 0.75
    assert mean([s["gpus"][0]["dram_bandwidth_utilization_ratio"] for s in late]) < 0.5
    # One thread at its CPU's limit, within the engine's 2-CPU budget: the thread is the limit.
    assert all(h["engine"]["busiest_thread"] == "engine_core" for h in hosts)
    assert min(h["engine"]["busiest_thread_cpu_ratio"] for h in hosts) > 0.9
    assert min(h["cpus"][h["engine"]["engine_core_cpu"]] for h in hosts) > 0.9
    assert all(h["engine"]["cpus_allowed"] == "0-1" for h in hosts)
    assert all(1.0 < h["cpu_busy_cores"] < h["cpu_budget_cores"] for h in hosts)
    assert max(h["cpu_all"] for h in hosts) < 0.15  # the host-wide ratio hides it


def test_thermal_throttle_cuts_clocks_and_slows_steps() -> None:
    t = run("thermal-throttle", 100)
    reasons = [s["gpus"][0]["clock_event_reasons"]["hw_thermal_slowdown"] for s in t.states]
    assert any(reasons)
    assert max(t.series("temperature_celsius")) >= 90
    assert min(t.series("sm_clock_hertz")) <= 0.6 * t.gpu("sm_clock_max_hertz")
    # Same traffic (same seed) on a healthily cooled card: no throttling, faster tokens.
    cool = Twin(TwinConfig(scenario="thermal-throttle", epoch=0.0))
    cool.gpu.set_thermal(Thermal())
    cool.fast_forward(100)
    assert not any(d["clock_event_reasons"]["hw_thermal_slowdown"] for d in cool.gpu_state()["gpus"])
    hot_itl = t.twin.recorder.h["itl"]
    cool_itl = cool.recorder.h["itl"]
    assert hot_itl.sum / hot_itl.count > 1.1 * cool_itl.sum / cool_itl.count


def test_power_capped_holds_power_at_the_lowered_limit_with_a_cool_card() -> None:
    t = run("power-capped", 60)
    gpu = t.states[-1]["gpus"][0]
    assert gpu["power_limit_watts"] == 0.4 * gpu["power_default_limit_watts"]
    assert gpu["clock_event_reasons"]["sw_power_cap"]
    assert not any(gpu["clock_event_reasons"][r] for r in ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"))
    assert gpu["power_watts"] == pytest.approx(gpu["power_limit_watts"], rel=0.01)
    assert gpu["temperature_celsius"] < 70
    assert gpu["sm_clock_hertz"] <= 0.75 * gpu["sm_clock_max_hertz"]
    # The same traffic on the default limit: no cap in the twin (the work fits in the card's TDP), full clocks.
    free = run("prefill-heavy", 60).states[-1]["gpus"][0]
    assert not free["clock_event_reasons"]["sw_power_cap"]
    assert free["sm_clock_hertz"] == free["sm_clock_max_hertz"]


def test_pcie_degraded_link_dominates_tp_steps() -> None:
    t = run("pcie-degraded", 60)
    assert t.twin.hw.tp == 2  # the scenario needs tensor parallelism
    gpu = t.states[-1]["gpus"][0]
    assert gpu["pcie"]["gen_current"] < gpu["pcie"]["gen_max"]
    assert gpu["pcie"]["width_current"] < gpu["pcie"]["width_max"]
    assert gpu["pcie"]["tx_bytes_per_second"] > 1e9
    assert gpu["nvlink"]["tx_bytes_per_second"] == 0.0  # TP traffic is not on NVLink
    a = t.twin.engine.activity
    assert a.comm_s > 0.5 * a.gpu_busy_s


def test_overload_queue_grows_without_bound_and_ttft_tail_explodes() -> None:
    calm = run("overload", 20)  # the surge starts at 20 s
    calm_p99 = calm.twin.recorder.h["ttft"].quantile(0.99)
    t = run("overload", 45, every=2.5)
    after = [s["engine"]["waiting"] for s in t.states if s["twin_time_s"] > 26]
    assert after[-1] > 200
    assert all(b >= a for a, b in zip(after, after[1:], strict=False))  # monotone growth
    ttft = t.twin.recorder.h["ttft"]
    assert calm_p99 < 1.0 and ttft.quantile(0.99) > 10 * calm_p99  # the tail explodes after the surge
    assert ttft.quantile(0.99) > 2 * ttft.quantile(0.5)


def test_scenario_switch_at_run_time() -> None:
    twin = Twin(TwinConfig(scenario="idle", epoch=0.0))
    twin.fast_forward(10)
    assert twin.engine.counters.arrived == 0
    twin.set_scenario("decode-heavy")
    twin.fast_forward(20)
    assert twin.engine.counters.finished > 0
    with pytest.raises(ValueError, match="needs at least 2 GPUs"):
        twin.set_scenario("pcie-degraded")
    with pytest.raises(ValueError, match="unknown scenario"):
        twin.set_scenario("nope")


def test_determinism_with_a_seed() -> None:
    a = Twin(TwinConfig(scenario="decode-heavy", seed=7, epoch=1000.0))
    b = Twin(TwinConfig(scenario="decode-heavy", seed=7, epoch=1000.0))
    c = Twin(TwinConfig(scenario="decode-heavy", seed=8, epoch=1000.0))
    for tw in (a, b, c):
        tw.fast_forward(30)
    assert a.metrics_text() == b.metrics_text()
    assert a.gpu_state() == b.gpu_state()
    assert a.metrics_text() != c.metrics_text()


def test_traffic_fast_forwards_much_faster_than_real_time() -> None:
    import time

    # 15 minutes of 70B chat traffic on 2 x H200 (about 25,000 engine steps); an hour takes ~4x this.
    twin = Twin(TwinConfig(scenario="decode-heavy", model="llama-3.1-70b", gpu="NVIDIA H200", gpus=2, epoch=0.0))
    start = time.thread_time()  # CPU time: a guard against a pathological slowdown, not a benchmark
    twin.fast_forward(900)
    assert time.thread_time() - start < 8
    assert twin.engine.counters.finished > 1000


def test_every_scenario_declares_what_the_demo_shows() -> None:
    from exporter.simulator.scenarios import Expect

    for name, sc in SCENARIOS.items():
        assert sc.expect is not None, name
        assert sc.expect.verdict is not None or sc.expect.why_no_verdict, name
    kv = SCENARIOS["kv-pressure"].expect
    assert "verdict kv_capacity " in kv.lines() and f"~{kv.within_s:.0f} s" in kv.lines()
    assert f"within ~{math.ceil(kv.within_s / 8)} s" in kv.lines(speed=8) and "KV cache usage" in kv.lines(speed=8)
    assert "within ~5 s" in kv.lines(speed=100)  # the verdict's own hysteresis: a few cycles at least
    # After a switch, never sooner than the exporter's windows let go of the previous scenario.
    assert "within ~25 s" in kv.lines(speed=8, floor_s=25) and kv.within(8, 25) == 25
    with pytest.raises(ValueError, match="why_no_verdict"):
        Expect(None)
