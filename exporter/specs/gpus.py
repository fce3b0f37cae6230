"""Peak specs of the GPUs an inference engine runs on, matched from NVML device names.

Every number carries its source (`GpuSpec.sources[field]`). Numbers that the research notes
(shared/reference/nvml.md section 4) could not re-read from a vendor page, and the TDP, clock and
memory-clock figures that section does not give at all, are listed in `GpuSpec.unverified`:
check them against the datasheet before trusting an efficiency ratio built on them.

Conventions: bandwidths in bytes/s (decimal, as datasheets state them), FLOPS dense (NVIDIA's
headline tensor numbers are 2:4 sparse, exactly 2x dense), memory in bytes as the product name
says in GiB (NVML reports totals within a few percent of that), NVLink as the per-GPU
bidirectional aggregate the datasheets quote.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GiB = 1 << 30
TB = 1e12
GB = 1e9
TFLOPS = 1e12
MHz = 1e6

# Usable bytes/s per lane and direction after line coding (8b/10b for gen 1-2, 128b/130b after).
_PCIE_LANE_BYTES_PER_S: Mapping[int, float] = MappingProxyType(
    {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
)


def pcie_bytes_per_s(gen: int, width: int) -> float:
    """One-direction PCIe payload bandwidth of a link (before protocol overhead of TLP headers)."""
    if gen not in _PCIE_LANE_BYTES_PER_S:
        raise ValueError(f"unknown PCIe generation {gen}")
    return _PCIE_LANE_BYTES_PER_S[gen] * width


SPEC_FIELDS = (
    "memory_bytes",
    "mem_bandwidth_bytes_per_s",
    "bf16_dense_flops",
    "fp8_dense_flops",
    "nvlink_bytes_per_s",
    "pcie_gen",
    "pcie_width",
    "tdp_watts",
    "max_sm_clock_hz",
    "max_mem_clock_hz",
)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    key: str
    display: str
    nvml_name: str  # what nvmlDeviceGetName returns (nvml.md 4.1)
    memory_bytes: int
    memory_type: str
    mem_bandwidth_bytes_per_s: float
    bf16_dense_flops: float
    fp8_dense_flops: float | None  # None: no FP8 tensor cores
    nvlink_bytes_per_s: float | None  # per GPU, both directions; None: no NVLink
    pcie_gen: int
    pcie_width: int
    tdp_watts: float
    max_sm_clock_hz: float
    max_mem_clock_hz: float
    sources: Mapping[str, str] = field(default_factory=dict)
    unverified: frozenset[str] = frozenset()
    match: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def pcie_bytes_per_s(self) -> float:
        """One direction, at the generation and width the card supports."""
        return pcie_bytes_per_s(self.pcie_gen, self.pcie_width)

    @property
    def nvlink_unidirectional_bytes_per_s(self) -> float | None:
        return None if self.nvlink_bytes_per_s is None else self.nvlink_bytes_per_s / 2

    def source_of(self, field_name: str) -> str:
        mark = " (unverified: needs checking)" if field_name in self.unverified else ""
        return self.sources.get(field_name, "unknown") + mark


# --- sources, abbreviated as in nvml.md section 1 -------------------------------------------
_NOTE_MEM = "recalled from the vendor page, not re-read (nvml.md 4: '(mem)')"
_NOTE_NOT_IN_TABLE = "not in nvml.md 4; from memory of the datasheet"
_NOTE_MEMCLK = "max memory clock as NVML reports it; not in nvml.md 4, from memory"


def _entry(
    key: str,
    display: str,
    nvml_name: str,
    *,
    mem_gib: float,
    mem_type: str,
    bw_tb: float,
    bf16_tf: float,
    fp8_tf: float | None,
    nvlink_gb: float | None,
    pcie: tuple[int, int],
    tdp_w: float,
    sm_mhz: float,
    mem_mhz: float,
    src: Mapping[str, str],
    unverified: tuple[str, ...],
    match: tuple[str, ...],
    exclude: tuple[str, ...] = (),
) -> GpuSpec:
    sources = dict(src)
    # The research table gives no TDP or clocks; they are always "needs checking".
    sources.setdefault("tdp_watts", _NOTE_NOT_IN_TABLE)
    sources.setdefault("max_sm_clock_hz", _NOTE_NOT_IN_TABLE)
    sources.setdefault("max_mem_clock_hz", _NOTE_MEMCLK)
    missing = set(SPEC_FIELDS) - set(sources) - {"pcie_width"}
    if missing:
        raise ValueError(f"{key}: no source for {sorted(missing)}")
    sources.setdefault("pcie_width", sources["pcie_gen"])
    return GpuSpec(
        key=key,
        display=display,
        nvml_name=nvml_name,
        memory_bytes=int(mem_gib * GiB),
        memory_type=mem_type,
        mem_bandwidth_bytes_per_s=bw_tb * TB,
        bf16_dense_flops=bf16_tf * TFLOPS,
        fp8_dense_flops=None if fp8_tf is None else fp8_tf * TFLOPS,
        nvlink_bytes_per_s=None if nvlink_gb is None else nvlink_gb * GB,
        pcie_gen=pcie[0],
        pcie_width=pcie[1],
        tdp_watts=tdp_w,
        max_sm_clock_hz=sm_mhz * MHz,
        max_mem_clock_hz=mem_mhz * MHz,
        sources=MappingProxyType(sources),
        unverified=frozenset(unverified) | {"tdp_watts", "max_sm_clock_hz", "max_mem_clock_hz"},
        match=match,
        exclude=exclude,
    )


def _src(all_: str, **per_field: str) -> dict[str, str]:
    """One source for every field, with per-field exceptions."""
    out = {f: all_ for f in SPEC_FIELDS if f not in ("tdp_watts", "max_sm_clock_hz", "max_mem_clock_hz")}
    out.update(per_field)
    return out


_A100_DS = "A100 datasheet https://www.nvidia.com/en-us/data-center/a100/ (nvml.md 4)"
_TM_A100 = "trainmeter a100_sxm_80gb.json quoting the A100 product page (nvml.md 4)"
_TM_H100 = "trainmeter h100_sxm.json: product page + Hopper whitepaper v1.04 Table 3 (nvml.md 4)"
_TM_H100P = "trainmeter h100_pcie.json: Hopper whitepaper Table 3 (nvml.md 4)"
_TM_H200 = "trainmeter h200.json: product page + H200 datasheet NOV24 (nvml.md 4)"
_MLPERF_H200 = "MLPerf v4.1 H200-SXM-141GBx8_TRT_MaxQ.json (nvml.md 4)"
_TM_B200 = "trainmeter b200.json: HGX page, Blackwell tech brief v2.1, DGX B200 datasheet (nvml.md 4)"
_TM_GB200 = "trainmeter gb200.json: GB200 NVL72 page, per-GPU share (nvml.md 4)"

GPUS: tuple[GpuSpec, ...] = (
    _entry("a100-pcie-40gb", "A100 40GB PCIe", "NVIDIA A100-PCIE-40GB", mem_gib=40, mem_type="HBM2", bw_tb=1.555,
           bf16_tf=312, fp8_tf=None, nvlink_gb=600, pcie=(4, 16), tdp_w=250, sm_mhz=1410, mem_mhz=1215,
           src=_src(_A100_DS, bf16_dense_flops="Lightning _CUDA_FLOPS / torchtitan get_peak_flops (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "nvlink_bytes_per_s"),
           match=("a100 pcie 40gb", "a100 40gb pcie")),
    _entry("a100-sxm4-40gb", "A100 40GB SXM4", "NVIDIA A100-SXM4-40GB", mem_gib=40, mem_type="HBM2", bw_tb=1.555,
           bf16_tf=312, fp8_tf=None, nvlink_gb=600, pcie=(4, 16), tdp_w=400, sm_mhz=1410, mem_mhz=1215,
           src=_src(_A100_DS), unverified=("mem_bandwidth_bytes_per_s",),
           match=("a100 sxm4 40gb", "a100 sxm 40gb")),
    _entry("a100-pcie-80gb", "A100 80GB PCIe", "NVIDIA A100 80GB PCIe", mem_gib=80, mem_type="HBM2e", bw_tb=1.935,
           bf16_tf=312, fp8_tf=None, nvlink_gb=600, pcie=(4, 16), tdp_w=300, sm_mhz=1410, mem_mhz=1512,
           src=_src(_TM_A100,
                    mem_bandwidth_bytes_per_s="trainmeter: 'the 80GB PCIe column has 1,935 GB/s' (nvml.md 4)"),
           unverified=(), match=("a100 80gb pcie", "a100 pcie 80gb", "a100 pcie")),
    _entry("a100-sxm4-80gb", "A100 80GB SXM4", "NVIDIA A100-SXM4-80GB", mem_gib=80, mem_type="HBM2e", bw_tb=2.039,
           bf16_tf=312, fp8_tf=None, nvlink_gb=600, pcie=(4, 16), tdp_w=400, sm_mhz=1410, mem_mhz=1593,
           src=_src(_TM_A100), unverified=(), match=("a100 sxm4 80gb", "a100 sxm 80gb", "a100 sxm4", "a100 sxm")),
    _entry("h100-sxm", "H100 SXM5 80GB", "NVIDIA H100 80GB HBM3", mem_gib=80, mem_type="HBM3", bw_tb=3.35,
           bf16_tf=989.5, fp8_tf=1979, nvlink_gb=900, pcie=(5, 16), tdp_w=700, sm_mhz=1980, mem_mhz=2619,
           src=_src(_TM_H100, fp8_dense_flops="3,958 sparse / 2; Lightning h100-sxm (nvml.md 4)"),
           unverified=(), match=("h100 80gb hbm3", "h100 sxm", "h100 sxm5")),
    _entry("h100-pcie", "H100 PCIe 80GB", "NVIDIA H100 PCIe", mem_gib=80, mem_type="HBM2e", bw_tb=2.0, bf16_tf=756,
           fp8_tf=1513, nvlink_gb=600, pcie=(5, 16), tdp_w=350, sm_mhz=1755, mem_mhz=1593,
           src=_src(_TM_H100P, fp8_dense_flops="Lightning h100-pcie 1.513e15 (nvml.md 4)"),
           unverified=("fp8_dense_flops",), match=("h100 pcie", "h100 80gb pcie", "h100 hbm2e")),
    _entry("h100-nvl", "H100 NVL 94GB", "NVIDIA H100 NVL", mem_gib=94, mem_type="HBM3", bw_tb=3.9, bf16_tf=835,
           fp8_tf=1671, nvlink_gb=600, pcie=(5, 16), tdp_w=400, sm_mhz=1785, mem_mhz=2619,
           src=_src("torchtitan 'NVL' -> 835e12, nvidia.com/en-us/data-center/h100/ (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "fp8_dense_flops"), match=("h100 nvl",)),
    _entry("h200-sxm", "H200 SXM 141GB", "NVIDIA H200", mem_gib=141, mem_type="HBM3e", bw_tb=4.8, bf16_tf=989.5,
           fp8_tf=1979, nvlink_gb=900, pcie=(5, 16), tdp_w=700, sm_mhz=1980, mem_mhz=3201,
           src=_src(_TM_H200, nvlink_bytes_per_s=_MLPERF_H200, pcie_gen=_MLPERF_H200),
           unverified=(), match=("h200", "h200 sxm"), exclude=("h200 nvl",)),
    _entry("h200-nvl", "H200 NVL 141GB", "NVIDIA H200 NVL", mem_gib=141, mem_type="HBM3e", bw_tb=4.8, bf16_tf=836,
           fp8_tf=1671, nvlink_gb=900, pcie=(5, 16), tdp_w=600, sm_mhz=1785, mem_mhz=3201,
           src=_src("nvidia.com/en-us/data-center/h200/ (nvml.md 4)",
                    bf16_dense_flops="nanochat/torchtitan-derived tables 836e12 (nvml.md 4)"),
           unverified=("memory_bytes", "mem_bandwidth_bytes_per_s", "fp8_dense_flops", "nvlink_bytes_per_s",
                       "pcie_gen"),
           match=("h200 nvl",)),
    _entry("h20", "H20 96GB", "NVIDIA H20", mem_gib=96, mem_type="HBM3", bw_tb=4.0, bf16_tf=148, fp8_tf=296,
           nvlink_gb=900, pcie=(5, 16), tdp_w=400, sm_mhz=1980, mem_mhz=2619,
           src=_src("no NVIDIA public datasheet; HF hardware page 96 GB / 148 TFLOPS / 400 W (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "fp8_dense_flops", "nvlink_bytes_per_s", "pcie_gen"),
           match=("h20",)),
    _entry("l40s", "L40S 48GB", "NVIDIA L40S", mem_gib=48, mem_type="GDDR6", bw_tb=0.864, bf16_tf=362, fp8_tf=733,
           nvlink_gb=None, pcie=(4, 16), tdp_w=350, sm_mhz=2520, mem_mhz=9001,
           src=_src("torchtitan: resources.nvidia.com/en-us-l40s/l40s-datasheet-28413 -> 362e12 (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "fp8_dense_flops"), match=("l40s",)),
    _entry("l4", "L4 24GB", "NVIDIA L4", mem_gib=24, mem_type="GDDR6", bw_tb=0.300, bf16_tf=121, fp8_tf=242.5,
           nvlink_gb=None, pcie=(4, 16), tdp_w=72, sm_mhz=2040, mem_mhz=6251,
           src=_src("L4 datasheet; nanochat-derived table l4 121e12 (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "fp8_dense_flops"), match=("l4",)),
    _entry("a10", "A10 24GB", "NVIDIA A10", mem_gib=24, mem_type="GDDR6", bw_tb=0.600, bf16_tf=125, fp8_tf=None,
           nvlink_gb=None, pcie=(4, 16), tdp_w=150, sm_mhz=1695, mem_mhz=6251,
           src=_src("Lightning _CUDA_FLOPS, a10-datasheet.pdf (nvml.md 4)"), unverified=(), match=("a10",)),
    _entry("a10g", "A10G 24GB (AWS G5)", "NVIDIA A10G", mem_gib=24, mem_type="GDDR6", bw_tb=0.600, bf16_tf=125,
           fp8_tf=None, nvlink_gb=None, pcie=(4, 16), tdp_w=300, sm_mhz=1710, mem_mhz=6251,
           src=_src("Baseten 'A10 vs A10G' (nvml.md 4)",
                    bf16_dense_flops="unpublished; Lightning reuses the A10's 125 (nvml.md 4)"),
           unverified=("bf16_dense_flops",), match=("a10g",)),
    _entry("rtx-4090", "GeForce RTX 4090 24GB", "NVIDIA GeForce RTX 4090", mem_gib=24, mem_type="GDDR6X", bw_tb=1.008,
           bf16_tf=165.2, fp8_tf=330.3, nvlink_gb=None, pcie=(4, 16), tdp_w=450, sm_mhz=2520, mem_mhz=10501,
           src=_src("nanochat table 4090 (FP32 accumulate); Ada whitepaper v2.1 (nvml.md 4)"),
           unverified=("mem_bandwidth_bytes_per_s", "fp8_dense_flops"), match=("rtx 4090", "geforce rtx 4090")),
    _entry("b200", "B200 180GB", "NVIDIA B200", mem_gib=180, mem_type="HBM3e", bw_tb=8.0, bf16_tf=2250, fp8_tf=4500,
           nvlink_gb=1800, pcie=(5, 16), tdp_w=1000, sm_mhz=1965, mem_mhz=3996,
           src=_src(_TM_B200, mem_bandwidth_bytes_per_s="DGX 64 TB/s / 8; tech brief says 7.7 TB/s (nvml.md 4)"),
           unverified=(), match=("b200", "b200 sxm"), exclude=("gb200",)),
    _entry("gb200", "GB200 (per GPU) 186GB", "NVIDIA GB200", mem_gib=186, mem_type="HBM3e", bw_tb=8.0, bf16_tf=2500,
           fp8_tf=5000, nvlink_gb=1800, pcie=(5, 16), tdp_w=1200, sm_mhz=1965, mem_mhz=3996,
           src=_src(_TM_GB200, pcie_gen="GPU attaches to Grace over NVLink-C2C; PCIe figure nominal"),
           unverified=("fp8_dense_flops", "pcie_gen"), match=("gb200",)),
)

_BY_KEY: Mapping[str, GpuSpec] = MappingProxyType({g.key: g for g in GPUS})


def normalize_gpu_name(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100 sxm4 80gb'; MIG suffixes (' MIG 1g.10gb') are dropped."""
    n = name.lower().replace("-", " ").replace("_", " ")
    n = re.sub(r"\s+mig\s.*$", "", n)
    n = re.sub(r"^(nvidia|amd)\s+", "", n)
    return re.sub(r"\s+", " ", n).strip()


def _contains_token(haystack: str, needle: str) -> bool:
    # Whole-token match so that 'l4' does not match 'l40s' and 'a10' not 'a100'.
    return re.search(rf"(?<![a-z0-9]){re.escape(needle)}(?![a-z0-9])", haystack) is not None


def _match_score(spec: GpuSpec, normalized: str) -> int:
    if any(_contains_token(normalized, e) for e in spec.exclude):
        return 0
    return max((len(m) for m in spec.match if _contains_token(normalized, m)), default=0)


def _apply_overrides(spec: GpuSpec, overrides: Mapping[str, float | int]) -> GpuSpec:
    unknown = set(overrides) - set(SPEC_FIELDS)
    if unknown:
        raise ValueError(f"unknown GPU spec override(s) {sorted(unknown)}; known: {', '.join(SPEC_FIELDS)}")
    sources = dict(spec.sources)
    for k in overrides:
        sources[k] = "user override"
    return dataclasses.replace(
        spec,
        **{k: v for k, v in overrides.items()},  # type: ignore[arg-type]
        sources=MappingProxyType(sources),
        unverified=spec.unverified - set(overrides),
    )


_CUSTOM_REQUIRED = ("memory_bytes", "mem_bandwidth_bytes_per_s", "bf16_dense_flops")


def _custom(name: str, overrides: Mapping[str, float | int]) -> GpuSpec | None:
    """An unknown card is only usable when the user gave the numbers the roofline needs."""
    if not all(k in overrides for k in _CUSTOM_REQUIRED):
        return None
    base = GpuSpec(
        key="custom", display=name or "custom GPU", nvml_name=name or "custom GPU",
        memory_bytes=0, memory_type="unknown", mem_bandwidth_bytes_per_s=0.0, bf16_dense_flops=0.0,
        fp8_dense_flops=None, nvlink_bytes_per_s=None, pcie_gen=4, pcie_width=16, tdp_watts=300.0,
        max_sm_clock_hz=1500 * MHz, max_mem_clock_hz=1500 * MHz,
        sources=MappingProxyType({f: "default for an unknown GPU" for f in SPEC_FIELDS}),
        unverified=frozenset(SPEC_FIELDS),
    )
    return _apply_overrides(base, overrides)


def lookup_gpu(name: str, overrides: Mapping[str, float | int] | None = None) -> GpuSpec | None:
    """The spec for an NVML device name (or a table key such as 'h100-sxm'), or None when unknown.

    The longest whole-token match wins ('h200 nvl' beats 'h200'). An unknown card gets no spec, so
    no efficiency ratio is computed from a guess, unless `overrides` give at least memory_bytes,
    mem_bandwidth_bytes_per_s and bf16_dense_flops. Overrides also replace fields of a known card.
    """
    spec = _BY_KEY.get(name.strip().lower())
    if spec is None:
        normalized = normalize_gpu_name(name)
        best = max(GPUS, key=lambda g: _match_score(g, normalized))
        spec = best if _match_score(best, normalized) > 0 else None
    if spec is None:
        return _custom(name, overrides) if overrides else None
    return _apply_overrides(spec, overrides) if overrides else spec


def known_gpus() -> tuple[GpuSpec, ...]:
    return GPUS
