"""The twin held to the physics of the source documents (shared/seeds, shared/docs/design.md)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from exporter.physics.costs import Batch, Hardware, decode_batch, prefill_batch, step_cost
from exporter.simulator.engine import Engine, EngineConfig, HostConfig, kv_pool_blocks
from exporter.simulator.gpu import GpuModel, Slice, Thermal
from exporter.simulator.recorders import VllmRecorder
from exporter.simulator.workload import LengthDist, Workload
from exporter.specs import load_model, lookup_gpu

GiB = 1 << 30


def _card_2tbs() -> Hardware:
    # "a 2 TB/s card" with room for 140 GB of weights (the seed's thought experiment).
    spec = lookup_gpu("custom 2TB/s", {"memory_bytes": 192 * GiB, "mem_bandwidth_bytes_per_s": 2e12,
                                       "bf16_dense_flops": 312e12})
    assert spec is not None
    return Hardware(spec)


def _run_fixed(hw: Hardware, model_name: str, *, concurrency: int, prompt: int, output: int,
               seconds: float, cfg: EngineConfig | None = None) -> tuple[Engine, VllmRecorder]:
    model = load_model(model_name)
    cfg = cfg or EngineConfig()
    rec = VllmRecorder(model.name, 0.0, 0.0, max_model_len=model.max_context)
    workload = Workload(LengthDist(prompt, kind="fixed"), LengthDist(output, kind="fixed", hi=output),
                        arrival="fixed", concurrency=concurrency)
    engine = Engine(hw, model, cfg, HostConfig(), workload, random.Random(1), rec)
    engine.advance_to(seconds)
    return engine, rec


def test_70b_fp16_on_a_2tbs_card_decodes_one_sequence_no_faster_than_14_6_tokens_per_s() -> None:
    hw = _card_2tbs()
    model = load_model("llama-3.1-70b")
    step = step_cost(hw, model, decode_batch(1, 512))
    assert step.bound == "memory"
    assert 1.0 / step.time_s <= 14.6
    assert 1.0 / step.time_s > 10.0  # and not absurdly slow either
    # The whole engine agrees: one client, long answers, measured from the generation counter.
    engine, rec = _run_fixed(hw, "llama-3.1-70b", concurrency=1, prompt=128, output=4000, seconds=60.0)
    decode_rate = rec.generation_tokens / engine.t
    assert 10.0 < decode_rate <= 14.6


def test_7b_fp16_on_an_a100_needs_7_to_9_ms_per_decode_step_at_batch_1() -> None:
    a100 = Hardware(lookup_gpu("NVIDIA A100-SXM4-80GB"))
    for name in ("qwen2.5-7b", "llama-2-7b"):
        step = step_cost(a100, load_model(name), decode_batch(1, 512))
        assert 0.007 <= step.time_s <= 0.009, (name, step.time_s)
        # Compute is a rounding error: ~14 GFLOPs at 312 TFLOPS is well under 0.1 ms.
        assert step.compute_time_s < 0.0002


def test_batch_64_multiplies_total_decode_throughput_while_each_sequence_slows() -> None:
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"))
    model = load_model("llama-3.1-8b")
    one = step_cost(hw, model, decode_batch(1, 1024))
    many = step_cost(hw, model, decode_batch(64, 1024))
    assert (64 / many.time_s) / (1 / one.time_s) > 10
    assert 1 / many.time_s < 1 / one.time_s  # per-sequence tokens/s fall
    # Same in the running engine, from its counters.
    e1, r1 = _run_fixed(hw, "llama-3.1-8b", concurrency=1, prompt=256, output=512, seconds=20.0)
    e64, r64 = _run_fixed(hw, "llama-3.1-8b", concurrency=64, prompt=256, output=512, seconds=20.0)
    total1 = r1.generation_tokens / e1.t
    total64 = r64.generation_tokens / e64.t
    assert total64 > 10 * total1
    assert r64.h["itl"].sum / r64.h["itl"].count > r1.h["itl"].sum / r1.h["itl"].count


def test_ttft_grows_roughly_linearly_with_prompt_length_in_the_compute_bound_range() -> None:
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"))
    model = load_model("llama-3.1-8b")
    lengths = (1024, 2048, 4096, 8192)
    times = [step_cost(hw, model, prefill_batch(n)).time_s for n in lengths]
    assert all(step_cost(hw, model, prefill_batch(n)).bound == "compute" for n in lengths)
    for i in range(1, len(lengths)):
        assert 1.7 < times[i] / times[i - 1] < 2.3, (lengths[i], times[i] / times[i - 1])
    # Measured TTFT from the engine's histogram (one request at a time, so no queueing).
    ttft = {}
    for n in (2048, 8192):
        engine, rec = _run_fixed(hw, "llama-3.1-8b", concurrency=1, prompt=n, output=2, seconds=20.0)
        ttft[n] = rec.h["ttft"].sum / rec.h["ttft"].count
    assert 3.0 < ttft[8192] / ttft[2048] < 5.0


def test_kv_pool_is_what_fits_after_weights() -> None:
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"))
    model = load_model("llama-3.1-8b")
    cfg = EngineConfig()
    blocks = kv_pool_blocks(hw, model, cfg)
    pool_gib = blocks * cfg.block_size * 128 * 1024 / GiB
    assert 50 < pool_gib < 56  # 0.9 x 80 GiB - 15 GiB of weights - 2 GiB reserve
    # Two GPUs: half the weights and half of each block per GPU, so more than twice the tokens.
    assert kv_pool_blocks(Hardware(hw.gpu, tp=2), model, cfg) > 2 * blocks
    # 70B does not fit on one 80 GB card.
    assert kv_pool_blocks(hw, load_model("llama-3.1-70b"), cfg) == 0


def test_tp_adds_interconnect_time_and_a_slow_link_dominates() -> None:
    gpu = lookup_gpu("NVIDIA H100 80GB HBM3")
    model = load_model("llama-3.1-70b")
    batch = decode_batch(64, 1024)
    nvlink = step_cost(Hardware(gpu, tp=4), model, batch)
    degraded = step_cost(Hardware(gpu, tp=4, interconnect="pcie", pcie_gen=3, pcie_width=4), model, batch)
    assert 0 < nvlink.comm_time_s < nvlink.memory_time_s
    assert degraded.bound == "interconnect" and degraded.time_s > 3 * nvlink.time_s
    assert degraded.comm_bytes_per_gpu == nvlink.comm_bytes_per_gpu


def test_throttled_clocks_slow_compute_in_proportion() -> None:
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"))
    model = load_model("llama-3.1-8b")
    full = step_cost(hw, model, prefill_batch(4096))
    half = step_cost(hw, model, prefill_batch(4096), clock_ratio=0.5)
    assert half.compute_time_s == pytest.approx(2 * full.compute_time_s)
    assert step_cost(hw, model, Batch()).time_s == 0.0


def _gpu_after(slice_: Slice, seconds: float, thermal: Thermal | None = None) -> GpuModel:
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"))
    gpu = GpuModel(hw, thermal or Thermal(), memory_used_bytes=70 * GiB, index_base=0, rng=random.Random(0))
    for _ in range(int(seconds / slice_.dt)):
        gpu.update(slice_)
    return gpu


def _decode_slice(dt: float = 0.25, *, tokens_per_step: float = 128.0) -> Slice:
    # Memory-bound decode: 90% of the slice streaming HBM at 0.9 of its peak, 20 ms steps.
    bw = lookup_gpu("NVIDIA H100 80GB HBM3").mem_bandwidth_bytes_per_s
    steps = int(dt / 0.02)
    return Slice(dt=dt, busy_s=0.95 * dt, memory_s=0.9 * dt, compute_s=0.2 * dt, dram_bytes=0.81 * bw * dt,
                 flops=0.0, comm_bytes=0.0, host_io_bytes=0.0, steps=steps, tokens=steps * tokens_per_step)


def test_memory_busy_share_is_the_memory_bound_time_and_sm_occupancy_grows_with_the_batch() -> None:
    small = _gpu_after(_decode_slice(tokens_per_step=8), 30).devices[0]
    large = _gpu_after(_decode_slice(tokens_per_step=4096), 30).devices[0]
    assert small.memory_busy == pytest.approx(0.9, abs=0.01)  # memory_s / dt, not the bandwidth share (0.81)
    assert small.dram_util == pytest.approx(0.81, abs=0.01)
    assert small.sm_occupancy < large.sm_occupancy < large.sm_active
    assert 0.1 < small.sm_occupancy < 0.25 and 0.4 < large.sm_occupancy < 0.65
    assert _gpu_after(dataclasses.replace(_decode_slice(), busy_s=0.0, memory_s=0.0, dram_bytes=0.0, steps=0,
                                          tokens=0.0), 30).devices[0].sm_occupancy == 0.0


def test_memory_temperature_tracks_power_and_cooling() -> None:
    idle = Slice(dt=0.25, busy_s=0.0, memory_s=0.0, compute_s=0.0, dram_bytes=0.0, flops=0.0, comm_bytes=0.0,
                 host_io_bytes=0.0)
    cold = _gpu_after(idle, 300).devices[0]
    hot = _gpu_after(_decode_slice(), 300).devices[0]
    assert abs(cold.memory_temperature_c - cold.temperature_c) < 3
    assert hot.memory_temperature_c > cold.memory_temperature_c + 15  # heated by the board's power
    assert hot.memory_temperature_c > hot.temperature_c  # and by its own traffic: memory-bound runs HBM hotter
    failing = _gpu_after(_decode_slice(), 300, Thermal(ambient_c=38.0, cooling=0.45)).devices[0]
    assert failing.memory_temperature_c > hot.memory_temperature_c + 15
