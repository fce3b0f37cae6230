"""Host source: golden /metrics per fixture host, the pure parsers, NUMA and link checks, the
engine process finder, missing files, and one run on this machine's real /proc and /sys."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

from exporter.expose import render
from exporter.snapshot import Sample
from exporter.sources.base import SourceData, SourceError
from exporter.sources.host import HostOptions, HostSource
from exporter.sources.host_engine import BUSIEST_THREAD_WINDOW_S
from exporter.sources.host_pci import NumaNode, is_nvidia_gpu, parse_link_speed, parse_numa_node
from exporter.sources.host_proc import (
    CpuTicks,
    busy_ratios,
    parse_cpulist,
    parse_listening_inodes,
    parse_loadavg,
    parse_meminfo,
    parse_pid_stat,
    parse_pid_status,
    parse_pressure,
    parse_stat_cpus,
    socket_inode,
)
from exporter.sources.host_process import busiest_thread_ratio, choose_root, numa_mismatch
from tests.support import promtool_check_metrics, wait_until

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "host"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "proc").is_dir())
CASE_OPTIONS: dict[str, dict] = {"missing_files": {"engine_process_name": "llama"}}
DEFAULT_OPTIONS = {"engine_port": 8000}


class Fixture:
    """A fixture host copied to tmp_path; `advance()` applies its next/ overlay (cycle 2) and moves
    the source's clock on by as much as the fixtures' /proc/uptime, 5 s."""

    STEP_S = 5.0

    def __init__(self, case: str, tmp_path: pathlib.Path) -> None:
        self.case = case
        self.root = tmp_path / case
        self.now = 0.0
        shutil.copytree(FIXTURES / case, self.root, symlinks=True, ignore=shutil.ignore_patterns("next"))

    def clock(self) -> float:
        return self.now

    def source(self, **overrides) -> HostSource:
        return HostSource(self.options(**overrides), clock=self.clock)

    @property
    def proc(self) -> pathlib.Path:
        return self.root / "proc"

    def options(self, **overrides) -> HostOptions:
        kwargs = dict(CASE_OPTIONS.get(self.case, DEFAULT_OPTIONS)) if not overrides else {}
        kwargs.update(overrides)
        return HostOptions(proc_root=str(self.proc), sys_root=str(self.root / "sys"), **kwargs)

    def advance(self) -> None:
        shutil.copytree(FIXTURES / self.case / "next", self.root, symlinks=True, dirs_exist_ok=True)
        self.now += self.STEP_S

    def two_cycles(self, source: HostSource) -> tuple[SourceData, SourceData]:
        first = source.collect_sync()
        self.advance()
        return first, source.collect_sync()


def by_name(data: SourceData, name: str) -> dict[tuple, float]:
    return {s.labels: s.value for s in data.samples if s.name == name}


def value(data: SourceData, name: str, **labels: str) -> float | None:
    want = tuple(sorted(labels.items()))
    return by_name(data, name).get(want)


def names(data: SourceData) -> set[str]:
    return {s.name for s in data.samples}


# --- golden ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_golden_second_cycle(case: str, tmp_path: pathlib.Path, assert_golden) -> None:
    fx = Fixture(case, tmp_path)
    _, second = fx.two_cycles(fx.source())
    assert_golden(f"host/{case}.metrics", render(second.samples).decode())


@pytest.mark.parametrize("case", CASES)
def test_golden_passes_promtool(case: str) -> None:
    promtool_check_metrics(
        (pathlib.Path(__file__).resolve().parent / "golden" / "host" / f"{case}.metrics").read_bytes())


def test_every_sample_has_a_catalogued_family(tmp_path: pathlib.Path) -> None:
    from exporter import catalog

    fx = Fixture("dual_socket_ok", tmp_path)
    _, second = fx.two_cycles(fx.source())
    for sample in second.samples:
        fam = catalog.family_of(sample.name)
        assert fam is not None and fam.source == "host", sample.name
        assert tuple(k for k, _ in sample.labels) == tuple(sorted(fam.labels)), sample


# --- cycles and rates ------------------------------------------------------------------------


def test_first_cycle_omits_rates(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    first, second = fx.two_cycles(fx.source())
    for rate in ("llm_host_cpu_busy_ratio", "llm_engine_process_busiest_thread_cpu_ratio"):
        assert rate not in names(first)
        assert rate in names(second)
    assert "llm_engine_process_cpu_seconds_total" in names(first)


def test_cpu_busy_ratios_from_stat_deltas(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    _, second = fx.two_cycles(fx.source())
    busy = {dict(k)["cpu"]: v for k, v in by_name(second, "llm_host_cpu_busy_ratio").items()}
    assert set(busy) == {"all", "busiest", *map(str, range(8))}
    assert busy["0"] == pytest.approx(0.6)
    assert busy["7"] == pytest.approx(0.05)
    assert busy["all"] == pytest.approx((4 * 0.6 + 4 * 0.05) / 8)
    # The summary a profile without per-CPU series keeps: the busiest CPU and how many there are.
    assert busy["busiest"] == pytest.approx(0.6)
    assert dict(by_name(second, "llm_host_cpus")) == {(): 8.0}


def test_busiest_thread_shows_saturated_tokenizer(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    _, second = fx.two_cycles(fx.source())
    # Thread 4243 ran 490 of the 500 ticks of the 5 s between cycles.
    assert value(second, "llm_engine_process_busiest_thread_cpu_ratio") == pytest.approx(0.98)
    # Process plus EngineCore child: 4 + 1 threads (the child counts by default).
    assert value(second, "llm_engine_process_threads") == 5
    assert value(second, "llm_engine_process_resident_memory_bytes") == (3_500_000 + 5_200_000) * 1024


def test_vanished_threads_leave_the_state(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    source.collect_sync()
    shutil.rmtree(fx.proc / "4242" / "task" / "4243")
    fx.advance()
    shutil.rmtree(fx.proc / "4242" / "task" / "4243")
    second = source.collect_sync()
    assert source.engine.tracked_threads == {4242, 4244, 4250, 4251}
    # Without the tokenizer the EngineCore main thread is the busiest: 350 of 500 ticks.
    assert value(second, "llm_engine_process_busiest_thread_cpu_ratio") == pytest.approx(0.7)


def test_process_tree_is_walked_again_only_when_due(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    now = [0.0]
    source = HostSource(fx.options(engine_port=8000, search_interval_s=10.0), clock=lambda: now[0])
    source.collect_sync()
    # A tensor-parallel worker starts: it shows once the tree is walked again, not before.
    shutil.copytree(fx.proc / "4250", fx.proc / "4260", symlinks=True)
    (fx.proc / "4242" / "task" / "4242" / "children").write_text("4250 4260 ")
    now[0] = 5.0
    source.collect_sync()
    assert source.engine_pids() == frozenset({4242, 4250})
    now[0] = 11.0
    source.collect_sync()
    assert source.engine_pids() == frozenset({4242, 4250, 4260})
    # A worker that exits drops out at once.
    shutil.rmtree(fx.proc / "4250")
    now[0] = 12.0
    data = source.collect_sync()
    assert source.engine_pids() == frozenset({4242, 4260})
    assert value(data, "llm_engine_process_threads") == 5


def set_utime(stat: pathlib.Path, ticks: int) -> None:
    fields = stat.read_text().split(" ")
    fields[13] = str(ticks)  # utime, field 14 of proc(5) (the fixtures' comms have no spaces)
    stat.write_text(" ".join(fields))


def set_uptime(fx: Fixture, seconds: float) -> None:
    (fx.proc / "uptime").write_text(f"{seconds:.2f} 600000.00\n")


def busiest(data: SourceData) -> float | None:
    return value(data, "llm_engine_process_busiest_thread_cpu_ratio")


def test_busiest_thread_is_read_once_per_window_and_repeated_between(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    _, second = fx.two_cycles(source)  # 0 s opens the first window, 5 s closes it
    assert busiest(second) == pytest.approx(0.98)
    task = fx.proc / "4242" / "task"
    # A second on, the tokenizer has idled and a thread has ended; the threads are not read again
    # before the window closes, so the last ratio stands and the ended thread is still tracked.
    shutil.rmtree(task / "4244")
    set_uptime(fx, 86406.0)
    fx.now = 6.0
    assert busiest(source.collect_sync()) == pytest.approx(0.98)
    assert 4244 in source.engine.tracked_threads
    # 4.5 s after the last window closed (a cycle may run a little early), the next one closes:
    # the tokenizer ran 100 of the 450 ticks since, and the thread list is read again.
    set_utime(task / "4243" / "stat", 88490 + 100)
    set_uptime(fx, 86409.5)
    fx.now = 9.5
    assert busiest(source.collect_sync()) == pytest.approx(100 / 450)
    assert source.engine.tracked_threads == {4242, 4243, 4250, 4251}


def test_a_window_that_closes_without_uptime_stays_open_for_the_next(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    _, second = fx.two_cycles(source)  # the window closed at uptime 86405
    assert busiest(second) == pytest.approx(0.98)
    (fx.proc / "uptime").unlink()
    fx.now = 9.5
    assert busiest(source.collect_sync()) is None  # no time base: no ratio
    # The next close measures from the last good one: 180 ticks of the tokenizer in 9 s.
    set_utime(fx.proc / "4242" / "task" / "4243" / "stat", 88490 + 180)
    set_uptime(fx, 86414.0)
    fx.now = 14.0
    assert busiest(source.collect_sync()) == pytest.approx(180 / 900)


def test_a_new_engine_opens_a_new_window(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    pidfile = fx.root / "engine.pid"
    source = fx.source(engine_pidfile=str(pidfile))
    _, second = fx.two_cycles(source)
    assert busiest(second) == pytest.approx(0.98)
    pidfile.write_text("777\n")  # restarted as another process: its threads share nothing
    fx.now = 6.0
    third = source.collect_sync()
    assert source.engine_pids() == {777}
    assert value(third, "llm_engine_process_found") == 1
    assert busiest(third) is None
    set_uptime(fx, 86411.0)
    fx.now = 11.0
    assert busiest(source.collect_sync()) == 0.0  # sshd's only thread did not run


def test_lost_engine_drops_the_ratio(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    pidfile = fx.root / "engine.pid"
    source = fx.source(engine_pidfile=str(pidfile))
    fx.two_cycles(source)
    pidfile.write_text("31337\n")  # no such process
    fx.now = 6.0
    data = source.collect_sync()
    assert value(data, "llm_engine_process_found") == 0
    assert busiest(data) is None and source.engine.tracked_threads == frozenset()


def test_link_width_now_read_every_cycle_and_max_every_search_interval(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source(search_interval_s=10.0)
    source.collect_sync()
    dev = fx.root / "sys/bus/pci/devices/0000:17:00.0"
    (dev / "current_link_width").write_text("4\n")
    (dev / "max_link_width").write_text("8\n")
    fx.now = 5.0
    data = source.collect_sync()
    # The link trained down: seen at once. The slot's capability is read again only later.
    assert value(data, "llm_host_gpu_pcie_link_width", pci="0000:17:00.0", state="current") == 4
    assert value(data, "llm_host_gpu_pcie_link_width", pci="0000:17:00.0", state="max") == 16
    fx.now = 10.0
    data = source.collect_sync()
    assert value(data, "llm_host_gpu_pcie_link_width", pci="0000:17:00.0", state="max") == 8


def test_gpu_that_goes_away_is_dropped(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    source.collect_sync()
    shutil.rmtree(fx.root / "sys/bus/pci/devices/0000:3a:00.0")
    data = source.collect_sync()
    assert {dict(k)["pci"] for k in by_name(data, "llm_host_gpu_numa_node")} == {"0000:17:00.0"}
    assert data.attrs["gpu_pci_addresses"] == "0000:17:00.0"


def test_fixture_files_are_never_held_open(tmp_path: pathlib.Path) -> None:
    # Regular files can be replaced under their path; only procfs and sysfs files are held.
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    fx.two_cycles(source)
    assert source.held_files == frozenset()


def test_children_excluded_when_configured(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source(engine_port=8000, engine_include_children=False)
    data = source.collect_sync()
    api_ticks = 52_000 + 3_000 + 88_000 + 1_000 + 400 + 100
    assert value(data, "llm_engine_process_cpu_seconds_total") == pytest.approx(api_ticks / os.sysconf("SC_CLK_TCK"))
    assert value(data, "llm_engine_process_threads") == 3
    # The GPU source still gets the whole tree.
    assert source.engine_pids() == frozenset({4242, 4250})


# --- degraded host: link, NUMA, PSI ----------------------------------------------------------


def test_degraded_link_and_wrong_numa_node(tmp_path: pathlib.Path) -> None:
    fx = Fixture("degraded", tmp_path)
    _, second = fx.two_cycles(fx.source())
    bad, good = "0000:3a:00.0", "0000:17:00.0"
    assert value(second, "llm_host_gpu_pcie_link_speed_gts", pci=bad, state="current") == 8.0
    assert value(second, "llm_host_gpu_pcie_link_speed_gts", pci=bad, state="max") == 32.0
    assert value(second, "llm_host_gpu_pcie_link_width", pci=bad, state="current") == 8
    assert value(second, "llm_host_gpu_pcie_link_width", pci=bad, state="max") == 16
    assert value(second, "llm_host_gpu_pcie_link_width", pci=good, state="current") == 16
    assert value(second, "llm_engine_numa_mismatch") == 1
    assert not names(second) & {"llm_host_pressure_waiting_ratio", "llm_host_pressure_waiting_seconds_total"}


def test_healthy_host_has_no_mismatch_and_only_gpus(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    data = fx.source().collect_sync()
    assert value(data, "llm_engine_numa_mismatch") == 0
    gpus = {dict(k)["pci"] for k in by_name(data, "llm_host_gpu_numa_node")}
    # The GPU's audio function (17:00.1), the NIC and the host bridge are not GPUs.
    assert gpus == {"0000:17:00.0", "0000:3a:00.0"}
    assert data.attrs["gpu_pci_addresses"] == "0000:17:00.0,0000:3a:00.0"
    assert value(data, "llm_host_pressure_waiting_ratio", resource="cpu", window="10s") == pytest.approx(0.125)
    assert value(data, "llm_host_pressure_waiting_seconds_total", resource="cpu") == pytest.approx(98.765432)


def test_engine_gpu_list_decides_the_numa_check(tmp_path: pathlib.Path) -> None:
    fx = Fixture("degraded", tmp_path)
    # Say the engine uses the node-1 NIC's "GPU": a pci address on node 1 makes the pinning right.
    (fx.root / "sys/bus/pci/devices/0000:9b:00.0/class").write_text("0x030200\n")
    (fx.root / "sys/bus/pci/devices/0000:9b:00.0/vendor").write_text("0x10de\n")
    data = fx.source(engine_port=8000, engine_gpu_pci_addresses=("0000:9b:00.0",)).collect_sync()
    assert value(data, "llm_engine_numa_mismatch") == 0


def test_gpu_address_override_skips_discovery(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    data = fx.source(gpu_pci_addresses=("0000:3a:00.0",)).collect_sync()
    assert {dict(k)["pci"] for k in by_name(data, "llm_host_gpu_numa_node")} == {"0000:3a:00.0"}


# --- engine process finder -------------------------------------------------------------------


@pytest.mark.parametrize("case", ["dual_socket_ok", "degraded"])  # tcp and tcp6 listeners
def test_engine_found_by_port(case: str, tmp_path: pathlib.Path) -> None:
    fx = Fixture(case, tmp_path)
    source = fx.source(engine_port=8000)
    data = source.collect_sync()
    assert value(data, "llm_engine_process_found") == 1
    assert source.engine_pids() == frozenset({4242, 4250})


def test_port_without_listener_is_not_found(tmp_path: pathlib.Path) -> None:
    # 8000 has an established connection in the table, but nothing listens on 9000 or owns it.
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source(engine_port=9000)
    data = source.collect_sync()
    assert by_name(data, "llm_engine_process_found") == {(): 0.0}
    assert names(data) & {"llm_engine_process_cpu_seconds_total", "llm_engine_numa_mismatch"} == set()
    assert source.engine_pids() == frozenset()


def test_engine_found_by_pidfile(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source(engine_pidfile=str(fx.root / "engine.pid"))
    assert value(source.collect_sync(), "llm_engine_process_found") == 1
    assert 4242 in source.engine_pids()
    (fx.root / "engine.pid").write_text("31337\n")  # no such process
    assert value(source.collect_sync(), "llm_engine_process_found") == 0


def test_engine_found_by_name_picks_the_root(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    # Both the API server (cmdline) and EngineCore (comm "VLLM::EngineCor") match; the parent wins.
    source = fx.source(engine_process_name="(?i)vllm")
    source.collect_sync()
    assert source.engine_pids() == frozenset({4242, 4250})
    assert source.engine.root_pid == 4242


def test_pid_reuse_triggers_a_new_search(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source(engine_process_name="sshd")
    source.collect_sync()
    assert source.engine_pids() == frozenset({777})
    # sshd exits and pid 777 is reused by an unrelated process with another start time.
    stat = fx.proc / "777" / "stat"
    stat.write_text(stat.read_text().replace("(sshd)", "(bash)").replace(" 300 ", " 99999 "))
    (fx.proc / "777" / "cmdline").write_text("bash\0")
    data = source.collect_sync()
    assert value(data, "llm_engine_process_found") == 0


def test_search_is_rate_limited_until_interval(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    now = [100.0]
    source = HostSource(fx.options(engine_process_name="late-engine", search_interval_s=10.0), clock=lambda: now[0])
    assert value(source.collect_sync(), "llm_engine_process_found") == 0
    (fx.proc / "777" / "cmdline").write_text("late-engine\0--serve\0")
    now[0] += 5
    assert value(source.collect_sync(), "llm_engine_process_found") == 0  # not searched again yet
    now[0] += 6
    assert value(source.collect_sync(), "llm_engine_process_found") == 1


def test_name_search_skips_excluded_pids() -> None:
    root = str(FIXTURES / "dual_socket_ok" / "proc")
    from exporter.sources.host_process import find_by_name

    assert find_by_name(root, re.compile("sshd")) == 777
    assert find_by_name(root, re.compile("sshd"), exclude=(777,)) is None


def test_no_selector_exports_no_engine_series(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    data = fx.source(engine_port=None).collect_sync()
    assert not any(n.startswith("llm_engine_") for n in names(data))


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="engine_process_name"):
        HostOptions(engine_process_name="vllm(")
    with pytest.raises(ValueError, match="engine_port"):
        HostOptions(engine_port=70000)


# --- missing files ---------------------------------------------------------------------------


def test_missing_files_omit_series_and_stay_up(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    fx = Fixture("missing_files", tmp_path)
    source = fx.source()
    with caplog.at_level(logging.INFO, logger="exporter.sources.host"):
        _, second = fx.two_cycles(source)
        source.collect_sync()
    assert names(second) == {
        "llm_host_cpu_busy_ratio",
        "llm_host_cpus",
        "llm_engine_process_found",
        "llm_engine_process_cpu_seconds_total",
    }
    assert value(second, "llm_host_cpu_busy_ratio", cpu="0") == pytest.approx(0.5)
    # No task/*/children files: the child is found through the ppid scan instead.
    assert source.engine_pids() == frozenset({5151, 5160})
    loadavg_logs = [r for r in caplog.records if "loadavg" in r.getMessage()]
    assert len(loadavg_logs) == 1, "a missing file is logged once, not every cycle"


def test_file_that_comes_back_is_logged_and_exported(tmp_path: pathlib.Path, caplog) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    saved = (fx.proc / "loadavg").read_text()
    (fx.proc / "loadavg").unlink()
    with caplog.at_level(logging.INFO, logger="exporter.sources.host"):
        assert "llm_host_load1" not in names(source.collect_sync())
        (fx.proc / "loadavg").write_text(saved)
        assert value(source.collect_sync(), "llm_host_load1") == pytest.approx(6.52)
    messages = [r.getMessage() for r in caplog.records if "loadavg" in r.getMessage()]
    assert len(messages) == 2 and "again" in messages[1]


def test_stat_gap_restarts_the_delta(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    source = fx.source()
    source.collect_sync()
    (fx.proc / "stat").unlink()
    assert "llm_host_cpu_busy_ratio" not in names(source.collect_sync())
    fx.advance()
    # The first read after the gap has nothing to compare with: no made-up ratio.
    assert "llm_host_cpu_busy_ratio" not in names(source.collect_sync())


def test_missing_proc_root_is_a_source_error(tmp_path: pathlib.Path) -> None:
    source = HostSource(HostOptions(proc_root=str(tmp_path / "nope"), sys_root=str(tmp_path)))
    with pytest.raises(SourceError) as err:
        asyncio.run(source.collect())
    assert err.value.reason == "procfs_missing"


# --- pure parsers ----------------------------------------------------------------------------


def test_parse_stat_cpus_and_ratios() -> None:
    a = parse_stat_cpus("cpu  100 0 100 700 100 0 0 0 50 0\ncpu0 100 0 100 700 100 0 0 0 50 0\nintr 1 2\n")
    assert a["all"] == CpuTicks(busy=200, total=1000)  # guest (50) is already inside user
    b = {"all": CpuTicks(busy=500, total=2000), "0": CpuTicks(busy=150, total=900), "9": CpuTicks(1, 2)}
    # cpu0 went backwards (hotplug) and cpu9 is new: both left out.
    assert busy_ratios(a, b) == {"all": pytest.approx(0.3)}
    assert busy_ratios(a, a) == {}


def test_parse_small_files() -> None:
    assert parse_loadavg("0.50 1.25 2.00 3/400 1234\n") == (0.5, 1.25, 2.0)
    assert parse_meminfo("MemTotal:  2 kB\nHugePages_Total: 4\n") == {"MemTotal": 2048, "HugePages_Total": 4}
    assert parse_meminfo("Node 1 MemFree:   3 kB\n") == {"MemFree": 3072}
    psi = parse_pressure("some avg10=2.66 avg60=1.01 avg300=1.12 total=6800014\n"
                         "full avg10=9 avg60=9 avg300=9 total=1\n")
    assert psi is not None
    assert (psi.avg10, psi.avg60, psi.total_seconds) == (pytest.approx(0.0266), pytest.approx(0.0101), 6.800014)
    assert parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") is None


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8-9,12\n") == frozenset({0, 1, 2, 3, 8, 9, 12})
    assert parse_cpulist("\n") == frozenset()
    assert parse_cpulist("5") == frozenset({5})


def test_parse_pid_stat_with_awkward_comm() -> None:
    text = "42 (a) b (c) R 7 42 42 0 -1 0 0 0 0 0 11 22 0 0 20 0 3 0 777 0 0"
    st = parse_pid_stat(text)
    assert (st.comm, st.ppid, st.utime, st.stime, st.starttime) == ("a) b (c", 7, 11, 22, 777)


def test_parse_thread_ticks_matches_parse_pid_stat() -> None:
    from exporter.sources.host_proc import parse_thread_ticks

    text = "42 (a) b (c) R 7 42 42 0 -1 0 0 0 0 0 11 22 0 0 20 0 3 0 777 0 0"
    st = parse_pid_stat(text)
    assert parse_thread_ticks(text) == (st.utime + st.stime, st.starttime) == (33, 777)
    with pytest.raises(ValueError):
        parse_thread_ticks("garbage")


def test_parse_meminfo_wanted_keys_only() -> None:
    text = "MemTotal:  2 kB\nMemFree:  1 kB\nMemAvailable:  3 kB\nBuffers:  x kB\n"
    # Stops once both are found: the unparsable Buffers line is never reached.
    assert parse_meminfo(text, ("MemTotal", "MemAvailable")) == {"MemTotal": 2048, "MemAvailable": 3072}
    assert parse_meminfo("Node 0 MemTotal: 4 kB\n", ("MemTotal", "MemFree")) == {"MemTotal": 4096}


def test_parse_stat_cpus_stops_after_the_cpu_lines() -> None:
    text = "cpu  1 0 1 8 0 0 0 0\ncpu0 1 0 1 8 0 0 0 0\nintr 5 x y\ncpu_not_a_cpu z\n"
    assert parse_stat_cpus(text) == {"all": CpuTicks(busy=2, total=10), "0": CpuTicks(busy=2, total=10)}


def test_parse_pid_status() -> None:
    st = parse_pid_status("Name:\tx\nThreads:\t12\nVmRSS:\t  100 kB\nCpus_allowed_list:\t0-1,4\n")
    assert (st.threads, st.rss_bytes, st.cpus_allowed) == (12, 102400, frozenset({0, 1, 4}))
    kernel_thread = parse_pid_status("Name:\tkworker\nThreads:\t1\n")
    assert kernel_thread.rss_bytes is None  # unknown, not zero
    assert kernel_thread.cpus_allowed is None
    first_line = parse_pid_status("Threads:\t2\nVmRSSx:\t5 kB\nXVmRSS:\t6 kB")
    assert (first_line.threads, first_line.rss_bytes) == (2, None)  # whole keys at a line start only


def test_parse_listening_inodes() -> None:
    text = (FIXTURES / "dual_socket_ok" / "proc" / "net" / "tcp").read_text()
    assert parse_listening_inodes(text, 8000) == {44001}  # the ESTABLISHED row is ignored
    assert parse_listening_inodes(text, 22) == {12345}
    tcp6 = (FIXTURES / "degraded" / "proc" / "net" / "tcp6").read_text()
    assert parse_listening_inodes(tcp6, 8000) == {44001}
    assert socket_inode("socket:[44001]") == 44001
    assert socket_inode("/dev/null") is None


def test_parse_sysfs_values() -> None:
    assert parse_link_speed("32.0 GT/s PCIe\n") == 32.0
    assert parse_link_speed("8 GT/s\n") == 8.0  # kernels before 4.19 have no " PCIe"
    assert parse_link_speed("2.5 GT/s PCIe") == 2.5
    assert parse_link_speed("Unknown\n") is None
    assert parse_numa_node("-1\n") is None
    assert parse_numa_node("1\n") == 1
    assert is_nvidia_gpu("0x10de\n", "0x030200\n")
    assert is_nvidia_gpu("0x10de", "0x030000")
    assert not is_nvidia_gpu("0x10de", "0x040300")  # HDMI audio function
    assert not is_nvidia_gpu("0x1002", "0x030000")


def test_choose_root_prefers_parent_then_oldest() -> None:
    def st(ppid: int, start: int):
        return parse_pid_stat(f"1 (x) S {ppid} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 0 {start} 0 0")

    assert choose_root({10: st(1, 50), 11: st(10, 40), 20: st(1, 30)}) == 20
    assert choose_root({10: st(1, 50), 11: st(10, 40)}) == 10
    assert choose_root({}) is None


def test_busiest_thread_ratio() -> None:
    prev = {(1, 0): 100, (2, 0): 100, (3, 0): 50}
    cur = {(1, 0): 150, (2, 0): 300, (4, 0): 999}  # 3 vanished, 4 is new
    assert busiest_thread_ratio(prev, cur, 2.0, 100) == pytest.approx(1.0)
    assert busiest_thread_ratio(prev, cur, 4.0, 100) == pytest.approx(0.5)
    assert busiest_thread_ratio(prev, {(4, 0): 1}, 1.0, 100) is None
    assert busiest_thread_ratio(prev, cur, 0.0, 100) is None


NODES = (NumaNode(0, frozenset(range(0, 4)), None, None), NumaNode(1, frozenset(range(4, 8)), None, None))
ALL = frozenset(range(8))


@pytest.mark.parametrize(
    ("allowed", "gpu_nodes", "expected"),
    [
        (frozenset(range(0, 4)), [0], False),  # pinned to the GPUs' node
        (frozenset(range(4, 8)), [0], True),  # pinned to the other node
        (frozenset({2, 3, 4, 5}), [0], True),  # straddles both
        (ALL, [0], False),  # unpinned
        (frozenset(range(4, 8)), [0, 1], False),  # GPUs on both nodes
        (frozenset(range(4, 8)), [], None),  # no GPU with a known node
        (None, [0], None),  # affinity unknown
    ],
)
def test_numa_mismatch(allowed, gpu_nodes, expected) -> None:
    assert numa_mismatch(allowed, ALL, NODES, gpu_nodes) is expected


def test_numa_mismatch_single_node_and_no_numa() -> None:
    one = (NumaNode(0, ALL, None, None),)
    assert numa_mismatch(frozenset({1}), ALL, one, []) is False
    assert numa_mismatch(frozenset({1}), ALL, (), [0]) is None
    half_known = (NODES[0], NumaNode(1, None, None, None))
    assert numa_mismatch(frozenset({5}), ALL, half_known, [0]) is None


# --- this machine ----------------------------------------------------------------------------


def test_real_proc_and_sys(tmp_path: pathlib.Path) -> None:
    pidfile = tmp_path / "self.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    now = [0.0]
    source = HostSource(HostOptions(engine_pidfile=str(pidfile)), clock=lambda: now[0])
    first = asyncio.run(source.collect())
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # burn some CPU so the ratios have ticks to count
        sum(range(10_000))
    now[0] += BUSIEST_THREAD_WINDOW_S  # closes the busiest-thread window
    second = asyncio.run(source.collect())
    busy = by_name(second, "llm_host_cpu_busy_ratio")
    assert (("cpu", "all"),) in busy
    assert all(0.0 <= v <= 1.0 for v in busy.values())
    assert "llm_host_cpu_busy_ratio" not in names(first)
    assert value(second, "llm_engine_process_found") == 1
    assert os.getpid() in source.engine_pids()
    assert value(second, "llm_engine_process_resident_memory_bytes") > 0
    assert 0.0 <= value(second, "llm_engine_process_busiest_thread_cpu_ratio") <= 1.0
    assert render(second.samples)  # renders without error


def test_real_port_lookup_finds_this_process() -> None:
    import socket

    from exporter.sources.host_process import find_by_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert find_by_port("/proc", port) == os.getpid()
    assert find_by_port("/proc", port) is None  # closed: nothing listens any more


def test_name_search_never_finds_the_exporter_itself() -> None:
    from exporter.sources.host_process import find_by_name, self_and_parent

    assert os.getpid() in self_and_parent("/proc")
    assert self_and_parent(str(FIXTURES / "dual_socket_ok" / "proc")) == ()  # no `self` link there
    # This test process's command line matches its own name; it (and its parent) must not be picked.
    own_comm = pathlib.Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert find_by_name("/proc", re.compile(re.escape(own_comm)), exclude=self_and_parent("/proc")) \
        not in self_and_parent("/proc")
    # And `exclude` is what keeps a match out: a process whose command line carries a unique token
    # is found, unless excluded.
    token = f"llm-exporter-test-{os.getpid()}-{time.monotonic_ns()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", token])
    try:
        pattern = re.compile(re.escape(token))
        assert wait_until(lambda: find_by_name("/proc", pattern) == child.pid, timeout=10)
        assert find_by_name("/proc", pattern, exclude=(child.pid,)) is None
    finally:
        child.kill()
        child.wait()


def test_unparsable_file_is_omitted_not_fatal(tmp_path: pathlib.Path) -> None:
    fx = Fixture("dual_socket_ok", tmp_path)
    (fx.proc / "loadavg").write_text("garbage\n")
    (fx.root / "sys/devices/system/node/node1/cpulist").write_text("x-y\n")
    data = fx.source().collect_sync()
    assert "llm_host_load1" not in names(data)
    assert "llm_host_memory_total_bytes" in names(data)
    # Node 1's CPUs are unknown now, so the NUMA verdict is "unknown", not a guess.
    assert "llm_engine_numa_mismatch" not in names(data)


def test_samples_are_plain_samples(tmp_path: pathlib.Path) -> None:
    fx = Fixture("degraded", tmp_path)
    data = fx.source().collect_sync()
    assert all(isinstance(s, Sample) and isinstance(s.value, float) for s in data.samples)
