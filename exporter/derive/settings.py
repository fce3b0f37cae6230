"""The configuration as the derivations read it, built once per Deriver.

DeriveSettings is a Config (exporter/config.py, whose fields the settings table declares) with the
values that depend on other settings resolved: it re-declares only the two fields whose type it
narrows (their defaults come from the interval and the bottleneck stage), so a setting the
derivations read is never declared twice. derive_settings() is the only place they read the
configuration (tests/test_derive_stages.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from exporter.config import Config
from exporter.derive.bottleneck import HOLD_CYCLES

DEFAULT_RATE_WINDOW_S = 15.0
RATE_WINDOW_INTERVALS = 5  # the rate window spans at least this many collection intervals


@dataclass(frozen=True, slots=True)
class DeriveSettings(Config):
    # Never None here: the configured value, else the default derive_settings() works out.
    verdict_hold_cycles: int = HOLD_CYCLES
    rate_window_s: float = DEFAULT_RATE_WINDOW_S

    @property
    def forget_after_s(self) -> float:
        """How long a window of a target or GPU not seen any more is kept (it may come back)."""
        return max(self.quantile_window_s, self.rate_window_s) * 2


def derive_settings(config: Config) -> DeriveSettings:
    """The only place the derivations read the configuration. Empty text and empty mappings mean
    unset to them (None), as an unset setting does."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(Config)}
    return DeriveSettings(**{
        **values,
        "model": config.model or None,
        "verdict_hold_cycles": int(config.verdict_hold_cycles or HOLD_CYCLES),
        "rate_window_s": float(config.rate_window_s or max(DEFAULT_RATE_WINDOW_S,
                                                           RATE_WINDOW_INTERVALS * config.interval_s)),
        "kv_cache_dtype": config.kv_cache_dtype or None,
        # Checked where they are used, as before: a bad override is noted, not fatal.
        "gpu_spec": config.gpu_spec or None,
        "target_gpus": config.target_gpus or None,
    })
