"""What a real GPU showed the exporter (tests/fixtures/gpu/, made by tests/live/gpu_capture.py on the
device machine), checked against the code that reads, models and judges it here on CPUs.

- the pages are ours: every GPU family is in the catalogue with its type, and promtool accepts them;
- the fake NVML's and the spec table's card agree with the real one (name, memory, power, clocks, link);
- what each phase measured is physics the verdict relies on (GPM against the load's own throughput);
- the captured GPU samples, replayed through the view and the verdict, give the verdict a user of that
  card should read: compute for dense math on the default power limit, not power/thermal throttling.
"""

from __future__ import annotations

import json
import pathlib
import re
from types import MappingProxyType

import pytest
from conftest import ROOT
from fake_pynvml import MIB, MODELS
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalog import family_of
from exporter.derive import STAGES
from exporter.derive.bottleneck import Signals, assess, raw_verdict, scores
from exporter.derive.signals import gpu_health
from exporter.derive.stage import view_needs
from exporter.derive.view import ViewCache, build_view
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of
from exporter.specs.gpus import lookup_gpu
from tests.support import promtool_check_metrics

CAPTURES = sorted(p for p in (ROOT / "tests" / "fixtures" / "gpu").iterdir() if p.is_dir())
PHASES = ("idle", "compute", "membw")
H200 = ROOT / "tests" / "fixtures" / "gpu" / "h200-580.159.04"


def gpu_samples(page: str) -> list[Sample]:
    out = []
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name.startswith("llm_gpu_") and not s.name.endswith("_created"):
                out.append(Sample(s.name, labels_of(**s.labels), float(s.value)))
    return out


def one(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def phase(capture: pathlib.Path, name: str) -> list[Sample]:
    return gpu_samples((capture / f"{name}.prom").read_text())


def test_there_is_a_capture() -> None:
    assert H200 in CAPTURES


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_captured_gpu_families_are_in_the_catalogue_and_promtool_accepts_the_pages(capture) -> None:
    for name in PHASES:
        page = (capture / f"{name}.prom").read_text()
        types = dict(re.findall(r"^# TYPE (llm_gpu_\S+) (\S+)", page, re.M))
        assert types, name
        for family, kind in types.items():
            declared = family_of(family)
            assert declared is not None, f"{family} is not in the catalogue"
            assert declared.type == kind, family
        promtool_check_metrics(page.encode())
    promtool_check_metrics((capture / "real_nvml.metrics").read_bytes())


def test_the_fake_and_the_spec_table_describe_the_real_h200() -> None:
    card = json.loads((H200 / "card.json").read_text())["nvidia_smi"][0]
    idle = phase(H200, "idle")
    fake, spec = MODELS["h200"], lookup_gpu(card["name"])
    assert fake.name == card["name"] and spec is not None and spec.key == "h200-sxm"
    mib = int(card["memory.total"].split()[0])
    assert fake.memory_total == mib * MIB == one(idle, "llm_gpu_memory_total_bytes")
    assert abs(spec.memory_bytes - mib * MIB) / (mib * MIB) < 0.01
    watts = float(card["power.limit"].split()[0])
    assert fake.power_limit_mw == fake.default_power_limit_mw == watts * 1000
    assert spec.tdp_watts == watts == one(idle, "llm_gpu_power_default_limit_watts")
    assert fake.sm_clock_max_mhz == int(card["clocks.max.sm"].split()[0]) == spec.max_sm_clock_hz / 1e6
    assert fake.mem_clock_max_mhz == int(card["clocks.max.memory"].split()[0]) == spec.max_mem_clock_hz / 1e6
    assert (fake.pcie_max_gen, fake.pcie_max_width) == (spec.pcie_gen, spec.pcie_width) \
        == (int(card["pcie.link.gen.max"]), int(card["pcie.link.width.max"]))
    assert fake.gpm is True and json.loads((H200 / "card.json").read_text())["gpm_supported"] == [True]


def _load_throughput(capture: pathlib.Path, kind: str) -> float:
    """Steps per second of the load (run.log: 'compute: N steps in Ss')."""
    n, seconds = re.search(rf"{kind}: (\d+) steps in (\d+)s", (capture / "run.log").read_text()).groups()
    return int(n) / int(seconds)


def test_gpm_agrees_with_what_the_load_itself_moved() -> None:
    spec = lookup_gpu("NVIDIA H200")
    # membw: each step copies a 4 GiB buffer, read once and written once.
    moved = _load_throughput(H200, "membw") * 2 * 4 * 2**30
    dram = one(phase(H200, "membw"), "llm_gpu_dram_bandwidth_utilization_ratio")
    assert dram == pytest.approx(moved / spec.mem_bandwidth_bytes_per_s, abs=0.05)
    # compute: each step is an 8192^3 bf16 product (2 n^3 flops); on the default power limit the card
    # reaches well under its boost-clock peak while its tensor cores are nearly always busy.
    flops = _load_throughput(H200, "compute") * 2 * 8192**3
    compute = phase(H200, "compute")
    assert 0.5 < flops / spec.bf16_dense_flops < 0.9
    assert one(compute, "llm_gpu_tensor_active_ratio") > 0.85
    assert one(compute, "llm_gpu_clock_event_active", reason="sw_power_cap") == 1.0
    assert one(compute, "llm_gpu_power_watts") > 0.95 * one(compute, "llm_gpu_power_limit_watts")
    assert one(compute, "llm_gpu_sm_clock_hertz") < 0.9 * one(compute, "llm_gpu_sm_clock_max_hertz")
    idle = phase(H200, "idle")
    assert one(idle, "llm_gpu_clock_event_active", reason="gpu_idle") == 1.0
    assert one(idle, "llm_gpu_utilization_ratio") == 0.0


def replay(samples: list[Sample]) -> tuple[str, dict[str, float], dict[str, tuple[str, ...]]]:
    """The verdict for a busy engine on these GPU samples, through the real view and gpu_health."""
    gpu = SourceResult("gpu", True, 0.0, 0.0, tuple(samples), kind=SourceKind.GPU)
    view = build_view(Snapshot(1_000.0, MappingProxyType({"gpu": gpu})), ViewCache(view_needs(STAGES)))
    (g,) = view.gpus
    signals = Signals(decode_tps=500.0, prefill_tps=2_000.0, running=8.0, mean_batch=8.0, gpus_known=True,
                      tensor_active=g.get("llm_gpu_tensor_active_ratio"),
                      hbm_gpm=g.get("llm_gpu_dram_bandwidth_utilization_ratio"),
                      gpu_util=g.get("llm_gpu_utilization_ratio"), **gpu_health(view.gpus, lookup_gpu))
    found = scores(signals)
    return raw_verdict(signals, found, None)[0], found, assess(signals).evidence


def test_dense_math_on_the_default_power_limit_is_the_compute_roof_not_throttling() -> None:
    verdict, found, evidence = replay(phase(H200, "compute"))
    assert verdict == "compute"
    assert found["power_thermal"] == 0.0
    assert any("default limit" in line and "not a fault" in line for line in evidence["power_thermal"])
    assert any("compute ceiling" in line for line in evidence["compute"])
    assert replay(phase(H200, "membw"))[0] == "memory_bandwidth"


def test_the_same_load_under_a_lowered_power_limit_is_power_thermal() -> None:
    lowered = [s._replace(value=500.0) if s.name == "llm_gpu_power_limit_watts" else s
               for s in phase(H200, "compute")]
    verdict, found, evidence = replay(lowered)
    assert verdict == "power_thermal" and found["power_thermal"] >= 0.6
    assert any("500 W, below its default 700 W" in line for line in evidence["power_thermal"])


def test_without_the_default_limit_the_rated_power_of_a_known_card_decides() -> None:
    samples = [s for s in phase(H200, "compute") if s.name != "llm_gpu_power_default_limit_watts"]
    assert replay(samples)[0] == "compute"
    unknown = [s._replace(labels=labels_of(**{**dict(s.labels), "name": "Some Future GPU"}))
               for s in samples]
    verdict, _, evidence = replay(unknown)
    assert verdict == "power_thermal"  # nothing says the limit is the card's own: the cap stays a lead
    assert any("unknown" in line for line in evidence["power_thermal"])


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_the_real_process_gave_the_verdict_the_replay_gives(capture) -> None:
    """The capture's own /api/v1/diagnosis (the exporter process on the real card) against the replay."""
    for name, expected in (("compute", "compute"), ("membw", "memory_bandwidth")):
        (target,) = json.loads((capture / f"{name}.diagnosis.json").read_text())["targets"].values()
        assert target["verdict"] == expected == replay(phase(capture, name))[0], name
        assert target["scores"]["power_thermal"] == 0.0
    assert "compute (tensor FLOPS" in (capture / "compute.doctor.txt").read_text()
