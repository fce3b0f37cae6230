"""NVML enums the exporter exports as numeric codes, declared once: the catalogue's help texts, the
simulated GPU, the alert rules and the dashboards' value mappings are all built from them. Data
only (exporter/specs), so the simulator may read them without importing the exporter.
"""

from __future__ import annotations

RECOVERY_ACTIONS: tuple[tuple[int, str], ...] = (
    (0, "none"),
    (1, "gpu_reset"),
    (2, "node_reboot"),
    (3, "drain_p2p"),
    (4, "drain_and_reset"),
    (5, "recover_imex_domain"),
    (6, "bus_reset"),
    (7, "system_reboot"),
)
"""nvmlDeviceGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): what the driver says the GPU
needs before it can be used again."""
FABRIC_STATES: tuple[tuple[int, str], ...] = (
    (1, "not_started"),
    (2, "in_progress"),
    (3, "completed"),
)
"""nvmlGpuFabricState_t without NOT_SUPPORTED (0): a GPU outside an NVSwitch fabric has no series."""
FABRIC_COMPLETED = 3
FABRIC_HEALTH: tuple[tuple[int, str], ...] = (
    (1, "healthy"),
    (2, "unhealthy"),
    (3, "limited_capacity"),
)
"""NVML_GPU_FABRIC_HEALTH_SUMMARY_* without NOT_SUPPORTED (0)."""
FABRIC_HEALTHY = 1
