"""GPU peak table and model-shape formulas (exporter/specs)."""

from __future__ import annotations

import pytest

from exporter.specs import (
    UnsupportedModel,
    active_params,
    flops_per_token,
    kv_bytes_per_token,
    load_model,
    lookup_gpu,
    total_params,
    weight_bytes,
)
from exporter.specs.gpus import GPUS, SPEC_FIELDS, normalize_gpu_name, pcie_bytes_per_s
from exporter.specs.models import (
    BUILTIN,
    expected_experts_touched,
    read_hf_config,
    weight_bytes_read_per_step,
)
from tests.conftest import FIXTURES

KiB = 1024
GiB = 1 << 30


@pytest.mark.parametrize(("nvml_name", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-sxm"),
    ("h100-sxm", "h100-sxm"),
])
def test_nvml_names_match_the_exact_model(nvml_name: str, key: str) -> None:
    spec = lookup_gpu(nvml_name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA L40", "Tesla V100-SXM2-16GB", "NVIDIA H800", ""])
def test_unknown_gpus_get_no_spec(name: str) -> None:
    # No guessed peak: an unknown card must not get an efficiency ratio built on another card's numbers.
    assert lookup_gpu(name) is None


def test_every_number_has_a_source_and_table_gaps_are_marked_unverified() -> None:
    for spec in GPUS:
        for f in SPEC_FIELDS:
            assert spec.sources.get(f), f"{spec.key}.{f} has no source"
        # nvml.md section 4 gives no TDP and no clocks: these must carry the needs-checking mark.
        assert {"tdp_watts", "max_sm_clock_hz", "max_mem_clock_hz"} <= spec.unverified
        assert spec.nvml_name and lookup_gpu(spec.nvml_name) is spec
    # Rows the research notes flagged "(mem)" stay flagged.
    assert "mem_bandwidth_bytes_per_s" in lookup_gpu("NVIDIA L4").unverified
    assert "mem_bandwidth_bytes_per_s" not in lookup_gpu("NVIDIA H100 80GB HBM3").unverified
    assert "unverified" in lookup_gpu("NVIDIA L4").source_of("mem_bandwidth_bytes_per_s")


def test_peak_numbers_from_the_table() -> None:
    h100 = lookup_gpu("NVIDIA H100 80GB HBM3")
    assert h100.mem_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.bf16_dense_flops == pytest.approx(989.5e12)
    assert h100.fp8_dense_flops == pytest.approx(2 * h100.bf16_dense_flops, rel=1e-3)
    a100 = lookup_gpu("NVIDIA A100-SXM4-80GB")
    assert a100.mem_bandwidth_bytes_per_s == pytest.approx(2.039e12)
    assert a100.fp8_dense_flops is None
    assert lookup_gpu("NVIDIA L4").nvlink_bytes_per_s is None
    assert lookup_gpu("NVIDIA H200").memory_bytes == 141 * GiB
    assert pcie_bytes_per_s(5, 16) == pytest.approx(63.0e9, rel=0.01)
    assert pcie_bytes_per_s(3, 4) == pytest.approx(3.94e9, rel=0.01)


def test_overrides_replace_fields_and_unknown_cards_need_the_roofline_numbers() -> None:
    l4 = lookup_gpu("NVIDIA L4", {"mem_bandwidth_bytes_per_s": 0.3e12})
    assert l4.source_of("mem_bandwidth_bytes_per_s") == "user override"
    with pytest.raises(ValueError, match="unknown GPU spec override"):
        lookup_gpu("NVIDIA L4", {"peak": 1.0})
    assert lookup_gpu("Mystery GPU", {"mem_bandwidth_bytes_per_s": 1e12}) is None
    custom = lookup_gpu("Mystery GPU", {"memory_bytes": 48 * GiB, "mem_bandwidth_bytes_per_s": 1e12,
                                        "bf16_dense_flops": 200e12})
    assert custom is not None and custom.mem_bandwidth_bytes_per_s == 1e12 and custom.key == "custom"


def test_normalize_gpu_name() -> None:
    assert normalize_gpu_name("NVIDIA A100-SXM4-80GB") == "a100 sxm4 80gb"
    assert normalize_gpu_name("NVIDIA B300 SXM6 AC MIG 1g.34gb") == "b300 sxm6 ac"


# --- models ------------------------------------------------------------------------------

def test_kv_bytes_per_token_80_layers_8_kv_heads_128_dims_fp16_is_320_kib() -> None:
    m = load_model("Llama-3.1-70B")
    assert (m.layers, m.kv_heads, m.head_dim) == (80, 8, 128)
    assert kv_bytes_per_token(m) == 320 * KiB
    # The seed's follow-on: about 31 GiB per 100K tokens.
    assert kv_bytes_per_token(m) * 100_000 / GiB == pytest.approx(30.5, abs=0.6)


def test_full_mha_7b_needs_half_a_mib_per_token_and_gqa_shrinks_it() -> None:
    mha = load_model("llama-2-7b")
    assert kv_bytes_per_token(mha) == 512 * KiB
    gqa = load_model("llama-3.1-8b")
    assert kv_bytes_per_token(gqa) == kv_bytes_per_token(mha) / 4  # 8 KV heads instead of 32
    assert kv_bytes_per_token(gqa, kv_dtype_bytes=1) == 64 * KiB


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("meta-llama/Llama-3.1-8B-Instruct", 8.03, 8.03),
    ("Llama-3.1-70B", 70.55, 70.55),
    ("Qwen2.5-7B", 7.62, 7.62),
    ("Mixtral-8x7B", 46.7, 12.9),
])
def test_parameter_counts_match_the_published_sizes(name: str, total_b: float, active_b: float) -> None:
    m = load_model(name)
    assert total_params(m) / 1e9 == pytest.approx(total_b, rel=0.01)
    assert active_params(m) / 1e9 == pytest.approx(active_b, rel=0.01)


def test_weight_bytes_and_flops_per_token() -> None:
    m = load_model("llama-3.1-70b")
    assert weight_bytes(m) / 1e9 == pytest.approx(141, rel=0.01)  # "70B in FP16 is 140 GB"
    # about 2 x params; attention adds 4 x layers x heads x head_dim per token of context.
    assert flops_per_token(m) == pytest.approx(2 * active_params(m), rel=0.02)
    assert flops_per_token(m, 8192) - flops_per_token(m) == pytest.approx(4 * 80 * 64 * 128 * 8192)


def test_moe_reads_only_routed_experts_at_small_batch() -> None:
    m = load_model("mixtral-8x7b")
    assert expected_experts_touched(m, 1) == pytest.approx(2)
    assert expected_experts_touched(m, 256) == pytest.approx(8, rel=1e-6)
    one = weight_bytes_read_per_step(m, 1)
    many = weight_bytes_read_per_step(m, 256)
    assert one < 0.6 * weight_bytes(m) < many <= weight_bytes(m)


def test_hf_config_json_from_local_path() -> None:
    m = read_hf_config(FIXTURES / "models" / "llama-3.1-8b")
    assert m == BUILTIN["llama-3.1-8b"].__class__(**{**_fields(BUILTIN["llama-3.1-8b"]), "name": m.name})
    moe = load_model(str(FIXTURES / "models" / "mixtral-8x7b" / "config.json"))
    assert (moe.experts, moe.active_experts) == (8, 2)


def _fields(m: object) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__dataclass_fields__}  # type: ignore[attr-defined]


def test_mla_models_are_reported_unsupported() -> None:
    with pytest.raises(UnsupportedModel, match="latent attention"):
        read_hf_config(FIXTURES / "models" / "deepseek-v3")
    with pytest.raises(UnsupportedModel, match="MLA"):
        load_model("deepseek-ai/DeepSeek-V3")
    with pytest.raises(KeyError, match="unknown model"):
        load_model("no-such-model-7b")


# --- quantization and dtypes in config.json (review items 3 and 4) ---------------------------------

_LLAMA_8B_CFG = dict(model_type="llama", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, intermediate_size=14336, torch_dtype="bfloat16")
# 8,030,261,248 parameters (BUILTIN llama-3.1-8b); KV 2 x 32 x 8 x 128 = 65,536 elements per token.
_PARAMS_8B = 8_030_261_248


def _shape(**quant: object):
    from exporter.specs.models import model_from_hf_config

    cfg = dict(_LLAMA_8B_CFG, quantization_config=quant) if quant else dict(_LLAMA_8B_CFG)
    return model_from_hf_config(cfg, "x")


def test_compressed_tensors_fp8_w8a8_is_one_byte_and_fp8_matmuls() -> None:
    m = _shape(quant_method="compressed-tensors", format="float-quantized", config_groups={"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
        "input_activations": {"num_bits": 8, "type": "float"}}})
    assert (m.dtype_bytes, m.quantization, m.matmul_kind) == (1.0, "fp8", "fp8")
    assert weight_bytes(m) == _PARAMS_8B  # 8.03 GB (it read as 2 bytes: 16.06 GB)
    assert m.kv_dtype_bytes == 2.0


def test_compressed_tensors_w4a16_and_int8_w8a8_and_kv_scheme() -> None:
    w4a16 = _shape(quant_method="compressed-tensors", format="pack-quantized", config_groups={"group_0": {
        "weights": {"num_bits": 4, "type": "int"}, "input_activations": None}})
    assert (w4a16.dtype_bytes, w4a16.quantization, w4a16.matmul_kind) == (0.5, "weight-only", "16bit")
    w8a8 = _shape(quant_method="compressed-tensors", kv_cache_scheme={"num_bits": 8, "type": "float"},
                  config_groups={"group_0": {"weights": {"num_bits": 8, "type": "int"},
                                             "input_activations": {"num_bits": 8, "type": "int"}}})
    assert (w8a8.dtype_bytes, w8a8.quantization, w8a8.kv_dtype_bytes) == (1.0, "int8", 1.0)
    assert kv_bytes_per_token(w8a8) == 64 * KiB


def test_modelopt_fp8_with_fp8_kv_cache() -> None:
    m = _shape(quant_method="modelopt", quant_algo="FP8", kv_cache_quant_algo="FP8")
    assert (m.dtype_bytes, m.quantization, m.kv_dtype_bytes) == (1.0, "fp8", 1.0)
    nested = _shape(quant_method="modelopt", quantization={"quant_algo": "FP8"})
    assert (nested.dtype_bytes, nested.kv_dtype_bytes) == (1.0, 2.0)


def test_weight_only_schemes_and_bitsandbytes() -> None:
    awq = _shape(quant_method="awq", bits=4, group_size=128)
    assert (awq.dtype_bytes, awq.quantization, awq.matmul_kind) == (0.5, "weight-only", "16bit")
    gptq8 = _shape(quant_method="gptq", bits=8)
    assert (gptq8.dtype_bytes, gptq8.matmul_kind) == (1.0, "16bit")
    bnb4 = _shape(quant_method="bitsandbytes", load_in_4bit=True, bnb_4bit_quant_type="nf4")
    assert (bnb4.dtype_bytes, bnb4.quantization) == (0.5, "weight-only")  # was read as 2 bytes
    bnb8 = _shape(quant_method="bitsandbytes", load_in_8bit=True)
    assert (bnb8.dtype_bytes, bnb8.quantization) == (1.0, "weight-only")
    fp8 = _shape(quant_method="fp8", activation_scheme="dynamic")
    assert (fp8.dtype_bytes, fp8.matmul_kind) == (1.0, "fp8")


def test_float32_checkpoints_are_served_in_16_bits() -> None:
    from exporter.specs.models import model_from_hf_config

    m = model_from_hf_config(dict(_LLAMA_8B_CFG, torch_dtype="float32"), "x")
    # vLLM's dtype "auto" serves FP32 checkpoints in FP16: 2 bytes per weight and KV element
    # (it read 4: 32.1 GB of weights, 256 KiB of KV per token).
    assert (m.dtype_bytes, m.kv_dtype_bytes) == (2.0, 2.0)
    assert weight_bytes(m) == 2 * _PARAMS_8B
    assert kv_bytes_per_token(m) == 128 * KiB


def test_kv_cache_dtype_names() -> None:
    from exporter.specs.models import kv_cache_dtype_bytes

    assert kv_cache_dtype_bytes("auto") is None
    assert kv_cache_dtype_bytes("fp8") == kv_cache_dtype_bytes("fp8_e5m2") == 1.0
    assert kv_cache_dtype_bytes("bfloat16") == 2.0
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        kv_cache_dtype_bytes("fp7")
    with pytest.raises(ValueError, match="quantization"):
        BUILTIN["llama-3.1-8b"].__class__(**{**_fields(BUILTIN["llama-3.1-8b"]), "quantization": "int3"})
