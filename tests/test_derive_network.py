"""The network between servers in the verdict: prefill/decode KV transfer and the engine's NIC and
RDMA links (exporter/derive/transfer.py, bottleneck._network). The live twin scenarios pd-transfer
and cross-node-tp drive the same rules through the real process (tests/test_demo_scenarios.py)."""

from __future__ import annotations

import json

import pytest

from exporter.config import Config
from exporter.derive import build_deriver
from exporter.derive.bottleneck import REMEDIES, Signals, assess, network_remedies, raw_verdict, remedies
from exporter.derive.transfer import spans_servers
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of

BUSY = dict(running=32.0, mean_batch=32.0, decode_tps=2_000.0, prefill_tps=5_000.0, gpus_known=True, hbm_gpm=0.5)
PD = "a decode instance of a prefill/decode disaggregated deployment: KV caches cross the network"


def verdict(**signals) -> tuple[str, Signals]:
    s = Signals(**{**BUSY, **signals})
    return raw_verdict(s, assess(s).scores, None)[0], s


@pytest.mark.parametrize(("signals", "expected"), [
    (dict(role="decode", spans=PD, kv_transfer_share=0.7, kv_transfer_p50=0.4), "interconnect"),
    (dict(role="decode", spans=PD, kv_transfer_share=0.1, kv_transfer_p50=0.01), "memory_bandwidth"),
    (dict(role="decode", spans=PD, kv_waiting=6.0), "interconnect"),
    (dict(spans="tensor parallel over 16 GPUs with 8 on this server", net_util=0.95,
          net_util_what="mlx5_0:1 (infiniband)"), "interconnect"),
    # A busy NIC with nothing saying the engine's work crosses servers is a lead, not a verdict.
    (dict(net_util=0.97, net_util_what="eth0 (ethernet)"), "memory_bandwidth"),
    (dict(spans=PD, net_down=("mlx5_0:1 (infiniband) down",)), "interconnect"),
    (dict(spans=PD, net_errors=("mlx5_0:1 40 errors+drops/s",)), "interconnect"),
    (dict(net_errors=("eth0 40 errors+drops/s",)), "memory_bandwidth"),
    (dict(spans=PD, kv_failures_per_s=0.2), "interconnect"),
    # A single GPU's PCIe link trained down is only noted (0.45): it must not hide the network's score.
    (dict(role="decode", spans=PD, kv_waiting=6.0, degraded_links=("GPU0 gen1 x16 (max gen5 x16)",)),
     "interconnect"),
    # Tensor parallel across servers: the GPU far below its roofs while its RDMA link is 70% busy.
    (dict(hbm_gpm=0.1, spans="the engine's RDMA links carry traffic (mlx5_0:1)", spans_parallel=True,
          net_util=0.7, net_util_what="mlx5_0:1 (roce)"), "interconnect"),
    # ... but not next to a GPU at its roof, nor when nothing says the work crosses servers.
    (dict(hbm_gpm=0.8, spans="the engine's RDMA links carry traffic (mlx5_0:1)", spans_parallel=True,
          net_util=0.7), "memory_bandwidth"),
    (dict(hbm_gpm=0.1, net_util=0.7), "headroom"),
])
def test_network_rules(signals, expected):
    assert verdict(**signals)[0] == expected


def test_a_decode_instance_waiting_only_for_kv_is_neither_idle_nor_kv_bound():
    v, s = verdict(running=0.0, mean_batch=0.0, decode_tps=0.0, prefill_tps=0.0, waiting=0.0, hbm_gpm=0.0,
                   role="decode", spans=PD, kv_waiting=5.0, kv_usage=0.95)
    assert s.work and v == "interconnect"
    words = assess(s).evidence["interconnect"]
    assert "5.0 requests waiting for a KV transfer on average" in words and PD in words


def test_network_verdict_gives_network_remedies_and_pcie_keeps_its_own():
    _, pd = verdict(role="decode", spans=PD, kv_transfer_share=0.8, kv_transfer_p50=0.5)
    assert remedies("interconnect", pd) == network_remedies(pd)
    pd_words = " ".join(remedies("interconnect", pd))
    assert "KV" in pd_words and "prefill and decode" in pd_words and "tensor parallelism" not in pd_words
    _, tp = verdict(hbm_gpm=0.1, spans="the engine's RDMA links carry traffic (mlx5_0:1)", spans_parallel=True,
                    net_util=0.7, net_util_what="mlx5_0:1 (roce)")
    tp_words = " ".join(remedies("interconnect", tp))
    assert "NCCL" in tp_words and "tensor parallelism" in tp_words and "prefill and decode" not in tp_words
    assert "all-reduce" in " ".join(assess(tp).evidence["interconnect"])
    assert "KV cache between the prefill and decode" in " ".join(
        assess(verdict(role="prefill", spans=PD, net_util=0.95, net_util_what="mlx5_0:1 (roce)")[1])
        .evidence["interconnect"])
    _, pcie = verdict(tp=2, degraded_links=("GPU0 gen3 x8 (max gen5 x16)",))
    assert remedies("interconnect", pcie) == REMEDIES["interconnect"]
    assert remedies("kv_capacity", pd) == REMEDIES["kv_capacity"]
    assert "PCIe links at their maximum" not in " ".join(assess(pd).evidence["interconnect"])


def test_what_says_the_work_crosses_servers():
    assert "prefill instance" in spans_servers("prefill", False, 1, 1, [])
    assert spans_servers("both", True, 1, 1, []) == "KV transfers between instances are reported"
    assert spans_servers("both", False, 16, 8, []) == "tensor parallel over 16 GPUs with 8 on this server"
    assert "mlx5_0:1" in spans_servers("", False, 2, 2, ["mlx5_0:1"])
    assert spans_servers("both", False, 2, 2, []) == ""


ENGINE = labels_of(target="decode", engine="sglang", model="m")


def _snapshot(t: float, *, transfers: float, waiting: float, util: float,
              errors: float = 0.0) -> Snapshot:
    """A decode instance after `transfers` KV transfers of which 90% took under 0.5 s, with TTFT
    under 0.8 s for 90%; its host's RDMA port at `util`."""
    engine = [Sample("llm_engine_info", labels_of(target="decode", engine="sglang", flavor="", role="decode"), 1.0),
              Sample("llm_requests_running", ENGINE, 8.0), Sample("llm_requests_waiting", ENGINE, 0.0),
              Sample("llm_requests_waiting_kv_transfer", ENGINE, waiting),
              Sample("llm_generation_tokens_total", ENGINE, 100.0 * t), Sample("llm_prompt_tokens_total", ENGINE, 0.0)]
    for hist, le_fast, fast, slow in (("llm_kv_transfer_seconds", "0.5", 0.9, 1.0),
                                      ("llm_time_to_first_token_seconds", "0.8", 0.9, 1.0)):
        for le, share in ((le_fast, fast), ("5", slow), ("+Inf", slow)):
            engine.append(Sample(hist + "_bucket", labels_of(**dict(ENGINE), le=le), share * transfers))
    host = [Sample("llm_host_network_info", labels_of(device="mlx5_0:1", kind="roce", numa_node="0",
                                                      engine="true"), 1.0),
            Sample("llm_host_network_up", labels_of(device="mlx5_0:1"), 1.0),
            Sample("llm_host_network_speed_bytes_per_second", labels_of(device="mlx5_0:1"), 25e9),
            Sample("llm_host_network_utilization_ratio", labels_of(device="mlx5_0:1", direction="receive"), util),
            Sample("llm_host_network_receive_errors_total", labels_of(device="mlx5_0:1"), errors * t),
            Sample("llm_host_network_info", labels_of(device="eth9", kind="ethernet", numa_node="1",
                                                      engine="false"), 1.0),
            Sample("llm_host_network_utilization_ratio", labels_of(device="eth9", direction="transmit"), 1.0)]
    results = {"engine:decode": SourceResult("engine:decode", True, t, t, tuple(engine), kind=SourceKind.ENGINE,
                                             attrs={"target": "decode", "engine": "sglang", "role": "decode"}),
               "host": SourceResult("host", True, t, t, tuple(host), kind=SourceKind.HOST)}
    return Snapshot(t, results)


def test_deriver_reads_transfer_and_links_into_the_diagnosis():
    deriver = build_deriver(Config(interval_s=1.0))
    for i in range(6):
        deriver(_snapshot(float(i), transfers=10.0 * i, waiting=5.0, util=0.97,
                          errors=3.0), None)
    target = deriver.diagnosis()["targets"]["decode"]
    json.dumps(target, allow_nan=False)
    numbers = target["numbers"]
    assert numbers["role"] == "decode" and numbers["kv_transfer_waiting_mean"] == 5.0
    ttft50 = numbers["ttft"]["quantiles"]["0.5"]
    assert numbers["kv_transfer_share_of_ttft"] == pytest.approx(numbers["kv_transfer_p50_seconds"] / ttft50, abs=1e-3)
    assert numbers["kv_transfer_share_of_ttft"] > 0.5
    assert numbers["busiest_engine_link"] == "mlx5_0:1 (roce) of 200 Gb/s"  # eth9 is not the engine's
    assert numbers["busiest_engine_link_utilization"] == 0.97
    assert numbers["engine_links_with_errors"] == ["mlx5_0:1 3 errors+drops/s"]
    assert target["verdict"] == "interconnect"
    assert target["remedies"][:3] == list(network_remedies(Signals(role="decode")))
    assert any("waiting for a KV transfer" in e for e in target["evidence"])


def test_requests_waiting_for_kv_are_not_a_kv_or_scheduler_queue_where_the_engine_counts_them_as_waiting():
    """vLLM's waiting gauge includes requests deferred for their KV load (waiting_has_kv): a decode
    instance whose pool is full of preallocated blocks while 6 requests wait for KV is not KV-bound."""
    common = dict(hbm_gpm=0.3, role="decode", spans=PD, kv_usage=0.95, waiting=6.0, mean_waiting=6.0,
                  kv_waiting=6.0, running_cap=32.0, peak_running=32.0)
    v, s = verdict(**common, waiting_has_kv=True)
    assert v == "interconnect" and assess(s).scores["kv_capacity"] < 0.6 and assess(s).scores["scheduler"] == 0
    # SGLang's waiting gauge is its scheduler queue alone: 6 there beside a full pool is KV's case.
    assert assess(Signals(**{**BUSY, **common, "waiting_has_kv": False})).scores["kv_capacity"] >= 0.6
