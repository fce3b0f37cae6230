"""Cardinality and cost of a fleet: series per replica by engine format and GPU count, and the central
store's ingestion, rule-evaluation cost and memory at N replicas (deploy/fleet.py), extrapolated to
1,000 replicas. `python -m bench fleet` runs it and rewrites only its section of docs/benchmarks.md.

Series per replica: one `llm-exporter demo --engines 1 --engine-format F --gpus G` (decode-heavy, no
probe) scraped until two scrapes agree; every sample line of its /metrics is one series in the store,
plus Prometheus' 5 per target (up, scrape_*).

The fleet at N = 4, 8, 16 (LLM_EXPORTER_FLEET_SIZES): deploy/fleet.py's fleet (the mixed profiles,
none dying, the rules at their real windows) at a 3 s interval, warmed up for WARMUP_S (the rule
series appear, the store's caches fill), then measured over WINDOW_S:
- active series: the store's vm_cache_entries{type="storage/hour_metric_ids"} (series with a sample
  this hour), and how many of them are recorded (names with ':', all written by vmalert);
- ingestion: rate of vm_rows_inserted_total (both Prometheus servers' remote write and vmalert's
  rule results);
- rule evaluation: vmalert's vmalert_iteration_duration_seconds_sum rate (seconds evaluating per
  second, i.e. cores) and per round (the sum over groups of the mean iteration);
- memory: RSS of victoria-metrics and vmalert (and of one cluster Prometheus, for comparison);
  CPU of each over the window from /proc.

Extrapolation to 1,000 replicas: series and samples/s scale with the replicas (the per-replica figures
are measured; the fleet's mix of formats and GPUs is the one deploy/fleet.py runs), at the production
scrape intervals 15 s and 30 s; memory from a least-squares line through the three RSS points (the
store's bytes per active series is its slope). A straight line from 16 replicas is a rough guide:
VictoriaMetrics' own capacity planning is the reference for a real sizing.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tests.support import free_port, free_ports, wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORMATS = ("vllm", "sglang", "tgi", "llamacpp")
GPU_COUNTS = (1, 2, 4, 8)
PROMETHEUS_PER_TARGET = 5  # up, scrape_duration_seconds, scrape_samples_scraped, _post_metric_relabeling, _series_added
SIZES = tuple(int(n) for n in os.environ.get("LLM_EXPORTER_FLEET_SIZES", "4,8,16").split(","))
INTERVAL = "3s"
WARMUP_S = float(os.environ.get("LLM_EXPORTER_FLEET_WARMUP_S", 90))
WINDOW_S = float(os.environ.get("LLM_EXPORTER_FLEET_WINDOW_S", 60))
AT_SCALE = 1000


def _fleet_module():
    from deploy import fleet  # Prometheus and podman around it: imported only by this bench

    return fleet


def _samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


_FAMILY_SUFFIX = re.compile(r"_(bucket|sum|count|created)$")


def family_series(text: str) -> dict[str, tuple[str, int]]:
    """family -> (type, series) of an exposition (a histogram's _bucket, _sum and _count count for it)."""
    types: dict[str, str] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            types[name] = kind
        elif line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
            base = _FAMILY_SUFFIX.sub("", name)
            family = base if base in types else name
            counts[family] = counts.get(family, 0) + 1
    return {name: (types.get(name, "untyped"), n) for name, n in counts.items()}


def referenced_families(families: Sequence[str]) -> set[str]:
    """The families some board query or rule expression names (dashboards/*.json, alerts/rules/*.yaml)."""
    text = "\n".join(p.read_text() for p in [*sorted((ROOT / "dashboards").glob("*.json")),
                                             *sorted((ROOT / "alerts" / "rules").glob("*.yaml"))])
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {f for f in families if f in names or any(f"{f}_{s}" in names for s in ("bucket", "sum", "count"))}


_pages: dict[tuple[str, int], str] = {}


def series_per_replica(engine_format: str, gpus: int) -> tuple[int, int]:
    """(series, families) of one demo replica's /metrics once stable (the page kept in _pages)."""
    text = stable_page(engine_format, gpus)
    _pages[(engine_format, gpus)] = text
    return _samples(text) + PROMETHEUS_PER_TARGET, len(family_series(text))


def stable_page(engine_format: str, gpus: int, extra: Sequence[str] = ()) -> str:
    """One `llm-exporter demo --engines 1` replica's /metrics once three scrapes 1 s apart agree on the
    number of series (`extra`: more demo arguments, e.g. --profile)."""
    port = free_port()
    argv = [sys.executable, "-m", "exporter.cli", "demo", "--engines", "1", "--listen", f"127.0.0.1:{port}",
            "--no-probe", "--interval", "1s", "--engine-format", engine_format, "--gpus", str(gpus), *extra]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        counts: list[int] = []
        text = ""

        def stable() -> bool:
            nonlocal text
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(url, timeout=5).text
                counts.append(_samples(text))
            return len(counts) >= 3 and counts[-1] == counts[-2] == counts[-3] and counts[-1] > 0

        # Histograms and counters appear with the first requests; three equal scrapes 1 s apart after that.
        if not wait_until(stable, timeout=60, interval=1.0):
            raise RuntimeError(f"{engine_format} x{gpus}: /metrics never settled: {counts[-5:]}")
        return text
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()


@dataclass
class FleetCost:
    replicas: int
    series: float  # active series in the store
    recorded: float  # of which recording-rule results
    rows_per_s: float  # ingestion
    eval_cores: float  # vmalert seconds evaluating per second
    eval_round_s: float  # one round of every group
    vm_rss_mb: float
    vmalert_rss_mb: float
    prometheus_rss_mb: float  # one cluster's Prometheus (the larger)
    vm_cores: float
    vmalert_cores: float
    replica_cores: float  # mean CPU of one demo replica (twin + exporter)


def scrape_metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
    """A server's own /metrics (VictoriaMetrics, vmalert) as `name{labels}` -> value."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=timeout).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _total(metrics: dict[str, float], pattern: str) -> float:
    regex = re.compile(pattern)
    return sum(v for k, v in metrics.items() if regex.fullmatch(k))


def _query(url: str, expr: str) -> float:
    result = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=20).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def fleet_cost(n: int) -> FleetCost:
    fleet_mod = _fleet_module()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        directory = pathlib.Path(tmp)
        names = [f"r{i}" for i in range(n)] + ["pa", "pb", "vm", "vmalert", "am", "sink"]
        free = free_ports(names)
        ports = fleet_mod.Ports([free[f"r{i}"] for i in range(n)], {"a": free["pa"], "b": free["pb"]}, free["vm"],
                                free["vmalert"], free["am"], free["sink"])
        opts = fleet_mod.FleetOptions(replicas=n, die_after_s=None, interval=INTERVAL)
        fleet, procs = fleet_mod.plan(directory, opts, ports)
        try:
            fleet_mod.start(fleet, procs, timeout_s=120)
            pids = {name: pid for name, pid, _ in fleet_mod.status(directory) if pid}
            time.sleep(WARMUP_S)
            vm, vmalert = fleet.central, fleet.vmalert

            def snapshot() -> tuple[float, dict[str, float], dict[str, float], dict[str, float]]:
                cpu = {name: fleet_mod.cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
                return time.monotonic(), scrape_metrics(vm), scrape_metrics(vmalert), cpu

            t0, vm0, al0, cpu0 = snapshot()
            time.sleep(WINDOW_S)
            t1, vm1, al1, cpu1 = snapshot()
            elapsed = t1 - t0
            rows = (_total(vm1, r'vm_rows_inserted_total\{.*\}') - _total(vm0, r'vm_rows_inserted_total\{.*\}'))
            sums = r'vmalert_iteration_duration_seconds_sum\{.*\}'
            eval_s = _total(al1, sums) - _total(al0, sums)
            groups = [k for k in al1 if k.startswith("vmalert_iteration_duration_seconds_sum{")]
            per_round = sum((al1[k] - al0.get(k, 0.0)) / max(1.0, al1[k.replace("_sum{", "_count{")]
                                                                  - al0.get(k.replace("_sum{", "_count{"), 0.0))
                            for k in groups)
            replicas = [r.name for r in fleet.replicas]
            rss = {name: (fleet_mod.rss_bytes(pid) or 0) / 2**20 for name, pid in pids.items()}
            return FleetCost(
                replicas=n,
                series=_total(vm1, r'vm_cache_entries\{type="storage/hour_metric_ids"\}'),
                recorded=_query(vm, 'count({__name__=~".+:.+"})'),
                rows_per_s=rows / elapsed,
                eval_cores=eval_s / elapsed,
                eval_round_s=per_round,
                vm_rss_mb=rss.get("victoria-metrics", 0.0),
                vmalert_rss_mb=rss.get("vmalert", 0.0),
                prometheus_rss_mb=max(rss.get("prometheus-a", 0.0), rss.get("prometheus-b", 0.0)),
                vm_cores=(cpu1["victoria-metrics"] - cpu0["victoria-metrics"]) / elapsed,
                vmalert_cores=(cpu1["vmalert"] - cpu0["vmalert"]) / elapsed,
                replica_cores=sum(cpu1[r] - cpu0[r] for r in replicas if r in cpu1) / len(replicas) / elapsed,
            )
        finally:
            fleet_mod.stop(directory)


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


@dataclass
class Results:
    per_replica: dict[tuple[str, int], tuple[int, int]]
    costs: list[FleetCost]


_last: Results | None = None


def measure() -> Results:
    per_replica = {(f, g): series_per_replica(f, g) for f in FORMATS for g in GPU_COUNTS}
    costs = [fleet_cost(n) for n in SIZES]
    return Results(per_replica, costs)


def run() -> list[tuple[str, str]]:
    global _last
    _last = measure()
    r = _last
    rows = [(f"fleet: series per replica, {f} x{g} GPU (families)", f"{s} ({fam})")
            for (f, g), (s, fam) in r.per_replica.items()]
    for c in r.costs:
        rows.append((f"fleet: N={c.replicas}: active series / recorded / rows/s",
                     f"{c.series:.0f} / {c.recorded:.0f} / {c.rows_per_s:.0f}"))
        rows.append((f"fleet: N={c.replicas}: RSS victoria-metrics / vmalert (MB); vmalert eval cores",
                     f"{c.vm_rss_mb:.0f} / {c.vmalert_rss_mb:.0f}; {c.eval_cores:.4f}"))
    return rows


def section() -> str:
    """Markdown for docs/benchmarks.md: the tables and the extrapolation to 1,000 replicas."""
    assert _last is not None, "run() first"
    r = _last
    lines = ["## Fleet: cardinality and cost", "",
             "Written by `python -m bench fleet` (bench/bench_fleet.py says what is measured and how). Series per "
             "replica: one `llm-exporter demo --engines 1` (decode-heavy) per engine format and GPU count, every "
             f"sample of its /metrics plus Prometheus' {PROMETHEUS_PER_TARGET} per target. The series are the same "
             "at any scrape interval; samples/s are series / interval.", "",
             "| engine format | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPU_COUNTS) + " |",
             "|---|" + "---|" * len(GPU_COUNTS)]
    for f in FORMATS:
        lines.append(f"| {f} | " + " | ".join(str(r.per_replica[(f, g)][0]) for g in GPU_COUNTS) + " |")
    gpu_step = [(r.per_replica[(f, 8)][0] - r.per_replica[(f, 1)][0]) / 7 for f in FORMATS]
    lines += ["", f"Each GPU adds {min(gpu_step):.0f} to {max(gpu_step):.0f} series (the GPU families: NVML "
              "fields, per-GPU roofline and energy); the rest is the engine's families (histograms dominate: "
              "TTFT, TBT, E2E, queue, prefill and decode times, prompt and output lengths) and the host's.", "",
              f"The central store (VictoriaMetrics 1.79 single node, vmalert 1.79) with deploy/fleet.py's fleet "
              f"(its mix of formats, models, scenarios and GPUs), every interval {INTERVAL}, after {WARMUP_S:.0f} s "
              f"of warm-up, over {WINDOW_S:.0f} s, on this 2-core machine with everything else the fleet runs:", "",
              "| replicas | active series | of which recorded | series / replica | rows/s ingested | "
              "vmalert eval (cores) | one round of all groups (s) | VM RSS (MB) | vmalert RSS (MB) | "
              "Prometheus RSS (MB) | VM CPU (cores) | replica CPU (cores) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r.costs:
        lines.append(f"| {c.replicas} | {c.series:.0f} | {c.recorded:.0f} | {c.series / c.replicas:.0f} | "
                     f"{c.rows_per_s:.0f} | {c.eval_cores:.4f} | {c.eval_round_s:.3f} | {c.vm_rss_mb:.0f} | "
                     f"{c.vmalert_rss_mb:.0f} | {c.prometheus_rss_mb:.0f} | {c.vm_cores:.3f} | "
                     f"{c.replica_cores:.3f} |")
    lines += knobs()
    ns = [c.replicas for c in r.costs]
    _, series_slope = _fit(ns, [c.series for c in r.costs])
    _, recorded_slope = _fit(ns, [c.recorded for c in r.costs])
    vm_base, vm_slope = _fit(ns, [c.vm_rss_mb for c in r.costs])
    al_base, al_slope = _fit(ns, [c.vmalert_rss_mb for c in r.costs])
    ev_base, ev_slope = _fit(ns, [c.eval_cores * _seconds(INTERVAL) for c in r.costs])  # seconds per round
    series_k = series_slope * AT_SCALE
    mb_per_kseries = vm_slope / series_slope * 1000 if series_slope else 0.0
    lines += ["", f"### At {AT_SCALE:,} replicas", "",
              f"Least-squares lines through the {len(ns)} points: {series_slope:.0f} active series per replica "
              f"({recorded_slope:.0f} of them recorded by the rules), {vm_slope:.2f} MB of store RSS per replica "
              f"({mb_per_kseries:.2f} MB per 1,000 series), vmalert {al_slope:.2f} MB per replica, "
              f"{ev_slope * 1000:.1f} ms of rule evaluation per replica per round.", "",
              "| | at 15 s scrape and evaluation | at 30 s |", "|---|---|---|",
              f"| active series | {series_k:,.0f} | {series_k:,.0f} |",
              f"| samples/s ingested | {series_k / 15:,.0f} | {series_k / 30:,.0f} |",
              f"| store RSS (line) | {(vm_base + vm_slope * AT_SCALE) / 1024:.1f} GB | "
              f"{(vm_base + vm_slope * AT_SCALE) / 1024:.1f} GB |",
              f"| vmalert RSS (line) | {(al_base + al_slope * AT_SCALE):.0f} MB | "
              f"{(al_base + al_slope * AT_SCALE):.0f} MB |",
              f"| rule evaluation (cores) | {(ev_base + ev_slope * AT_SCALE) / 15:.2f} | "
              f"{(ev_base + ev_slope * AT_SCALE) / 30:.2f} |",
              "",
              "The store's memory is the line's estimate from 16 replicas at most; the series and samples/s "
              "are exact multiples. docs/deploy.md (\"Cutting the cost\") lists the knobs: which families to drop "
              "with metric_relabel_configs, which recording rules to keep centrally, the scrape interval."]
    return "\n".join(lines) + "\n"


def knobs(engine_format: str = "vllm", gpus: int = 8) -> list[str]:
    """What each knob of docs/deploy.md ("Cutting the cost") saves on one replica's page."""
    page = _pages[(engine_format, gpus)]
    fams = family_series(page)
    total = sum(n for _, n in fams.values())
    used = referenced_families(list(fams))
    unused = sorted(((n, f) for f, (_, n) in fams.items() if f not in used), reverse=True)
    hist = sum(n for kind, n in fams.values() if kind == "histogram")
    per_gpu = sum(n for f, (_, n) in fams.items() if f.startswith("llm_gpu_")) / gpus
    top = sorted(((n, f, kind) for f, (kind, n) in fams.items()), reverse=True)[:8]
    lines = ["", f"Where one replica's series go ({engine_format}, {gpus} GPUs: {total} series on its page):", "",
             "| family | type | series |", "|---|---|---|"]
    lines += [f"| `{f}` | {kind} | {n} |" for n, f, kind in top]
    lines += ["", f"- histograms: {hist} series ({hist / total:.0%}); `llm_gpu_*`: {per_gpu:.0f} per GPU;",
              f"- families no board query and no rule reads ({len(unused)}, {sum(n for n, _ in unused)} series, "
              f"{sum(n for n, _ in unused) / total:.0%}): "
              + ", ".join(f"`{f}` ({n})" for n, f in unused[:12]) + (", ..." if len(unused) > 12 else "")
              + ". Dropping them centrally (write_relabel_configs) costs no panel and no alert."]
    return lines


def _seconds(duration: str) -> float:
    from exporter.slo import duration_seconds

    return duration_seconds(duration)
