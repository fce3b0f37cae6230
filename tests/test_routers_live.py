"""Real routers in front of twins, read by the real exporter (`llm-exporter run --router`), scraped by a
real Prometheus that runs the shipped routing rules and the fleet board's routing row.

vllm-router 0.1.17 and sglang-router 0.3.2 (tests/routers.py; `make test` installs them into the engine
cache) route two twins' OpenAI API (exporter/simulator/, an L4 serving an 8B model: a few concurrent
3,000-token prompts queue on one replica). One exporter reads both twins and both routers of a kind:

1. even load (round_robin): no routing verdict, skew near 1, each backend near half the share;
2. skewed load (vllm-router consistent_hash: every request to one replica): the hot replica's verdict is
   routing, with the router, the policy, its share and the idle replica in the evidence, and the idle
   replica's is not; the normalized per-backend counters equal the router's own page;
3. a backend killed: the router takes it out (health check and breaker) and the exporter reports it the
   cycle after the router's page does; a promtool test built from the recorded series fires
   LLMRouterBackendOut for that backend only.

Every page's families are accounted for (mapped or ignored), and every query of the fleet board's routing
row returns data from this Prometheus."""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import httpx
import pytest
import yaml

from exporter.sources.engines.accounting import unaccounted
from exporter.sources.routers.registry import SPECS
from tests import routers
from tests.support import background_process, exporter_run, free_port, stop_process, wait_until

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPT_WORDS = 3_000
CLIENTS = 12
ROUTING_DEADLINE_S = 120.0


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    routers.install(log=lambda *_: None)  # a no-op once cached; fails (never skips) without the index


@contextlib.contextmanager
def twin(seed: int) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    cmd = [sys.executable, "-m", "exporter.simulator", "--port", str(port), "--scenario", "idle", "--gpu", "l4",
           "--seed", str(seed)]
    with background_process(cmd, f"http://127.0.0.1:{port}/metrics") as process:
        yield f"http://127.0.0.1:{port}", process


class Load:
    """CLIENTS threads sending the same long prompt through a router until stopped."""

    def __init__(self, url: str, *, clients: int = CLIENTS) -> None:
        body = json.dumps({"model": "m", "prompt": " ".join(["hello"] * PROMPT_WORDS), "max_tokens": 16}).encode()
        self._stop = threading.Event()
        self.codes: dict[str, int] = {}

        def run() -> None:
            while not self._stop.is_set():
                request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                                 headers={"content-type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as r:
                        r.read()
                        key = str(r.status)
                except Exception as error:  # noqa: BLE001 - counted: a killed backend fails some requests
                    key = type(error).__name__
                    time.sleep(0.2)
                self.codes[key] = self.codes.get(key, 0) + 1

        self._threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


def metrics(base: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.match(r'([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def values(base: str, name: str, **match: str) -> dict[tuple, float]:
    return {tuple(sorted(labels.items())): v for n, labels, v in metrics(base)
            if n == name and all(labels.get(k) == want for k, want in match.items())}


def verdicts(base: str) -> dict[str, str]:
    return {labels["target"]: labels["resource"] for n, labels, v in metrics(base)
            if n == "llm_bottleneck" and v == 1.0}


@contextlib.contextmanager
def prometheus(exporter: str, tmp: pathlib.Path) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus not on PATH: `make debs` installs it (this test never skips)"
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(ROOT / "alerts" / "rules" / "routing.yaml")],
              "scrape_configs": [{"job_name": "llm-exporter",
                                  "static_configs": [{"targets": [exporter.removeprefix("http://")]}]}]}
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    cmd = [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}"]
    with background_process(cmd, f"http://127.0.0.1:{port}/-/ready", timeout=60):
        yield f"http://127.0.0.1:{port}"


def query(prom: str, expr: str) -> list[dict]:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def routing_row_queries() -> list[tuple[str, str]]:
    from exporter.mixin.dashboards import generate

    board = json.loads(generate.build_all()["llm-serving-fleet.json"])
    out, in_row = [], False
    for panel in board["panels"]:
        if panel["type"] == "row":
            in_row = panel["title"] == "Routing"
            continue
        if in_row:
            out += [(panel["title"], t["expr"]) for t in panel.get("targets", [])]
    return out


def grafana(expr: str, instance: str) -> str:
    subs = {"job": "llm-exporter", "instance": instance.replace(".", "[.]"), "cluster": ".*", "namespace": ".*",
            "__rate_interval": "15s"}
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: subs[m.group(1) or m.group(2)], expr)


def promtool_backend_out(series: dict[str, list[float]], kill_index: int, tmp: pathlib.Path) -> str:
    """A promtool test of LLMRouterBackendOut whose input is the recorded series (1 s apart), the last value
    held for 40 s more: it must not fire before the kill, and must fire 31 s after the first sample that
    shows the backend out."""
    out_at = next(i for i in range(len(series["up"]))
                  if series["up"][i] == 0 or series["open"][i] == 1)
    assert out_at >= kill_index
    pad = 40

    def vals(xs: list[float]) -> str:
        return " ".join(f"{x:g}" for x in xs + [xs[-1]] * pad)

    labels = series["labels"]
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    rules = yaml.safe_load((ROOT / "alerts" / "rules" / "routing.yaml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "LLMRouterBackendOut")
    annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: pairs[m.group(1)], v)
                   for k, v in rule["annotations"].items()}
    test = {
        "rule_files": [str(ROOT / "alerts" / "rules" / "routing.yaml")],
        "evaluation_interval": "1s",
        "tests": [{"interval": "1s",
                   "input_series": [
                       {"series": f"llm_router_backend_up{{{labels}}}", "values": vals(series["up"])},
                       {"series": f'llm_router_backend_breaker_state{{{labels},state="open"}}',
                        "values": vals(series["open"])}],
                   "alert_rule_test": [
                       {"eval_time": f"{max(0, kill_index - 1)}s", "alertname": "LLMRouterBackendOut",
                        "exp_alerts": []},
                       {"eval_time": f"{out_at + 31}s", "alertname": "LLMRouterBackendOut",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", **pairs},
                                        "exp_annotations": annotations}]}]}]}
    path = tmp / "backend-out-test.yaml"
    path.write_text(json.dumps(test))  # JSON is YAML
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return path.read_text()


def _skew(base: str, router: str) -> float | None:
    got = values(base, "llm_router_load_skew", target=router)
    return next(iter(got.values()), None)


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-router"])
def test_real_router_in_front_of_two_twins(kind, tmp_path):
    skewing = kind == "vllm-router"  # sglang-router 0.3.2 has no consistent hashing
    with twin(1) as (a_url, _), twin(2) as (b_url, b_process):
        ports = [free_port() for _ in range(4)]
        even = routers.start(kind, [a_url, b_url], port=ports[0], metrics_port=ports[1], policy="round_robin",
                             log_dir=tmp_path)
        stack = contextlib.ExitStack()
        with stack:
            stack.enter_context(even)
            args = ["--engine", f"{a_url}/metrics,name=a", "--engine", f"{b_url}/metrics,name=b",
                    "--router", f"{even.metrics_url},name=even"]
            hot = None
            if skewing:
                hot = stack.enter_context(routers.start(kind, [a_url, b_url], port=ports[2], metrics_port=ports[3],
                                                        policy="consistent_hash", log_dir=tmp_path))
                args += ["--router", f"{hot.metrics_url},name=hashed"]
            base, _, _ = stack.enter_context(exporter_run(*args))
            prom = stack.enter_context(prometheus(base, tmp_path))

            # 1. Even load: no routing verdict, skew near 1.
            load = Load(even.url)
            try:
                assert wait_until(lambda: (_skew(base, "even") or 0) > 0, timeout=60, interval=0.5), metrics(base)
                time.sleep(8)  # a rate window's worth of even traffic
                skew, found = _skew(base, "even"), verdicts(base)
            finally:
                load.stop()
            assert skew is not None and skew < 1.3, skew
            assert "routing" not in found.values(), found
            shares = values(base, "llm_router_backend_share_ratio", target="even")
            assert len(shares) == 2 and all(0.3 < v < 0.7 for v in shares.values()), shares
            assert load.codes.get("200", 0) > 0, load.codes

            # Every family on the router's live page is accounted for, and the per-backend counters the
            # exporter writes are the router's own, read after the load stopped.
            page = even.page()
            assert unaccounted(SPECS[kind].accounting, page) == [], "new families on the live page"
            time.sleep(1.0)
            own = _router_backend_counts(kind, page)
            exported = {dict(k)["backend"]: v
                        for k, v in values(base, "llm_router_backend_requests_total", target="even").items()}
            assert own == exported, (own, exported)
            info = values(base, "llm_router_info", target="even")
            assert [dict(k)["policy"] for k in info] == ["round_robin"], info

            # 2. Skewed load (vllm-router's consistent hashing): routing named, with evidence.
            if hot is not None:
                load = Load(hot.url)
                try:
                    def named() -> bool:
                        return "routing" in verdicts(base).values()
                    assert wait_until(named, timeout=ROUTING_DEADLINE_S, interval=1.0), (verdicts(base), metrics(base))
                    found = verdicts(base)
                    diagnosis = httpx.get(f"{base}/api/v1/diagnosis", timeout=10).json()
                finally:
                    load.stop()
                hot_target = next(t for t, r in found.items() if r == "routing")
                cold = {"a": "b", "b": "a"}[hot_target]
                assert found.get(cold) != "routing", found
                evidence = " ".join(diagnosis["targets"][hot_target]["evidence"])
                cold_url = {"a": a_url, "b": b_url}[cold].removeprefix("http://")
                assert "router hashed (vllm-router, policy consistent_hash)" in evidence, evidence
                assert f"idle meanwhile: {cold_url}" in evidence, evidence
                assert "SLO attainment" in evidence or "waiting" in evidence, evidence
                assert (_skew(base, "hashed") or 0) >= 1.5
                numbers = diagnosis["targets"][hot_target]["numbers"]["routing"]["hashed"]
                assert numbers["busiest"] and numbers["idle_backends"] == [cold_url], numbers

            # The fleet board's routing row, on this Prometheus.
            instance = base.removeprefix("http://")
            assert wait_until(lambda: bool(query(prom, 'llm_router_load_skew')), timeout=30, interval=1)
            # Per panel: some of its queries have data (vllm-router and the SGLang gateway's HTTP router have
            # no TTFT: that panel draws their latency). Breakers fill once a backend is out (below); retries
            # and errors once a request fails.
            panels: dict[str, bool] = {}
            for title, expr in routing_row_queries():
                panels[title] = panels.get(title, False) or bool(query(prom, grafana(expr, instance)))
            empty = [t for t, has in panels.items() if not has and "Breakers" not in t and "Retries" not in t]
            assert empty == [], empty

            # 3. A backend killed: taken out by the router, reported by the exporter, the alert fires.
            series: dict = {"up": [], "open": []}
            backend = b_url.removeprefix("http://")
            load = Load(even.url, clients=2)
            try:
                stop_process(b_process)
                kill_index = 0
                router_out = exporter_out = None
                started = time.monotonic()
                while time.monotonic() - started < 60 and (exporter_out is None or len(series["up"]) < 5):
                    page = even.page()
                    if router_out is None and _router_says_out(kind, page, backend):
                        router_out = time.monotonic()
                    up = values(base, "llm_router_backend_up", target="even", backend=backend)
                    opened = values(base, "llm_router_backend_breaker_state", target="even", backend=backend,
                                    state="open")
                    series["up"].append(next(iter(up.values()), 1.0))
                    series["open"].append(next(iter(opened.values()), 0.0))
                    if exporter_out is None and (series["up"][-1] == 0 or series["open"][-1] == 1):
                        exporter_out = time.monotonic()
                    time.sleep(1.0)
            finally:
                load.stop()
            assert router_out is not None and exporter_out is not None, (series, even.log_tail())
            # The exporter reads the router every 200 ms: it says so within a few of its cycles of the router.
            assert exporter_out - router_out < 5.0, (exporter_out - router_out)
            print(f"{kind}: backend out on the router's page {router_out - started:.1f} s after the kill, on the "
                  f"exporter's {exporter_out - started:.1f} s")
            out_now = values(base, "llm_router_backends_out", target="even")
            assert list(out_now.values()) == [1.0], out_now
            series["labels"] = (f'job="llm-exporter",instance="{instance}",target="even",router="{kind}",'
                                f'backend="{backend}"')
            promtool_backend_out(series, kill_index, tmp_path)
            for wanted in ("Breakers", "Retries"):
                exprs = [expr for title, expr in routing_row_queries() if wanted in title]
                assert wait_until(lambda e=exprs: any(query(prom, grafana(x, instance)) for x in e), timeout=20,
                                  interval=1), f"the {wanted} panel shows the killed backend"


def _router_backend_counts(kind: str, page: str) -> dict[str, float]:
    """Requests per backend as the router's own page counts them (its own family names)."""
    name = "vllm_router_processed_requests_total" if kind == "vllm-router" else "smg_worker_cb_outcomes_total"
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith(name + "{"):
            worker = re.search(r'worker="([^"]+)"', line).group(1).removeprefix("http://")
            out[worker] = out.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _router_says_out(kind: str, page: str, backend: str) -> bool:
    prefix = "vllm_router_" if kind == "vllm-router" else "smg_worker_"
    for line in page.splitlines():
        if backend not in line:
            continue
        health = "vllm_router_worker_health{" if kind == "vllm-router" else "smg_worker_health{"
        if line.startswith(health) and float(line.rsplit(" ", 1)[1]) == 0:
            return True
        if line.startswith(f"{prefix}cb_state{{") and float(line.rsplit(" ", 1)[1]) == 1:
            return True
    return False
