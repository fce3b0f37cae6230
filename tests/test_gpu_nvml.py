"""The NVML GPU source against a fake pynvml (tests/fake_pynvml.py): golden /metrics per GPU model,
each failure mode degrading as documented, GPM and counter rate math, XID counting."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time

import fake_pynvml as F
import pytest
from conftest import GOLDEN, ROOT
from fake_pynvml import ENGINE_PID, GIB, FakeNvml

from exporter import catalog
from exporter.catalog import gpu as gpu_catalog
from exporter.expose import render
from exporter.sources.base import SourceData, SourceError
from exporter.sources.gpu._counters import CounterRates, ResetSafeTotals
from exporter.sources.gpu._device import FABRIC_REFRESH_S, POWER_LIMIT_REFRESH_S, normalise_bus_id
from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource
from tests.support import promtool_check_metrics

GPU_FAMILIES = {f.name for f in gpu_catalog.FAMILIES}


def make_source(fake: FakeNvml, **options: object) -> NvmlSource:
    defaults: dict[str, object] = {"pynvml_module": fake, "clock": fake.clock, "xid_wait_ms": 20,
                                   "retry_interval_s": 10.0}
    defaults.update(options)
    return NvmlSource(NvmlOptions(**defaults))  # type: ignore[arg-type]


def collect(source: NvmlSource) -> SourceData:
    return asyncio.run(source.collect())


def close(source: NvmlSource) -> None:
    asyncio.run(source.close())


def two_cycles(fake: FakeNvml, source: NvmlSource, dt: float = 1.0) -> SourceData:
    """Rates need two readings: one cycle, `dt` seconds of load, a second cycle."""
    collect(source)
    fake.advance(dt)
    return collect(source)


def values(data: SourceData, name: str, **match: str) -> list[float]:
    return [s.value for s in data.samples if s.name == name and all(s.label(k) == v for k, v in match.items())]


def one(data: SourceData, name: str, **match: str) -> float:
    found = values(data, name, **match)
    assert len(found) == 1, f"{name} {match}: {found}"
    return found[0]


def names_for_gpu(data: SourceData, gpu: str) -> set[str]:
    return {s.name for s in data.samples if s.label("gpu") == gpu}


def wait_for(predicate, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# -- golden files ---------------------------------------------------------------------------------

def _scenario_busy(model: str) -> tuple[FakeNvml, dict]:
    return FakeNvml([model], "busy"), {}


def _scenario_idle(model: str) -> tuple[FakeNvml, dict]:
    return FakeNvml([model], "idle"), {}


def _scenario_engine(model: str) -> tuple[FakeNvml, dict]:
    """Only the engine's process counted; ECC and replays present."""
    fake = FakeNvml([model], "busy")
    fake.devices[0].ecc_corrected, fake.devices[0].pcie_replays = 3, 12
    return fake, {"engine_pids": lambda: [ENGINE_PID]}


def _scenario_mig(model: str) -> tuple[FakeNvml, dict]:
    fake = FakeNvml([model], "busy")
    fake.set_mig(0, True)
    return fake, {}


def _scenario_old_driver(model: str) -> tuple[FakeNvml, dict]:
    fake = FakeNvml([model], "busy", driver="470.223.02", cuda=11040)
    fake.old_driver = True
    return fake, {}


def _scenario_gpu_lost(model: str) -> tuple[FakeNvml, dict]:
    fake = FakeNvml([model, model], "busy")
    return fake, {}


SCENARIOS = {
    "busy": _scenario_busy,
    "idle": _scenario_idle,
    "engine": _scenario_engine,
    "mig": _scenario_mig,
    "old_driver": _scenario_old_driver,
    "gpu_lost": _scenario_gpu_lost,
}
GOLDEN_CASES = [
    ("h100", "busy"), ("h100", "idle"), ("h100", "engine"), ("h100", "mig"), ("h100", "gpu_lost"),
    ("h200", "busy"), ("a100", "busy"), ("a100", "old_driver"), ("l4", "busy"), ("l4", "idle"),
]


def golden_text(model: str, state: str) -> str:
    fake, options = SCENARIOS[state](model)
    source = make_source(fake, xid_events=False, **options)
    try:
        collect(source)
        fake.advance(1.0)
        if state == "gpu_lost":
            fake.lose(1)
        return render(collect(source).samples).decode()
    finally:
        close(source)


@pytest.mark.parametrize(("model", "state"), GOLDEN_CASES, ids=[f"{m}__{s}" for m, s in GOLDEN_CASES])
def test_golden(model: str, state: str, assert_golden) -> None:
    assert_golden(f"gpu/{model}__{state}.metrics", golden_text(model, state))


def test_golden_folder_has_no_stale_cases() -> None:
    expected = {f"{m}__{s}.metrics" for m, s in GOLDEN_CASES}
    present = {p.name for p in (GOLDEN / "gpu").glob("*.metrics")}
    assert present == expected


@pytest.mark.parametrize("path", sorted((GOLDEN / "gpu").glob("*.metrics")), ids=lambda p: p.stem)
def test_golden_passes_promtool(path) -> None:
    promtool_check_metrics(path.read_bytes())


def test_every_gpu_family_is_emitted_and_catalogued() -> None:
    """The catalogue and the source agree: an H100 under load with an XID emits every family."""
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake)
    try:
        collect(source)
        fake.advance(1.0)
        fake.inject_xid(0, 79)
        wait_for(lambda: values(collect(source), "llm_gpu_xid_errors_total"))
        fake.advance(1.0)
        data = collect(source)
    finally:
        close(source)
    emitted = {s.name for s in data.samples}
    assert emitted == GPU_FAMILIES
    for sample in data.samples:
        fam = catalog.family_of(sample.name)
        assert fam is not None and fam.source in ("nvml", "gpm")
        assert {k for k, _ in sample.labels} == set(fam.labels), sample


def test_model_coverage_differs_as_the_hardware_does() -> None:
    fake = FakeNvml(["h100", "a100", "l4"], "busy")
    source = make_source(fake, xid_events=False)
    data = two_cycles(fake, source)
    close(source)
    h100, a100, l4 = (names_for_gpu(data, g) for g in "012")
    gpm = {"llm_gpu_dram_bandwidth_utilization_ratio", "llm_gpu_sm_active_ratio",
           "llm_gpu_sm_occupancy_ratio", "llm_gpu_tensor_active_ratio"}
    assert gpm <= h100 and not gpm & a100 and not gpm & l4
    # A100: NVLink from per-link counters, no PCIe byte counters and no GPM, so no PCIe rate.
    assert one(data, "llm_gpu_nvlink_tx_bytes_per_second", gpu="1") == 12 * 2_000_000 * 1024
    assert "llm_gpu_pcie_tx_bytes_per_second" not in a100
    # L4: PCIe rates from counters, no NVLink, no HBM sensor, no row remapping.
    assert one(data, "llm_gpu_pcie_rx_bytes_per_second", gpu="2") == 3_000_000_000
    assert not {"llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_memory_temperature_celsius",
                "llm_gpu_remapped_rows"} & l4
    assert data.attrs["gpm"] == "1,0,0"
    assert data.attrs["names"] == "NVIDIA H100 80GB HBM3,NVIDIA A100-SXM4-80GB,NVIDIA L4"
    assert data.attrs["pci_bus_ids"].split(",")[0] == "0000:18:00.0"


def test_units_are_converted_to_base_units() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    data = two_cycles(fake, source)
    close(source)
    dev = fake.devices[0]
    assert one(data, "llm_gpu_power_watts") == dev.load.power_mw / 1000
    assert one(data, "llm_gpu_power_limit_watts") == 700.0
    assert one(data, "llm_gpu_sm_clock_hertz") == dev.load.sm_clock_mhz * 1e6
    assert one(data, "llm_gpu_memory_clock_max_hertz") == 2619e6
    assert one(data, "llm_gpu_utilization_ratio") == 0.97
    assert one(data, "llm_gpu_energy_joules_total") == int(dev.energy_mj) / 1000
    # v2 memory info: used excludes reserved.
    assert one(data, "llm_gpu_memory_used_bytes") == dev.load.memory_used
    assert one(data, "llm_gpu_memory_reserved_bytes") == dev.model.memory_reserved
    assert one(data, "llm_gpu_clock_event_active", reason="sw_power_cap") == 1.0
    assert one(data, "llm_gpu_clock_event_active", reason="gpu_idle") == 0.0


def test_idle_gpu_shows_link_trained_down_and_idle_reason() -> None:
    fake = FakeNvml(["h100"], "idle")
    source = make_source(fake, xid_events=False)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_pcie_link_generation", state="current") == 1.0
    assert one(data, "llm_gpu_pcie_link_generation", state="max") == 5.0
    assert one(data, "llm_gpu_clock_event_active", reason="gpu_idle") == 1.0


def test_unsupported_clock_reasons_are_not_emitted() -> None:
    fake = FakeNvml(["l4"], "busy")  # supports 0x16F: no sync_boost (0x10), no power brake (0x80)
    source = make_source(fake, xid_events=False)
    data = collect(source)
    close(source)
    reasons = {s.label("reason") for s in data.samples if s.name == "llm_gpu_clock_event_active"}
    assert len(reasons) == 7
    assert "sync_boost" not in reasons and "hw_power_brake_slowdown" not in reasons


# -- degradation ------------------------------------------------------------------------------------

def test_field_not_supported_is_omitted_for_that_gpu_and_logged_once(caplog) -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    fake.fail(0, "nvmlDeviceGetPowerUsage", F.NVMLError_NotSupported)
    source = make_source(fake, xid_events=False)
    with caplog.at_level(logging.INFO, logger="exporter.sources.gpu"):
        for _ in range(3):
            data = collect(source)
            fake.advance(1.0)
    close(source)
    assert values(data, "llm_gpu_power_watts", gpu="0") == []
    assert values(data, "llm_gpu_power_watts", gpu="1") == [651.0]
    assert one(data, "llm_gpu_up", gpu="0") == 1.0
    assert "llm_gpu_temperature_celsius" in names_for_gpu(data, "0")
    # Asked once, then remembered as absent; listed once in the log.
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 + 3
    assert sum("power not available" in r.getMessage() for r in caplog.records) == 1


def test_transient_field_failure_skips_one_cycle_only() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.fail(0, "nvmlDeviceGetPowerUsage", F.NVMLError_NoData)
    source = make_source(fake, xid_events=False)
    assert values(collect(source), "llm_gpu_power_watts") == []
    del fake.devices[0].failures["nvmlDeviceGetPowerUsage"]
    assert values(collect(source), "llm_gpu_power_watts") == [651.0]
    close(source)


def test_gpu_lost_mid_run_marks_it_down_keeps_the_others_and_reinitialises(caplog) -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    source = make_source(fake, retry_interval_s=5.0)
    first = collect(source)
    assert one(first, "llm_gpu_up", gpu="1") == 1.0
    fake.lose(1)
    fake.advance(1.0)
    with caplog.at_level(logging.WARNING, logger="exporter.sources.gpu"):
        data = collect(source)
    assert one(data, "llm_gpu_up", gpu="1") == 0.0
    assert names_for_gpu(data, "1") == {"llm_gpu_up"}  # nothing stale for the lost GPU
    assert one(data, "llm_gpu_up", gpu="0") == 1.0
    assert one(data, "llm_gpu_power_watts", gpu="0") == 651.0
    lost_labels = next(s.labels for s in data.samples if s.name == "llm_gpu_up" and s.label("gpu") == "1")
    assert dict(lost_labels)["uuid"] == fake.devices[1].uuid
    assert data.attrs["state"] == "gpu_lost" and data.attrs["lost"] == "1"
    assert any("lost" in r.getMessage() for r in caplog.records)

    # Within the backoff NVML is left alone; after it, NVML is re-initialised.
    fake.advance(1.0)
    collect(source)
    assert fake.inits == 1
    fake.recover(1)
    fake.advance(5.0)
    data = collect(source)
    assert fake.inits == 2
    assert values(data, "llm_gpu_up") == [1.0, 1.0]
    assert data.attrs["state"] == "ok"
    assert fake.refcount == 1  # the old generation was shut down
    close(source)
    assert fake.refcount == 0 and fake.gpm_samples_live == 0 and fake.event_sets_live == 0


def test_gpu_still_lost_after_reinit_backs_off_exponentially() -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    source = make_source(fake, retry_interval_s=10.0, xid_events=False)
    collect(source)
    fake.lose(1)
    collect(source)  # lost: retry in 10 s
    fake.advance(10.0)
    data = collect(source)  # re-init; GPU 1 cannot be opened: retry in 20 s
    assert fake.inits == 2
    assert one(data, "llm_gpu_up", gpu="1") == 0.0
    assert one(data, "llm_gpu_up", gpu="0") == 1.0
    fake.advance(10.0)
    collect(source)
    assert fake.inits == 2
    fake.advance(10.0)
    collect(source)
    assert fake.inits == 3
    close(source)


def test_gpu_lost_before_start_is_reported_down_by_index() -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    fake.lose(1)
    source = make_source(fake, xid_events=False)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_up", gpu="1") == 0.0
    assert one(data, "llm_gpu_up", gpu="0") == 1.0
    assert data.attrs["gpus"] == "2"


def test_lost_error_codes_other_than_gpu_is_lost_also_mark_down() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    collect(source)
    fake.fail(0, "nvmlDeviceGetClockInfo", F.NVMLError_Unknown)
    data = collect(source)
    close(source)
    assert values(data, "llm_gpu_up") == [0.0]


@pytest.mark.parametrize(("error", "state"), [
    (F.NVMLError_LibraryNotFound, "nvml_missing"),
    (F.NVMLError_DriverNotLoaded, "driver_not_loaded"),
])
def test_no_library_or_driver_is_a_normal_state_in_auto_mode(error, state, caplog) -> None:
    fake = FakeNvml(["h100"])
    fake.init_error = error
    source = make_source(fake, retry_interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="exporter.sources.gpu"):
        for _ in range(3):
            data = collect(source)
    assert data.samples == ()
    assert data.attrs["state"] == state
    assert sum("NVML unavailable" in r.getMessage() for r in caplog.records) == 1
    # The driver appears later: picked up on a later cycle.
    fake.init_error = None
    fake.advance(1.0)
    assert values(collect(source), "llm_gpu_up") == [1.0]
    close(source)


@pytest.mark.parametrize(("error", "reason"), [
    (F.NVMLError_LibraryNotFound, "nvml_missing"),
    (F.NVMLError_DriverNotLoaded, "driver_not_loaded"),
    (F.NVMLError_NoPermission, "nvml_permission"),
    (F.NVMLError_LibRmVersionMismatch, "nvml_mismatch"),
    (F.NVMLLibraryMismatchError("mismatch"), "nvml_mismatch"),
])
def test_init_failure_is_a_source_error_when_nvml_is_required(error, reason) -> None:
    fake = FakeNvml(["h100"])
    fake.init_error = error
    source = make_source(fake, required=True)
    with pytest.raises(SourceError) as info:
        collect(source)
    assert info.value.reason == reason


@pytest.mark.parametrize("error", [F.NVMLError_LibRmVersionMismatch, F.NVMLLibraryMismatchError("x")])
def test_version_mismatch_is_an_error_even_in_auto_mode(error) -> None:
    fake = FakeNvml(["h100"])
    fake.init_error = error
    with pytest.raises(SourceError) as info:
        collect(make_source(fake))
    assert info.value.reason == "nvml_mismatch"


def test_missing_pynvml_package(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    data = collect(NvmlSource(NvmlOptions()))
    assert data.samples == () and data.attrs["state"] == "nvml_missing"
    with pytest.raises(SourceError) as info:
        collect(NvmlSource(NvmlOptions(required=True)))
    assert info.value.reason == "nvml_missing"


def test_zero_gpus() -> None:
    fake = FakeNvml([])
    data = collect(make_source(fake))
    assert data.samples == () and data.attrs["state"] == "no_gpus"
    assert fake.refcount == 0  # the init that found nothing was balanced by a shutdown
    with pytest.raises(SourceError) as info:
        collect(make_source(fake, required=True))
    assert info.value.reason == "no_gpus"


def test_driver_gone_after_gpus_were_seen_reports_them_down() -> None:
    fake = FakeNvml(["h100", "l4"])
    source = make_source(fake, retry_interval_s=1.0, xid_events=False)
    collect(source)
    fake.lose(0)
    fake.lose(1)
    collect(source)
    fake.init_error = F.NVMLError_DriverNotLoaded
    fake.advance(2.0)
    data = collect(source)
    assert values(data, "llm_gpu_up") == [0.0, 0.0]
    assert {s.label("name") for s in data.samples} == {"NVIDIA H100 80GB HBM3", "NVIDIA L4"}
    assert data.attrs["state"] == "driver_not_loaded"
    close(source)


def test_old_driver_falls_back_to_older_calls() -> None:
    fake = FakeNvml(["a100"], "busy")
    fake.old_driver = True
    source = make_source(fake, xid_events=False)
    data = collect(source)
    close(source)
    dev = fake.devices[0]
    # v1 memory info: used includes reserved, no reserved series.
    assert one(data, "llm_gpu_memory_used_bytes") == dev.load.memory_used + dev.model.memory_reserved
    assert values(data, "llm_gpu_memory_reserved_bytes") == []
    # The unversioned process call raised NVMLLibraryMismatchError; _v2 answered.
    assert one(data, "llm_gpu_engine_memory_used_bytes") == dev.load.memory_used
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1
    assert one(data, "llm_gpu_temperature_celsius") == 67.0
    assert one(data, "llm_gpu_clock_event_active", reason="sw_power_cap") == 1.0


def test_mig_mode_is_noted_and_unsupported_fields_omitted(caplog) -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.set_mig(0, True)
    source = make_source(fake, xid_events=False)
    with caplog.at_level(logging.INFO, logger="exporter.sources.gpu"):
        data = collect(source)
    close(source)
    info = next(s for s in data.samples if s.name == "llm_gpu_info")
    assert info.label("mig_mode") == "enabled"
    assert data.attrs["mig"] == "enabled"
    assert not {"llm_gpu_utilization_ratio", "llm_gpu_remapped_rows"} & names_for_gpu(data, "0")
    assert "llm_gpu_memory_used_bytes" in names_for_gpu(data, "0")
    assert any("MIG enabled" in r.getMessage() for r in caplog.records)


def test_nvml_runs_off_the_event_loop_and_never_uses_the_blocking_pcie_call() -> None:
    fake = FakeNvml(["h100", "l4"], "busy")
    threads: set[int] = set()
    original = fake.nvmlDeviceGetPowerUsage

    def spy(handle):
        threads.add(threading.get_ident())
        return original(handle)

    fake.nvmlDeviceGetPowerUsage = spy
    source = make_source(fake)

    async def run() -> int:
        for _ in range(3):
            await source.collect()
            fake.advance(1.0)
        await source.close()
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert threads and loop_thread not in threads
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_a_wedged_cycle_is_refused_instead_of_queued() -> None:
    fake = FakeNvml(["h100"], "busy")
    release = threading.Event()
    original = fake.nvmlDeviceGetPowerUsage

    def hang(handle):
        release.wait(5)
        return original(handle)

    fake.nvmlDeviceGetPowerUsage = hang
    source = make_source(fake, xid_events=False)

    async def run() -> None:
        first = asyncio.create_task(source.collect())
        await asyncio.sleep(0.05)
        with pytest.raises(SourceError) as info:
            await source.collect()
        assert info.value.reason == "busy"
        release.set()
        await first

    asyncio.run(run())
    close(source)


def test_pynvml_is_not_imported_at_import_time() -> None:
    code = "import sys, exporter.sources.gpu.nvml, exporter.catalog; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# -- engine memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("pids", "expected"), [
    (None, "all"),
    (lambda: [ENGINE_PID], "engine"),
    (lambda: [], None),  # engine process not found: no made-up zero
    (lambda: [99999], 0.0),  # found, but it has no context on this GPU: a real zero
])
def test_engine_memory(pids, expected) -> None:
    fake = FakeNvml(["h100"], "busy")
    data = collect(make_source(fake, engine_pids=pids, xid_events=False))
    used = fake.devices[0].load.memory_used
    want = {"all": used, "engine": used - GIB}.get(expected, expected)  # type: ignore[arg-type]
    assert values(data, "llm_gpu_engine_memory_used_bytes") == ([] if want is None else [want])


def test_engine_memory_omitted_when_a_counted_process_has_no_value() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.set_load(0, processes=((ENGINE_PID, None),))
    data = collect(make_source(fake, xid_events=False))
    assert values(data, "llm_gpu_engine_memory_used_bytes") == []
    assert one(data, "llm_gpu_up") == 1.0


def test_failing_engine_pid_lookup_only_drops_engine_memory() -> None:
    def broken() -> list[int]:
        raise RuntimeError("proc gone")

    fake = FakeNvml(["h100"], "busy")
    data = collect(make_source(fake, engine_pids=broken, xid_events=False))
    assert values(data, "llm_gpu_engine_memory_used_bytes") == []
    assert one(data, "llm_gpu_power_watts") == 651.0


# -- GPM ---------------------------------------------------------------------------------------

def test_gpm_metrics_average_over_the_window_between_two_cycles() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    first = collect(source)
    assert values(first, "llm_gpu_dram_bandwidth_utilization_ratio") == []  # one sample is not a rate
    fake.set_load(0, dram_bw_pct=50.0, pcie_tx_bps=1_000_000_000)
    fake.advance(0.5)
    fake.set_load(0, dram_bw_pct=90.0, pcie_tx_bps=3_000_000_000)
    fake.advance(0.5)
    data = collect(source)
    assert one(data, "llm_gpu_dram_bandwidth_utilization_ratio") == pytest.approx(0.70)
    assert one(data, "llm_gpu_pcie_tx_bytes_per_second") == pytest.approx(2_000_000_000)
    assert one(data, "llm_gpu_nvlink_tx_bytes_per_second") == pytest.approx(18 * 2_000_000 * 1024)
    # The next window starts where this one ended.
    fake.advance(1.0)
    assert one(collect(source), "llm_gpu_dram_bandwidth_utilization_ratio") == pytest.approx(0.90)
    close(source)
    assert fake.gpm_samples_live == 0


def test_gpm_waits_for_100ms_without_sleeping(monkeypatch) -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    collect(source)
    fake.set_load(0, sm_active_pct=20.0)
    fake.advance(0.05)
    # A wall-time bound cannot see a 100 ms sleep (the cycle takes tens of ms either way), so the
    # sleeps themselves are recorded: the cycle 50 ms after the last must return, not wait.
    slept: list[float] = []
    real_sleep, real_async_sleep = time.sleep, asyncio.sleep

    def recording_sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    async def recording_async_sleep(seconds: float, *args: object, **kwargs: object) -> object:
        slept.append(seconds)
        return await real_async_sleep(seconds, *args, **kwargs)

    monkeypatch.setattr(time, "sleep", recording_sleep)
    monkeypatch.setattr(asyncio, "sleep", recording_async_sleep)
    fast = collect(source)
    monkeypatch.undo()
    assert [s for s in slept if s >= 0.01] == [], slept
    assert values(fast, "llm_gpu_sm_active_ratio") == []
    fake.set_load(0, sm_active_pct=80.0)
    fake.advance(0.10)
    data = collect(source)
    # The window spans both cycles (0.15 s), from the sample kept at the first one.
    assert one(data, "llm_gpu_sm_active_ratio") == pytest.approx((20 * 0.05 + 80 * 0.10) / 0.15 / 100)
    assert fake.gpm_short_windows == 0
    assert fake.gpm_samples_live == 2  # two buffers rotated, never one per cycle
    close(source)
    assert fake.gpm_samples_live == 0


def test_gpm_metric_nvml_cannot_compute_is_omitted() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.gpm_unsupported.add(F.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
    data = two_cycles(fake, make_source(fake, xid_events=False))
    assert values(data, "llm_gpu_tensor_active_ratio") == []
    assert one(data, "llm_gpu_sm_active_ratio") == pytest.approx(0.91)


def test_gpm_refused_falls_back_to_cumulative_counters() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    collect(source)
    fake.fail(0, "nvmlGpmSampleGet", F.NVMLError_NotSupported)
    fake.advance(1.0)
    data = collect(source)
    assert values(data, "llm_gpu_sm_active_ratio") == []
    assert data.attrs["gpm"] == "0"
    assert fake.gpm_samples_live == 0
    fake.advance(1.0)
    data = collect(source)
    assert one(data, "llm_gpu_pcie_rx_bytes_per_second") == 3_000_000_000
    assert one(data, "llm_gpu_nvlink_rx_bytes_per_second") == 18 * 1_500_000 * 1024
    close(source)


def test_gpm_can_be_disabled() -> None:
    fake = FakeNvml(["h100"], "busy")
    data = two_cycles(fake, make_source(fake, gpm=False, xid_events=False))
    assert values(data, "llm_gpu_tensor_active_ratio") == []
    assert one(data, "llm_gpu_pcie_tx_bytes_per_second") == 1_500_000_000
    assert fake.calls["nvmlGpmSampleAlloc"] == 0


# -- counters -----------------------------------------------------------------------------------

def test_energy_counter_survives_a_driver_reload() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_events=False)
    before = one(collect(source), "llm_gpu_energy_joules_total")
    fake.devices[0].energy_mj = 2_000.0  # the driver reloaded: NVML's counter restarted
    after_reset = one(collect(source), "llm_gpu_energy_joules_total")
    assert after_reset == pytest.approx(before + 2.0)
    fake.advance(1.0)  # 651 W for 1 s
    assert one(collect(source), "llm_gpu_energy_joules_total") == pytest.approx(before + 2.0 + 651.0)
    close(source)


def test_counter_rates_handle_wrap_reset_and_cached_values() -> None:
    rates = CounterRates()
    assert rates.update("k", 100.0, 10.0) is None
    assert rates.update("k", 300.0, 12.0) == 100.0
    # 32-bit wrap: 2**32 - 100 -> 50 is 150 units.
    rates.update("w", 2**32 - 100.0, 0.0, wrap=2.0**32)
    assert rates.update("w", 50.0, 1.0, wrap=2.0**32) == 150.0
    # A 64-bit counter going down is a reset: no rate, then rates resume from the new base.
    assert rates.update("k", 5.0, 13.0) is None
    assert rates.update("k", 25.0, 14.0) == 20.0
    # A cached value (same timestamp) keeps the older point.
    assert rates.update("k", 25.0, 14.0) is None
    assert rates.update("k", 45.0, 15.0) == 20.0


def test_reset_safe_totals_never_decrease() -> None:
    totals = ResetSafeTotals()
    readings = [10.0, 20.0, 3.0, 8.0, 1.0, 4.0]
    out = [totals.update("gpu", r) for r in readings]
    assert out == [10.0, 20.0, 23.0, 28.0, 29.0, 32.0]


def test_reset_safe_totals_hold_a_reading_a_hair_below_the_last_instead_of_adding_a_lifetime() -> None:
    totals = ResetSafeTotals()
    # Two readers of one energy counter (the field, then the dedicated call) differ by 1 mJ.
    assert [totals.update("gpu", r) for r in (1e9, 1e9 - 1, 1e9 + 5)] == [1e9, 1e9, 1e9 + 5]
    assert totals.update("gpu", 10.0) == 1e9 + 5 + 10  # a real reset still counts
    small = ResetSafeTotals()  # a small counter's drop is a reset however small the step
    assert [small.update("ecc", r) for r in (2.0, 1.0)] == [2.0, 3.0]


def test_nvlink_link_that_fails_once_skips_the_rate_for_that_cycle() -> None:
    fake = FakeNvml(["a100"], "busy")
    source = make_source(fake, xid_events=False)
    collect(source)
    original = fake._field

    def flaky(dev, fid, scope):
        out = original(dev, fid, scope)
        if fid == F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and scope == 3:
            out.nvmlReturn = F.NVML_ERROR_NO_DATA
        return out

    fake._field = flaky
    fake.advance(1.0)
    assert values(collect(source), "llm_gpu_nvlink_tx_bytes_per_second") == []
    fake._field = original
    fake.advance(1.0)
    # Computed over both intervals from the last complete reading.
    assert one(collect(source), "llm_gpu_nvlink_tx_bytes_per_second") == 12 * 2_000_000 * 1024
    close(source)


def test_bus_id_is_normalised_to_the_sysfs_form() -> None:
    assert normalise_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalise_bus_id("0000:3b:00.0") == "0000:3b:00.0"


# -- NVML calls per cycle ----------------------------------------------------------------------
# On a GPU host each call is a driver round trip plus pynvml's ctypes work: the number of calls a
# steady cycle makes is the cost that transfers from these tests to real hardware.

def _calls_per_cycle(fake: FakeNvml, source: NvmlSource, cycles: int = 20) -> dict[str, float]:
    before = fake.calls.copy()
    for _ in range(cycles):
        fake.advance(1.0)
        collect(source)
    return {name: n / cycles for name, n in (fake.calls - before).items()}


def test_a_steady_cycle_asks_nvml_once_per_reading() -> None:
    """Counters ride in one field batch per GPU, values fixed for the generation are not asked
    again, and the enforced power limit is asked every POWER_LIMIT_REFRESH_S."""
    fake = FakeNvml(["h100", "a100"], "busy")
    source = make_source(fake, xid_events=False)
    two_cycles(fake, source)  # the second allocates GPM's second sample buffer
    per_cycle = _calls_per_cycle(fake, source)
    close(source)
    per_gpu = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
               "nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons",
               "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
               "nvmlDeviceGetFieldValues", "nvmlDeviceGetComputeRunningProcesses")
    expected = dict.fromkeys(per_gpu, 2.0)
    expected["nvmlDeviceGetClockInfo"] = 4.0  # SM and memory clock
    expected["nvmlGpmSampleGet"] = expected["nvmlGpmMetricsGet"] = 1.0  # the H100 only
    expected["nvmlDeviceGetEnforcedPowerLimit"] = 2 / POWER_LIMIT_REFRESH_S
    # The H100 sits in an NVSwitch fabric; the A100 refused the fabric call once and is not asked again.
    expected["nvmlDeviceGetGpuFabricInfoV"] = 1 / FABRIC_REFRESH_S
    assert per_cycle == pytest.approx(expected)


def test_power_limit_is_refreshed_on_a_slow_cadence() -> None:
    fake = FakeNvml(["h100"], "busy")
    dev = fake.devices[0]
    source = make_source(fake, xid_events=False)
    assert one(collect(source), "llm_gpu_power_limit_watts") == 700.0
    dev.model = dataclasses.replace(dev.model, power_limit_mw=500_000)  # an operator sets a cap
    fake.advance(POWER_LIMIT_REFRESH_S - 1.0)
    assert one(collect(source), "llm_gpu_power_limit_watts") == 700.0  # the last reading, reused
    fake.advance(1.0)
    assert one(collect(source), "llm_gpu_power_limit_watts") == 500.0
    # A failed refresh omits the series for that cycle and is retried on the next one.
    fake.fail(0, "nvmlDeviceGetEnforcedPowerLimit", F.NVMLError_NoData)
    fake.advance(POWER_LIMIT_REFRESH_S)
    assert values(collect(source), "llm_gpu_power_limit_watts") == []
    del dev.failures["nvmlDeviceGetEnforcedPowerLimit"]
    fake.advance(1.0)
    assert one(collect(source), "llm_gpu_power_limit_watts") == 500.0
    close(source)


def test_the_default_power_limit_is_read_until_it_answers_once_and_survives_a_lowered_limit() -> None:
    fake = FakeNvml(["h200"], "busy")
    dev = fake.devices[0]
    fake.fail(0, "nvmlDeviceGetPowerManagementDefaultLimit", F.NVMLError_NoData)  # transient: asked again
    source = make_source(fake, xid_events=False)
    data = collect(source)
    assert values(data, "llm_gpu_power_default_limit_watts") == [] and one(data, "llm_gpu_up") == 1.0
    del dev.failures["nvmlDeviceGetPowerManagementDefaultLimit"]
    fake.advance(POWER_LIMIT_REFRESH_S)
    assert one(collect(source), "llm_gpu_power_default_limit_watts") == 700.0
    dev.model = dataclasses.replace(dev.model, power_limit_mw=450_000)  # an operator lowers the limit
    for _ in range(3):
        fake.advance(POWER_LIMIT_REFRESH_S)
        data = collect(source)
    assert one(data, "llm_gpu_power_limit_watts") == 450.0
    assert one(data, "llm_gpu_power_default_limit_watts") == 700.0
    assert fake.calls["nvmlDeviceGetPowerManagementDefaultLimit"] == 2  # fixed by the board: never asked again
    close(source)


def test_a_gpu_without_a_default_power_limit_omits_only_that_series() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.fail(0, "nvmlDeviceGetPowerManagementDefaultLimit", F.NVMLError_NotSupported)
    source = make_source(fake, xid_events=False)
    collect(source)
    fake.advance(POWER_LIMIT_REFRESH_S)
    data = collect(source)
    assert values(data, "llm_gpu_power_default_limit_watts") == []
    assert one(data, "llm_gpu_power_limit_watts") == 700.0
    assert fake.calls["nvmlDeviceGetPowerManagementDefaultLimit"] == 1  # not supported: marked absent
    close(source)


def test_a_counter_the_field_batch_refuses_is_read_with_its_own_call() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.devices[0].ecc_corrected = 3
    original = fake._field

    def refuse_energy_and_corrected_ecc(dev, fid, scope):
        out = original(dev, fid, scope)
        if fid in (F.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, F.NVML_FI_DEV_ECC_SBE_VOL_TOTAL):
            out.nvmlReturn = F.NVML_ERROR_NOT_SUPPORTED
        return out

    fake._field = refuse_energy_and_corrected_ecc
    source = make_source(fake, xid_events=False)
    first = collect(source)  # refused in the batch: asked by call from the next cycle on
    assert values(first, "llm_gpu_ecc_errors_total", type="corrected") == []
    fake.advance(1.0)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_energy_joules_total") == int(fake.devices[0].energy_mj) / 1000
    assert one(data, "llm_gpu_ecc_errors_total", type="corrected") == 3.0
    assert one(data, "llm_gpu_ecc_errors_total", type="uncorrected") == 0.0  # still from the batch
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1


def test_a_counter_the_batch_keeps_answering_without_a_value_moves_to_its_own_call() -> None:
    fake = FakeNvml(["h100"], "busy")
    original = fake._field
    no_data = {"cycles": 1}  # energy: NO_DATA in the batch for this many cycles

    def energy_without_data(dev, fid, scope):
        out = original(dev, fid, scope)
        if fid == F.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and no_data["cycles"] > 0:
            out.nvmlReturn = F.NVML_ERROR_NO_DATA
        return out

    fake._field = energy_without_data
    source = make_source(fake, xid_events=False)
    # One miss costs one sample; the batch answers again and keeps the value.
    assert values(collect(source), "llm_gpu_energy_joules_total") == []
    no_data["cycles"] = 0
    fake.advance(1.0)
    assert len(values(collect(source), "llm_gpu_energy_joules_total")) == 1
    # Misses that last hand the value to its own call, and the series comes back.
    no_data["cycles"] = 10**6
    seen = []
    for _ in range(2 + 2):
        fake.advance(1.0)
        seen.append(len(values(collect(source), "llm_gpu_energy_joules_total")))
    close(source)
    assert seen == [0, 0, 0, 1], seen
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_field_batch_refused_as_a_whole_falls_back_to_one_call_per_value() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.fail(0, "nvmlDeviceGetFieldValues", F.NVMLError_NotSupported)
    fake.devices[0].pcie_replays = 12
    source = make_source(fake, xid_events=False)
    collect(source)
    fake.advance(1.0)
    data = collect(source)
    close(source)
    names = names_for_gpu(data, "0")
    assert {"llm_gpu_energy_joules_total", "llm_gpu_ecc_errors_total", "llm_gpu_remapped_rows"} <= names
    assert one(data, "llm_gpu_pcie_replay_errors_total") == 12.0
    assert "llm_gpu_memory_temperature_celsius" not in names  # only the batch serves it
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # refused once, not asked again


def test_field_batch_decodes_pynvml_ctypes_structs() -> None:
    """The fake answers field reads with plain objects, pynvml with a ctypes array of
    c_nvmlFieldValue_t: the source must read both the same way."""
    import pynvml  # nvidia-ml-py: a dependency of the project, always there

    def render_two_cycles(as_ctypes: bool) -> bytes:
        fake = FakeNvml(["a100", "l4"], "busy")  # NVLink counters; PCIe counters; refused fields
        plain = fake.nvmlDeviceGetFieldValues

        def ctypes_answer(handle, field_ids):
            answers = plain(handle, field_ids)
            array = (pynvml.c_nvmlFieldValue_t * len(answers))()
            for slot, answer in zip(array, answers, strict=True):
                slot.fieldId, slot.scopeId, slot.timestamp = answer.fieldId, answer.scopeId, answer.timestamp
                slot.valueType, slot.nvmlReturn = answer.valueType, answer.nvmlReturn
                member = {F.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal"}.get(answer.valueType, "ullVal")
                setattr(slot.value, member, getattr(answer.value, member))
            return array

        if as_ctypes:
            fake.nvmlDeviceGetFieldValues = ctypes_answer
        source = make_source(fake, xid_events=False)
        try:
            return render(two_cycles(fake, source).samples)
        finally:
            close(source)

    assert render_two_cycles(as_ctypes=True) == render_two_cycles(as_ctypes=False)


# -- recovery action and NVLink fabric -------------------------------------------------------------

def test_recovery_action_and_fabric_state_follow_the_driver() -> None:
    """An HGX H100: the recovery action from the field batch, the fabric state refreshed every
    FABRIC_REFRESH_S; the status appears once registration completed, the health summary with v3."""
    fake = FakeNvml(["h100", "h100"], "busy")
    source = make_source(fake, xid_events=False)
    data = collect(source)
    assert values(data, "llm_gpu_recovery_action") == [0.0, 0.0]
    assert values(data, "llm_gpu_fabric_state") == [3.0, 3.0]
    assert values(data, "llm_gpu_fabric_status") == [0.0, 0.0]
    assert values(data, "llm_gpu_fabric_health") == [1.0, 1.0]
    # The driver asks for a reset of GPU 1 (e.g. after an uncontained ECC error): seen next cycle.
    fake.set_recovery_action(1, F.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    fake.set_fabric(0, state=F.NVML_GPU_FABRIC_STATE_IN_PROGRESS, health=F.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
    fake.advance(1.0)
    data = collect(source)
    assert one(data, "llm_gpu_recovery_action", gpu="1") == 1.0
    assert one(data, "llm_gpu_recovery_action", gpu="0") == 0.0
    assert one(data, "llm_gpu_fabric_state", gpu="0") == 3.0  # the last reading, reused until the refresh
    fake.advance(FABRIC_REFRESH_S)
    data = collect(source)
    assert one(data, "llm_gpu_fabric_state", gpu="0") == 2.0
    assert values(data, "llm_gpu_fabric_status", gpu="0") == []  # only meaningful once completed
    assert one(data, "llm_gpu_fabric_health", gpu="0") == 2.0
    # Registration completes, but failed: the status carries NVML's error code.
    fake.set_fabric(0, state=F.NVML_GPU_FABRIC_STATE_COMPLETED, status=F.NVML_ERROR_NOT_READY)
    fake.advance(FABRIC_REFRESH_S)
    data = collect(source)
    assert one(data, "llm_gpu_fabric_state", gpu="0") == 3.0
    assert one(data, "llm_gpu_fabric_status", gpu="0") == float(F.NVML_ERROR_NOT_READY)
    close(source)


def test_gpus_outside_an_nvswitch_fabric_have_no_fabric_series_and_are_asked_once(caplog) -> None:
    """A100 (the fabric call answers NotSupported) and L4 (it answers state NOT_SUPPORTED): no
    fabric series, never a made-up 0, one log line each, and no fabric call after the first."""
    fake = FakeNvml(["a100", "l4"], "busy")
    source = make_source(fake, xid_events=False)
    with caplog.at_level(logging.INFO, logger="exporter.sources.gpu"):
        for _ in range(3):
            data = collect(source)
            fake.advance(FABRIC_REFRESH_S)
    close(source)
    names = {s.name for s in data.samples}
    assert not names & {"llm_gpu_fabric_state", "llm_gpu_fabric_status", "llm_gpu_fabric_health"}
    assert values(data, "llm_gpu_recovery_action") == [0.0, 0.0]  # the field is there on both
    fabric_calls = fake.calls["nvmlDeviceGetGpuFabricInfoV"] + fake.calls["nvmlDeviceGetGpuFabricInfo"]
    # Once per generation: the A100 refuses each of the three forms once, the L4 answers v3 with state 0.
    assert fabric_calls == 3 + 1
    fabric_logs = [r for r in caplog.records if "fabric" in r.getMessage()]
    assert len(fabric_logs) == 2, [r.getMessage() for r in fabric_logs]


def test_an_older_driver_falls_back_to_older_fabric_forms() -> None:
    """Driver before 550: v3 refused (ArgumentVersionMismatch), v2 answers state and status without
    a health summary. Before 535 (no versioned symbol, no recovery-action field): the deprecated
    call answers; the recovery action is absent."""
    fake = FakeNvml(["h100"], "busy")
    fake.fabric_v3 = False
    source = make_source(fake, xid_events=False)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_fabric_state") == 3.0 and one(data, "llm_gpu_fabric_status") == 0.0
    assert values(data, "llm_gpu_fabric_health") == []
    assert one(data, "llm_gpu_recovery_action") == 0.0

    fake = FakeNvml(["h100"], "busy")
    fake.old_driver = True
    source = make_source(fake, xid_events=False)
    data = collect(source)
    fake.advance(FABRIC_REFRESH_S)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_fabric_state") == 3.0
    assert values(data, "llm_gpu_fabric_health") == [] and values(data, "llm_gpu_recovery_action") == []
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 2  # FunctionNotFound for v3 and v2: not asked again
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 2


def test_fabric_read_errors_skip_a_cycle_or_mark_the_gpu_lost() -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    source = make_source(fake, xid_events=False)
    collect(source)
    # A transient failure: no fabric series this cycle (not a stale or made-up one), back next cycle.
    fake.fail(0, "nvmlDeviceGetGpuFabricInfoV", F.NVMLError_NoData)
    fake.advance(FABRIC_REFRESH_S)
    data = collect(source)
    assert values(data, "llm_gpu_fabric_state", gpu="0") == [] and one(data, "llm_gpu_up", gpu="0") == 1.0
    del fake.devices[0].failures["nvmlDeviceGetGpuFabricInfoV"]
    fake.advance(1.0)
    assert one(collect(source), "llm_gpu_fabric_state", gpu="0") == 3.0
    # GpuIsLost from the fabric call: that GPU is down, the other still served.
    fake.fail(1, "nvmlDeviceGetGpuFabricInfoV", F.NVMLError_GpuIsLost)
    fake.advance(FABRIC_REFRESH_S)
    data = collect(source)
    close(source)
    assert one(data, "llm_gpu_up", gpu="1") == 0.0 and values(data, "llm_gpu_fabric_state", gpu="1") == []
    assert one(data, "llm_gpu_fabric_state", gpu="0") == 3.0


def test_fabric_info_is_read_through_pynvml_ctypes_structs() -> None:
    """With pynvml's own struct classes (as on a real host) the source passes ctypes.byref and reads
    the same values as with the fake's."""
    import pynvml

    def fabric_samples(real_structs: bool) -> list[tuple[str, float]]:
        fake = FakeNvml(["h200"], "busy")
        fake.set_fabric(0, health=F.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY)
        if real_structs:
            for name in ("c_nvmlGpuFabricInfo_t", "c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfo_v3_t"):
                setattr(fake, name, getattr(pynvml, name))
        source = make_source(fake, xid_events=False)
        try:
            data = collect(source)
        finally:
            close(source)
        return sorted((s.name, s.value) for s in data.samples if s.name.startswith("llm_gpu_fabric"))

    assert fabric_samples(real_structs=True) == fabric_samples(real_structs=False) == [
        ("llm_gpu_fabric_health", 3.0), ("llm_gpu_fabric_state", 3.0), ("llm_gpu_fabric_status", 0.0)]


# -- XID ---------------------------------------------------------------------------------------

def test_xid_events_are_counted_per_gpu_and_code() -> None:
    fake = FakeNvml(["h100", "h100"], "busy")
    source = make_source(fake)
    collect(source)
    fake.inject_xid(0, 79)
    fake.inject_xid(0, 79)
    fake.inject_xid(1, 31)
    wait_for(lambda: sum(values(collect(source), "llm_gpu_xid_errors_total")) == 3)
    data = collect(source)
    assert one(data, "llm_gpu_xid_errors_total", gpu="0", xid="79") == 2.0
    assert one(data, "llm_gpu_xid_errors_total", gpu="1", xid="31") == 1.0
    close(source)


def test_xid_codes_are_bounded_per_gpu() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake)
    collect(source)
    for xid in range(1, 41):
        fake.inject_xid(0, xid)
    wait_for(lambda: sum(values(collect(source), "llm_gpu_xid_errors_total")) == 40)
    data = collect(source)
    codes = {s.label("xid") for s in data.samples if s.name == "llm_gpu_xid_errors_total"}
    assert len(codes) == 33 and "other" in codes
    assert one(data, "llm_gpu_xid_errors_total", xid="other") == 8.0
    close(source)


def test_xid_counts_stay_for_a_lost_gpu() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake)
    collect(source)
    fake.inject_xid(0, 79)
    wait_for(lambda: values(collect(source), "llm_gpu_xid_errors_total") == [1.0])
    fake.lose(0)
    data = collect(source)
    assert one(data, "llm_gpu_up") == 0.0
    assert one(data, "llm_gpu_xid_errors_total", xid="79") == 1.0
    close(source)


def test_xid_thread_stops_promptly_on_close() -> None:
    fake = FakeNvml(["h100"], "busy")
    source = make_source(fake, xid_wait_ms=200)
    collect(source)
    assert any(t.name == "nvml-xid" and t.is_alive() for t in threading.enumerate())
    started = time.monotonic()
    close(source)
    assert time.monotonic() - started < 1.5
    assert not any(t.name == "nvml-xid" and t.is_alive() for t in threading.enumerate())
    assert fake.event_sets_live == 0 and fake.refcount == 0


def test_xid_registration_refused_still_collects() -> None:
    fake = FakeNvml(["h100"], "busy")
    fake.fail(0, "nvmlDeviceRegisterEvents", F.NVMLError_NotSupported)
    source = make_source(fake)
    data = collect(source)
    assert one(data, "llm_gpu_up") == 1.0
    assert fake.event_sets_live == 0  # nothing registered: the set was freed at once
    close(source)


# -- the real thing ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("LLM_EXPORTER_TEST_GPU") != "1", reason="set LLM_EXPORTER_TEST_GPU=1 on a GPU host")
def test_real_nvml() -> None:
    source = NvmlSource(NvmlOptions(required=True))
    try:
        collect(source)
        time.sleep(0.3)  # a GPM window and counter interval
        data = collect(source)
    finally:
        close(source)
    ups = values(data, "llm_gpu_up")
    assert ups and all(v == 1.0 for v in ups)
    assert all(v > 0 for v in values(data, "llm_gpu_memory_total_bytes"))
    assert all(0.0 <= v <= 1.0 for v in values(data, "llm_gpu_utilization_ratio"))
    assert {s.name for s in data.samples} <= GPU_FAMILIES
    text = render(data.samples).decode()
    assert "llm_gpu_power_watts" in text
    out_dir = os.environ.get("LLM_EXPORTER_GPU_CAPTURE")
    if out_dir:  # a device run saves what it saw, for a captured golden file
        with open(os.path.join(out_dir, "real_nvml.metrics"), "w") as fh:
            fh.write(text)


# -- which GPUs (exporter/sources/gpu/attribution.py) ---------------------------------------------

def test_a_selection_reads_only_the_engines_gpus_and_a_new_one_takes_effect_next_cycle() -> None:
    """The sidecar of an engine on GPUs 1 and 3 of a 4-GPU node: the others are never read (half the
    per-GPU calls of the whole node) and export nothing; by UUID or by NVML index alike."""
    from exporter.sources.gpu.attribution import GpuSelection

    fake = FakeNvml(["h100", "a100", "h100", "a100"], "busy")
    whole = make_source(fake, xid_events=False)
    uuids = two_cycles(fake, whole).attrs["uuids"].split(",")
    every = _calls_per_cycle(fake, whole)
    close(whole)
    source = make_source(fake, xid_events=False)
    source.select(GpuSelection("pod_resources", frozenset({uuids[1], "3"})))
    data = two_cycles(fake, source)
    assert {s.label("uuid") for s in data.samples if s.name == "llm_gpu_up"} == {uuids[1], uuids[3]}
    assert {s.label("gpu") for s in data.samples} == {"1", "3"}
    assert data.attrs["gpus"] == "2" and data.attrs["uuids"] == f"{uuids[1]},{uuids[3]}"
    watched = _calls_per_cycle(fake, source)
    assert watched["nvmlDeviceGetMemoryInfo"] == every["nvmlDeviceGetMemoryInfo"] / 2 == 2.0
    source.select(GpuSelection("pod_resources", frozenset()))  # a pod that holds no GPU
    data = collect(source)
    assert not data.samples and data.attrs["gpus"] == "0"
    source.select(None)
    assert {s.label("gpu") for s in collect(source).samples if s.name == "llm_gpu_up"} == {"0", "1", "2", "3"}
    close(source)
