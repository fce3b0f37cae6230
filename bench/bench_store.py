"""The central store's steady-state cost with days of data: VictoriaMetrics 1.79 and vmalert 1.79 (Debian's,
as deploy/fleet.py runs them) loaded with N replicas' series over D days, then the shipped rules evaluated
and every fleet-board panel queried at "now". `python -m bench store` runs it and rewrites only its section
of docs/benchmarks.md. Environment: LLM_EXPORTER_STORE_SIZES (100,300,1000), LLM_EXPORTER_STORE_DAYS (3),
LLM_EXPORTER_STORE_INTERVAL (sample interval, 30m), LLM_EXPORTER_STORE_PROFILES (default,minimal).

Shapes: one `llm-exporter demo --engines 1 --engine-format vllm --gpus 1 --no-probe --profile P` page once
stable (bench_fleet.series_per_replica), every sample line one series, plus Prometheus' 5 per target (up,
scrape_*). Replicated to N replicas with the labels a Kubernetes scrape gives them: job, instance, pod,
namespace (4), cluster (2), target ("engine", the sidecar's name for its engine) and model (5 models).

Values (generate(): pure Python, precomputed per series, written as /api/v1/import JSON lines, one line
per series holding all its samples; the timestamps string is shared): counters grow at a per-series rate
with a slow daily swing (monotone); a histogram's count grows like a counter and each bucket is
floor(count x cdf(le)) with a per-series cdf (monotone in le and in time, +Inf = _count, _sum = count x a
mean); gauges swing around the page's value; 0/1 gauges keep the page's value.

The interval is coarse because 15 s samples of 1,000 replicas over 3 days (~100 M samples per 1,000
series-days) do not fit a 2-core machine in minutes: series count, index size, the rules' and panels'
series lookups are those of production; the per-sample work inside a 1d/3d window is that of the coarse
interval (at 15 s it is interval/15 s times more samples to decode, which VictoriaMetrics' rollup cache does
not remove on the first evaluation). VictoriaMetrics widens a rate window shorter than the sample interval to
the interval, so the 5m rules and panels read the newest two samples.

Per (size, profile), a fresh store (removed after):
- load: samples / wall time (the generator and the store share the 2 cores; the generator's own rate
  and the store's CPU seconds are reported too), then /internal/force_flush;
- store: series created (vm_new_timeseries_created_total), RSS after the load and after the queries, disk
  (du of -storageDataPath after the flush);
- vmalert with the central rules (deploy/fleet.render_rules: keep_firing_for stripped for 1.79), ROUNDS
  rounds at EVAL_INTERVAL: per group the mean of vmalert_iteration_duration_seconds, the round = their sum;
  vmalert's RSS;
- every query of dashboards/llm-serving-fleet.json (variables as tests/fleet substitutes them, "All") as a
  range query over the last 6 h and 1 d at a Grafana-like step (range / 1,000 points): median and slowest.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import pathlib
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from bench import bench_fleet
from tests.support import free_ports, stop_process, wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _duration_s(duration: str) -> float:
    from exporter.slo import duration_seconds

    return duration_seconds(duration)


SIZES = tuple(int(n) for n in os.environ.get("LLM_EXPORTER_STORE_SIZES", "100,300,1000").split(","))
DAYS = float(os.environ.get("LLM_EXPORTER_STORE_DAYS", "3"))
INTERVAL = os.environ.get("LLM_EXPORTER_STORE_INTERVAL", "30m")
PROFILES = tuple(os.environ.get("LLM_EXPORTER_STORE_PROFILES", "default,minimal").split(","))
EVAL_INTERVAL_S = 15
ROUNDS = 3
# The boards' time ranges (LLM_EXPORTER_STORE_RANGES, e.g. "6h,1d"): each costs its queries, and the longest
# the replay that backfills recorded series under it (25 h of replay at 1,000 replicas took 275 s here).
RANGES = tuple((r, int(_duration_s(r))) for r in os.environ.get("LLM_EXPORTER_STORE_RANGES", "6h").split(","))
REPLAY_S = max(s for _, s in RANGES) + 3600  # recorded series backfilled over the longest range and an hour before
POINTS = 1000  # Grafana's maxDataPoints for a full-width panel: step = range / POINTS
CLUSTERS = ("a", "b")
NAMESPACES = ("chat", "batch", "agents", "eval")
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
          "mistralai/Mistral-7B-Instruct-v0.3", "google/gemma-2-9b-it")
JOB = "llm-exporter"
PATTERNS = 16  # distinct swing patterns (phases): enough to vary series, few enough to precompute
CHUNK_SERIES = 20000  # series per import request


# ------------------------------------------------------------------------------------------------
# Shapes: one replica's page
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """One series of the page: metric name, its labels (without le), its kind and the page's value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    kind: str  # counter | gauge | histogram (one Shape per histogram: buckets, _sum and _count together)
    value: float = 0.0  # counter/gauge: the page's value; histogram: _count
    buckets: tuple[tuple[str, float], ...] = ()  # histogram: (le, page's cumulative count), +Inf last
    total: float = 0.0  # histogram: the page's _sum


_LINE = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_page(text: str) -> list[Shape]:
    """The page's series grouped into Shapes (histograms as one each), in page order."""
    types: dict[str, str] = {}
    plain: list[Shape] = []
    hist: dict[tuple[str, tuple[tuple[str, str], ...]], dict] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            types[name] = kind
            continue
        m = _LINE.fullmatch(line.strip()) if line and not line.startswith("#") else None
        if not m:
            continue
        name, raw, value = m.group(1), m.group(2) or "", float(m.group(3))
        labels = dict(_LABEL.findall(raw))
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if types.get(base) == "histogram" and base != name:
            le = labels.pop("le", None)
            entry = hist.setdefault((base, tuple(sorted(labels.items()))), {"buckets": [], "sum": 0.0, "count": 0.0})
            if name.endswith("_bucket") and le is not None:
                entry["buckets"].append((le, value))
            elif name.endswith("_sum"):
                entry["sum"] = value
            else:
                entry["count"] = value
            continue
        kind = types.get(name) or types.get(re.sub(r"_total$", "", name), "gauge")
        plain.append(Shape(name, tuple(sorted(labels.items())), "counter" if kind == "counter" else "gauge", value))
    out = list(plain)
    for (base, labels), e in hist.items():
        buckets = sorted(e["buckets"], key=lambda b: math.inf if b[0] == "+Inf" else float(b[0]))
        out.append(Shape(base, labels, "histogram", e["count"], tuple(buckets), e["sum"]))
    return out


def series_of(shapes: Sequence[Shape]) -> int:
    """Series one replica writes (a histogram: its buckets, _sum and _count) plus Prometheus' 5."""
    return sum(len(s.buckets) + 2 if s.kind == "histogram" else 1 for s in shapes) + len(SCRAPE_SERIES)


SCRAPE_SERIES = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
                 "scrape_series_added")


# ------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replica:
    index: int
    labels: dict[str, str]  # job, instance, pod, namespace, cluster, target, model


def replica_labels(i: int) -> Replica:
    cluster, namespace, model = CLUSTERS[i % 2], NAMESPACES[(i // 2) % len(NAMESPACES)], MODELS[i % len(MODELS)]
    short = model.split("/")[-1].lower().replace(".", "-")
    pod = f"{short}-{i // 256:x}{i % 256:02x}-{(i * 2654435761) % 99991:05d}"
    return Replica(i, {"job": JOB, "instance": f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}:9400", "pod": pod,
                       "namespace": namespace, "cluster": cluster, "target": "engine", "model": model})


@dataclass
class Timeline:
    """The samples' timestamps (ms) and per-pattern cumulative growth: growth[p][k] is the time-integral of
    a rate that swings +-40 % over a day, in units of `step_s` at rate 1 (so a counter with rate r per
    second is r x step_s x growth[p][k])."""

    start_ms: int
    step_s: float
    count: int
    timestamps: str = ""  # "t0,t1,..." shared by every series
    growth: list[list[float]] = field(default_factory=list)
    swing: list[list[float]] = field(default_factory=list)  # gauges: 1 +- 0.25, daily

    @classmethod
    def ending_now(cls, days: float, step_s: float, now_s: float) -> Timeline:
        count = int(days * 86400 // step_s) + 1
        end_ms = int(now_s * 1000) // 1000 * 1000
        start_ms = end_ms - int((count - 1) * step_s * 1000)
        t = cls(start_ms, step_s, count)
        t.timestamps = ",".join(str(start_ms + int(k * step_s * 1000)) for k in range(count))
        for p in range(PATTERNS):
            phase = 2 * math.pi * p / PATTERNS
            acc, cum, sw = 0.0, [], []
            for k in range(count):
                angle = 2 * math.pi * (start_ms / 1000 + k * step_s) / 86400 + phase
                cum.append(acc)
                acc += 1.0 + 0.4 * math.sin(angle)
                sw.append(1.0 + 0.25 * math.sin(angle))
            t.growth.append(cum)
            t.swing.append(sw)
        return t


def _labels_json(name: str, base: dict[str, str], own: Sequence[tuple[str, str]], extra: str = "") -> str:
    labels = {**dict(own), **base, "__name__": name}
    return json.dumps(labels, separators=(",", ":"))[:-1] + extra + "}"


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else repr(round(x, 4))


def _line(metric: str, values: str, timeline: Timeline) -> str:
    return f'{{"metric":{metric},"values":[{values}],"timestamps":[{timeline.timestamps}]}}\n'


def replica_lines(shapes: Sequence[Shape], replica: Replica, timeline: Timeline, rng: random.Random,
                  page_uptime_s: float = 20.0) -> Iterator[str]:
    """Every series of one replica as import lines (see the module docstring for the value model)."""
    base = replica.labels
    n = timeline.count
    constant: dict[str, str] = {}

    def flat(v: float) -> str:
        s = _num(v)
        if s not in constant:
            constant[s] = ",".join([s] * n)
        return constant[s]

    for s in shapes:
        own = [kv for kv in s.labels if kv[0] not in base]
        growth = timeline.growth[rng.randrange(PATTERNS)]
        if s.kind == "counter":
            per_step = max(s.value / page_uptime_s, 0.01) * rng.uniform(0.5, 1.5) * timeline.step_s
            start = rng.uniform(0, 1000) * per_step
            if s.value == int(s.value):
                values = ",".join([str(int(start + per_step * g)) for g in growth])
            else:
                values = ",".join([repr(round(start + per_step * g, 3)) for g in growth])
            yield _line(_labels_json(s.name, base, own), values, timeline)
        elif s.kind == "gauge":
            if s.value in (0.0, 1.0) or s.value != s.value:  # one-hot, flags, NaN: as on the page
                values = flat(0.0 if s.value != s.value else s.value)
            else:
                swing = timeline.swing[rng.randrange(PATTERNS)]
                level = s.value * rng.uniform(0.7, 1.3)
                values = ",".join([repr(round(level * w, 4)) for w in swing])
            yield _line(_labels_json(s.name, base, own), values, timeline)
        else:
            per_step = max(s.value / page_uptime_s, 0.5) * rng.uniform(0.5, 1.5) * timeline.step_s
            counts = [int(per_step * g) for g in growth]
            page_count = s.buckets[-1][1] if s.buckets and s.buckets[-1][1] > 0 else 0.0
            skew = rng.uniform(0.8, 1.25)  # cdf ** skew: still monotone in le, 1 at +Inf
            edges = len(s.buckets)
            for j, (le, cumulative) in enumerate(s.buckets):
                cdf = cumulative / page_count if page_count else (j + 1) / edges
                cdf = 1.0 if le == "+Inf" else min(1.0, cdf) ** skew
                values = ",".join([str(c) for c in counts]) if cdf >= 1.0 else \
                    ",".join([str(int(c * cdf)) for c in counts])
                yield _line(_labels_json(f"{s.name}_bucket", base, own, f',"le":"{le}"'), values, timeline)
            mean = (s.total / s.value if s.value else 1.0) * rng.uniform(0.8, 1.2)
            yield _line(_labels_json(f"{s.name}_sum", base, own), ",".join([repr(round(c * mean, 3)) for c in counts]),
                        timeline)
            yield _line(_labels_json(f"{s.name}_count", base, own), ",".join([str(c) for c in counts]), timeline)
    yield _line(_labels_json("up", base, ()), flat(1.0), timeline)
    total = series_of(shapes) - len(SCRAPE_SERIES)
    for name, value in (("scrape_duration_seconds", 0.012), ("scrape_samples_scraped", total),
                        ("scrape_samples_post_metric_relabeling", total), ("scrape_series_added", 0)):
        yield _line(_labels_json(name, base, ()), flat(value), timeline)


def generate(shapes: Sequence[Shape], replicas: int, timeline: Timeline, seed: int = 0) -> Iterator[str]:
    rng = random.Random(seed)
    for i in range(replicas):
        yield from replica_lines(shapes, replica_labels(i), timeline, rng)


# ------------------------------------------------------------------------------------------------
# The store
# ------------------------------------------------------------------------------------------------
def _fleet_module():
    from deploy import fleet  # Prometheus, VictoriaMetrics and their configs: imported only by this bench

    return fleet


def _board_code():
    from tests.fleet import test_fleet  # Grafana's variable substitution as the fleet tier runs it

    return test_fleet


class _Sink(http.server.BaseHTTPRequestHandler):
    """vmalert 1.79 needs a -notifier.url when the rules hold alerts: a notifier that accepts and drops."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class StoreCost:
    profile: str
    replicas: int
    series_per_replica: int
    series: float  # series the store created (raw; recorded ones come on top, see `recorded`)
    recorded: float  # series vmalert's recording rules wrote in its rounds
    samples: int
    load_s: float
    generate_s: float  # the generator's own time within load_s
    vm_load_cpu_s: float  # the store's CPU seconds during the load
    vm_rss_loaded_mb: float
    vm_rss_after_mb: float
    disk_mb: float
    vmalert_rss_mb: float
    round_s: float  # sum over groups of the mean iteration
    groups: dict[str, float]  # group -> mean iteration (s)
    rules: dict[str, float]  # "group / rule" -> its expression as one instant query at now (s)
    long_rules: frozenset[str]  # the rules of `rules` that read a 1d or 3d window
    replay_s: float  # vmalert's replay of every rule over the last REPLAY_S at the data's interval
    panels: dict[str, dict[str, float]]  # range name -> "panel / ref" -> seconds
    empty: dict[str, list[str]]  # range name -> queries without a finite value
    failed: list[str]  # panel queries the store refused, with the reason

    @property
    def rows_per_s(self) -> float:
        return self.samples / self.load_s if self.load_s else 0.0


def _metrics(url: str) -> dict[str, float]:
    return bench_fleet.scrape_metrics(url, timeout=30)


def _sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k == prefix or k.startswith(prefix + "{"))


def _du_mb(path: pathlib.Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def _start(argv: list[str], url: str, ready: str, log: pathlib.Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def up() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url + ready, timeout=2).status_code == 200
        return False

    if not wait_until(up, timeout=60, interval=0.2):
        process.kill()
        raise RuntimeError(f"{argv[0]} not ready: {log.read_text()[-2000:]}")
    return process


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        stop_process(process, timeout=30)


def load(vm: str, lines: Iterator[str]) -> tuple[int, float]:
    """POST the lines to /api/v1/import, CHUNK_SERIES series per request streamed in batches of 500;
    returns (series sent, seconds spent generating)."""
    spent = 0.0
    sent = 0
    exhausted = False

    def chunk() -> Iterator[bytes]:
        nonlocal spent, sent, exhausted
        batch: list[str] = []
        t0 = time.perf_counter()
        for in_request, line in enumerate(lines, 1):
            batch.append(line)
            if len(batch) == 500 or in_request == CHUNK_SERIES:
                spent += time.perf_counter() - t0
                sent += len(batch)
                yield "".join(batch).encode()
                batch.clear()
                if in_request == CHUNK_SERIES:
                    return
                t0 = time.perf_counter()
        exhausted = True
        spent += time.perf_counter() - t0
        sent += len(batch)
        if batch:
            yield "".join(batch).encode()

    with httpx.Client(timeout=600) as client:
        while not exhausted:
            response = client.post(vm + "/api/v1/import", content=chunk())
            if response.status_code >= 300:
                raise RuntimeError(f"import: {response.status_code} {response.text[:500]}")
    return sent, spent


def store_cost(profile: str, shapes: Sequence[Shape], n: int, timeline: Timeline) -> StoreCost:
    fleet_mod = _fleet_module()
    board_mod = _board_code()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        directory = pathlib.Path(tmp)
        ports = free_ports(("vm", "vmalert", "sink"))
        vm, vmalert = f"http://127.0.0.1:{ports['vm']}", f"http://127.0.0.1:{ports['vmalert']}"
        sink = http.server.ThreadingHTTPServer(("127.0.0.1", ports["sink"]), _Sink)
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        data = directory / "vm-data"
        processes: list[subprocess.Popen] = []
        try:
            vm_proc = _start([
                fleet_mod._binary("victoria-metrics"), f"-storageDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{ports['vm']}", "-retentionPeriod=1y",
                # A fleet-wide rule or panel reads every replica's series of a family at once: 1,000 replicas'
                # buckets exceed the default 300,000 unique series per query.
                "-search.maxUniqueTimeseries=10000000", "-loggerLevel=WARN"],
                vm, "/health", directory / "vm.log")
            processes.append(vm_proc)
            cpu0 = fleet_mod.cpu_seconds(vm_proc.pid) or 0.0
            t0 = time.perf_counter()
            sent, spent = load(vm, generate(shapes, n, timeline, seed=n))
            httpx.get(vm + "/internal/force_flush", timeout=120)
            load_s = time.perf_counter() - t0
            vm_cpu = (fleet_mod.cpu_seconds(vm_proc.pid) or 0.0) - cpu0
            # Imported rows are searchable once flushed; wait for the newest sample of every replica.
            wait_until(lambda: _instant(vm, 'count(up{job="llm-exporter"})') >= n, timeout=120, interval=1.0)
            metrics = _metrics(vm)
            series = _sum(metrics, "vm_new_timeseries_created_total")
            rss_loaded = (fleet_mod.rss_bytes(vm_proc.pid) or 0) / 2**20
            disk = _du_mb(data)

            rules = fleet_mod.render_rules(directory, 1.0, f"http://127.0.0.1:{ports['sink']}")
            # The boards read recorded series: vmalert's replay mode writes them for the last day at the
            # data's interval, as a store that has run the rules for a day holds them, level by level.
            end_s = (timeline.start_ms + int((timeline.count - 1) * timeline.step_s * 1000)) / 1000
            t0 = time.perf_counter()
            for level_glob in recording_levels(rules["central"], directory / "replay"):
                replay = subprocess.run([
                    fleet_mod._binary("vmalert"), f"-rule={level_glob}", f"-datasource.url={vm}",
                    f"-remoteWrite.url={vm}", f"-evaluationInterval={int(timeline.step_s)}s",
                    f"-replay.timeFrom={_rfc3339(end_s - REPLAY_S)}", f"-replay.timeTo={_rfc3339(end_s)}",
                    "-replay.rulesDelay=0s", "-replay.disableProgressBar", "-loggerLevel=WARN"],
                    capture_output=True, text=True, timeout=1800)
                if replay.returncode != 0:
                    raise RuntimeError(f"vmalert replay: {replay.stdout[-1000:]}{replay.stderr[-1000:]}")
                # The next level reads these results: stored and searchable first.
                httpx.get(vm + "/internal/force_flush", timeout=120)
                time.sleep(2)
            replay_s = time.perf_counter() - t0
            httpx.get(vm + "/internal/force_flush", timeout=120)
            al_proc = _start([
                fleet_mod._binary("vmalert"), f"-rule={rules['central']}", f"-datasource.url={vm}",
                f"-remoteWrite.url={vm}", f"-notifier.url=http://127.0.0.1:{ports['sink']}",
                f"-evaluationInterval={EVAL_INTERVAL_S}s", f"-httpListenAddr=127.0.0.1:{ports['vmalert']}",
                "-loggerLevel=WARN"], vmalert, "/health", directory / "vmalert.log")
            processes.append(al_proc)

            def counts() -> dict[str, float]:
                m = _metrics(vmalert)
                return {k: v for k, v in m.items() if k.startswith("vmalert_iteration_duration_seconds_count{")}

            wait_until(lambda: bool(counts()) and min(counts().values()) >= ROUNDS, timeout=ROUNDS * 300, interval=2)
            m = _metrics(vmalert)
            groups: dict[str, float] = {}
            for key, count in m.items():
                if key.startswith("vmalert_iteration_duration_seconds_count{") and count:
                    name = re.search(r'group="([^"]*)"', key)
                    groups[name.group(1) if name else key] = m[key.replace("_count{", "_sum{")] / count
            vmalert_rss = (fleet_mod.rss_bytes(al_proc.pid) or 0) / 2**20
            _stop(al_proc)
            httpx.get(vm + "/internal/force_flush", timeout=120)
            recorded = _sum(_metrics(vm), "vm_new_timeseries_created_total") - series

            per_rule, long_rules = rule_times(vm, rules["central"], end_s)
            panels, empty, failed = board_times(vm, board_mod, timeline)
            rss_after = (fleet_mod.rss_bytes(vm_proc.pid) or 0) / 2**20
            return StoreCost(profile, n, series_of(shapes), series, recorded, sent * timeline.count, load_s, spent,
                             vm_cpu, rss_loaded, rss_after, disk, vmalert_rss, sum(groups.values()), groups,
                             per_rule, long_rules, replay_s, panels, empty, failed)
        finally:
            for process in reversed(processes):
                _stop(process)
            sink.shutdown()
            sink.server_close()
            shutil.rmtree(data, ignore_errors=True)


def recording_levels(rules_glob: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """The recording rules of the files under `rules_glob`, split by dependency level: level 0 reads raw
    series only, level k reads a result of level k-1 (the per-target bucket rates before the quantiles over
    them). Returns one glob per level: the replay runs them in order, so a chained rule reads its input's
    stored results. Alerts are left out (no board reads ALERTS)."""
    import yaml

    docs = {path: yaml.safe_load(path.read_text()) or {} for path in sorted(rules_glob.parent.glob(rules_glob.name))}
    rules = [(path, g["name"], r) for path, doc in docs.items() for g in doc.get("groups", [])
             for r in g.get("rules", []) if "record" in r]
    names = {r["record"] for _, _, r in rules}
    level: dict[str, int] = {}

    def of(rule: dict) -> int:
        reads = [n for n in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", rule["expr"]) if n in names and n != rule["record"]]
        return 1 + max((level.get(n, 0) for n in reads), default=-1)

    for _ in range(len(rules)):  # fixed point: levels only grow, bounded by the number of rules
        changed = False
        for _, _, r in rules:
            if level.get(r["record"], -1) < of(r):
                level[r["record"]] = of(r)
                changed = True
        if not changed:
            break
    globs = []
    for k in range(max(level.values(), default=-1) + 1):
        target = out / f"level{k}"
        target.mkdir(parents=True, exist_ok=True)
        groups: dict[tuple[pathlib.Path, str], list[dict]] = {}
        for path, group, r in rules:
            if level[r["record"]] == k:
                groups.setdefault((path, group), []).append(r)
        for path in docs:
            mine = [{"name": g, "rules": rs} for (p, g), rs in groups.items() if p == path]
            if mine:
                (target / path.name).write_text(yaml.safe_dump({"groups": mine}, sort_keys=False))
        globs.append(target / "*.yaml")
    return globs


def rule_times(vm: str, rules_glob: pathlib.Path, at_s: float) -> tuple[dict[str, float], frozenset[str]]:
    """Each rule's expression as one instant query at `at_s`, one after the other as vmalert runs a group:
    "group / rule" -> seconds (vmalert 1.79 reports time per group, not per rule); and the rules that read
    a 1d or 3d window."""
    import yaml

    out: dict[str, float] = {}
    long: set[str] = set()
    with httpx.Client(timeout=300) as client:
        for path in sorted(rules_glob.parent.glob(rules_glob.name)):
            for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
                for rule in group.get("rules", []):
                    t0 = time.perf_counter()
                    client.get(vm + "/api/v1/query", params={"query": rule["expr"], "time": at_s})
                    name = rule.get("record") or rule.get("alert")
                    out[f"{group['name'].removeprefix('llm-exporter.')} / {name}"] = time.perf_counter() - t0
                    if re.search(r"\[(1d|3d)\]", rule["expr"]):
                        long.add(f"{group['name'].removeprefix('llm-exporter.')} / {name}")
    return out, frozenset(long)


def _instant(vm: str, expr: str) -> float:
    with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
        result = httpx.get(vm + "/api/v1/query", params={"query": expr}, timeout=60).json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0
    return 0.0


@dataclass
class _Store:
    name: str
    url: str
    cluster: str | None = None


@dataclass
class _Querier:
    """What tests/fleet's variables() asks of its fleet: an instant query against a store, and $__range."""

    range_s: int

    def query(self, store: _Store, expr: str) -> list[dict]:
        body = httpx.get(store.url + "/api/v1/query", params={"query": expr}, timeout=60).json()
        return body.get("data", {}).get("result", [])

    def time_range(self) -> str:
        return f"{self.range_s}s"


def _step(range_s: int) -> int:
    """Grafana's step for a full-width panel: range / maxDataPoints, rounded up to a whole 10 s above 10 s."""
    raw = range_s / POINTS
    return max(1, math.ceil(raw / 10) * 10 if raw > 10 else math.ceil(raw))


def board_times(vm: str, board_mod, timeline: Timeline) -> tuple[dict[str, dict[str, float]], dict[str, list[str]],
                                                                 list[str]]:
    """Every fleet-board query as a range query ending at the newest sample: seconds per query and range."""
    board = board_mod.boards_under_test()[board_mod.FLEET_BOARD]
    store = _Store("central", vm)
    end = (timeline.start_ms + int((timeline.count - 1) * timeline.step_s * 1000)) / 1000
    out: dict[str, dict[str, float]] = {}
    empty: dict[str, list[str]] = {}
    failed: list[str] = []
    with httpx.Client(timeout=300) as client:
        for range_name, range_s in RANGES:
            step = _step(range_s)
            values = board_mod.variables(_Querier(range_s), store, board)
            # Grafana's $__rate_interval with the production scrape interval (15 s): max(4 x 15 s, step + 15 s).
            values.update({"__interval": f"{step}s", "__range": f"{range_s}s",
                           "__rate_interval": f"{max(60, step + 15)}s"})
            times: dict[str, float] = {}
            for title, ref, expr in board_mod.board_queries(board):
                query = board_mod.substitute(expr, values)
                t0 = time.perf_counter()
                response = client.get(vm + "/api/v1/query_range",
                                      params={"query": query, "start": end - range_s, "end": end, "step": step})
                elapsed = time.perf_counter() - t0
                if response.status_code != 200 or response.json().get("status") != "success":
                    failed.append(f"{title} / {ref} ({range_name}): {response.text[:200]}")
                    continue
                times[f"{title} / {ref}"] = elapsed
                if not any(math.isfinite(float(v[1])) for r in response.json()["data"]["result"]
                           for v in r.get("values", [])):
                    empty.setdefault(range_name, []).append(f"{title} / {ref}")
            out[range_name] = times
    return out, empty, failed


def _rfc3339(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


# ------------------------------------------------------------------------------------------------
# The bench
# ------------------------------------------------------------------------------------------------
def page(profile: str) -> str:
    """One demo replica's /metrics once stable (bench_fleet's procedure) with `--profile`."""

    return bench_fleet.stable_page("vllm", 1, ("--profile", profile))


_last: list[StoreCost] = []
_setup: dict[str, object] = {}


def measure() -> list[StoreCost]:
    from bench.__main__ import _load

    _setup["load_before"] = _load()
    out = []
    step_s = _duration_s(INTERVAL)
    for profile in PROFILES:
        shapes = parse_page(page(profile))
        for n in SIZES:
            timeline = Timeline.ending_now(DAYS, step_s, time.time() - 60)
            _setup.update(samples_per_series=timeline.count)
            started = time.perf_counter()
            cost = store_cost(profile, shapes, n, timeline)
            out.append(cost)
            print(f"# store {profile} N={n}: {time.perf_counter() - started:.0f}s, {cost.samples:,} samples, "
                  f"{cost.rows_per_s:,.0f} rows/s, round {cost.round_s:.2f}s", file=sys.stderr)
    _setup["load_after"] = _load()
    return out


def run() -> list[tuple[str, str]]:
    global _last
    _last = measure()
    rows = []
    for c in _last:
        rows.append((f"store: {c.profile} N={c.replicas}: series / rows/s / VM RSS MB / disk MB",
                     f"{c.series:.0f} / {c.rows_per_s:.0f} / {c.vm_rss_after_mb:.0f} / {c.disk_mb:.0f}"))
        rows.append((f"store: {c.profile} N={c.replicas}: rule round s / panel median / max s",
                     f"{c.round_s:.3f} / {_median(c, RANGES[0][0]):.3f} / {_max(c, RANGES[0][0])[1]:.3f}"))
    return rows


def _median(c: StoreCost, range_name: str) -> float:
    times = list(c.panels.get(range_name, {}).values())
    return statistics.median(times) if times else 0.0


def _max(c: StoreCost, range_name: str) -> tuple[str, float]:
    times = c.panels.get(range_name, {})
    return max(times.items(), key=lambda kv: kv[1]) if times else ("", 0.0)


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


def _growth(costs: Sequence[StoreCost], value) -> str:
    """Per-replica slope between the smallest and largest size, and the exponent of value ~ N^k."""
    first, last = costs[0], costs[-1]
    a, b = value(first), value(last)
    slope = (b - a) / (last.replicas - first.replicas) if last.replicas != first.replicas else 0.0
    k = math.log(b / a) / math.log(last.replicas / first.replicas) if a > 0 and b > 0 and last.replicas != \
        first.replicas else float("nan")
    return f"{slope:.4g} per replica, N^{k:.2f}"


def section() -> str:
    assert _last, "run() first"
    machine = f"{os.cpu_count()} CPUs, {_mem_gb():.0f} GB"
    lines = ["## Central store: steady state with days of data", "",
             "Written by `python -m bench store` (bench/bench_store.py says what is generated and measured). "
             f"VictoriaMetrics and vmalert {_version()} (Debian's) on this machine ({machine}; load average "
             f"{_setup.get('load_before')} before, {_setup.get('load_after')} after: other work shared it), a fresh "
             f"store per row. {DAYS:g} days of one sample every {INTERVAL} per series "
             f"({_setup.get('samples_per_series')} samples per series, ending now) loaded through /api/v1/import; "
             f"vmalert's replay mode writes the recording rules' results over the last {REPLAY_S / 3600:g} h at the "
             "data's interval (the boards read recorded series; its wall time is the replay column); vmalert with "
             f"the shipped central rules, {ROUNDS} rounds every {EVAL_INTERVAL_S} s at now, the 1d and 3d windows "
             "full (the round is the sum over groups of vmalert_iteration_duration_seconds' mean: the groups run "
             "concurrently and contend for the 2 cores, so \"rules one at a time\" also gives each rule's expression "
             "as one instant query, summed); every query of the fleet board (variables at All) as a range query "
             "over the last "
             + " and ".join(r for r, _ in RANGES) + " at a step of range/1,000 (Grafana's for a full-width panel).",
             "",
             f"The interval is {INTERVAL}, not 15 s: 3 days of 15 s samples of 1,000 replicas (about 6.6 G samples "
             "for `default`) do not load on 2 cores in minutes. Series, index, and the series each rule and panel "
             "looks up are production's; the samples a long window decodes are interval/15 s fewer, so the 1d and "
             "3d rules' sample work is understated by that factor (their series lookups are not). VictoriaMetrics "
             "widens a rate window shorter than the sample interval to the interval, so the 5m rules read the newest "
             "samples.", ""]
    for profile in PROFILES:
        costs = sorted((c for c in _last if c.profile == profile), key=lambda c: c.replicas)
        if not costs:
            continue
        lines += [f"### Profile `{profile}` ({costs[0].series_per_replica} series per replica, "
                  "Prometheus' 5 per target included)", "",
                  "| replicas | active series (raw + recorded) | samples loaded | ingestion rows/s (store CPU s) | "
                  "store RSS loaded / after queries | disk | vmalert RSS | rule round (s) | slowest 3 groups (s) | "
                  "rules one at a time (s) | "
                  "replay (s) | " + " | ".join(f"panels {r} median / max (s)" for r, _ in RANGES) + " |",
                  "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(RANGES)]
        for c in costs:
            slow = sorted(c.groups.items(), key=lambda kv: kv[1], reverse=True)[:3]
            lines.append(
                f"| {c.replicas:,} | {c.series:,.0f} + {c.recorded:,.0f} | {c.samples / 1e6:.1f} M | "
                f"{c.rows_per_s:,.0f} ({c.vm_load_cpu_s:.0f}) | {c.vm_rss_loaded_mb:,.0f} / {c.vm_rss_after_mb:,.0f}"
                f" MB | {c.disk_mb:,.0f} MB | {c.vmalert_rss_mb:.0f} MB | {c.round_s:.2f} | "
                + ", ".join(f"{g.removeprefix('llm-exporter.')} {s:.2f}" for g, s in slow)
                + f" | {sum(c.rules.values()):.2f} | {c.replay_s:.0f} | "
                + " | ".join(f"{_median(c, r):.3f} / {_max(c, r)[1]:.2f}" for r, _ in RANGES) + " |")
        lines += ["", "Growth from the smallest to the largest size (slope, and k in value ~ N^k; k > 1 grows "
                  "faster than linearly):", "",
                  f"- active series: {_growth(costs, lambda c: c.series + c.recorded)}; store RSS: "
                  f"{_growth(costs, lambda c: c.vm_rss_after_mb)} MB; disk: {_growth(costs, lambda c: c.disk_mb)} MB;",
                  f"- rule round: {_growth(costs, lambda c: c.round_s)} s; panels' {RANGES[0][0]} median: "
                  f"{_growth(costs, lambda c: _median(c, RANGES[0][0]))} s; slowest panel: "
                  f"{_growth(costs, lambda c: _max(c, RANGES[0][0])[1])} s;"]
        for group in sorted(costs[-1].groups, key=lambda g: costs[-1].groups[g], reverse=True)[:4]:
            lines.append(f"- group `{group}`: {_growth(costs, lambda c, g=group: c.groups.get(g, 0.0))} s;")
        big = costs[-1]
        by_group: dict[str, float] = {}
        for name, seconds in big.rules.items():
            by_group[name.split(" / ")[0]] = by_group.get(name.split(" / ")[0], 0.0) + seconds
        lines.append(f"- rules one at a time at {big.replicas:,} replicas, by group: " + ", ".join(
            f"{g} {s:.2f} s" for g, s in sorted(by_group.items(), key=lambda kv: kv[1], reverse=True)[:5]) + ";")
        long = {name: seconds for name, seconds in big.rules.items() if name in big.long_rules}
        if long:
            lines.append(f"- the {len(long)} rules with 1d or 3d windows (full) at {big.replicas:,} replicas: "
                         f"{sum(long.values()):.2f} s one at a time, "
                         f"{_growth(costs, lambda c: sum(v for k, v in c.rules.items() if k in c.long_rules))} s; "
                         "slowest: " + "; ".join(f"`{n}` {s:.2f} s" for n, s in sorted(
                             long.items(), key=lambda kv: kv[1], reverse=True)[:3]) + ";")
        top_rules = sorted(big.rules.items(), key=lambda kv: kv[1], reverse=True)[:6]
        if top_rules:
            lines.append(f"- slowest rules at {big.replicas:,} replicas (each expression as one instant query): "
                         + "; ".join(f"`{name}` {s:.2f} s" for name, s in top_rules) + ".")
        for range_name, _ in RANGES:
            top = sorted(big.panels.get(range_name, {}).items(), key=lambda kv: kv[1], reverse=True)[:5]
            lines.append(f"- slowest panels at {big.replicas:,} replicas ({range_name}): "
                         + "; ".join(f"{name} {s:.2f} s" for name, s in top) + ".")
        for range_name, names in big.empty.items():
            lines.append(f"- queries without data at {big.replicas:,} replicas ({range_name}, {len(names)} of "
                         f"{len(big.panels.get(range_name, {})) }): " + "; ".join(names[:8]) + ".")
        failed = [f for c in costs for f in c.failed]
        if failed:
            lines.append(f"- queries the store refused ({len(failed)}): " + "; ".join(failed[:5]))
        lines.append("")
    return "\n".join(lines)


def _mem_gb() -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def _version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([_fleet_module()._binary("victoria-metrics"), "-version"], capture_output=True,
                             text=True, timeout=10).stdout
        m = re.search(r"v\d+\.\d+\.\d+", out)
        if m:
            return m.group(0)
    return "1.79"
