"""Prefill/decode disaggregation and cross-node tensor parallelism on the fast-forwarded twin
(exporter/simulator/pd.py, costs.py's network interconnect, the host state's network links): the
physics of `pd-transfer` and `cross-node-tp`, and the upstream names, labels and units their pages
carry (vLLM 0.34 NixlConnector, SGLang 0.5.23 --disaggregation-mode)."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import SCENARIOS, Twin, TwinConfig
from exporter.simulator.recorders import SGLANG_KV_TRANSFER_LATENCY_MS
from exporter.simulator.twin import pd_pair
from exporter.sources.engines.accounting import unaccounted
from exporter.sources.engines.normalize import normalize
from exporter.sources.engines.registry import SPECS
from exporter.sources.engines.state import NormalizerState
from exporter.specs.models import kv_bytes_per_token

LINK_KEYS = {"device", "kind", "up", "speed_bytes_per_s", "numa_node", "engine", "receive_bytes", "transmit_bytes",
             "receive_packets", "transmit_packets", "receive_errors", "transmit_errors", "receive_drops",
             "transmit_drops"}


def engine_link(twin: Twin) -> dict:
    (link,) = [n for n in twin.host_state()["network"] if n["engine"]]
    return link


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_pd_transfer_the_kv_link_dominates_the_decode_instances_ttft() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    prefill, decode = pair.prefill, pair.decode
    decode.fast_forward(30)  # the queue builds
    rec = decode.recorder
    ttft0, xfer0 = (rec.h["ttft"].sum, rec.h["ttft"].count), (rec.nixl["xfer"].sum, rec.nixl["xfer"].count)
    rx0, tx0, t0 = engine_link(decode)["receive_bytes"], engine_link(prefill)["transmit_bytes"], decode.now
    queue, sending = [], []
    for _ in range(120):
        decode.fast_forward(1.0)
        queue.append(decode.engine.state().kv_receiving)
        sending.append(prefill.engine.state().kv_sending)
    dt = decode.now - t0
    ttft = (rec.h["ttft"].sum - ttft0[0]) / (rec.h["ttft"].count - ttft0[1])
    xfer = (rec.nixl["xfer"].sum - xfer0[0]) / (rec.nixl["xfer"].count - xfer0[1])
    share = xfer / ttft
    rx_rate = (engine_link(decode)["receive_bytes"] - rx0) / dt
    tx_rate = (engine_link(prefill)["transmit_bytes"] - tx0) / dt
    speed = engine_link(decode)["speed_bytes_per_s"]
    print(f"pd-transfer: transfer {xfer:.3f} s of TTFT {ttft:.3f} s ({share:.2f}), decode transfer queue "
          f"{sum(queue) / len(queue):.1f}, link utilization rx {rx_rate / speed:.2f} tx {tx_rate / speed:.2f}")
    assert share > 0.5
    assert sum(queue) / len(queue) > 1 and sum(sending) / len(sending) > 1
    assert 0.8 < rx_rate / speed <= 1.0 and 0.8 < tx_rate / speed <= 1.0
    # Both GPUs are far from their limits: the link, not the engines, sets the pace.
    assert decode.engine.state().running < 64 and decode.engine.state().waiting == 0
    assert prefill.engine.state().waiting < 5


def test_pd_transfer_bytes_on_the_link_are_the_kv_of_the_requests_moved() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    prefill, decode = pair.prefill, pair.decode
    decode.fast_forward(45)
    per_token = kv_bytes_per_token(prefill.model)
    assert per_token == 131072  # Llama 3.1 8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    # Every prefilled request handed exactly its prompt's KV to the link.
    assert pair.link.bytes_submitted == prefill.engine.counters.prompt_tokens * per_token
    # What the decode node received: the KV of the requests that arrived, plus the one being sent.
    received = decode.recorder.nixl["bytes"].sum
    rx = engine_link(decode)["receive_bytes"]
    in_flight = sum(r.kv_bytes for r in decode.engine.inbox)
    assert received <= rx <= received + in_flight + 1
    assert engine_link(prefill)["transmit_bytes"] == rx  # the same bytes, sent and received
    # No failures on a healthy link, and no prefill compute on the decode instance.
    assert all(n[k] == 0 for tw in (prefill, decode) for n in tw.host_state()["network"]
               for k in ("receive_errors", "transmit_errors", "receive_drops", "transmit_drops"))
    assert decode.engine.counters.prefill_computed_tokens == 0
    # The prefill instance makes one token a request and no decode steps: its requests are done
    # (KV sent) or still sending.
    c = prefill.engine.counters
    assert c.generation_tokens == c.finished + prefill.engine.state().kv_sending


def test_cross_node_tp_network_comm_dominates_the_step() -> None:
    twin = Twin(TwinConfig(scenario="cross-node-tp", epoch=0.0))
    assert twin.hw.tp == 2 and twin.hw.link == "network"
    twin.fast_forward(30)
    a0 = dataclasses.replace(twin.engine.activity)
    link0 = engine_link(twin)
    twin.fast_forward(90)
    a = twin.engine.activity
    comm, memory, compute = a.comm_s - a0.comm_s, a.memory_s - a0.memory_s, a.compute_s - a0.compute_s
    link = engine_link(twin)
    util = (link["transmit_bytes"] - link0["transmit_bytes"]) / 90 / link["speed_bytes_per_s"]
    print(f"cross-node-tp: comm {comm:.1f} s, memory {memory:.1f} s, compute {compute:.1f} s of "
          f"{a.gpu_busy_s - a0.gpu_busy_s:.1f} s busy; link utilization {util:.2f}")
    assert comm > memory and comm > compute
    assert comm > 0.5 * (a.gpu_busy_s - a0.gpu_busy_s)
    assert 0.6 < util <= 1.0
    # The link carries the all-reduce bytes, each way, at most at its rate: what the steps sent, less
    # at most the last step's share still on the wire.
    assert link["transmit_bytes"] == link["receive_bytes"]
    last = twin.engine.last_step
    assert 0 <= a.comm_bytes - link["transmit_bytes"] <= last.cost.comm_bytes_per_gpu + 1
    assert twin.gpu_state()["interconnect"] == "network"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_host_has_its_network_links_in_the_shape_the_host_source_reads(scenario: str) -> None:
    twins = list(pd_pair(TwinConfig(scenario=scenario, epoch=0.0, gpus=2)).twins) if SCENARIOS[scenario].pd \
        else [Twin(TwinConfig(scenario=scenario, epoch=0.0, gpus=2))]
    twins[0].fast_forward(5)
    for twin in twins:
        links = twin.host_state()["network"]
        assert all(set(n) == LINK_KEYS for n in links)
        management = links[0]
        assert management["device"] == "eth0" and management["kind"] == "ethernet" and not management["engine"]
        assert management["receive_bytes"] > 0 and management["transmit_bytes"] > 0
        has_engine_link = SCENARIOS[scenario].pd is not None or scenario == "cross-node-tp"
        assert [n["engine"] for n in links] == [False] + ([True] if has_engine_link else [])
        for n in links:
            assert n["kind"] in ("infiniband", "roce", "ethernet") and n["up"] is True
            assert n["numa_node"] in (0, 1, None) and n["speed_bytes_per_s"] > 0
            assert all(isinstance(n[k], int) for k in LINK_KEYS - {"device", "kind", "up", "speed_bytes_per_s",
                                                                   "numa_node", "engine"})


def test_vllm_pages_of_a_pair_carry_the_nixl_families() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=1.7e9))
    pair.decode.fast_forward(30)
    decode, prefill = families(pair.decode.metrics_text()), families(pair.prefill.metrics_text())
    for page in (decode, prefill):
        for name in ("vllm:nixl_xfer_time_seconds", "vllm:nixl_post_time_seconds", "vllm:nixl_bytes_transferred",
                     "vllm:nixl_num_descriptors"):
            assert page[name].type == "histogram"
        for name in ("vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_notifications",
                     "vllm:nixl_num_kv_expired_reqs", "vllm:nixl_num_notifications_after_expiry"):
            (total,) = [s for s in page[name].samples if s.name == name + "_total"]
            assert page[name].type == "counter" and total.value == 0
    xfer = {s.labels.get("le"): s.value for s in decode["vllm:nixl_xfer_time_seconds"].samples
            if s.name.endswith("_bucket")}
    assert list(xfer)[:3] == ["0.005", "0.01", "0.025"] and list(xfer)[-2:] == ["5.0", "+Inf"] and xfer["+Inf"] > 0
    sizes = [s.labels["le"] for s in decode["vllm:nixl_bytes_transferred"].samples if s.name.endswith("_bucket")]
    assert float(sizes[0]) == 2 ** 11 and float(sizes[-2]) == 2 ** 33  # vLLM's 2 KiB to 8 GiB, every 4x
    # The KV consumer alone has the fetch stages; the producer observes no transfers.
    stages = {s.labels["stage"]: s.value for s in decode["vllm:num_requests_kv_fetch_by_stage"].samples}
    assert set(stages) == {"waiting_to_start", "in_progress", "completed_waiting"}
    # vLLM counts the requests waiting for their KV among the waiting ones.
    assert decode["vllm:num_requests_waiting"].samples[0].value == sum(stages.values()) > 0
    assert {s.labels["engine"] for s in decode["vllm:num_requests_kv_fetch_by_stage"].samples} == {"0"}
    assert "vllm:num_requests_kv_fetch_by_stage" not in prefill
    # vLLM's PromptTokenStats: the consumer's prompts came over the connector, the producer computed them.
    by_source = {page_name: {s.labels["source"]: s.value for s in page["vllm:prompt_tokens_by_source"].samples
                             if s.name.endswith("_total")} for page_name, page in (("d", decode), ("p", prefill))}
    assert by_source["d"]["external_kv_transfer"] > 0 and by_source["d"]["local_compute"] == 0
    assert by_source["p"]["local_compute"] > 0 and by_source["p"]["external_kv_transfer"] == 0
    assert [s.value for s in prefill["vllm:nixl_xfer_time_seconds"].samples if s.name.endswith("_count")] == [0]


def test_sglang_pages_of_a_pair_carry_the_pd_families_in_ms_and_mb() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", engine_format="sglang", epoch=1.7e9))
    pair.decode.fast_forward(30)
    decode, prefill = families(pair.decode.metrics_text()), families(pair.prefill.metrics_text())
    assert {s.labels["engine_type"] for f in decode.values() for s in f.samples} == {"decode"}
    assert {s.labels["engine_type"] for f in prefill.values() for s in f.samples} == {"prefill"}
    for page in (decode, prefill):
        for name in ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
                     "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"):
            assert page[name].type == "gauge"
        # No failure yet: SGLang's labelled counters have no series until their first increment.
        assert "sglang:num_transfer_failed_reqs" not in page and "sglang:num_bootstrap_failed_reqs" not in page

    def value(page: dict, name: str) -> float:
        return page[name].samples[0].value

    assert value(decode, "sglang:num_decode_transfer_queue_reqs") > 0
    assert value(decode, "sglang:num_prefill_inflight_queue_reqs") == 0
    assert value(prefill, "sglang:num_prefill_inflight_queue_reqs") > 0
    assert value(prefill, "sglang:num_decode_transfer_queue_reqs") == 0
    # The transfer histograms are the prefill instance's (SGLang observes them as the KV leaves).
    latency = prefill["sglang:kv_transfer_latency_ms"]
    bounds = [s.labels["le"] for s in latency.samples if s.name.endswith("_bucket")]
    assert bounds == [str(float(b)) for b in SGLANG_KV_TRANSFER_LATENCY_MS] + ["+Inf"]
    count = next(s.value for s in latency.samples if s.name.endswith("_count"))
    total = next(s.value for s in latency.samples if s.name.endswith("_sum"))
    assert count > 0 and 50 < total / count < 60_000  # milliseconds: a transfer takes ~0.13 s plus its wait
    mb = prefill["sglang:kv_transfer_total_mb"]
    mean_mb = (next(s.value for s in mb.samples if s.name.endswith("_sum"))
               / next(s.value for s in mb.samples if s.name.endswith("_count")))
    assert 200 < mean_mb < 800  # ~3,000 tokens x 128 KiB
    assert "sglang:kv_transfer_speed_gb_s" in prefill and "sglang:kv_transfer_latency_ms" not in decode


@pytest.mark.parametrize("engine_format", ["vllm", "sglang"])
def test_the_exporter_still_reads_both_instances_pages(engine_format: str) -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", engine_format=engine_format, epoch=1.7e9))
    pair.decode.fast_forward(20)
    for twin in pair.twins:
        scrape = normalize(twin.metrics_text(), target="t", kind=None, state=NormalizerState(), max_series=10_000)
        assert scrape.kind == engine_format
        assert any(s.name == "llm_time_to_first_token_seconds_count" and s.value > 0 for s in scrape.samples)
        # Accounted for like a real PD engine's page: no LLMEngineFamiliesUnaccounted from the demo.
        assert unaccounted(SPECS[engine_format], twin.metrics_text()) == []


def test_a_pair_refuses_to_switch_out_of_pd_and_a_single_twin_into_it() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    with pytest.raises(ValueError, match="needs a twin that is not a prefill/decode pair"):
        pair.decode.set_scenario("decode-heavy")
    with pytest.raises(ValueError, match="needs a prefill/decode pair"):
        Twin(TwinConfig(scenario="decode-heavy", epoch=0.0)).set_scenario("pd-transfer")
    with pytest.raises(ValueError, match="needs a prefill/decode pair"):
        Twin(TwinConfig(scenario="pd-transfer", epoch=0.0))
    with pytest.raises(ValueError, match="not 'tgi'"):
        pd_pair(TwinConfig(scenario="pd-transfer", engine_format="tgi", epoch=0.0))


def test_a_restart_keeps_the_pair_moving() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    pair.decode.fast_forward(10)
    rx = engine_link(pair.decode)["receive_bytes"]
    pair.prefill.restart()
    pair.decode.restart()
    pair.decode.fast_forward(10)
    assert engine_link(pair.decode)["receive_bytes"] > rx  # the host's counters never go back
    assert pair.decode.engine.counters.finished > 0


def test_start_twins_serves_a_pair_decode_first() -> None:
    from exporter.simulator.demo import start_twins

    async def main() -> list[tuple[str, int, str]]:
        twins = await start_twins(scenario="pd-transfer", engines=1, gpus=1, engine_format="sglang",
                                  gpu_name="NVIDIA H100 80GB HBM3", model="llama-3.1-8b", speed=20)
        try:
            await asyncio.sleep(1.5)
            out = []
            async with httpx.AsyncClient() as client:
                for t in twins:
                    page = (await client.get(t.url + "/metrics")).text
                    host = (await client.get(t.url + "/sim/host")).json()
                    switch = await client.post(t.url + "/sim/scenario?name=overload")
                    out.append((t.role, switch.status_code, page, host))
            return [(role, status, page, host) for role, status, page, host in out]
        finally:
            for t in twins:
                await t.stop()

    served = asyncio.run(main())
    assert [role for role, *_ in served] == ["decode", "prefill"]
    for role, status, page, host in served:
        assert status == 409
        assert f'engine_type="{role}"' in page
        assert [n["device"] for n in host["network"]] == ["eth0", "mlx5_0:1"]
    assert "sglang:num_decode_transfer_queue_reqs" in served[0][2]
    assert "sglang:kv_transfer_latency_ms_bucket" in served[1][2]
    assert served[1][3]["network"][1]["transmit_bytes"] > 0


def test_a_network_all_reduce_costs_its_latency_and_its_bytes_at_the_link_rate() -> None:
    from exporter.physics.costs import Hardware, NetworkLink, prefill_batch, step_cost
    from exporter.specs.gpus import lookup_gpu
    from exporter.specs.models import load_model

    model = load_model("llama-3.1-8b")
    link = NetworkLink(bytes_per_s=6.25e9, latency_s=15e-6)
    hw = Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"), tp=2, interconnect="network", network=link)
    cost = step_cost(hw, model, prefill_batch(4096))
    # Two all-reduces a layer; a 2-GPU ring sends the whole activation buffer from each GPU.
    allreduces = 2 * model.layers
    assert cost.comm_bytes_per_gpu == allreduces * 4096 * model.hidden * 2
    assert cost.comm_time_s == pytest.approx(allreduces * 15e-6 + cost.comm_bytes_per_gpu / 6.25e9)
    assert cost.bound == "interconnect"
    nvlink = step_cost(dataclasses.replace(hw, interconnect="nvlink"), model, prefill_batch(4096))
    assert nvlink.comm_time_s < cost.comm_time_s / 10
    with pytest.raises(ValueError, match="needs its NetworkLink"):
        Hardware(lookup_gpu("NVIDIA H100 80GB HBM3"), tp=2, interconnect="network")
    with pytest.raises(ValueError, match="network kind"):
        NetworkLink(kind="token-ring")


def test_api_requests_are_served_whole_by_either_instance_of_a_pair() -> None:
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    pair.decode.fast_forward(5)
    reqs = [twin.engine.submit(100, 8) for twin in pair.twins]
    pair.decode.fast_forward(5)
    for twin, req in zip(pair.twins, reqs, strict=True):
        assert req.finished_at > 0 and twin.engine.generated(req) == 8, twin.config.role


@pytest.mark.parametrize("scenario", ["pd-transfer", "cross-node-tp"])
def test_no_second_carries_more_than_the_link_can(scenario: str) -> None:
    pair = pd_pair(TwinConfig(scenario=scenario, epoch=0.0)) if SCENARIOS[scenario].pd else None
    twin = pair.prefill if pair else Twin(TwinConfig(scenario=scenario, epoch=0.0))

    def clock() -> float:  # a pair's NIC counters are read at the time both its twins have reached
        return min(pair.prefill.now, pair.decode.now) if pair else twin.now

    twin.fast_forward(20)
    before, t0 = engine_link(twin), clock()
    busiest = 0.0
    for _ in range(40):
        twin.fast_forward(1.0)
        now, t1 = engine_link(twin), clock()
        rate = max(now[k] - before[k] for k in ("transmit_bytes", "receive_bytes")) / (t1 - t0)
        busiest = max(busiest, rate / now["speed_bytes_per_s"])
        before, t0 = now, t1
    assert 0.8 < busiest <= 1.0 + 1e-6, busiest


def test_the_kv_crosses_each_gpus_pcie_link_to_the_nic() -> None:
    """GPUDirect RDMA: the NIC reads the KV from the prefill GPU and writes it into the decode GPU."""
    pair = pd_pair(TwinConfig(scenario="pd-transfer", epoch=0.0))
    pair.decode.fast_forward(40)
    prefill, decode = (twin.gpu_state()["gpus"][0]["pcie"] for twin in pair.twins)
    speed = pair.link.spec.bytes_per_s
    assert 0.7 * speed < prefill["tx_bytes_per_second"] < 1.05 * speed > decode["rx_bytes_per_second"] > 0.7 * speed
    assert prefill["rx_bytes_per_second"] < 0.01 * speed and decode["tx_bytes_per_second"] < 0.01 * speed
