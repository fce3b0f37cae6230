#!/usr/bin/env python3
"""A simulated fleet on loopback: many sidecar pairs in two clusters, a Prometheus per cluster, a
central store (VictoriaMetrics + vmalert) with the rules, and Alertmanager.

    python deploy/fleet.py up      [--dir .fleet] [--replicas 6] [--die-after 300] [--time-scale 1]
                                   [--interval 3s] [--base-port 19480] [--webhook URL] [--ha-cluster b]
    python deploy/fleet.py status  [--dir .fleet]
    python deploy/fleet.py down    [--dir .fleet] [--purge]

`make fleet` / `make fleet-down` call it with the project's venv (docs/deploy.md, "A central store").

    replica i (i = 0..N-1)   `llm-exporter demo --engines 1` (twin + exporter in one process), cluster
                             a or b (alternating), namespace chat or batch, with mixed engine formats,
                             models and scenarios (PROFILES); the last replica is killed (SIGKILL, as a
                             node that vanishes) --die-after seconds after it started
    prometheus-a/-b          Debian's prometheus: scrapes its cluster's exporters (target label
                             `namespace`), external_labels {cluster: a|b}, evaluates the rules for its
                             own boards and remote-writes raw series (recorded ones dropped) centrally
    prometheus-<c>-1         with --ha-cluster c: the second of an HA pair for cluster c, scraping the
                             same exporters; both carry external_labels {cluster: c, prometheus_replica:
                             c-0|c-1} and remote-write everything twice
    victoria-metrics         the central store (Debian's victoria-metrics), Prometheus API on its port;
                             it drops `prometheus_replica` from what it ingests (-relabelConfig) and keeps
                             one sample per series and scrape interval (-dedup.minScrapeInterval), so an
                             HA pair is stored once (docs/deploy.md, "HA Prometheus pairs")
    vmalert                  the same rules against the central store; recorded series and ALERTS are
                             written back to it; the one notifier of Alertmanager
    alertmanager             the generated config (exporter/mixin), receivers pointed at --webhook
                             or at `webhook`, a sink that appends each notification to
                             <dir>/notifications.jsonl

Why the cluster Prometheus servers drop recorded series (names with ':') and ALERTS from their
remote write: vmalert writes the same recording rules' results into the central store, computed
over every cluster. A cluster's copy of `llm:...` and the central one would be two series with one
name and different label sets (the cluster's carries `cluster` from external_labels, the central one
whatever the rule keeps), and a fleet-wide sum would count each twice. The central store holds raw
series plus its own rule results only.

Processes are started like deploy/stack.py's (its pid files, readiness and log helpers are reused):
each in its own session, its pid and command line under <dir>/pids, its log under <dir>/logs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import yaml

from exporter.mixin.alerts import generate
from exporter.settings import PROFILES as PROFILE_NAMES

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `deploy` importable
    sys.path.insert(0, str(ROOT))

from deploy import stack  # noqa: E402

DEFAULT_DIR = ROOT / ".fleet"
CLUSTERS = ("a", "b")
NAMESPACES = ("chat", "batch")
JOB = "llm-exporter"  # the job the recording rules select (exporter/slo.py EXPORTER_SELECTOR)
# The label each Prometheus sets in external_labels: the mixin's one setting, which rules and boards follow.
CLUSTER_LABEL: str = generate.CONFIG["cluster_label"]
# What tells the two servers of an HA pair apart (the Prometheus Operator's name for it). The central
# store drops it on ingestion: the pair's series become one series with two writers, which
# -dedup.minScrapeInterval thins to one sample per interval.
REPLICA_LABEL = "prometheus_replica"


@dataclass(frozen=True)
class Profile:
    """What one replica serves: engine exposition, model shape, load scenario, GPUs, twin speed."""

    engine_format: str
    model: str
    scenario: str
    gpus: int = 1
    # The twin's clock: kv-pressure fills its KV cache in minutes at real time, in seconds at 8x.
    # Token rates then read `speed` times too high, which a replica in trouble may.
    speed: float = 1.0
    # The client-side probe (one small request every 5 s to the twin's OpenAI API): on one replica per
    # cluster, so the probe panels have data on every store without probing the whole fleet.
    probe: bool = False


# The fleet, in order: replica i runs PROFILES[i % len]. Mixed formats, two models with replicas in
# both clusters (the per-model fleet views and quantiles), most healthy, two in trouble, no
# prefill/decode pair (the KV-transfer panels stay empty: tests/fleet NO_DATA). Replica 5
# (the last of the default six) is a healthy vLLM replica of the most common model: its death leaves
# its peers running, which is what a capacity-loss alert is for.
PROFILES: tuple[Profile, ...] = (
    Profile("vllm", "llama-3.1-8b", "decode-heavy", probe=True),
    Profile("vllm", "llama-3.1-8b", "decode-heavy", probe=True),
    Profile("sglang", "qwen2.5-7b", "prefill-heavy"),
    Profile("tgi", "qwen2.5-7b", "overload"),
    Profile("llamacpp", "llama-3.1-8b", "kv-pressure", speed=8.0),
    Profile("vllm", "llama-3.1-8b", "decode-heavy"),
    Profile("vllm", "qwen2.5-7b", "decode-heavy", gpus=2),
    Profile("sglang", "llama-3.1-8b", "prefill-heavy"),
)

# vmalert 1.79 (Debian's) rejects rule fields it does not know; `keep_firing_for` (Prometheus 2.42)
# is the one the shipped rules use. The central store gets the rules rendered without it: a burn
# alert there pages again when its condition flips (docs/deploy.md, "What vmalert 1.79 lacks").
CENTRAL_RULES_OVERRIDES: dict[str, object] = {"burn_keep_firing": False}


@dataclass(frozen=True)
class Replica:
    index: int
    name: str  # <cluster>-<namespace>-<format>-<index>, the process name under <dir>/pids
    cluster: str
    namespace: str
    profile: Profile
    port: int
    dies_after_s: float | None = None

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"


def replicas(n: int, ports: Sequence[int], die_after_s: float | None) -> list[Replica]:
    """The fleet's N replicas: cluster alternates a, b; namespace chat, chat, batch, batch, ...; the
    last one dies after `die_after_s` (None: none dies)."""
    if n < 2:
        raise stack.StackError("a fleet needs at least 2 replicas (one per cluster)")
    out = []
    for i in range(n):
        profile = PROFILES[i % len(PROFILES)]
        cluster, namespace = CLUSTERS[i % 2], NAMESPACES[(i // 2) % 2]
        out.append(Replica(i, f"{cluster}-{namespace}-{profile.engine_format}-{i}", cluster, namespace, profile,
                           ports[i], die_after_s if i == n - 1 else None))
    return out


@dataclass
class Ports:
    replicas: list[int]
    prometheus: dict[str, int]  # cluster -> port
    victoria_metrics: int
    vmalert: int
    alertmanager: int
    webhook: int
    ha_prometheus: int | None = None  # the HA cluster's second Prometheus (--ha-cluster)

    @classmethod
    def from_base(cls, base: int, n: int, ha: bool = False) -> Ports:
        """base..base+n-1 the exporters, then Prometheus a and b, the store, vmalert, Alertmanager, sink,
        and with `ha` the HA pair's second Prometheus."""
        after = base + n
        return cls(list(range(base, after)), {c: after + i for i, c in enumerate(CLUSTERS)}, after + 2, after + 3,
                   after + 4, after + 5, after + 6 if ha else None)

    def all(self) -> list[int]:
        ha = [] if self.ha_prometheus is None else [self.ha_prometheus]
        return [*self.replicas, *self.prometheus.values(), *ha, self.victoria_metrics, self.vmalert,
                self.alertmanager, self.webhook]


@dataclass
class FleetOptions:
    replicas: int = 6
    die_after_s: float | None = 300.0
    time_scale: float = 1.0
    interval: str = "3s"  # each exporter's collection interval, and every scrape and evaluation interval
    webhook: str | None = None  # Alertmanager's receivers; None: the built-in sink
    retention: str = "1d"
    ha_cluster: str | None = None  # a cluster scraped by an HA pair of Prometheus servers (needs Ports.ha_prometheus)
    profile: str = "default"  # every replica's --profile: a production fleet's (exporter/catalog/families.csv)


@dataclass
class Fleet:
    """What `up` started: URLs to look at, and the plan to stop it."""

    directory: pathlib.Path
    replicas: list[Replica]
    prometheus: dict[str, str]  # cluster -> base URL
    central: str  # the central store's Prometheus-compatible API (base URL; /api/v1/query under it)
    vmalert: str
    alertmanager: str
    webhook: str
    order: list[str] = field(default_factory=list)  # process names in start order
    notifications: pathlib.Path | None = None  # the built-in sink's file (None with --webhook)
    # The HA cluster's second Prometheus, by process name (prometheus-b-1): `prometheus` holds the first.
    ha_prometheus: dict[str, str] = field(default_factory=dict)

    def exporter(self, replica: Replica) -> str:
        return f"http://{replica.instance}"

    def to_json(self) -> dict:
        return {"replicas": [{**asdict(r), "profile": asdict(r.profile)} for r in self.replicas],
                "prometheus": self.prometheus, "central": self.central, "vmalert": self.vmalert,
                "alertmanager": self.alertmanager, "webhook": self.webhook, "order": self.order,
                "notifications": str(self.notifications) if self.notifications else None,
                "ha_prometheus": self.ha_prometheus}


# ------------------------------------------------------------------------------------------------
# Configs
# ------------------------------------------------------------------------------------------------
def _seconds(duration: str) -> float:
    from exporter.slo import duration_seconds

    return duration_seconds(duration)


def render_rules(directory: pathlib.Path, time_scale: float, webhook: str) -> dict[str, pathlib.Path]:
    """Rules for the cluster Prometheus servers (as shipped, scaled) and for vmalert (the central
    variant, scaled), and alertmanager.yml with both receivers at `webhook`. Returns the globs."""
    cfg = dict(generate.CONFIG)
    cfg["alertmanager"] = {**cfg["alertmanager"], "pager_url": webhook + "/pager", "ticket_url": webhook + "/ticket"}
    out = {}
    for kind, overrides in (("prometheus", {}), ("central", CENTRAL_RULES_OVERRIDES)):
        target = directory / "rules" / kind
        if target.exists():
            shutil.rmtree(target)  # a rule file of an older checkout must not linger
        for path, text in generate.render_scaled(target, time_scale, {**cfg, **overrides}).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out[kind] = target / "rules" / "*.yaml"
    shutil.copy(directory / "rules" / "central" / "alertmanager.yml", directory / "alertmanager.yml")
    return out


def prometheus_config(cluster: str, members: Sequence[Replica], rules_glob: pathlib.Path, central_write: str,
                      interval: str, replica: str | None = None) -> dict:
    """One cluster's Prometheus: its exporters by namespace, the rules, remote write of raw series.
    `replica`: one of an HA pair, told apart from its twin by REPLICA_LABEL alone."""
    timeout = f"{max(500, int(_seconds(interval) * 900))}ms"
    external = {CLUSTER_LABEL: cluster, **({REPLICA_LABEL: replica} if replica else {})}
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": timeout,
                   "external_labels": external},
        "rule_files": [str(rules_glob)],
        # No alertmanagers: the central vmalert is the one notifier, so an alert is not sent twice
        # with two label sets (this server's copy carries external_labels, the central one may not).
        "scrape_configs": [{
            "job_name": JOB,
            # The labels a Kubernetes scrape gives each pod: its namespace and its pod's name (the
            # replica's), so the per-pod GPU rules (pod:llm_gpu_*) and their panel read this fleet too.
            "static_configs": [{"targets": [r.instance], "labels": {"namespace": r.namespace, "pod": r.name}}
                               for r in sorted(members, key=lambda r: (r.namespace, r.name))],
        }],
        "remote_write": [{
            "url": central_write,
            # Recorded series (level:metric:operations) and alert states are the central vmalert's
            # to write: see the module docstring.
            "write_relabel_configs": [
                {"source_labels": ["__name__"], "regex": ".+:.+", "action": "drop"},
                {"source_labels": ["__name__"], "regex": "ALERTS|ALERTS_FOR_STATE", "action": "drop"},
            ],
            # Small batches sent often: the central store is seconds behind, not a minute.
            "queue_config": {"batch_send_deadline": "1s", "max_samples_per_send": 2000},
        }],
    }


# ------------------------------------------------------------------------------------------------
# Processes (deploy/stack.py's pid files and readiness checks)
# ------------------------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    argv: list[str]
    url: str
    ready_path: str
    port: int
    env: dict[str, str] = field(default_factory=dict)


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise stack.StackError(f"{' or '.join(names)} not found: install the Debian package (`make fleet` does)")


def vm_relabel_config() -> list[dict]:
    """The central store's -relabelConfig: the HA replica label dropped on ingestion (VictoriaMetrics'
    relabeling), so both servers of a pair write one series and -dedup.minScrapeInterval keeps one
    sample of the two per interval. Without it the pair's series stay two, and every fleet sum and
    replica count over them doubles."""
    return [{"action": "labeldrop", "regex": REPLICA_LABEL}]


def plan(directory: pathlib.Path, opts: FleetOptions, ports: Ports) -> tuple[Fleet, list[Proc]]:
    """Render every config under `directory` and return the fleet and its processes in start order."""
    directory.mkdir(parents=True, exist_ok=True)
    if opts.ha_cluster is not None and (opts.ha_cluster not in CLUSTERS or ports.ha_prometheus is None):
        raise stack.StackError(f"--ha-cluster must be one of {', '.join(CLUSTERS)}, with a port for its second "
                               f"Prometheus; got {opts.ha_cluster!r}")
    members = replicas(opts.replicas, ports.replicas, opts.die_after_s)
    url = {name: f"http://127.0.0.1:{port}" for name, port in (
        ("vm", ports.victoria_metrics), ("vmalert", ports.vmalert), ("am", ports.alertmanager),
        ("sink", ports.webhook))}
    webhook = opts.webhook or url["sink"]
    rules = render_rules(directory, opts.time_scale, webhook)
    interval = opts.interval
    python = sys.executable
    procs: list[Proc] = []
    relabel = directory / "vm-relabel.yml"
    relabel.write_text("# Rendered by deploy/fleet.py; do not edit.\n" + yaml.safe_dump(vm_relabel_config()),
                       encoding="utf-8")
    if opts.webhook is None:
        procs.append(Proc("webhook", [python, str(pathlib.Path(__file__).resolve()), "webhook", "--port",
                                      str(ports.webhook), "--out", str(directory / "notifications.jsonl")],
                          url["sink"], "/", ports.webhook))
    procs.append(Proc("victoria-metrics", [
        _binary("victoria-metrics"), f"-storageDataPath={directory / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{ports.victoria_metrics}", f"-retentionPeriod={opts.retention}",
        # Queries see samples once written: the default 30 s hides the newest scrapes, which vmalert
        # and the boards need at a scaled time (a for: of 30 s would wait a minute).
        f"-search.latencyOffset={interval}",
        # HA pairs: one sample per series per scrape interval, the replica label dropped (vm_relabel_config).
        f"-dedup.minScrapeInterval={interval}", f"-relabelConfig={relabel}",
        "-loggerLevel=WARN"], url["vm"], "/health", ports.victoria_metrics))
    procs.append(Proc("alertmanager", [
        _binary("prometheus-alertmanager", "alertmanager"), f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'am-data'}", f"--web.listen-address=127.0.0.1:{ports.alertmanager}",
        "--cluster.listen-address=", "--log.level=warn"], url["am"], "/-/ready", ports.alertmanager))
    procs.append(Proc("vmalert", [
        _binary("vmalert"), f"-rule={rules['central']}", f"-datasource.url={url['vm']}",
        f"-remoteWrite.url={url['vm']}", f"-remoteRead.url={url['vm']}", f"-notifier.url={url['am']}",
        f"-evaluationInterval={interval}", f"-httpListenAddr=127.0.0.1:{ports.vmalert}",
        f"-external.url={url['vmalert']}",  # the alerts' source links (default: this host's name)
        # Alertmanager resolves an alert 4 x this after the last send unless resent: scaled like the rules.
        f"-rule.resendDelay={interval}", "-loggerLevel=WARN"], url["vmalert"], "/health", ports.vmalert))
    prometheus: dict[str, str] = {}
    ha_prometheus: dict[str, str] = {}
    # (cluster, process name, port, replica label value or None, the HA pair's second server)
    servers = [(c, f"prometheus-{c}", ports.prometheus[c], f"{c}-0" if c == opts.ha_cluster else None, False)
               for c in CLUSTERS]
    if opts.ha_cluster is not None and ports.ha_prometheus is not None:
        servers.append((opts.ha_cluster, f"prometheus-{opts.ha_cluster}-1", ports.ha_prometheus,
                        f"{opts.ha_cluster}-1", True))
    for cluster, name, port, replica, second in servers:
        config = prometheus_config(cluster, [r for r in members if r.cluster == cluster], rules["prometheus"],
                                   url["vm"] + "/api/v1/write", interval, replica)
        path = directory / f"{name}.yml"
        path.write_text("# Rendered by deploy/fleet.py; do not edit.\n" + yaml.safe_dump(config, sort_keys=False),
                        encoding="utf-8")
        base = f"http://127.0.0.1:{port}"
        if second:
            ha_prometheus[name] = base
        else:
            prometheus[cluster] = base
        data = directory / name.replace("prometheus-", "prom-", 1)
        procs.append(Proc(name, [
            _binary("prometheus"), f"--config.file={path}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], base, "/-/ready", port))
    for r in members:
        p = r.profile
        probe = [] if p.probe and r.index < len(PROFILES) else ["--no-probe"]  # the first lap's only
        argv = [python, "-m", "exporter.cli", "demo", "--engines", "1", "--listen", r.instance, *probe,
                "--interval", interval, "--engine-format", p.engine_format, "--model", p.model,
                "--scenario", p.scenario, "--gpus", str(p.gpus), "--seed", str(r.index), "--speed", f"{p.speed:g}",
                "--profile", opts.profile]
        if r.dies_after_s is not None:
            # coreutils timeout: the kill happens even after `up` has returned; SIGKILL, as a node that
            # vanishes (no goodbye, the target just stops answering).
            argv = [_binary("timeout"), "-s", "KILL", f"{r.dies_after_s:g}", *argv]
        procs.append(Proc(r.name, argv, f"http://{r.instance}", "/readyz", r.port))
    fleet = Fleet(directory, members, prometheus, url["vm"], url["vmalert"], url["am"], webhook,
                  [p.name for p in procs], None if opts.webhook else directory / "notifications.jsonl", ha_prometheus)
    return fleet, procs


def _record(directory: pathlib.Path, proc: Proc, pid: int, log: pathlib.Path) -> None:
    stack._pidfile(directory, proc.name).write_text(json.dumps(
        {"pid": pid, "argv": proc.argv, "url": proc.url, "log": str(log)}))


def start(fleet: Fleet, procs: Sequence[Proc], timeout_s: float = 60.0) -> None:
    """Start every process, then wait for all to be ready (in parallel: a demo takes a second or two
    to import and start on a loaded machine, sixteen of them one after the other most of a minute)."""
    directory = fleet.directory
    for sub in ("pids", "logs"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    running = [p.name for p in procs if stack._alive(directory, p.name)]
    if running:
        raise stack.StackError(f"already running ({', '.join(running[:4])}...): `make fleet-down` first")
    busy = [f"{p.name} {p.port}" for p in procs if not stack._port_free(p.port)]
    if busy:
        raise stack.StackError("port(s) in use: " + ", ".join(busy) + "; pick another --base-port")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_EXPORTER_")}
    env["PYTHONUNBUFFERED"] = "1"
    children: dict[str, subprocess.Popen] = {}
    try:
        for proc in procs:
            log = directory / "logs" / f"{proc.name}.log"
            with open(log, "ab") as out:
                child = subprocess.Popen(proc.argv, cwd=ROOT, env={**env, **proc.env}, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            children[proc.name] = child
            _record(directory, proc, child.pid, log)
        deadline = time.monotonic() + timeout_s
        pending = list(procs)
        while pending:
            for proc in list(pending):
                child = children[proc.name]
                if stack._ready(proc.url + proc.ready_path):
                    pending.remove(proc)
                elif child.poll() is not None or time.monotonic() > deadline:
                    log = directory / "logs" / f"{proc.name}.log"
                    why = f"exited with {child.returncode}" if child.poll() is not None else "not ready in time"
                    raise stack.StackError(f"{proc.name} {why}; {log}:\n{stack._tail(log)}")
            time.sleep(0.2)
    except BaseException:
        stop(directory)
        raise
    (directory / "fleet.json").write_text(json.dumps(fleet.to_json(), indent=1))


def _names(directory: pathlib.Path) -> list[str]:
    """Process names in start order (fleet.json), then any other pid file (an interrupted `up`)."""
    order: list[str] = []
    with contextlib.suppress(OSError, ValueError):
        order = json.loads((directory / "fleet.json").read_text())["order"]
    extra = sorted(p.stem for p in (directory / "pids").glob("*.pid") if p.stem not in order) \
        if (directory / "pids").exists() else []
    return [*order, *extra]


# Stopped last, once every writer is gone: a Prometheus flushes its final samples on shutdown (the
# staleness markers of every series it scraped) and vmalert its last results. With the store already
# closed they retry against a refused port until their flush deadline (Prometheus: 1 min), which
# costs stop() its whole timeout and a SIGKILL.
SINKS = ("victoria-metrics", "alertmanager", "webhook")


def stop(directory: pathlib.Path, timeout_s: float = 15.0) -> list[str]:
    """SIGTERM every process this launcher started (newest first, the SINKS after the rest have gone),
    SIGKILL what is left of each phase after timeout_s. Only pids whose command line still matches the
    recorded one are signalled."""
    alive = {name: pid for name in reversed(_names(directory)) if (pid := stack._alive(directory, name))}
    writers = {name: pid for name, pid in alive.items() if name not in SINKS}
    _terminate(writers, timeout_s)
    _terminate({name: pid for name, pid in alive.items() if name in SINKS}, timeout_s)
    for name in _names(directory):
        stack._pidfile(directory, name).unlink(missing_ok=True)
    return list(alive)


def _terminate(alive: Mapping[str, int], timeout_s: float) -> None:
    for pid in alive.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(stack._cmdline(pid) is not None for pid in alive.values()):
        for pid in alive.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap when the caller is our parent (tests)
        time.sleep(0.1)
    for pid in alive.values():
        if stack._cmdline(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU time of a process and its waited-for children, from /proc/<pid>/stat."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks


def rss_bytes(pid: int) -> int | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def status(directory: pathlib.Path) -> list[tuple[str, int | None, str]]:
    rows = []
    for name in _names(directory):
        path = stack._pidfile(directory, name)
        url = json.loads(path.read_text())["url"] if path.exists() else ""
        rows.append((name, stack._alive(directory, name), url))
    return rows


# ------------------------------------------------------------------------------------------------
# The webhook sink (`make fleet` without --webhook)
# ------------------------------------------------------------------------------------------------
def webhook(port: int, out: pathlib.Path) -> int:
    """Append each Alertmanager notification (webhook JSON) to `out`, one line each, with its path."""
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with contextlib.suppress(ValueError), lock, open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps({"receiver": self.path, "at": time.time(), **json.loads(body)}) + "\n")
            self.send_response(200)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - readiness
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    return 0


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deploy/fleet.py", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "status", "webhook"))
    parser.add_argument("--dir", type=pathlib.Path, default=DEFAULT_DIR, help="pids, logs, data (default .fleet)")
    parser.add_argument("--replicas", type=int, default=int(env.get("FLEET_REPLICAS", 6)),
                        help="sidecar pairs, across clusters a and b (default 6, or $FLEET_REPLICAS)")
    parser.add_argument("--die-after", type=float, default=float(env.get("FLEET_DIE_AFTER", 300)),
                        help="seconds until the last replica is killed; 0: it never dies (default 300, "
                             "or $FLEET_DIE_AFTER)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every rule window, `for` and Alertmanager timer (tests: 0.05)")
    parser.add_argument("--interval", default=env.get("FLEET_INTERVAL", "3s"),
                        help="collection, scrape and evaluation interval (default 3s, or $FLEET_INTERVAL)")
    parser.add_argument("--base-port", type=int, default=int(env.get("FLEET_BASE_PORT", 19480)),
                        help="first port: the exporters, then both Prometheus servers, the store, vmalert, "
                             "Alertmanager and the webhook sink (default 19480, or $FLEET_BASE_PORT)")
    parser.add_argument("--webhook", help="Alertmanager's receivers (default: a sink writing notifications.jsonl)")
    parser.add_argument("--ha-cluster", choices=("", *CLUSTERS), default=env.get("FLEET_HA_CLUSTER", ""),
                        help="scrape this cluster with an HA pair of Prometheus servers, deduplicated in the "
                             "central store (default: none, or $FLEET_HA_CLUSTER)")
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=env.get("FLEET_PROFILE", "default"),
                        help="every replica's --profile (default: default, or $FLEET_PROFILE)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds the fleet may take to be ready")
    parser.add_argument("--purge", action="store_true", help="down: also delete the directory (data, logs)")
    parser.add_argument("--port", type=int, help="webhook: port")
    parser.add_argument("--out", type=pathlib.Path, help="webhook: the JSON-lines file")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    args = parse_args(sys.argv[1:] if argv is None else argv, env)
    directory = args.dir.resolve()
    if args.action == "webhook":
        return webhook(args.port, args.out)
    if args.action == "down":
        stopped = stop(directory)
        if args.purge and directory.exists():
            shutil.rmtree(directory)
        print(f"stopped: {len(stopped)} processes" if stopped else "stopped: nothing was running")
        return 0
    if args.action == "status":
        rows = status(directory)
        if not rows:
            print("no fleet (make fleet)")
            return 3
        for name, pid, url in rows:
            cpu = cpu_seconds(pid) if pid else None
            rss = rss_bytes(pid) if pid else None
            state = f"up   pid {pid}" if pid else "down"
            extra = f"cpu {cpu:7.1f}s  rss {rss / 2**20:6.0f} MiB" if cpu is not None and rss else ""
            print(f"{name:28} {state:16} {url:28} {extra}")
        return 0 if all(pid for _, pid, _ in rows) else 3
    opts = FleetOptions(replicas=args.replicas, die_after_s=args.die_after or None, time_scale=args.time_scale,
                        interval=args.interval, webhook=args.webhook, ha_cluster=args.ha_cluster or None,
                        profile=args.profile)
    try:
        fleet, procs = plan(directory, opts, Ports.from_base(args.base_port, args.replicas, ha=bool(args.ha_cluster)))
        start(fleet, procs, timeout_s=args.timeout)
    except stack.StackError as error:
        print(f"fleet: {error}", file=sys.stderr)
        return 1
    print(describe(fleet))
    return 0


def describe(fleet: Fleet) -> str:
    lines = [f"fleet up: {len(fleet.replicas)} replicas in clusters {', '.join(CLUSTERS)} "
             f"(logs and data in {fleet.directory})", "  exporters (twin + exporter each):"]
    for r in fleet.replicas:
        p = r.profile
        dies = f"  dies after {r.dies_after_s:g}s" if r.dies_after_s else ""
        lines.append(f"    {r.name:26} {fleet.exporter(r)}/metrics  {p.engine_format}/{p.model}/{p.scenario}"
                     f" x{p.gpus} GPU{dies}")
    for cluster, url in fleet.prometheus.items():
        lines.append(f"  prometheus {cluster}      {url}   (targets {url}/targets, rules {url}/rules)")
    for name, url in fleet.ha_prometheus.items():
        lines.append(f"  {name:17} {url}   (the HA pair's second server: same targets, deduplicated centrally)")
    lines += [f"  central store     {fleet.central}   (Prometheus API: {fleet.central}/prometheus/api/v1/query;"
              f" Grafana datasource URL {fleet.central})",
              f"  vmalert           {fleet.vmalert}   (rules {fleet.vmalert}/api/v1/rules, alerts {fleet.vmalert}"
              "/api/v1/alerts)",
              f"  alertmanager      {fleet.alertmanager}",
              f"  notifications     {fleet.webhook}" + (f" -> {fleet.notifications}" if fleet.notifications else ""),
              "status with `python deploy/fleet.py status`; stop with `make fleet-down`"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
