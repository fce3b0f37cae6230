"""Peak specs of GPUs and shapes of models: the numbers the roofline model and the derivations stand on."""

from exporter.specs.gpus import GpuSpec, lookup_gpu
from exporter.specs.models import (
    ModelShape,
    UnsupportedModel,
    active_params,
    flops_per_token,
    kv_bytes_per_token,
    load_model,
    total_params,
    weight_bytes,
)

__all__ = [
    "GpuSpec",
    "ModelShape",
    "UnsupportedModel",
    "active_params",
    "flops_per_token",
    "kv_bytes_per_token",
    "load_model",
    "lookup_gpu",
    "total_params",
    "weight_bytes",
]
