"""Network links in the host source (exporter/sources/host_net.py): the fixture sysfs tree of a GPU
server read through HostSource (every family, InfiniBand words x 4, utilization over two cycles,
a counter reset, the engine rule, exclusion), hostile trees (thousands of interfaces, oversized,
unreadable and blocking files), and the simulated host's `network` list through the same code."""

from __future__ import annotations

import gc
import logging
import os
import pathlib
import shutil
import time

import psutil
import pytest

from exporter import catalog
from exporter.snapshot import Sample
from exporter.sources.base import SourceData
from exporter.sources.host import HostOptions, HostSource
from exporter.sources.host_net import (
    MAX_ATTR_BYTES,
    MAX_CLASSIFIED,
    MAX_HELD_NETWORK_FILES,
    MAX_NETWORK_LINKS,
    ByteRates,
    parse_ib_rate,
    parse_ib_state,
    parse_netdev_speed,
    parse_proc_net_dev,
    pci_root_of,
)
from exporter.sources.host_sim import samples_from_host_state

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "net"
STEP_S = 5.0


class Tree:
    """A fixture tree copied to tmp_path; `advance()` applies next/ and moves the clock 5 s."""

    def __init__(self, tmp_path: pathlib.Path, case: str = "gpu_server") -> None:
        self.case = case
        self.root = tmp_path / case
        self.now = 0.0
        shutil.copytree(FIXTURES / case, self.root, symlinks=True, ignore=shutil.ignore_patterns("next"))

    def clock(self) -> float:
        return self.now

    @property
    def sys(self) -> pathlib.Path:
        return self.root / "sys"

    def source(self, **options) -> HostSource:
        return HostSource(HostOptions(proc_root=str(self.root / "proc"), sys_root=str(self.sys), **options),
                          clock=self.clock)

    def advance(self) -> None:
        shutil.copytree(FIXTURES / self.case / "next", self.root, symlinks=True, dirs_exist_ok=True)
        self.now += STEP_S

    def two_cycles(self, source: HostSource) -> tuple[SourceData, SourceData]:
        first = source.collect_sync()
        self.advance()
        return first, source.collect_sync()


def net(data: SourceData, name: str) -> dict[str, float]:
    """{device: value} of a one-label family."""
    return {dict(s.labels)["device"]: s.value for s in data.samples if s.name == name}


def info(data: SourceData) -> dict[str, dict[str, str]]:
    return {dict(s.labels)["device"]: dict(s.labels) for s in data.samples if s.name == "llm_host_network_info"}


def utilization(data: SourceData) -> dict[tuple[str, str], float]:
    return {(dict(s.labels)["device"], dict(s.labels)["direction"]): s.value
            for s in data.samples if s.name == "llm_host_network_utilization_ratio"}


# --- the fixture GPU server --------------------------------------------------------------------


def test_links_kinds_numa_and_engine_by_numa_node_or_pci_host_bridge(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    _, second = tree.two_cycles(tree.source())
    assert info(second) == {
        # node 0, like the GPU
        "eno1": {"device": "eno1", "engine": "true", "kind": "ethernet", "numa_node": "0"},
        "eno2": {"device": "eno2", "engine": "true", "kind": "ethernet", "numa_node": "0"},
        # node 1, another host bridge
        "ens2f0np0": {"device": "ens2f0np0", "engine": "false", "kind": "ethernet", "numa_node": "1"},
        # no NUMA node from firmware, but behind the GPU's host bridge pci0000:15
        "mlx5_0:1": {"device": "mlx5_0:1", "engine": "true", "kind": "infiniband", "numa_node": ""},
        "mlx5_0:2": {"device": "mlx5_0:2", "engine": "true", "kind": "infiniband", "numa_node": ""},
        "mlx5_1:1": {"device": "mlx5_1:1", "engine": "false", "kind": "roce", "numa_node": "1"},
    }
    assert second.attrs["network_devices"] == "eno1,eno2,ens2f0np0,mlx5_0:1,mlx5_0:2,mlx5_1:1"
    assert second.attrs["gpu_pci_addresses"] == "0000:17:00.0"


def test_every_family_read_right(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    _, second = tree.two_cycles(tree.source())
    assert net(second, "llm_host_network_up") == {
        "eno1": 1, "eno2": 0, "ens2f0np0": 1, "mlx5_0:1": 1, "mlx5_0:2": 0, "mlx5_1:1": 1}
    # 25000 Mb/s; eno2 says -1 (down): absent, never 0; IB rate in Gb/s / 8.
    assert net(second, "llm_host_network_speed_bytes_per_second") == {
        "eno1": 3.125e9, "ens2f0np0": 12.5e9, "mlx5_0:1": 25e9, "mlx5_0:2": 1.25e9, "mlx5_1:1": 12.5e9}
    rx = net(second, "llm_host_network_receive_bytes_total")
    tx = net(second, "llm_host_network_transmit_bytes_total")
    assert rx["eno1"] == 1_312_500_000 and tx["eno1"] == 562_500_000
    # port_rcv_data and port_xmit_data count 4-byte words
    assert rx["mlx5_0:1"] == 4 * 3_250_000_000 and tx["mlx5_0:1"] == 4 * 1_250_000_000
    assert net(second, "llm_host_network_receive_packets_total")["eno1"] == 1_150_000
    assert net(second, "llm_host_network_transmit_packets_total")["mlx5_0:1"] == 4_000_000
    assert net(second, "llm_host_network_receive_errors_total") == {
        "eno1": 3, "eno2": 0, "ens2f0np0": 0, "mlx5_0:1": 2, "mlx5_0:2": 0, "mlx5_1:1": 0}
    assert net(second, "llm_host_network_transmit_errors_total")["eno1"] == 1
    assert net(second, "llm_host_network_receive_drops_total") == {
        "eno1": 19, "eno2": 0, "ens2f0np0": 0, "mlx5_0:1": 11}  # out_of_buffer: mlx5_0 only
    assert net(second, "llm_host_network_transmit_drops_total")["mlx5_0:1"] == 7  # port_xmit_discards
    for s in second.samples:
        fam = catalog.family_of(s.name)
        assert fam is not None and fam.source == "host", s.name
        assert tuple(k for k, _ in s.labels) == tuple(sorted(fam.labels)), s


def test_utilization_over_two_cycles_and_a_counter_reset(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    first, second = tree.two_cycles(tree.source())
    assert utilization(first) == {}  # one read: no rate yet
    got = utilization(second)
    assert got[("eno1", "receive")] == pytest.approx(312_500_000 / 5 / 3.125e9)  # 2%
    assert got[("eno1", "transmit")] == pytest.approx(62_500_000 / 5 / 3.125e9)
    assert got[("mlx5_0:1", "receive")] == pytest.approx(4 * 1_250_000_000 / 5 / 25e9)  # 4%
    assert got[("mlx5_0:1", "transmit")] == pytest.approx(4 * 250_000_000 / 5 / 25e9)
    # mlx5_1:1's transmit counter went backwards (driver reload): no ratio this cycle.
    assert got[("mlx5_1:1", "receive")] == pytest.approx(4 * 25_000_000 / 5 / 12.5e9)
    assert ("mlx5_1:1", "transmit") not in got
    assert ("eno2", "receive") not in got  # rate unknown
    assert got[("mlx5_0:2", "receive")] == 0.0  # down, rate known, nothing moved


def test_counter_reset_gives_the_ratio_again_on_the_next_cycle() -> None:
    rates = ByteRates()
    assert rates.ratios("x", 0.0, {"transmit_bytes": 1000}, 1000.0) == {}
    assert rates.ratios("x", 1.0, {"transmit_bytes": 10}, 1000.0) == {}  # reset
    assert rates.ratios("x", 2.0, {"transmit_bytes": 510}, 1000.0) == {"transmit": 0.5}
    assert rates.ratios("x", 2.0, {"transmit_bytes": 600}, 1000.0) == {}  # no time elapsed
    assert rates.ratios("x", 3.0, {"transmit_bytes": 10**9}, 1000.0) == {"transmit": 1.0}  # clamped
    rates.keep(())
    assert rates.ratios("x", 4.0, {"transmit_bytes": 10**9}, 1000.0) == {}  # forgotten


def test_configured_engine_devices_win(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    data = tree.source(engine_network_devices=("mlx5_1:*", "ens2f0np0")).collect_sync()
    engine = {d: labels["engine"] for d, labels in info(data).items()}
    assert engine == {"eno1": "false", "eno2": "false", "ens2f0np0": "true", "mlx5_0:1": "false",
                      "mlx5_0:2": "false", "mlx5_1:1": "true"}


def test_engine_gpus_decide_the_rule(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    data = tree.source(engine_gpu_pci_addresses=()).collect_sync()  # the engine uses no GPU here
    assert {labels["engine"] for labels in info(data).values()} == {"false"}


def test_exclusion_and_loopback(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    assert "veth0a1b2c" not in info(tree.source().collect_sync())  # host side of a pod: excluded
    everything = tree.source(network_exclude=()).collect_sync()
    assert info(everything)["veth0a1b2c"] == {"device": "veth0a1b2c", "engine": "false", "kind": "ethernet",
                                              "numa_node": ""}
    assert "lo" not in info(everything)  # ARPHRD_LOOPBACK, whatever the patterns
    some = tree.source(network_exclude=("mlx5_0:*", "eno*")).collect_sync()
    assert set(info(some)) == {"ens2f0np0", "mlx5_1:1", "veth0a1b2c"}


def test_no_rdma_hardware_gives_no_series_and_one_note(tmp_path: pathlib.Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    tree = Tree(tmp_path)
    shutil.rmtree(tree.sys / "class" / "infiniband")
    source = tree.source()
    with caplog.at_level(logging.INFO, logger="exporter.sources.host"):
        for _ in range(3):
            data = source.collect_sync()
            tree.now += 11  # past the search interval: discovered again each cycle
    assert not any(d.startswith("mlx5") for d in info(data))
    notes = [r.getMessage() for r in caplog.records if "infiniband" in r.getMessage()]
    assert len(notes) == 1 and "not available" in notes[0]


def test_no_sysfs_network_at_all(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    shutil.rmtree(tree.sys / "class")
    data = tree.source().collect_sync()
    assert not any(s.name.startswith("llm_host_network_") for s in data.samples)


def test_oversized_unreadable_and_fifo_files_omit_their_series(tmp_path: pathlib.Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    tree = Tree(tmp_path)
    stats = tree.sys / "class" / "net" / "eno1" / "statistics"
    (stats / "rx_bytes").write_text("1" * (MAX_ATTR_BYTES + 10))
    (stats / "tx_bytes").unlink()
    (stats / "tx_bytes").mkdir()  # unreadable as a file
    (stats / "rx_packets").unlink()
    os.mkfifo(stats / "rx_packets")  # must never block
    (stats / "tx_packets").write_text("-5\n")  # not a counter
    source = tree.source()
    with caplog.at_level(logging.INFO, logger="exporter.sources.host"):
        for _ in range(3):
            data = source.collect_sync()
    for family in ("receive_bytes", "transmit_bytes", "receive_packets", "transmit_packets"):
        assert "eno1" not in net(data, f"llm_host_network_{family}_total"), family
    assert net(data, "llm_host_network_receive_errors_total")["eno1"] == 3  # the rest is read
    # One summary line for the link, naming its files, not one per file, nor one per cycle.
    missing = [r.getMessage() for r in caplog.records if "eno1" in r.getMessage()]
    assert len(missing) == 1, missing
    assert "eno1: receive_bytes, receive_packets, transmit_bytes, transmit_packets" in missing[0]


def test_an_interface_that_goes_away_is_dropped_and_one_that_comes_is_found(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    source = tree.source()
    source.collect_sync()
    target = (tree.sys / "class" / "net" / "eno1").resolve()
    (tree.sys / "class" / "net" / "eno1").unlink()
    shutil.rmtree(target)
    tree.now += 1  # before the search interval: a vanished link triggers the next discovery itself
    data = source.collect_sync()
    assert "eno1" not in info(data)
    shutil.copytree(tree.sys / "devices" / "virtual" / "net" / "veth0a1b2c",
                    tree.sys / "devices" / "virtual" / "net" / "eth7")
    os.symlink("../../devices/virtual/net/eth7", tree.sys / "class" / "net" / "eth7")
    tree.now += 1
    assert "eth7" in info(source.collect_sync())  # rediscovered: the last cycle lost a link


def test_link_that_goes_down_has_its_rate_read_again(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    source = tree.source()
    source.collect_sync()
    eno1 = tree.sys / "class" / "net" / "eno1"
    (eno1 / "operstate").write_text("down\n")
    (eno1 / "speed").write_text("-1\n")
    tree.now += 1
    data = source.collect_sync()
    assert net(data, "llm_host_network_up")["eno1"] == 0
    assert "eno1" not in net(data, "llm_host_network_speed_bytes_per_second")


def test_each_search_interval_reads_the_rates_and_finds_new_links(tmp_path: pathlib.Path) -> None:
    tree = Tree(tmp_path)
    source = tree.source()
    source.collect_sync()
    eno1 = tree.sys / "class" / "net" / "eno1"
    (eno1 / "speed").write_text("10000\n")  # renegotiated between two cycles, operstate still up
    shutil.copytree(tree.sys / "devices" / "virtual" / "net" / "veth0a1b2c",
                    tree.sys / "devices" / "virtual" / "net" / "eth7")
    os.symlink("../../devices/virtual/net/eth7", tree.sys / "class" / "net" / "eth7")
    tree.now += 1  # before the search interval: nothing listed again
    data = source.collect_sync()
    assert net(data, "llm_host_network_speed_bytes_per_second")["eno1"] == 3.125e9
    assert "eth7" not in info(data)
    tree.now += 10
    data = source.collect_sync()
    assert net(data, "llm_host_network_speed_bytes_per_second")["eno1"] == 1.25e9
    assert "eth7" in info(data)


# --- hostile trees -----------------------------------------------------------------------------


def hostile_tree(root: pathlib.Path, interfaces: int) -> pathlib.Path:
    """A sysfs with `interfaces` virtual NICs, each with a full set of files."""
    sys_root = root / "sys"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "stat").write_text("cpu  1 0 1 10 0 0 0 0 0 0\n")
    devices = sys_root / "devices" / "virtual" / "net"
    cls = sys_root / "class" / "net"
    cls.mkdir(parents=True)
    for i in range(interfaces):
        name = f"dummy{i:05d}"
        d = devices / name
        (d / "statistics").mkdir(parents=True)
        (d / "type").write_text("1\n")
        (d / "operstate").write_text("up\n")
        (d / "speed").write_text("10000\n")
        for stat in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
                     "tx_dropped"):
            (d / "statistics" / stat).write_text(f"{i}\n")
        os.symlink(f"../../devices/virtual/net/{name}", cls / name)
    return sys_root


def steady_cycle_cpu_s(source: HostSource, clock: list[float], cycles: int = 10) -> float:
    """Best of 3 runs of the CPU time per cycle, with the clock stepped 1 s (no rediscovery)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(cycles):
            clock[0] += 1.0
            source.collect_sync()
        best = min(best, (time.process_time() - started) / cycles)
    return best


def test_thousands_of_interfaces_stay_bounded(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.sources import host_net

    big = hostile_tree(tmp_path / "big", 5000)
    small = hostile_tree(tmp_path / "small", MAX_NETWORK_LINKS)
    discovery_reads = []
    real_read_attr = host_net.read_attr
    monkeypatch.setattr(host_net, "read_attr", lambda p: discovery_reads.append(p) or real_read_attr(p))

    def make(sys_root: pathlib.Path) -> tuple[HostSource, list[float]]:
        clock = [0.0]
        opts = HostOptions(proc_root=str(sys_root.parent / "proc"), sys_root=str(sys_root), search_interval_s=1e6)
        return HostSource(opts, clock=lambda: clock[0]), clock

    process = psutil.Process()
    gc.collect()
    rss_before = process.memory_info().rss
    source, clock = make(big)
    started = time.process_time()
    data = source.collect_sync()  # the discovery
    discovery_s = time.process_time() - started
    devices = info(data)
    assert len(devices) == MAX_NETWORK_LINKS
    assert all(d.startswith("dummy") for d in devices)  # past MAX_NETWORK_ENTRIES: those listed first
    # Discovery reads at most MAX_CLASSIFIED entries' type, ifindex and numa_node, and the kept links' rates.
    assert len(discovery_reads) <= 3 * MAX_CLASSIFIED + MAX_NETWORK_LINKS
    assert len(source.network.held_files) <= MAX_HELD_NETWORK_FILES
    per_cycle_big = steady_cycle_cpu_s(source, clock)
    for _ in range(20):
        clock[0] += 1.0
        source.collect_sync()
    gc.collect()
    growth = process.memory_info().rss - rss_before
    assert growth < 30_000_000, f"RSS grew {growth / 1e6:.1f} MB with 5000 interfaces"
    small_source, small_clock = make(small)
    small_source.collect_sync()
    per_cycle_small = steady_cycle_cpu_s(small_source, small_clock)
    # The same 64 links are read every cycle whatever the tree holds.
    assert per_cycle_big < 5 * per_cycle_small + 0.002, (per_cycle_big, per_cycle_small)
    print(f"5000 interfaces: discovery {discovery_s * 1e3:.1f} ms CPU, cycle {per_cycle_big * 1e3:.2f} ms; "
          f"64 interfaces: cycle {per_cycle_small * 1e3:.2f} ms; RSS +{growth / 1e6:.1f} MB")


def test_sysfs_parsers() -> None:
    assert parse_netdev_speed("25000\n") == 3.125e9
    for unknown in ("-1\n", "0", "4294967295", "", "fast", None):
        assert parse_netdev_speed(unknown) is None
    assert parse_ib_rate("200 Gb/sec (4X HDR)\n") == 25e9
    assert parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    for unknown in ("", "junk", "0 Gb/sec", "100 Mb/sec", None):
        assert parse_ib_rate(unknown) is None
    assert parse_ib_state("4: ACTIVE\n") == 4 and parse_ib_state("1: DOWN") == 1 and parse_ib_state("x") is None
    assert pci_root_of("/sys/devices/pci0000:15/0000:15:01.0/0000:18:00.0") == "pci0000:15"
    assert pci_root_of("/sys/devices/virtual/net/veth0") is None


PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier
    lo:  123456     100    0    0    0     0          0         0   123456     100    0    0    0     0       0     0
  eth0: 2941357552 74169 1 2 0 0 0 0 3647552 38885 3 4 0 0 0 0
 eth1:0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
"""


def test_parse_proc_net_dev() -> None:
    got = parse_proc_net_dev(PROC_NET_DEV, {"eth0", "eth1", "absent"})
    assert got["eth0"] == {"receive_bytes": 2941357552, "receive_packets": 74169, "receive_errors": 1,
                           "receive_drops": 2, "transmit_bytes": 3647552, "transmit_packets": 38885,
                           "transmit_errors": 3, "transmit_drops": 4}
    assert got["eth1"]["transmit_bytes"] == 8 and got["eth1"]["transmit_drops"] == 11  # no space after ':'
    assert set(got) == {"eth0", "eth1"}  # only the wanted ones
    assert parse_proc_net_dev("x\ny\n  eth0: 1 2 junk\n", {"eth0"}) == {}


def test_sysfs_of_another_namespace_reads_the_statistics_files(tmp_path: pathlib.Path) -> None:
    """A NIC whose sysfs ifindex is not this process's index for its name (the host's /sys in a
    container with its own network): its counters come from its statistics/ files, never from
    this process's /proc/self/net/dev (whose eth0 would be another interface)."""
    tree = Tree(tmp_path)
    for nic in (tree.sys / "class" / "net").iterdir():
        (nic / "ifindex").write_text("99999\n")
    source = tree.source()
    data = source.collect_sync()
    assert not source.network._own_namespace  # noqa: SLF001 - the choice is what is tested
    assert "/proc/self/net/dev" not in source.held_files
    assert net(data, "llm_host_network_receive_bytes_total")["eno1"] == 1_000_000_000


# --- the simulated host ------------------------------------------------------------------------


def sim_state(t: float, rx: int, **overrides) -> dict:
    link = {"device": "mlx5_0:1", "kind": "infiniband", "up": True, "speed_bytes_per_s": 5e10, "numa_node": 0,
            "engine": True, "receive_bytes": rx, "transmit_bytes": 1000, "receive_packets": 10,
            "transmit_packets": 20, "receive_errors": 0, "transmit_errors": 0, "receive_drops": 1,
            "transmit_drops": 2}
    link.update(overrides)
    return {
        "twin_time_s": t, "cpus": [0.1], "cpu_all": 0.1, "online_cpus": "0", "load": [0.1, 0.1, 0.1],
        "memory_total_bytes": 1 << 30, "memory_available_bytes": 1 << 29,
        "numa_nodes": [{"node": 0, "cpus": "0", "memory_total_bytes": 1 << 30, "memory_free_bytes": 1 << 29}],
        "pressure": {r: {"avg10": 0, "avg60": 0, "avg300": 0, "total_seconds": 0} for r in ("cpu", "memory", "io")},
        "gpus": [], "engine": {"cpu_seconds_total": 1, "busiest_thread_cpu_ratio": 0.1, "threads": 4,
                               "resident_memory_bytes": 1, "cpus_allowed": "0"},
        "network": [link],
    }


def as_data(samples: list[Sample]) -> SourceData:
    return SourceData(tuple(samples))


def test_sim_network_same_families_and_rate_code(tmp_path: pathlib.Path) -> None:
    rates = ByteRates()
    first, _ = samples_from_host_state(sim_state(10.0, 0), rates)
    assert utilization(as_data(first)) == {}
    second, _ = samples_from_host_state(sim_state(12.0, int(1e10)), rates)
    data = as_data(second)
    assert utilization(data)[("mlx5_0:1", "receive")] == pytest.approx(1e10 / 2 / 5e10)
    assert info(data)["mlx5_0:1"] == {"device": "mlx5_0:1", "engine": "true", "kind": "infiniband",
                                      "numa_node": "0"}
    assert net(data, "llm_host_network_speed_bytes_per_second") == {"mlx5_0:1": 5e10}
    tree = Tree(tmp_path)
    _, real = tree.two_cycles(tree.source())

    def shape(d: SourceData) -> set[tuple[str, tuple[str, ...]]]:
        return {(s.name, tuple(k for k, _ in s.labels)) for s in d.samples if "network" in s.name}

    assert shape(data) == shape(real)
    unknown_rate, _ = samples_from_host_state(sim_state(1.0, 0, speed_bytes_per_s=None, numa_node=None))
    assert "mlx5_0:1" not in net(as_data(unknown_rate), "llm_host_network_speed_bytes_per_second")
    assert info(as_data(unknown_rate))["mlx5_0:1"]["numa_node"] == ""


@pytest.mark.parametrize("bad", [
    {"kind": "token-ring"}, {"device": ""}, {"device": "x" * 200}, {"device": 'a"b'}, {"up": 1},
    {"engine": "yes"}, {"receive_bytes": -1}, {"receive_bytes": float("nan")}, {"transmit_bytes": 1e300},
    {"speed_bytes_per_s": 0}, {"numa_node": -1}, {"receive_drops": "7"},
])
def test_sim_network_is_validated(bad: dict) -> None:
    with pytest.raises((ValueError, TypeError, KeyError)):
        samples_from_host_state(sim_state(1.0, 0, **bad))


def test_sim_network_is_bounded() -> None:
    state = sim_state(1.0, 0)
    link = state["network"][0]
    state["network"] = [{**link, "device": f"eth{i}"} for i in range(MAX_NETWORK_LINKS + 1)]
    with pytest.raises(ValueError):
        samples_from_host_state(state)
    state["network"] = [link, dict(link)]  # the same device twice
    with pytest.raises(ValueError):
        samples_from_host_state(state)
    del state["network"]
    samples, _ = samples_from_host_state(state)  # no network: no network series, not an error
    assert not any("network" in s.name for s in samples)
