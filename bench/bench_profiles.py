"""Series per replica by profile (exporter/catalog/families.csv), engine format and GPU count, with the
series the shipped recording rules add, against the budgets of docs/metrics.md ("Profiles").

One real `llm-exporter demo --engines 1 --no-probe --profile P --engine-format F --gpus G` per
(format, profile, GPU count), all at once, each scraped by one real Prometheus every second with the
shipped rules (alerts/rules/*.yaml) evaluated every second. Each demo's series carry a `cluster` label
of its own (a static scrape label), which every fleet rule keeps, so one Prometheus counts each replica
apart. After SETTLE_S of rule evaluation: the stored series of each replica (its page, plus
Prometheus' 5 per target) and the recorded ones (names with ':'), in two parts: those of the replica
(they keep its `instance`: one set per replica, `target_model:*`) and those of its model's fleet
(`model:*`, `cluster:*`: one set per model, whatever the replica count, so at 1,000 replicas of ten
models they add a few tenths of a series per replica). ALERTS are not counted. A recording that only
traffic fills (quantiles, ratios) is there: the demo's decode-heavy load runs throughout.

Budgets (issue 44): a 1-GPU vLLM replica adds at most 150 series under `minimal` and 450 under
`default`, its recorded series included; `default` adds at most 30 series per GPU ((series at 8 GPUs -
series at 1) / 7). The fleet's per-model recordings are printed beside them: a one-replica fleet pays them
too."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx
import yaml

from tests.support import free_port, stop_process, wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORMATS = ("vllm", "sglang", "tgi", "llamacpp")
PROFILES = ("minimal", "default", "full")
GPU_COUNTS = (1, 8)
SETTLE_S = 20.0
BUDGETS = {("vllm", "minimal"): 150, ("vllm", "default"): 450}
"""Series of a 1-GPU replica, recorded ones included."""
PER_GPU_BUDGET = {"default": 30}


@dataclass(frozen=True)
class Replica:
    engine_format: str
    profile: str
    gpus: int

    @property
    def name(self) -> str:
        return f"{self.engine_format}-{self.profile}-{self.gpus}"


@dataclass(frozen=True)
class Count:
    stored: int  # the replica's scraped series in Prometheus (its page + Prometheus' per-target series)
    recorded: int  # the recording-rule series of the replica (with its `instance`)
    fleet_recorded: int  # the recording-rule series of its model's fleet (without `instance`)

    @property
    def total(self) -> int:
        """What one more replica adds to the store."""
        return self.stored + self.recorded


def _demo(replica: Replica, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "exporter.cli", "demo", "--engines", "1", "--listen", f"127.0.0.1:{port}",
            "--no-probe", "--interval", "1s", "--engine-format", replica.engine_format, "--gpus", str(replica.gpus),
            "--profile", replica.profile]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _page_lines(url: str) -> int:
    text = httpx.get(url, timeout=5).text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _settled(urls: Sequence[str], timeout: float) -> None:
    """Every page's series count the same three times running (histograms appear with traffic)."""
    history: dict[str, list[int]] = {url: [] for url in urls}

    def stable() -> bool:
        for url, counts in history.items():
            if len(counts) >= 3 and counts[-1] == counts[-2] == counts[-3] > 0:
                continue
            with contextlib.suppress(httpx.HTTPError):
                counts.append(_page_lines(url))
        return all(len(c) >= 3 and c[-1] == c[-2] == c[-3] > 0 for c in history.values())

    if not wait_until(stable, timeout=timeout, interval=1.0):
        raise RuntimeError(f"pages never settled: { {u: c[-4:] for u, c in history.items()} }")


def _query(prometheus: str, expr: str) -> dict[str, int]:
    result = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30).json()["data"]["result"]
    return {r["metric"].get("cluster", ""): int(float(r["value"][1])) for r in result}


def count_series(replicas: Iterable[Replica], *, settle_s: float = SETTLE_S) -> dict[Replica, Count]:
    """Each replica's stored and recorded series under one Prometheus with the shipped rules."""
    replicas = list(replicas)
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        raise RuntimeError("prometheus is not installed (make debs)")
    ports = {r: free_port() for r in replicas}
    procs = [_demo(r, ports[r]) for r in replicas]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bench-profiles-"))
    prometheus_proc = None
    try:
        _settled([f"http://127.0.0.1:{ports[r]}/metrics" for r in replicas], timeout=120)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in sorted((ROOT / "alerts" / "rules").glob("*.yaml"))],
            "scrape_configs": [{"job_name": "llm-exporter", "static_configs": [
                {"targets": [f"127.0.0.1:{ports[r]}"], "labels": {"cluster": r.name}} for r in replicas]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = free_port()
        prometheus_proc = subprocess.Popen(
            [prometheus_bin, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{web}"
        if not wait_until(lambda: _ready(url), timeout=60, interval=0.5):
            raise RuntimeError("prometheus never became ready")
        time.sleep(settle_s)
        stored = _query(url, 'count by (cluster) ({__name__=~".+", __name__!~".*:.*|ALERTS.*"})')
        recorded = _query(url, 'count by (cluster) ({__name__=~".+:.+", instance!=""})')
        fleet = _query(url, 'count by (cluster) ({__name__=~".+:.+", instance=""})')
        return {r: Count(stored.get(r.name, 0), recorded.get(r.name, 0), fleet.get(r.name, 0)) for r in replicas}
    finally:
        running = [*procs, *([prometheus_proc] if prometheus_proc else [])]
        for proc in running:  # all at once, then each waited for
            proc.terminate()
        for proc in running:
            stop_process(proc, timeout=15)
        shutil.rmtree(workdir, ignore_errors=True)


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    return False


def measure() -> dict[Replica, Count]:
    counts: dict[Replica, Count] = {}
    for gpus in GPU_COUNTS:  # one batch per GPU count: 12 demos at a time on 2 cores
        counts.update(count_series(Replica(f, p, gpus) for f in FORMATS for p in PROFILES))
    return counts


def per_gpu(counts: dict[Replica, Count], engine_format: str, profile: str) -> float:
    low, high = Replica(engine_format, profile, GPU_COUNTS[0]), Replica(engine_format, profile, GPU_COUNTS[-1])
    return (counts[high].total - counts[low].total) / (GPU_COUNTS[-1] - GPU_COUNTS[0])


_results: dict[Replica, Count] = {}


def run() -> list[tuple[str, str]]:
    _results.update(measure())
    rows = []
    for f in FORMATS:
        for p in PROFILES:
            one = _results[Replica(f, p, 1)]
            budget = BUDGETS.get((f, p))
            slope = per_gpu(_results, f, p)
            gpu_budget = PER_GPU_BUDGET.get(p)
            verdict = "" if budget is None else (" within" if one.total <= budget else " OVER") + f" {budget}"
            gpu_verdict = ("" if gpu_budget is None
                           else (" within" if slope <= gpu_budget else " OVER") + f" {gpu_budget}")
            rows.append((f"profile {p}, {f} x1 GPU: series (stored + recorded; + per model)",
                         f"{one.total} ({one.stored} + {one.recorded}; + {one.fleet_recorded}){verdict}"))
            rows.append((f"profile {p}, {f}: series per GPU", f"{slope:.1f}{gpu_verdict}"))
    return rows


def section() -> str:
    if not _results:
        _results.update(measure())
    lines = ["### Profiles: series per replica", "",
             "Written by `python -m bench profiles` (bench/bench_profiles.py says how): one demo replica per engine "
             "format, profile and GPU count under one Prometheus with the shipped rules; stored = the page plus "
             "Prometheus' 5 per target, recorded = the rules' series of that replica (they keep its `instance`); "
             "per model = the fleet rules' series of its model (one set per model, not per replica). Budgets "
             "(docs/metrics.md, \"Profiles\"): a 1-GPU vLLM replica adds at most 150 (minimal) and 450 (default) "
             "series; default at most 30 more per GPU.", "",
             "| engine | profile | 1 GPU: stored + recorded = per replica | per model | 8 GPUs: per replica "
             "| per GPU |",
             "|---|---|---|---|---|---|"]
    for f in FORMATS:
        for p in PROFILES:
            one, eight = _results[Replica(f, p, 1)], _results[Replica(f, p, 8)]
            lines.append(f"| {f} | {p} | {one.stored} + {one.recorded} = {one.total} | {one.fleet_recorded} | "
                         f"{eight.total} | {per_gpu(_results, f, p):.1f} |")
    return "\n".join(lines) + "\n"
