"""The Stage contract (exporter/derive/stage.py): what the stages declare is in the catalogue, in
an order one pass can run, reaches the view, and is all that their samples emit; one setting
record (exporter/derive/settings.py) is the only reader of the configuration."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re

import pytest

from exporter.catalog import FAMILIES, family_of
from exporter.config import Config
from exporter.derive import STAGES, Deriver, kv
from exporter.derive.settings import DeriveSettings, derive_settings
from exporter.derive.stage import Stage, check_order, view_needs
from exporter.derive.view import ViewCache, build_view
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of
from exporter.sources.engines.state import NormalizerState
from tests.test_derive_twin import Harness
from tests.test_derive_verdict import llamacpp_snapshot, ranked_snapshot, run

DERIVE = pathlib.Path(__file__).resolve().parent.parent / "exporter" / "derive"
GPU_SOURCES = ("nvml", "gpm", "sim")


def test_every_need_and_every_emitted_family_is_in_the_catalogue():
    for stage in STAGES:
        for name in stage.engine:
            assert family_of(name) is not None and family_of(name).source == "engine", (stage.name, name)
        for name in stage.histograms:
            fam = FAMILIES[name]
            assert fam.type == "histogram" and fam.source == "engine", (stage.name, name)
        for name in stage.gpu:
            assert name in FAMILIES and FAMILIES[name].source in GPU_SOURCES, (stage.name, name)
        for name in stage.host:
            assert name in FAMILIES and FAMILIES[name].source == "host", (stage.name, name)
        assert stage.emits or stage.numbers, f"{stage.name} adds neither a family nor a diagnosis number"
        for name in stage.emits:
            assert name in FAMILIES and FAMILIES[name].source == "derived", (stage.name, name)
    emitted = [name for stage in STAGES for name in stage.emits]
    assert len(emitted) == len(set(emitted)), "a derived family is emitted by one stage only"
    assert set(emitted) == {f.name for f in FAMILIES.values() if f.source == "derived"}


def test_no_stage_needs_a_later_stage():
    names = [s.name for s in STAGES]
    for i, stage in enumerate(STAGES):
        assert set(stage.after) <= set(names[:i]), stage.name
    check_order(STAGES)
    with pytest.raises(ValueError, match="not listed before it"):
        check_order(tuple(reversed(STAGES)))
    with pytest.raises(ValueError, match="twice"):
        check_order((*STAGES, STAGES[0]))


def test_a_misspelled_need_fails_at_construction_instead_of_reading_none():
    typo = dataclasses.replace(kv.STAGE, engine=("llm_kv_cache_capacity_token",))
    with pytest.raises(KeyError, match="llm_kv_cache_capacity_token"):
        Deriver(Config(), stages=[typo if s.name == "kv" else s for s in STAGES])


def _by_label(name: str) -> str:
    """A GPU family's one label besides gpu/uuid/name (state, an ECC type, an XID code), or ""."""
    fam = family_of(name)
    extra = [label for label in fam.labels if label not in ("gpu", "uuid", "name", "reason")]
    return extra[0] if fam.name.startswith("llm_gpu_") and len(extra) == 1 else ""


def _sample_for(name: str, labels: tuple) -> list[Sample]:
    fam = family_of(name)
    if by := _by_label(name):
        return [Sample(name, labels_of(**dict(labels), **{by: st}), 1.0) for st in ("current", "max")]
    if "reason" in fam.labels:
        return [Sample(name, labels_of(**dict(labels), reason="sw_power_cap"), 1.0)]
    if "cpu" in fam.labels:
        return [Sample(name, labels_of(cpu="0"), 0.1), Sample(name, labels_of(cpu="all"), 0.5)]
    if "device" in fam.labels:  # per network link; a direction's two series read as the higher
        return [Sample(name, labels_of(device="ib0", direction=d), v) for d, v in (("receive", 1.0),
                                                                                    ("transmit", 2.0))]
    return [Sample(name, labels, 2.0)]


def test_every_declared_need_reaches_the_view():
    """The view keeps exactly what the stages declare: each engine, GPU and host need is there."""
    engine_labels = labels_of(target="a", engine="vllm", model="m")
    gpu_labels = labels_of(gpu="0", uuid="GPU-0", name="NVIDIA H100 80GB HBM3")
    engine, gpu, host = [], [], []
    for name in sorted({n for s in STAGES for n in s.engine}):
        engine += _sample_for(name, engine_labels)
    for hist in sorted({n for s in STAGES for n in s.histograms}):
        engine += [Sample(hist + "_bucket", labels_of(**dict(engine_labels), le=le), 1.0)
                   for le in ("1", "+Inf")]
    for name in sorted({n for s in STAGES for n in s.gpu}):
        gpu += _sample_for(name, gpu_labels)
    for name in sorted({n for s in STAGES for n in s.host}):
        host += _sample_for(name, ())
    host.append(Sample("llm_host_network_info",
                       labels_of(device="ib0", kind="infiniband", numa_node="0", engine="true"), 1.0))
    results = {"engine:a": SourceResult("engine:a", True, 0.0, 0.0, tuple(engine), kind=SourceKind.ENGINE),
               "gpu": SourceResult("gpu", True, 0.0, 0.0, tuple(gpu), kind=SourceKind.GPU),
               "host": SourceResult("host", True, 0.0, 0.0, tuple(host), kind=SourceKind.HOST)}
    view = build_view(Snapshot(1.0, results), ViewCache(view_needs(STAGES)))
    (e,), (g,) = view.engines, view.gpus
    for stage in STAGES:
        for name in stage.engine:
            if name == "llm_kv_cache_usage_ratio":
                assert e.kv_usage_ratio == 2.0  # 2 x 2 used of 2 capacity
            elif name == "llm_prefix_cache_hit_ratio":
                assert e.prefix_hit_ratio == 2.0
            else:
                assert e.get(name) == 2.0, (stage.name, name)
        for hist in stage.histograms:
            assert e.histograms[hist].bounds == (1.0, float("inf")), (stage.name, hist)
        for name in stage.gpu:
            fam = family_of(name)
            if _by_label(name):
                assert g.link[(name, "current")] == g.link[(name, "max")] == 1.0, (stage.name, name)
            elif "reason" in fam.labels:
                assert g.reasons_active == ("sw_power_cap",)
            else:
                assert g.get(name) == 2.0, (stage.name, name)
        for name in stage.host:
            if "device" in family_of(name).labels:
                (link,) = view.links
                assert (link.device, link.kind, link.engine) == ("ib0", "infiniband", True)
                assert link.get(name) == 2.0, (stage.name, name)
                continue
            assert view.host[name] == (0.5 if "cpu" in family_of(name).labels else 2.0), (stage.name, name)


def _recording(stages: tuple[Stage, ...]) -> tuple[list[tuple[str, Sample]], list[Stage]]:
    seen: list[tuple[str, Sample]] = []

    def wrap(stage: Stage) -> Stage:
        def samples(result, key):
            out = list(stage.samples(result, key))
            seen.extend((stage.name, s) for s in out)
            return out
        return dataclasses.replace(stage, samples=samples)

    return seen, [wrap(s) for s in stages]


def _outputs() -> list[tuple[str, Sample]]:
    """Samples of every stage over twin scenarios and synthetic snapshots, by the stage that made them."""
    seen, stages = _recording(STAGES)
    for scenario, gpus in (("decode-heavy", 1), ("pcie-degraded", 2), ("overload", 1), ("faults", 1)):
        harness = Harness(scenario, gpus=gpus)
        harness.deriver = Deriver(Config(interval_s=1.0, gpu_price_per_hour=2.0), stages=stages)
        harness.twin.fast_forward(30)
        harness.run(8)
    deriver = Deriver(Config(gpu_price_per_hour=2.0), stages=stages)
    run(deriver, 6, targets=("b", "a"), gpus=4)
    deriver = Deriver(Config(), stages=stages)
    for t in range(4):
        deriver(ranked_snapshot(5.0 * t, {"0": 5_000.0 * t, "1": 4_000.0 * t}), None)
    deriver, state = Deriver(Config(), stages=stages), NormalizerState()
    for t in range(4):  # speculative decoding counters
        deriver(llamacpp_snapshot(5.0 * t, state), None)
    return seen


def test_each_stage_emits_only_the_families_it_declares_and_all_of_them():
    seen = _outputs()
    emitted = {stage.name: set() for stage in STAGES}
    for stage_name, s in seen:
        emitted[stage_name].add(family_of(s.name).name)
    for stage in STAGES:
        assert emitted[stage.name] == set(stage.emits), stage.name


def test_derived_labels_are_sorted_by_name():
    """Stages build some label tuples by hand (cheaper than sorting per sample): they must come
    out sorted, as labels_of() makes them, or one series would have two identities."""
    for stage_name, s in _outputs():
        assert s.labels == tuple(sorted(s.labels)), (stage_name, s)
        assert len({k for k, _ in s.labels}) == len(s.labels), (stage_name, s)


def test_derived_samples_carry_exactly_their_declared_labels_with_the_engine():
    """The catalogue is the one declaration: every derived sample has the labels its family
    declares, no more and no fewer, and every per-target family names the engine, as the target's
    engine series do (so LLMKVCacheHeadroomExhausted carries `engine` like the target's other alerts)."""
    seen = _outputs()
    for stage_name, s in seen:
        fam = family_of(s.name)
        assert {k for k, _ in s.labels} == set(fam.labels), (stage_name, s)
        assert "engine" in fam.labels and s.label("engine") not in ("", None), (stage_name, s)
    engines = {s.label("engine") for _, s in seen}
    assert {"vllm", "llamacpp"} <= engines, engines


def test_a_stage_whose_samples_raise_loses_only_its_families_and_is_logged_once(caplog):
    def broken(result, key):
        raise ValueError("cannot render")

    stages = [dataclasses.replace(s, samples=broken) if s.name == "energy" else s for s in STAGES]
    deriver = Deriver(Config(gpu_price_per_hour=2.0), stages=stages)
    with caplog.at_level(logging.WARNING, logger="llm_exporter.derive"):
        out = run(deriver, 4)
    names = {s.name for s in out}
    assert not names & {"llm_energy_joules_per_token", "llm_cost_per_million_tokens"}
    assert {"llm_decode_tokens_per_second", "llm_kv_cache_used_bytes", "llm_bottleneck"} <= names
    assert sum("energy failed" in r.getMessage() for r in caplog.records) == 1
    target = deriver.diagnosis()["targets"]["a"]
    assert any("energy failed this cycle: ValueError" in o for o in target["omitted"])
    assert "joules_per_token" in target["numbers"]  # computed, only its samples failed


def test_derive_settings_reads_the_typed_config_fields():
    default = derive_settings(Config())
    assert default.verdict_hold_cycles == 3 and default.rate_window_s == 15.0
    assert default.kv_cache_dtype is None and default.gpu_spec is None and default.target_gpus is None
    assert derive_settings(Config(interval_s=10.0)).rate_window_s == 50.0  # 5 intervals
    typed = {"verdict_hold_cycles": 5, "rate_window_s": 30.0, "kv_cache_dtype": "fp8",
             "gpu_spec": {"tdp_watts": 300}, "target_gpus": {"a": ["1"]}}
    settings = derive_settings(Config(**typed, slo_ttft_s=1.5, slo_tbt_s=0.05, quantile_window_s=60.0))
    assert (settings.verdict_hold_cycles, settings.rate_window_s, settings.kv_cache_dtype) == (5, 30.0, "fp8")
    assert settings.gpu_spec == {"tdp_watts": 300} and settings.target_gpus == {"a": ["1"]}
    assert (settings.slo_ttft_s, settings.slo_tbt_s, settings.quantile_window_s) == (1.5, 0.05, 60.0)
    fields = {f.name for f in dataclasses.fields(DeriveSettings)}
    assert set(typed) <= fields  # the same names as the configuration keys
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rate_window_s = 1.0  # type: ignore[misc]


def test_only_the_settings_module_reads_the_configuration():
    reads = re.compile(r"(?<![\w.])config\.(?!json)\w|\.extra\b")
    readers = sorted(p.name for p in DERIVE.glob("*.py")
                     if p.name != "settings.py" and reads.search(p.read_text()))
    assert readers == [], readers
