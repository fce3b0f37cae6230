"""PromQL and rule helpers shared by the area modules: selectors spliced from CONFIG, bucket matchers,
recording-rule names, and `alert()`, which adds the severity label and the runbook link."""

from __future__ import annotations

from collections.abc import Iterable

from alerts.config import CONFIG
from exporter.slo import duration_seconds

# Who an alert is about, for descriptions.
TM = "{{ $labels.target }} ({{ $labels.model }})"
GPU = "GPU {{ $labels.gpu }} ({{ $labels.name }}, {{ $labels.uuid }}) on {{ $labels.instance }}"

# The latency histograms the recording rules summarise, by short name.
LATENCY_HISTOGRAMS = {
    "ttft": "llm_time_to_first_token_seconds",
    "tbt": "llm_inter_token_latency_seconds",
    "e2e": "llm_e2e_request_latency_seconds",
    "queue": "llm_request_queue_time_seconds",
    "prefill": "llm_request_prefill_time_seconds",
    "decode": "llm_request_decode_time_seconds",
}


class Scaled(str):
    """A duration rendered at a test's --time-scale (generate.scale_durations). The string is the
    scaled duration the expressions use; `nominal` is the duration it stands for, which the
    recording-rule names keep, so the dashboards and the alerts reading them work on a scaled
    stack unchanged."""

    nominal: str

    def __new__(cls, value: str, nominal: str) -> Scaled:
        self = super().__new__(cls, value)
        self.nominal = nominal
        return self


def nominal(window: str) -> str:
    """The window a recording-rule name states: the unscaled one under --time-scale."""
    return getattr(window, "nominal", window)


def sel(metric: str, *matchers: str, cfg: dict = CONFIG) -> str:
    """`metric{<exporter selector>,<matchers>}`."""
    return f"{metric}{{{','.join((cfg['exporter_selector'], *matchers))}}}"


def regex_of(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def le_matcher(seconds: float) -> str:
    """A matcher for the `le` bucket at `seconds`, whichever way the float is written (1 / 1.0)."""
    forms = {repr(float(seconds)), f"{seconds:g}"}
    if float(seconds).is_integer():
        forms |= {str(int(seconds)), f"{int(seconds)}.0"}
    if len(forms) == 1:
        return f'le="{forms.pop()}"'
    escaped = sorted(f.replace(".", "\\\\.").replace("+", "\\\\+") for f in forms)
    return f'le=~"{"|".join(escaped)}"'


def without(*extra: str, cfg: dict = CONFIG) -> str:
    return f"without ({', '.join((*cfg['aggregate_away'], *extra))})"


def on_gpu_join(cfg: dict = CONFIG) -> str:
    return ", ".join(cfg["gpu_join_labels"])


def gpu_join_who(cfg: dict = CONFIG) -> str:
    """The join labels other than `job`, as template values: who a joined alert is about."""
    return ", ".join(f"{{{{ $labels.{label} }}}}" for label in cfg["gpu_join_labels"] if label != "job")


def fmt_num(value: float) -> str:
    """A threshold as PromQL and prose write it: 5, 0.95 (not 5.0)."""
    return repr(value) if not float(value).is_integer() else str(int(value))


def fmt_pct(ratio: float) -> str:
    return f"{ratio * 100:g}%"


def pct(q: float) -> str:
    return f"p{round(q * 100):d}"


def rec(name: str, expr: str) -> dict:
    return {"record": name, "expr": expr}


def alert(name: str, expr: str, severity: str, summary: str, description: str,
          for_: str | None = None, labels: dict | None = None, cfg: dict = CONFIG,
          keep_firing_for: str | None = None) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if for_ and for_ not in ("0", "0s", "0m"):
        rule["for"] = for_
    if keep_firing_for:
        rule["keep_firing_for"] = keep_firing_for
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": cfg["runbook_url"].format(anchor=name.lower()),
    }
    return rule


def quantile_rule(metric: str, q: float, window: str) -> str:
    return f"target_model:{metric}:{pct(q)}_{nominal(window)}"


def probe_mean_rule(window: str) -> str:
    """The probe's client-side mean TTFT (recording.py), read by the gap rule and LLMProbeLatencyGap."""
    return f"target_model:llm_probe_time_to_first_token_seconds:mean{nominal(window)}"


def probe_gap_rule(window: str) -> str:
    return f"target_model:llm_probe_time_to_first_token_seconds:gap_mean{nominal(window)}"


def engine_mean_rule(metric: str, window: str) -> str:
    return f"target_model:{metric}:mean{nominal(window)}"


def request_rate_rule(window: str) -> str:
    return f"target_model:llm_time_to_first_token_seconds_count:rate{nominal(window)}"


def good_ratio_rule(metric: str, window: str) -> str:
    return f"target_model:{metric}:slo_good_ratio_rate{nominal(window)}"


def slo_windows(cfg: dict) -> list[str]:
    """The rate window and every burn-rate pair's windows, shortest first."""
    seen: dict[str, str] = {nominal(cfg["rate_window"]): cfg["rate_window"]}
    for br in cfg["burn_rates"]:
        for w in (br["short"], br["long"]):
            seen.setdefault(nominal(w), w)
    return sorted(seen.values(), key=lambda w: duration_seconds(nominal(w)))
