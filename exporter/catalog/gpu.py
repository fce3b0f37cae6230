"""GPU families: read through NVML (exporter/sources/gpu/nvml.py) or simulated (sim.py).

Every per-GPU series carries `gpu` (NVML index), `uuid` and `name`; in DaemonSet mode
(--kubernetes-gpu-mapping) a GPU that a pod holds also `pod`, `namespace` and `container`
(exporter/sources/gpu/attribution.py). Units are base units; NVML's
mW, mJ, MHz, KiB and MiB/s are converted at the source. A field the GPU does not support is
omitted for that GPU, never exported as 0 or NaN.
"""

from exporter.catalog.base import family
from exporter.specs.nvml_codes import FABRIC_HEALTH, FABRIC_STATES, RECOVERY_ACTIONS

G = ("gpu", "uuid", "name")

# NVML enums exported as numeric codes (exporter/specs/nvml_codes.py): one gauge per GPU that an
# alert compares with a number and a state-timeline maps to words, instead of one series per state.


def code_list(codes: tuple[tuple[int, str], ...]) -> str:
    """`0 none, 1 gpu_reset, ...` for a help text."""
    return ", ".join(f"{code} {name}" for code, name in codes)


FAMILIES = (
    family("llm_gpu_up", "gauge", "bool",
           "1 when the GPU was read through NVML this cycle, 0 when it is lost or unreadable "
           "(its other NVML series are then absent; XID counts, kept by the exporter, stay).", G, "nvml"),
    family("llm_gpu_info", "gauge", "info",
           "Always 1; labels carry the driver and CUDA driver versions, the PCI bus id and the MIG "
           "mode (enabled, disabled, unsupported).",
           G + ("driver_version", "cuda_version", "pci_bus_id", "mig_mode"), "nvml"),
    family("llm_gpu_utilization_ratio", "gauge", "ratio",
           "Fraction of the last sample period (1/6 s to 1 s) in which one or more kernels ran "
           "(nvmlDeviceGetUtilizationRates.gpu). A busy-time share, not how much of the GPU was used; "
           "absent under MIG.", G, "nvml"),
    family("llm_gpu_memory_utilization_ratio", "gauge", "ratio",
           "Fraction of the last sample period in which device memory was being read or written "
           "(nvmlDeviceGetUtilizationRates.memory). A busy-time share, not a fraction of bandwidth: "
           "use llm_gpu_dram_bandwidth_utilization_ratio for that.", G, "nvml"),
    family("llm_gpu_memory_used_bytes", "gauge", "bytes",
           "Device memory allocated by processes (nvmlDeviceGetMemoryInfo v2 `used`, which excludes "
           "driver-reserved memory; with the v1 call it includes it).", G, "nvml"),
    family("llm_gpu_memory_total_bytes", "gauge", "bytes",
           "Total installed device memory.", G, "nvml"),
    family("llm_gpu_memory_reserved_bytes", "gauge", "bytes",
           "Device memory reserved by the driver and firmware (v2 memory info; absent on drivers "
           "older than 510).", G, "nvml"),
    family("llm_gpu_power_watts", "gauge", "watts",
           "Board power draw; averaged over 1 s on Ampere (except GA100) and newer, instantaneous "
           "before.", G, "nvml"),
    family("llm_gpu_power_limit_watts", "gauge", "watts",
           "Enforced power limit: the effective limit after every limiter, in band and out of band "
           "(read every 10 s).",
           G, "nvml"),
    family("llm_gpu_power_default_limit_watts", "gauge", "watts",
           "The board's default power limit (its TDP as shipped). sw_power_cap with the enforced limit "
           "at this value is the card at its own power envelope under full load, not a fault; below it, "
           "someone lowered the limit.", G, "nvml"),
    family("llm_gpu_energy_joules_total", "counter", "joules",
           "Energy consumed since the exporter first saw the GPU's counter. NVML's counter restarts "
           "when the driver reloads; the source adds the value before the drop so this series never "
           "decreases while the exporter runs.", G, "nvml"),
    family("llm_gpu_temperature_celsius", "gauge", "celsius",
           "GPU die temperature.", G, "nvml"),
    family("llm_gpu_memory_temperature_celsius", "gauge", "celsius",
           "Memory (HBM) temperature; absent on GPUs without a memory sensor (GDDR cards).", G, "nvml"),
    family("llm_gpu_sm_clock_hertz", "gauge", "hertz",
           "Current SM clock.", G, "nvml"),
    family("llm_gpu_sm_clock_max_hertz", "gauge", "hertz",
           "Maximum SM clock of the GPU.", G, "nvml"),
    family("llm_gpu_memory_clock_hertz", "gauge", "hertz",
           "Current memory clock.", G, "nvml"),
    family("llm_gpu_memory_clock_max_hertz", "gauge", "hertz",
           "Maximum memory clock of the GPU.", G, "nvml"),
    family("llm_gpu_clock_event_active", "gauge", "bool",
           "1 while NVML reports the clock-event (throttle) reason as active, else 0. One series per "
           "reason the GPU can report: gpu_idle, applications_clocks_setting, sw_power_cap, "
           "hw_slowdown, sync_boost, sw_thermal_slowdown, hw_thermal_slowdown, "
           "hw_power_brake_slowdown, display_clock_setting.", G + ("reason",), "nvml"),
    family("llm_gpu_pcie_link_generation", "gauge", "generation",
           "PCIe link generation: state=\"current\" as trained now (idle GPUs often train down), "
           "state=\"max\" the most the GPU and its slot together support.", G + ("state",), "nvml"),
    family("llm_gpu_pcie_link_width", "gauge", "lanes",
           "PCIe link width in lanes: state=\"current\" or state=\"max\".", G + ("state",), "nvml"),
    family("llm_gpu_pcie_replay_errors_total", "counter", "errors",
           "PCIe replay counter (link-level retransmissions); restarts with the driver.", G, "nvml"),
    family("llm_gpu_pcie_tx_bytes_per_second", "gauge", "bytes_per_second",
           "PCIe traffic from the GPU, averaged between two collections: from GPM on Hopper and "
           "newer, else from NVML's cumulative PCIe byte counters. Never the 20 ms blocking "
           "nvmlDeviceGetPcieThroughput.", G, "nvml"),
    family("llm_gpu_pcie_rx_bytes_per_second", "gauge", "bytes_per_second",
           "PCIe traffic to the GPU, averaged between two collections (GPM, else cumulative "
           "counters).", G, "nvml"),
    family("llm_gpu_nvlink_tx_bytes_per_second", "gauge", "bytes_per_second",
           "NVLink data sent, all links, averaged between two collections: from GPM on Hopper and "
           "newer, else from the per-link NVLINK_THROUGHPUT_DATA_TX counters.", G, "nvml"),
    family("llm_gpu_nvlink_rx_bytes_per_second", "gauge", "bytes_per_second",
           "NVLink data received, all links, averaged between two collections (GPM, else per-link "
           "counters).", G, "nvml"),
    family("llm_gpu_ecc_errors_total", "counter", "errors",
           "Volatile ECC error count since the driver loaded, type=\"corrected\" (single-bit) or "
           "\"uncorrected\" (double-bit); absent when ECC is off.", G + ("type",), "nvml"),
    family("llm_gpu_remapped_rows", "gauge", "rows",
           "Row remapping (Ampere and newer, not under MIG): state=\"correctable\" and "
           "\"uncorrectable\" count rows remapped for each cause; state=\"pending\" is 1 when a "
           "remap waits for a GPU reset; state=\"failed\" is 1 when a remap failed.",
           G + ("state",), "nvml"),
    family("llm_gpu_recovery_action", "gauge", "code",
           "The recovery action the driver asks for before the GPU can be trusted again "
           f"(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): {code_list(RECOVERY_ACTIONS)}. Anything but 0 "
           "means the GPU needs attention; absent on drivers that do not report it.", G, "nvml"),
    family("llm_gpu_fabric_state", "gauge", "code",
           "NVLink fabric (NVSwitch) registration state of the GPU (nvmlDeviceGetGpuFabricInfoV): "
           f"{code_list(FABRIC_STATES)}. CUDA cannot use the GPU before it is 3. Absent on GPUs "
           "outside an NVSwitch fabric (PCIe cards, NVLink bridges).", G, "nvml"),
    family("llm_gpu_fabric_status", "gauge", "code",
           "Result of the GPU's fabric registration once llm_gpu_fabric_state is 3 (completed): 0 "
           "succeeded, else the NVML error code it failed with. Absent before it completes.", G, "nvml"),
    family("llm_gpu_fabric_health", "gauge", "code",
           f"NVLink fabric health summary of the GPU: {code_list(FABRIC_HEALTH)}. Absent where the "
           "driver gives no summary (nvmlGpuFabricInfo_v3, driver 550 and newer).", G, "nvml"),
    family("llm_gpu_xid_errors_total", "counter", "errors",
           "XID critical errors seen since the exporter started, by XID code (values beyond 32 "
           "distinct codes per GPU are counted as xid=\"other\"). A series appears with the first "
           "event of its code.", G + ("xid",), "nvml"),
    family("llm_gpu_engine_memory_used_bytes", "gauge", "bytes",
           "Device memory used by the engine's processes (all compute processes when no engine "
           "process is configured). PIDs are host PIDs: inside a container run with hostPID or the "
           "match fails and the series is absent.", G, "nvml"),
    family("llm_gpu_dram_bandwidth_utilization_ratio", "gauge", "ratio",
           "GPM DRAM_BW_UTIL: achieved memory bandwidth as a fraction of the GPU's theoretical "
           "peak, averaged between two collections (Hopper and newer).", G, "gpm"),
    family("llm_gpu_sm_active_ratio", "gauge", "ratio",
           "GPM SM_UTIL: fraction of SMs busy, averaged between two collections.", G, "gpm"),
    family("llm_gpu_sm_occupancy_ratio", "gauge", "ratio",
           "GPM SM_OCCUPANCY: resident warps as a fraction of the theoretical maximum.", G, "gpm"),
    family("llm_gpu_tensor_active_ratio", "gauge", "ratio",
           "GPM ANY_TENSOR_UTIL: fraction of time the SMs ran any tensor-core instruction. A busy "
           "share, not achieved FLOP/s.", G, "gpm"),
)
