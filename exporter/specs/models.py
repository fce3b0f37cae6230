"""Model shapes and the pure formulas built on them (weight bytes, KV bytes per token, FLOPs).

A shape comes from a Hugging Face `config.json` on local disk (never downloaded) or from the few
built-in shapes. Formulas assume the decoder-only transformer family served by the engines we
watch: gated MLP (SwiGLU, three matrices), grouped-query attention, optional mixture of experts.
Multi-head latent attention (DeepSeek V2/V3) caches a compressed latent instead of K and V, so
`2 x layers x kv_heads x head_dim` would be wrong for it; such configs raise UnsupportedModel.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter import jsonsafe
from exporter.safefile import read_regular_file

MAX_MODEL_CONFIG_BYTES = 4 << 20  # a Hugging Face config.json is a few KiB


class UnsupportedModel(ValueError):
    """The config describes an architecture these formulas do not model."""


# ModelShape.quantization values
WEIGHT_ONLY, FP8, INT8, FP4 = "weight-only", "fp8", "int8", "fp4"


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str  # served model name, as an engine labels it
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # MLP width of one expert (of the dense MLP when experts == 1)
    experts: int = 1  # routed experts per layer; 1 = dense
    active_experts: int = 1  # experts each token is routed to
    dtype_bytes: float = 2.0  # bytes per weight element (2 = BF16/FP16, 1 = FP8, 0.5 = 4-bit)
    kv_dtype_bytes: float = 2.0  # bytes per KV-cache element
    # How the weights are quantized, which decides the tensor-core type the matmuls run on:
    # "" (not stated: 8-bit weights are taken as FP8 W8A8, fewer bits as weight-only), "none"
    # (16-bit), WEIGHT_ONLY (AWQ, GPTQ, bitsandbytes...: weights are dequantized and multiplied in
    # BF16/FP16), FP8 (W8A8 FP8), INT8 (W8A8 INT8, SmoothQuant), FP4 (W4A4 NVFP4/MXFP4).
    quantization: str = ""
    tied_embeddings: bool = False
    attention_bias: bool = False
    max_context: int = 8192

    def __post_init__(self) -> None:
        for attr in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate"):
            if getattr(self, attr) <= 0:
                raise ValueError(f"{self.name}: {attr} must be positive")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads ({self.heads}) not a multiple of kv_heads ({self.kv_heads})")
        if not 1 <= self.active_experts <= self.experts:
            raise ValueError(f"{self.name}: active_experts must be in 1..experts")
        if self.quantization not in ("", "none", WEIGHT_ONLY, FP8, INT8, FP4):
            raise ValueError(f"{self.name}: quantization {self.quantization!r} is not one of "
                             f"none, {WEIGHT_ONLY}, {FP8}, {INT8}, {FP4}")

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def matmul_kind(self) -> str:
        """What the tensor cores multiply: "fp8", "int8", "fp4" (weights and activations both
        quantized) or "16bit" (unquantized, and weight-only schemes that dequantize to BF16/FP16)."""
        kind = self.quantization
        if not kind:
            kind = FP8 if self.dtype_bytes == 1.0 else "none"
        return kind if kind in (FP8, INT8, FP4) else "16bit"


# --- parameter counts ----------------------------------------------------------------------

def attention_params_per_layer(m: ModelShape) -> int:
    q_out = m.heads * m.head_dim
    kv_out = m.kv_heads * m.head_dim
    params = m.hidden * q_out + 2 * m.hidden * kv_out + q_out * m.hidden
    if m.attention_bias:
        params += q_out + 2 * kv_out
    return params


def expert_params(m: ModelShape) -> int:
    """One gated MLP (gate, up, down)."""
    return 3 * m.hidden * m.intermediate


def _router_params(m: ModelShape) -> int:
    return m.hidden * m.experts if m.is_moe else 0


def _norm_params_per_layer(m: ModelShape) -> int:
    return 2 * m.hidden


def embedding_params(m: ModelShape) -> int:
    return m.vocab * m.hidden


def lm_head_params(m: ModelShape) -> int:
    """Separate output projection; zero when tied to the input embedding."""
    return 0 if m.tied_embeddings else m.vocab * m.hidden


def total_params(m: ModelShape) -> int:
    per_layer = attention_params_per_layer(m) + m.experts * expert_params(m) + _router_params(m)
    per_layer += _norm_params_per_layer(m)
    return m.layers * per_layer + embedding_params(m) + lm_head_params(m) + m.hidden


def active_params(m: ModelShape) -> int:
    """Parameters one token touches (all of them for a dense model; top-k experts for MoE)."""
    per_layer = attention_params_per_layer(m) + m.active_experts * expert_params(m) + _router_params(m)
    per_layer += _norm_params_per_layer(m)
    return m.layers * per_layer + embedding_params(m) + lm_head_params(m) + m.hidden


def matmul_params_per_token(m: ModelShape) -> int:
    """Weights that take part in a matrix multiply for one token: the embedding lookup is a gather,
    the output projection (tied or not) is a full vocab x hidden matmul."""
    per_layer = attention_params_per_layer(m) + m.active_experts * expert_params(m) + _router_params(m)
    return m.layers * per_layer + m.vocab * m.hidden


# --- bytes ---------------------------------------------------------------------------------

def weight_bytes(m: ModelShape) -> float:
    """Bytes the weights occupy in GPU memory (all experts, all GPUs together)."""
    return total_params(m) * m.dtype_bytes


def kv_bytes_per_token(m: ModelShape, kv_dtype_bytes: float | None = None) -> float:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    elem = m.kv_dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    return 2 * m.layers * m.kv_heads * m.head_dim * elem


def expected_experts_touched(m: ModelShape, tokens: int) -> float:
    """Expected distinct experts per layer that `tokens` tokens route to, with uniform routing:
    E x (1 - (1 - k/E)^tokens). One token reads k experts; a large batch reads all E."""
    if tokens <= 0:
        return 0.0
    if not m.is_moe:
        return 1.0
    return m.experts * (1.0 - (1.0 - m.active_experts / m.experts) ** tokens)


def weight_bytes_read_per_step(m: ModelShape, tokens: int = 1) -> float:
    """Weight bytes one forward pass over `tokens` tokens streams from memory.

    Every matrix is read once per step whatever the batch (that is why batching shares the cost);
    the input embedding table is only gathered, so an untied one is not read. For MoE only the
    experts some token routes to are read.
    """
    dense_per_layer = attention_params_per_layer(m) + _router_params(m) + _norm_params_per_layer(m)
    experts_read = expected_experts_touched(m, tokens) if m.is_moe else 1.0
    per_layer = dense_per_layer + experts_read * expert_params(m)
    params = m.layers * per_layer + m.vocab * m.hidden + m.hidden
    return params * m.dtype_bytes


# --- FLOPs ---------------------------------------------------------------------------------

def attention_flops(m: ModelShape, context_len: float) -> float:
    """Score and value FLOPs for one new token attending to `context_len` earlier tokens:
    2 (multiply-add) x 2 (QK^T and AV) x layers x heads x head_dim x context."""
    return 4.0 * m.layers * m.heads * m.head_dim * context_len


def flops_per_token(m: ModelShape, context_len: float = 0.0) -> float:
    """About 2 x active (matmul) params, plus attention over the context."""
    return 2.0 * matmul_params_per_token(m) + attention_flops(m, context_len)


def prefill_flops(m: ModelShape, tokens: float, start: float = 0.0, logits: int = 1) -> float:
    """FLOPs to process prompt tokens start..start+tokens (causal: token i attends to i tokens;
    the first `start` tokens are already in the KV cache, e.g. prefix-cache hits).

    Every prompt token goes through the layers' matmuls and attends to the tokens before it, but
    the engines compute logits only for the last prompt position (the one that samples the first
    output token), so the vocab x hidden output projection counts `logits` times, not per token.
    """
    mean_context = start + tokens / 2.0
    layers_only = flops_per_token(m, mean_context) - 2.0 * m.vocab * m.hidden
    return tokens * layers_only + logits * 2.0 * m.vocab * m.hidden


# --- Hugging Face config.json --------------------------------------------------------------

# What vLLM's default dtype ("auto") serves a checkpoint in: FP32 checkpoints are served in 16 bits.
_DTYPE_BYTES = {"float32": 2.0, "float": 2.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
                "float8_e4m3fn": 1.0, "float8": 1.0}
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32"})
# quant_method values whose weights are dequantized and multiplied in BF16/FP16 (bits from `bits`).
_WEIGHT_ONLY_METHODS = frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin",
                                  "bitblas", "hqq", "aqlm", "exl2", "eetq", "gguf", "moe_wna16", "mxfp4",
                                  "auto-round", "auto_round", "torchao"})
# quant_method values that quantize weights and activations to FP8 (W8A8 FP8).
_FP8_METHODS = frozenset({"fp8", "fbgemm_fp8", "ptpc_fp8", "fp8_e4m3", "w8a8_fp8"})
# KV-cache dtypes by the names engines use (vLLM --kv-cache-dtype, SGLang, LMDeploy, modelopt).
_KV_DTYPE_BYTES = {"bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
                   "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "float8_e4m3fn": 1.0,
                   "int8": 1.0, "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5, "fp4_e2m1": 0.5}


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def kv_cache_dtype_bytes(name: str) -> float | None:
    """Bytes per KV element for a KV-cache dtype name ("fp8", "fp8_e5m2", "bfloat16", ...);
    None for "auto" (the model's own 16-bit dtype). Raises ValueError for a name it does not know."""
    key = str(name).strip().lower().replace("torch.", "")
    if key in ("", "auto"):
        return None
    if key not in _KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {name!r}: auto, {', '.join(sorted(_KV_DTYPE_BYTES))}")
    return _KV_DTYPE_BYTES[key]


class _Quant(NamedTuple):
    dtype_bytes: float | None  # None: the checkpoint's torch dtype decides
    kind: str
    kv_bytes: float | None = None  # None: 16-bit KV cache


def _compressed_tensors(quant: Mapping[str, Any]) -> _Quant:
    """compressed-tensors (llm-compressor): config_groups[*].weights / input_activations."""
    weights = activations = None
    for group in (quant.get("config_groups") or {}).values():
        if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping):
            weights, activations = group["weights"], group.get("input_activations")
            break
    kv = quant.get("kv_cache_scheme")
    kv_bytes = float(kv["num_bits"]) / 8.0 if isinstance(kv, Mapping) and kv.get("num_bits") else None
    if weights is None or not weights.get("num_bits"):
        return _Quant(None, "", kv_bytes)
    w_bits = float(weights["num_bits"])
    kind = WEIGHT_ONLY
    if isinstance(activations, Mapping) and activations.get("num_bits"):
        a_bits, a_type = float(activations["num_bits"]), str(activations.get("type", "int")).lower()
        if a_type == "float" and a_bits == 8:
            kind = FP8
        elif a_type == "float" and a_bits == 4:
            kind = FP4
        elif a_type == "int" and a_bits == 8:
            kind = INT8
    return _Quant(w_bits / 8.0, kind, kv_bytes)


def _modelopt(quant: Mapping[str, Any]) -> _Quant:
    """NVIDIA TensorRT Model Optimizer (quant_method "modelopt"): quant_algo and kv_cache_quant_algo,
    in the quantization_config itself or under its "quantization" key (hf_quant_config.json)."""
    nested = quant.get("quantization")
    inner = nested if isinstance(nested, Mapping) else quant
    algo = str(inner.get("quant_algo") or quant.get("quant_algo") or "").upper()
    kv_algo = str(inner.get("kv_cache_quant_algo") or quant.get("kv_cache_quant_algo") or "").upper()
    kv_bytes = 1.0 if "FP8" in kv_algo or "INT8" in kv_algo else 0.5 if "FP4" in kv_algo else None
    if "FP4" in algo:
        return _Quant(0.5, FP4, kv_bytes)
    if "W4A8" in algo:  # int4 weights, FP8 activations: FP8 tensor cores
        return _Quant(0.5, FP8, kv_bytes)
    if "FP8" in algo:
        return _Quant(1.0, FP8, kv_bytes)
    if "SQ" in algo or "SMOOTHQUANT" in algo or "W8A8" in algo:
        return _Quant(1.0, INT8, kv_bytes)
    if "INT4" in algo or "W4A16" in algo:
        return _Quant(0.5, WEIGHT_ONLY, kv_bytes)
    if "INT8" in algo:  # INT8 weight-only
        return _Quant(1.0, WEIGHT_ONLY, kv_bytes)
    return _Quant(None, "", kv_bytes)


def _quantization(cfg: Mapping[str, Any]) -> _Quant:
    quant = cfg.get("quantization_config") or {}
    if not isinstance(quant, Mapping):
        return _Quant(None, "")
    method = str(quant.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method == "modelopt" or "quant_algo" in quant:
        return _modelopt(quant)
    if method == "bitsandbytes" or quant.get("load_in_4bit") or quant.get("load_in_8bit"):
        if quant.get("load_in_4bit"):
            return _Quant(0.5, WEIGHT_ONLY)
        if quant.get("load_in_8bit"):
            return _Quant(1.0, WEIGHT_ONLY)
        return _Quant(None, "")
    if method in _FP8_METHODS or method.startswith("fp8"):
        return _Quant(1.0, FP8)
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("weight_bits")
    if bits:
        return _Quant(float(bits) / 8.0, WEIGHT_ONLY)
    if method in _WEIGHT_ONLY_METHODS:
        return _Quant(0.5 if method == "mxfp4" else None, WEIGHT_ONLY)
    return _Quant(None, "")


def _dtype_bytes(cfg: Mapping[str, Any]) -> float:
    dtype = str(_first(cfg, "torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    return _DTYPE_BYTES.get(dtype, 2.0)


def model_from_hf_config(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """Build a shape from a parsed config.json. Raises UnsupportedModel for MLA architectures."""
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k == "quantization_config"}}
    model_type = str(cfg.get("model_type", ""))
    if "kv_lora_rank" in cfg or model_type in _MLA_TYPES:
        raise UnsupportedModel(
            f"{name}: multi-head latent attention ({model_type or 'kv_lora_rank'}) caches a compressed latent, "
            "not K/V per head; the KV-per-token formula does not apply"
        )
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except KeyError as e:
        raise UnsupportedModel(f"{name}: config.json lacks {e.args[0]}") from None
    kv_heads = int(_first(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1))
    active = int(_first(cfg, "num_experts_per_tok", "moe_topk", default=1)) if experts > 1 else 1
    intermediate = int(
        _first(cfg, "moe_intermediate_size", default=None) if experts > 1 and "moe_intermediate_size" in cfg
        else _first(cfg, "intermediate_size", "ffn_dim", default=4 * hidden)
    )
    quant = _quantization(cfg)
    dtype = quant.dtype_bytes if quant.dtype_bytes is not None else _dtype_bytes(cfg)
    kind = quant.kind
    return ModelShape(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        intermediate=intermediate,
        experts=experts,
        active_experts=active,
        dtype_bytes=dtype,
        # Engines keep the KV cache in 16 bits unless told otherwise (--kv-cache-dtype, or a KV
        # scheme in the checkpoint's quantization config).
        kv_dtype_bytes=quant.kv_bytes if quant.kv_bytes is not None else 2.0,
        quantization=kind,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        max_context=int(_first(cfg, "max_position_embeddings", "n_positions", default=8192)),
    )


def read_hf_config(path: str | pathlib.Path, name: str | None = None) -> ModelShape:
    """Read `config.json` (or a directory holding one). Local files only: no hub download."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "config.json"
    # A regular file, bounded: the path may come from the engine's model label, and /dev/zero or a
    # FIFO there would read for ever or block (exporter/safefile.py).
    cfg = jsonsafe.loads(read_regular_file(p, MAX_MODEL_CONFIG_BYTES))
    served = name or str(cfg.get("_name_or_path") or p.parent.name)
    return model_from_hf_config(cfg, served)


# --- built-in shapes -----------------------------------------------------------------------
# From the models' published config.json files (hub ids given as names).

BUILTIN: Mapping[str, ModelShape] = MappingProxyType({
    "llama-3.1-8b": ModelShape("meta-llama/Llama-3.1-8B-Instruct", layers=32, hidden=4096, heads=32, kv_heads=8,
                               head_dim=128, vocab=128256, intermediate=14336, max_context=131072),
    "llama-3.1-70b": ModelShape("meta-llama/Llama-3.1-70B-Instruct", layers=80, hidden=8192, heads=64, kv_heads=8,
                                head_dim=128, vocab=128256, intermediate=28672, max_context=131072),
    "qwen2.5-7b": ModelShape("Qwen/Qwen2.5-7B-Instruct", layers=28, hidden=3584, heads=28, kv_heads=4,
                             head_dim=128, vocab=152064, intermediate=18944, attention_bias=True, max_context=32768),
    "mixtral-8x7b": ModelShape("mistralai/Mixtral-8x7B-Instruct-v0.1", layers=32, hidden=4096, heads=32, kv_heads=8,
                               head_dim=128, vocab=32000, intermediate=14336, experts=8, active_experts=2,
                               max_context=32768),
    # Full multi-head attention: the seeds' "7B, 32 layers, 0.5 MB of KV per token" example.
    "llama-2-7b": ModelShape("meta-llama/Llama-2-7b-chat-hf", layers=32, hidden=4096, heads=32, kv_heads=32,
                             head_dim=128, vocab=32000, intermediate=11008, max_context=4096),
})

UNSUPPORTED: Mapping[str, str] = MappingProxyType({
    "deepseek-v3": "DeepSeek-V3 uses multi-head latent attention (MLA); not modelled",
    "deepseek-v2": "DeepSeek-V2 uses multi-head latent attention (MLA); not modelled",
    "deepseek-r1": "DeepSeek-R1 (V3 architecture) uses multi-head latent attention (MLA); not modelled",
})


def _builtin_key(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-instruct-v0.1", "-instruct", "-chat-hf", "-hf", "-chat"):
        key = key.removesuffix(suffix)
    return key.removeprefix("meta-")


def builtin_models() -> tuple[str, ...]:
    return tuple(BUILTIN)


def load_model(name_or_path: str) -> ModelShape:
    """A local config.json (file or directory) or a built-in shape by name
    ('Llama-3.1-8B', 'meta-llama/Llama-3.1-70B-Instruct', 'qwen2.5-7b', 'mixtral-8x7b')."""
    p = pathlib.Path(name_or_path)
    if p.exists():
        return read_hf_config(p)
    key = _builtin_key(name_or_path)
    if key in BUILTIN:
        return BUILTIN[key]
    if key in UNSUPPORTED:
        raise UnsupportedModel(UNSUPPORTED[key])
    raise KeyError(f"unknown model {name_or_path!r}; built-in: {', '.join(BUILTIN)}; or give a config.json path")
