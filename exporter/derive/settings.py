"""Every setting the derivations read, gathered in one typed record built once per Deriver.

The field names are the configuration keys (exporter/settings.py declares and validates them);
derive_settings() only fills in the defaults that depend on other settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.config import Config
from exporter.derive.bottleneck import HOLD_CYCLES

DEFAULT_RATE_WINDOW_S = 15.0
RATE_WINDOW_INTERVALS = 5  # the rate window spans at least this many collection intervals


@dataclass(frozen=True, slots=True)
class DeriveSettings:
    interval_s: float
    model: str | None  # a built-in shape name or a config.json path; None: the engine's model name
    tensor_parallel: int | None  # GPUs per engine replica; None: the target's GPUs / its DP ranks
    gpu_price_per_hour: float | None
    slo_ttft_s: float
    slo_tbt_s: float
    quantile_window_s: float
    verdict_hold_cycles: int
    rate_window_s: float
    kv_cache_dtype: str | None  # the engine's --kv-cache-dtype when it is not the model's own
    gpu_spec: Mapping[str, Any] | None  # overrides of the GPU spec table's fields
    target_gpus: Mapping[str, Sequence[str]] | None  # target -> GPU indices it runs on

    @property
    def forget_after_s(self) -> float:
        """How long a window of a target or GPU not seen any more is kept (it may come back)."""
        return max(self.quantile_window_s, self.rate_window_s) * 2


def derive_settings(config: Config) -> DeriveSettings:
    """The only place the derivations read the configuration."""
    return DeriveSettings(
        interval_s=config.interval_s,
        model=config.model or None,
        tensor_parallel=config.tensor_parallel,
        gpu_price_per_hour=config.gpu_price_per_hour,
        slo_ttft_s=config.slo_ttft_s,
        slo_tbt_s=config.slo_tbt_s,
        quantile_window_s=config.quantile_window_s,
        verdict_hold_cycles=int(config.verdict_hold_cycles or HOLD_CYCLES),
        rate_window_s=float(config.rate_window_s or max(DEFAULT_RATE_WINDOW_S,
                                                        RATE_WINDOW_INTERVALS * config.interval_s)),
        kv_cache_dtype=config.kv_cache_dtype or None,
        # Checked where they are used, as before: a bad override is noted, not fatal.
        gpu_spec=config.gpu_spec or None,
        target_gpus=config.target_gpus or None,
    )
