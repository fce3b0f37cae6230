"""The whole alerting path on loopback for tests/test_e2e_alerts.py: twin -> exporter -> Prometheus
-> Alertmanager -> a webhook receiver in the test process.

Processes are started and stopped by deploy/stack.py (`make stack`'s launcher: its Plan, Proc,
start, stop and status), with configs for a test instead of the compose ones:

- rules from exporter/mixin/alerts/generate.py rendered with every window and `for` scaled by TIME_SCALE
  (render_scaled), so an hour-long burn-rate window takes 36 s; the shipped files are untouched;
- the generated Alertmanager config (same routing and inhibition) with its pager/ticket webhook
  URLs pointed at WebhookReceiver, and Prometheus evaluating every second with a 1 s resend delay;
- the engine reached through EngineProxy, which the test can take down and bring back: the engine
  is "killed" while the twin keeps serving /sim/gpu, so the GPU source (--gpu-backend sim) and the
  host source keep flowing, as they do on a real host whose engine died;
- the twin runs at TWIN_SPEED x real time (its `--speed`), so the overload scenario's 20 s of
  normal traffic before the surge take 2 s and the card heats up in seconds.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import httpx

from deploy import stack as launcher
from exporter.mixin.alerts import generate
from tests.support import free_port, free_ports, send_body, wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIME_SCALE = 0.01  # 1h -> 36s, 5m -> 3s, for: 15m -> 9s
TWIN_SPEED = 10.0
TARGET = "twin"




# ------------------------------------------------------------------------------------------------
# The webhook receiver
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    """One alert out of one webhook notification."""

    at: float  # time.monotonic() on arrival
    receiver: str  # the URL path: /pager or /ticket
    status: str  # firing | resolved
    labels: dict
    annotations: dict

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


@dataclass(frozen=True)
class Notification:
    """One webhook POST: one notification of one Alertmanager group."""

    at: float
    receiver: str
    status: str  # firing while any alert in it fires
    group: dict  # groupLabels
    alerts: tuple[tuple[str, str], ...]  # (long label or alertname, status) per alert, as sent


class WebhookReceiver:
    """Collects every alert Alertmanager POSTs (the webhook_config JSON, version 4), and every
    notification as a whole (to count pages)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.notifications: list[Notification] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.monotonic()
                with contextlib.suppress(ValueError):
                    doc = json.loads(body)
                    with owner.lock:
                        owner.notifications.append(Notification(
                            now, self.path, doc.get("status", ""), doc.get("groupLabels", {}),
                            tuple((a.get("labels", {}).get("long") or a.get("labels", {}).get("alertname", ""),
                                   a.get("status", "")) for a in doc.get("alerts", []))))
                        for a in doc.get("alerts", []):
                            owner.received.append(Received(now, self.path, a.get("status", ""),
                                                           a.get("labels", {}), a.get("annotations", {})))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, name: str | None = None, /, *, status: str | None = None, since: float = 0.0,
               **labels: str) -> list[Received]:
        with self.lock:
            items = list(self.received)
        return [r for r in items if (name is None or r.name == name) and (status is None or r.status == status)
                and r.at >= since and all(r.labels.get(k) == v for k, v in labels.items())]

    def notified(self, alertname: str, /, *, since: float = 0.0, **group: str) -> list[Notification]:
        """Notifications of the groups of `alertname` (and the given group labels) since `since`."""
        with self.lock:
            items = list(self.notifications)
        return [n for n in items if n.group.get("alertname") == alertname and n.at >= since
                and all(n.group.get(k) == v for k, v in group.items())]

    def pages(self, alertname: str, /, *, since: float = 0.0, receiver: str | None = None,
              **group: str) -> list[Notification]:
        """The notifications that opened a page or ticket (only `receiver`'s, when given): a group's
        first firing one, and each firing one after it was resolved, per receiver and group as pager
        and ticket systems key them. Updates of a firing group are not new pages. (One state across
        receivers once counted a slow-burn ticket opening just after the page resolved as a page.)"""
        out, firing = [], set()
        for n in self.notified(alertname, since=since, **group):
            if receiver is not None and n.receiver != receiver:
                continue
            key = (n.receiver, tuple(sorted(n.group.items())))
            if n.status == "firing" and key not in firing:
                out.append(n)
            (firing.add if n.status == "firing" else firing.discard)(key)
        return out

    def open_groups(self) -> list[Notification]:
        """The last notification of each group (per receiver) that still says firing: what a pager or
        ticket system keyed by Alertmanager's group has open. An alert that resolves while the
        longer burn pair of its group inhibits it gets no resolve of its own (alertmanager#2754);
        the group's resolve closes the page."""
        with self.lock:
            items = list(self.notifications)
        last = {(n.receiver, tuple(sorted(n.group.items()))): n for n in items}
        return [n for n in last.values() if n.status == "firing"]

    def last_status(self, name: str, /, **labels: str) -> str | None:
        found = self.alerts(name, **labels)
        return found[-1].status if found else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------------
# The engine proxy (the engine that can die)
# ------------------------------------------------------------------------------------------------
class EngineProxy:
    """GET /metrics on a fixed port, forwarded to the twin. stop(): the port refuses connections,
    as when the engine process is gone; start() brings it back on the same port."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        upstream = self.upstream

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                try:
                    with urllib.request.urlopen(upstream + self.path, timeout=5) as response:
                        body, ctype = response.read(), response.headers.get("Content-Type", "text/plain")
                except OSError:
                    self.send_error(502)
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    send_body(self, body, 200, ctype)

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# ------------------------------------------------------------------------------------------------
# The stack
# ------------------------------------------------------------------------------------------------
def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"{' or '.join(names)} not found on PATH; `make debs` installs the Debian package. "
                       "This test never skips.")


@dataclass
class FullStack:
    directory: pathlib.Path
    receiver: WebhookReceiver
    proxy: EngineProxy
    twin: str
    exporter: str
    prometheus: str
    alertmanager: str
    exporter_proc: object
    prometheus_config: str
    scaled: dict  # the scaled alerts CONFIG the rules were rendered from
    target: str = TARGET  # the engine target's name (the `target` label)
    marks: dict[str, float] = field(default_factory=dict)  # what one test leaves for the next
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    # --- Prometheus -----------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        body = self.client.get(f"{self.prometheus}/api/v1/query", params={"query": expr}).json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def firing(self) -> list[dict]:
        """Prometheus' own view: alerts in state firing (labels)."""
        body = self.client.get(f"{self.prometheus}/api/v1/alerts").json()
        return [a["labels"] for a in body["data"]["alerts"] if a["state"] == "firing"]

    def alerts_since(self, wall: float) -> list[dict]:
        """Alerts pending or firing in Prometheus that became active at or after `wall` (epoch s)."""
        import datetime

        body = self.client.get(f"{self.prometheus}/api/v1/alerts").json()
        return [a["labels"] for a in body["data"]["alerts"]
                if datetime.datetime.fromisoformat(a["activeAt"].replace("Z", "+00:00")).timestamp() >= wall]

    # --- Alertmanager ---------------------------------------------------------------------------
    def am_alerts(self) -> list[dict]:
        response = self.client.get(f"{self.alertmanager}/api/v2/alerts",
                                   params={"active": "true", "silenced": "true", "inhibited": "true"})
        return response.json()

    # --- the twin -------------------------------------------------------------------------------
    def scenario(self, name: str, *, keep_backlog: bool = False) -> None:
        """Switch the twin: the old traffic's requests are aborted, unless `keep_backlog` (then they
        run on under the new scenario, as on a real engine whose load drops: the queue drains)."""
        params = {"name": name, **({"backlog": "keep"} if keep_backlog else {})}
        self.client.post(f"{self.twin}/sim/scenario", params=params).raise_for_status()

    def restart_engine(self) -> None:
        self.client.post(f"{self.twin}/sim/restart").raise_for_status()

    def twin_engine(self) -> dict:
        return self.client.get(f"{self.twin}/sim/gpu").json()["engine"]

    # --- the exporter ---------------------------------------------------------------------------
    def exporter_pid(self) -> int | None:
        return next((pid for name, pid, _ in launcher.status(self.directory) if name == "exporter"), None)

    def restart_exporter(self) -> None:
        """SIGTERM the exporter, wait for it to exit, start the same command again (same port)."""
        pid = self.exporter_pid()
        assert pid is not None, "the exporter is not running"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
            if not pathlib.Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.02)
        launcher.start(launcher.Plan(self.directory, [self.exporter_proc], self.prometheus_config))


@dataclass(frozen=True)
class LiveEngine:
    """A real engine the exporter scrapes directly (tests/live): it dies and restarts for real, so
    there is no twin and no proxy, and no GPU source on a CPU-only machine."""

    port: int
    target: str = "live"
    interval: str = "2s"  # a busy vLLM on two cores can take most of a second to answer /metrics
    # Prometheus scrapes the exporter at its own interval (its page changes only then), with a timeout of
    # almost that: at 1s/900ms, a full CI run on two cores saw Prometheus and the exporter starved by the
    # busy vLLM for 21 scrapes of the live story, and the burn alert resolved and paged again.
    scrape_interval: str = "2s"
    scrape_timeout: str = "1900ms"
    engine_timeout: str = "1800ms"
    # Prometheus tells Alertmanager an alert ends 4 x this after each send: on two cores a busy engine
    # can stall an evaluation for seconds, and at the twin's 1s every alert then "resolved" and fired
    # again at once (seen in the live story). At 3s (ends 12 s after a send) a clean-clone CI run saw
    # the TTFT page, its fast and slow pair both firing, resolve during the overload and open again
    # the moment the engine was killed and the CPU came back: a second page. A firing alert is sent
    # at once whatever this is, and a resolve too; only the re-sends of one still firing wait for it.
    resend_delay: str = "10s"
    # The exporter's window (tails and SLO attainment) scaled like the rules' 5m windows, so that the
    # exporter and the burn-rate rules read one window (docs/diagnosis.md): 5m at the story's
    # TIME_SCALE 0.02 is 6s, raised to five 2 s scrapes.
    quantile_window: str = "10s"
    # The rules' windows at least as long, for the same reason: the burn pairs' 5m short window at 0.02
    # is 6 s, three 2 s scrapes, and a CI run on two cores lost enough cycles that the TTFT page's
    # short window kept emptying (its `for` started over) through 240 s of overload.
    min_window_s: float = 10.0
    # What a user on a CPU-only host sets (docs/alerts.md): no GPU source, so no GPU metrics to miss.
    disabled_alerts: tuple[str, ...] = ("LLMEngineWithoutGPUMetrics",)


@contextlib.contextmanager
def full_stack(directory: pathlib.Path, *, live: LiveEngine | None = None,
               time_scale: float = TIME_SCALE) -> Iterator[FullStack]:
    """The stack on loopback: the twin behind an EngineProxy (default), or the `live` engine."""
    prometheus_bin = _binary("prometheus")
    alertmanager_bin = _binary("prometheus-alertmanager", "alertmanager")
    receiver = WebhookReceiver()
    ports = free_ports(("twin", "exporter", "alertmanager", "prometheus"))
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    proxy = EngineProxy(urls["twin"])
    target = live.target if live else TARGET

    cfg = dict(generate.CONFIG)
    cfg["alertmanager"] = {**cfg["alertmanager"], "pager_url": receiver.url + "/pager",
                           "ticket_url": receiver.url + "/ticket"}
    if live is not None:
        cfg["disabled_alerts"] = live.disabled_alerts
    min_window_s = live.min_window_s if live else 1.0
    for path, text in generate.render_scaled(directory, time_scale, cfg, min_window_s=min_window_s).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    prometheus_config = json.dumps({  # JSON is YAML
        "global": {"scrape_interval": live.scrape_interval if live else "1s", "evaluation_interval": "1s",
                   "scrape_timeout": live.scrape_timeout if live else "900ms"},
        "rule_files": [str(directory / "rules" / "*.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [{"job_name": "llm-exporter",
                            "static_configs": [{"targets": [f"127.0.0.1:{ports['exporter']}"]}]}],
    }, indent=1)
    python = sys.executable
    Proc = launcher.Proc
    procs = []
    if live is None:
        procs.append(Proc("twin", [python, "-m", "exporter.simulator", "--port", str(ports["twin"]), "--scenario",
                                   "decode-heavy", "--speed", str(TWIN_SPEED), "--seed", "1"], {}, ports["twin"],
                          urls["twin"]))
        sources = ["--interval", "1s", "--engine", f"{proxy.url},name={target}", "--gpu-backend", "sim",
                   "--sim-url", urls["twin"], "--engine-port", str(ports["twin"])]
    else:
        sources = ["--interval", live.interval, "--engine-timeout", live.engine_timeout,
                   "--quantile-window", live.quantile_window,
                   "--engine", f"http://127.0.0.1:{live.port}/metrics,name={target}", "--gpu-backend", "none",
                   "--engine-port", str(live.port)]
    exporter = Proc("exporter", [python, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{ports['exporter']}",
                                 *sources, "--log-level", "warning"], {}, ports["exporter"], urls["exporter"])
    alertmanager = Proc("alertmanager", [
        alertmanager_bin, f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'am-data'}", f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
        "--cluster.listen-address=", "--log.level=warn"], {}, ports["alertmanager"], urls["alertmanager"])
    prometheus = Proc("prometheus", [
        prometheus_bin, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
        f"--rules.alert.resend-delay={live.resend_delay if live else '1s'}",
        "--log.level=warn"], {}, ports["prometheus"], urls["prometheus"])
    stack = FullStack(directory, receiver, proxy, urls["twin"], urls["exporter"], urls["prometheus"],
                      urls["alertmanager"], exporter, prometheus_config,
                      generate.scale_durations(cfg, time_scale, min_window_s=min_window_s), target=target)
    try:
        if live is None:
            proxy.start()
        launcher.start(launcher.Plan(directory, [*procs, exporter, alertmanager, prometheus], prometheus_config),
                       timeout_s=30)
        assert wait_until(lambda: bool(stack.query(f'llm_engine_up{{target="{target}"}} == 1')), timeout=30,
                          interval=0.5), "Prometheus never scraped the exporter"
        yield stack
    finally:
        launcher.stop(directory)
        proxy.stop()
        receiver.close()
        stack.client.close()


def timeline(stack: FullStack, since: float = 0.0) -> str:
    """The notifications the receiver got, one line each, in seconds from the stack's "start" mark."""
    start = stack.marks.get("start", since)
    lines = [f"{n.at - start:7.1f}s {n.receiver:7} {n.group.get('alertname', '')} {n.status}: "
             + ", ".join(f"{a}={s}" for a, s in n.alerts) for n in stack.receiver.notifications if n.at >= since]
    return "notifications:\n  " + "\n  ".join(lines)


def outage_check(stack: FullStack, names: Collection[str], target: str, since: float) -> Callable[[], list[str]]:
    """Taken just before an engine dies: what its outage must not do to its alerts `names`. The call
    it returns lists each breach since: an alert Alertmanager shows inhibited by another alert (a
    burn pair under its longer one aside: one group, whose resolve closes the page; any other
    inhibited alert's resolve is dropped, alertmanager#2754), and a page or ticket opened for an
    alert Prometheus did not already have pending or firing."""
    under_way = {a["alertname"] for a in stack.alerts_since(0) if a.get("target") == target}

    def opened() -> dict[str, int]:
        return {name: len(stack.receiver.pages(name, since=since, target=target)) for name in names}

    before = opened()

    def breaches() -> list[str]:
        inhibited = [f'{a["labels"]["alertname"]} inhibited' for a in stack.am_alerts()
                     if a["labels"]["alertname"] in names and a["labels"].get("target") == target
                     and a["status"]["state"] == "suppressed" and not a["labels"].get("long")]
        after = opened()
        return inhibited + [f"{name} opened" for name in names if after[name] > before[name] and name not in under_way]

    return breaches


def logs(directory: pathlib.Path) -> str:
    """The tail of every service's log, for assertion messages."""
    out = []
    for path in sorted((directory / "logs").glob("*.log")):
        out.append(f"--- {path.name}\n" + launcher._tail(path, 10))
    return "\n".join(out)
