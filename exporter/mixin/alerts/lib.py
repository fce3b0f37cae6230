"""PromQL and rule helpers shared by the area modules: selectors spliced from CONFIG, bucket matchers,
recording-rule names, and `alert()`, which adds the severity label and the runbook link."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.mixin.config import CONFIG, fleet_labels
from exporter.slo import duration_seconds

# Who an alert is about, for descriptions.
TM = "{{ $labels.target }} ({{ $labels.model }})"

def _extra_fleet_labels_who(cfg: dict) -> str:
    return "".join(f"{{{{ with $labels.{label} }}}} ({label} {{{{ . }}}}){{{{ end }}}}"
                   for label in cfg["fleet_extra_labels"])


def fleet_who(cfg: dict = CONFIG) -> str:
    """Who a fleet alert is about: a model, in its cluster and namespace when the series carry them."""
    return (f"{{{{ $labels.model }}}}{{{{ with $labels.{cfg['cluster_label']} }}}} in cluster {{{{ . }}}}{{{{ end }}}}"
            + _extra_fleet_labels_who(cfg))


def cluster_who(cfg: dict = CONFIG) -> str:
    """Who a per-cluster alert (GPUs) is about."""
    return (f"{{{{ with $labels.{cfg['cluster_label']} }}}}cluster {{{{ . }}}}{{{{ else }}}}this Prometheus"
            f"{{{{ end }}}}" + _extra_fleet_labels_who(cfg))

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


def by_fleet(*extra: str, cfg: dict = CONFIG) -> str:
    """`by (cluster, namespace, <extra>)`: a fleet rule names what it keeps, so nothing else leaks in
    (a `without` would keep every label a scrape adds); absent labels are empty and harmless."""
    return f"by ({', '.join((*fleet_labels(cfg), *extra))})"


def when_positive(expr: str) -> str:
    """`((expr) > 0)`: a denominator that drops the series at zero traffic, so a ratio or mean has no
    sample ("No traffic") instead of 0/0 = NaN, and no alert can read one. The outer parentheses
    matter: `a / b > 0` is `(a / b) > 0`, which would drop a good ratio of 0 (every request bad)."""
    return f"(({expr}) > 0)"


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



def quantile_of(q: float, buckets: str, every_request: str | None = None) -> str:
    """histogram_quantile over bucket rates of series that saw requests: at zero traffic every bucket
    rate is 0 and histogram_quantile returns NaN; keeping only the histograms whose +Inf bucket (every
    request) rose leaves no sample instead. `buckets` is a recorded rule's name, or an expression whose
    +Inf bucket alone is `every_request`."""
    if every_request is None:
        every_request = f"{buckets}{{le=\"+Inf\"}}"
    return f"histogram_quantile({q},\n  {buckets}\n  and ignoring (le)\n  {every_request} > 0)"


def fleet_bucket_rule(metric: str, window: str) -> str:
    return f"model:{metric}_bucket:rate{nominal(window)}"


def fleet_quantile_rule(metric: str, q: float, window: str) -> str:
    return f"model:{metric}:{pct(q)}_{nominal(window)}"


def finished_rate_rule(window: str) -> str:
    """Finished requests/s per (cluster, namespace, model, reason): the fleet's ratios and the
    availability SLO's traffic floor read it."""
    return f"model:llm_requests_finished:rate{nominal(window)}"


def availability_good_ratio_rule(window: str) -> str:
    return f"model:llm_requests_availability:good_ratio_rate{nominal(window)}"


REPLICAS_UP = "model:llm_replicas_up:count"
GPUS_UP = "cluster:llm_gpus_up:count"
