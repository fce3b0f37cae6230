"""Host families: CPU, load, memory, NUMA, PSI, the GPUs' PCIe links and the network links from
sysfs, and the engine process. Provided by exporter/sources/host.py from /proc and /sys (docs/host.md)."""

from exporter.catalog.base import family

FAMILIES = (
    family("llm_host_cpu_busy_ratio", "gauge", "ratio",
           "Share of the last cycle each CPU was busy (not idle or iowait; steal counts as busy), from "
           "/proc/stat deltas; cpu=\"all\" is the whole host, cpu=\"busiest\" the busiest CPU, the others one "
           "per CPU (--profile full). Absent on the first cycle.",
           ("cpu",), "host"),
    family("llm_host_cpus", "gauge", "cpus",
           "CPUs the host source reads in /proc/stat (online CPUs of the host, whatever the container's quota).",
           (), "host"),
    family("llm_host_load1", "gauge", "tasks",
           "1-minute load average from /proc/loadavg (runnable plus uninterruptible tasks).", (), "host"),
    family("llm_host_load5", "gauge", "tasks",
           "5-minute load average from /proc/loadavg.", (), "host"),
    family("llm_host_load15", "gauge", "tasks",
           "15-minute load average from /proc/loadavg.", (), "host"),
    family("llm_host_memory_total_bytes", "gauge", "bytes",
           "Usable RAM (MemTotal in /proc/meminfo).", (), "host"),
    family("llm_host_memory_available_bytes", "gauge", "bytes",
           "RAM available to new allocations without swapping (MemAvailable in /proc/meminfo).", (), "host"),
    family("llm_host_numa_memory_total_bytes", "gauge", "bytes",
           "RAM of each NUMA node (sysfs node*/meminfo MemTotal).", ("node",), "host"),
    family("llm_host_numa_memory_free_bytes", "gauge", "bytes",
           "Free RAM of each NUMA node (sysfs node*/meminfo MemFree; page cache counts as used).",
           ("node",), "host"),
    family("llm_host_pressure_waiting_ratio", "gauge", "ratio",
           "PSI \"some\": share of wall time in which at least one task waited for the resource, averaged "
           "by the kernel over the window. Absent where the kernel has no /proc/pressure.",
           ("resource", "window"), "host"),
    family("llm_host_pressure_waiting_seconds_total", "counter", "seconds",
           "PSI \"some\" total: cumulative time at least one task waited for the resource.",
           ("resource",), "host"),
    family("llm_host_gpu_pcie_link_speed_gts", "gauge", "GT/s",
           "PCIe link speed of each NVIDIA GPU's PCI device in GT/s from sysfs (state=current|max; "
           "8 = Gen3, 16 = Gen4, 32 = Gen5). Idle GPUs lower the current speed to save power.",
           ("pci", "state"), "host"),
    family("llm_host_gpu_pcie_link_width", "gauge", "lanes",
           "PCIe link width of each NVIDIA GPU's PCI device from sysfs (state=current|max); current "
           "below max means the link trained down.", ("pci", "state"), "host"),
    family("llm_host_gpu_numa_node", "gauge", "node",
           "NUMA node the GPU's PCI device is attached to (sysfs numa_node); absent when the firmware "
           "gives none.", ("pci",), "host"),
    family("llm_host_network_info", "gauge", "info",
           "1 for each network link read: a NIC from /sys/class/net (device = interface name) or an RDMA "
           "port from /sys/class/infiniband (device = <ibdev>:<port>). kind = ethernet (any netdev but "
           "IPoIB), infiniband (an IB port, or an IPoIB netdev) or roce (an RDMA port whose link_layer is "
           "Ethernet); numa_node from the device's sysfs numa_node (empty when unknown); engine = true when "
           "the link belongs to the engine (engine_network_devices, else same NUMA node or PCI host bridge "
           "as the engine's GPUs).", ("device", "engine", "kind", "numa_node"), "host"),
    family("llm_host_network_up", "gauge", "bool",
           "1 when the link is up (NIC operstate \"up\", or \"unknown\" with carrier 1; RDMA port state "
           "4: ACTIVE), else 0.", ("device",), "host"),
    family("llm_host_network_speed_bytes_per_second", "gauge", "bytes/s",
           "Link rate in bytes per second: NIC sysfs speed (Mb/s) x 125000, RDMA port rate (\"200 Gb/sec "
           "(4X HDR)\") / 8. Absent when unknown (a down NIC says -1), never 0.", ("device",), "host"),
    family("llm_host_network_receive_bytes_total", "counter", "bytes",
           "Bytes received: NIC statistics/rx_bytes; RDMA port counters/port_rcv_data x 4 (the kernel counts"
           " 4-byte words).", ("device",), "host"),
    family("llm_host_network_transmit_bytes_total", "counter", "bytes",
           "Bytes transmitted: NIC statistics/tx_bytes; RDMA port counters/port_xmit_data x 4 (4-byte "
           "words).", ("device",), "host"),
    family("llm_host_network_receive_packets_total", "counter", "packets",
           "Packets received: NIC statistics/rx_packets; RDMA port counters/port_rcv_packets.", ("device",), "host"),
    family("llm_host_network_transmit_packets_total", "counter", "packets",
           "Packets transmitted: NIC statistics/tx_packets; RDMA port counters/port_xmit_packets.",
           ("device",), "host"),
    family("llm_host_network_receive_errors_total", "counter", "packets",
           "Received packets with errors: NIC statistics/rx_errors; RDMA port counters/port_rcv_errors "
           "(physical, malformed, overrun, mapping errors).", ("device",), "host"),
    family("llm_host_network_transmit_errors_total", "counter", "packets",
           "Packets not transmitted because of an error: NIC statistics/tx_errors; RDMA port "
           "counters/port_xmit_constraint_errors (the port's only transmit-side error counter).", ("device",), "host"),
    family("llm_host_network_receive_drops_total", "counter", "packets",
           "Received packets dropped: NIC statistics/rx_dropped; RDMA port hw_counters/out_of_buffer (mlx5: "
           "no receive buffer posted; absent on HCAs without it).", ("device",), "host"),
    family("llm_host_network_transmit_drops_total", "counter", "packets",
           "Packets dropped before transmission: NIC statistics/tx_dropped; RDMA port "
           "counters/port_xmit_discards (port down or congested).", ("device",), "host"),
    family("llm_host_network_utilization_ratio", "gauge", "ratio",
           "Bytes per second over the last cycle in each direction (receive | transmit) divided by the link "
           "rate, 0..1. Absent on a link's first cycle, after a counter reset, and when the rate is unknown.",
           ("device", "direction"), "host"),
    family("llm_engine_process_found", "gauge", "bool",
           "1 when the configured engine process (pid file, port or name) was found this cycle, else 0. "
           "Absent when no selector is configured.", (), "host"),
    family("llm_engine_process_cpu_seconds_total", "counter", "seconds",
           "User plus system CPU time of the engine process and, by default, its child processes "
           "(a child that exits takes its share with it, which rate() reads as a reset).", (), "host"),
    family("llm_engine_process_busiest_thread_cpu_ratio", "gauge", "ratio",
           "CPU share of the engine's busiest thread over a 5 s window (0..1), computed every 5 s and "
           "repeated in between; ~1 means one thread (tokenizer, scheduler, HTTP loop) is saturated "
           "whatever the other cores do.", (), "host"),
    family("llm_engine_process_threads", "gauge", "threads",
           "Threads of the engine process (and its children by default).", (), "host"),
    family("llm_engine_process_resident_memory_bytes", "gauge", "bytes",
           "Resident set size of the engine process (and its children by default; shared pages count "
           "once per process).", (), "host"),
    family("llm_engine_numa_mismatch", "gauge", "bool",
           "1 when the engine process is pinned (Cpus_allowed_list) to CPUs outside the NUMA node(s) of "
           "the GPUs it uses, 0 when not (or unpinned). Absent when the topology is unknown.", (), "host"),
)
