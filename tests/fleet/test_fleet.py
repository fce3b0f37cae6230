"""The fleet tier: deploy/fleet.py's simulated fleet (N >= 6 sidecar pairs in clusters a and b), a
Prometheus per cluster remote-writing raw series to the central store (VictoriaMetrics), vmalert
running the rules there, Alertmanager notifying a webhook receiver in this process.

- every query of the fleet board and the overview, Grafana's variables resolved the way Grafana
  resolves them, is evaluated against the central store and each cluster's Prometheus: none errors,
  none is empty unless NO_DATA says why (a small, explicit list: a strict entry must stay empty);
- the instance table lists every replica of both clusters on the central store;
- the replica that dies raises the capacity-loss alert through vmalert and Alertmanager;
- cluster b is scraped by an HA pair of Prometheus servers: the central store holds each of its series
  once, one sample per scrape interval, and its replica counts are the cluster's, not twice them;
- a cluster whose exporters all vanish pages LLMExporterClusterAbsent (last: it silences cluster a).

Rules run at TIME_SCALE (exporter/mixin/alerts/generate.py render_scaled): 5m windows take 15 s, `for: 10m` 30 s.
Run by `make test-fleet` (LLM_EXPORTER_FLEET=1); `make test` leaves the folder out. The machine may
be loaded: everything polls against generous deadlines; no duration is asserted.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from deploy import fleet as fleet_launcher
from exporter.catalog import profiles
from exporter.mixin.dashboards import generate as boards
from exporter.slo import duration_seconds
from tests import routers
from tests.fullstack import WebhookReceiver, logs
from tests.support import free_ports, wait_until

pytestmark = [pytest.mark.fleet]
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

REPLICAS = 6
TIME_SCALE = 0.05  # 5m -> 15s, 1h -> 3m
INTERVAL = "2s"  # collection, scrape and evaluation: 6 demos, 2 Prometheus servers and the store on 2 cores
DIE_AFTER_S = 100.0  # the last replica's life: long enough for its series to count in the recent maximum
DEADLINE_S = 150.0  # for data to reach every panel of every store
ALERT_DEADLINE_S = 240.0  # from the death to the notification, on a loaded machine
# Grafana's $__rate_interval: max(4 x scrape interval, $__interval + scrape interval), here 8 s; 20 s
# keeps a rate window over several remote-written samples when the store lags a scrape or two.
RATE_INTERVAL = "20s"
FLEET_BOARD = "llm-serving-fleet.json"
OVERVIEW = "llm-serving-overview.json"
CAPACITY_ALERT = "LLMFleetReplicasLost"
CLUSTER_ALERT = "LLMExporterClusterAbsent"
HA_CLUSTER = "b"  # scraped by two Prometheus servers; the dying replica is in it too
SILENT_CLUSTER = "a"  # its exporters are all killed by the last test

# (dashboard file, panel title, refId) -> (reason, strict). strict: must stay empty in this fleet (what
# no replica runs); not strict: depends on timing. Everything else must have data on every store.
PD_PANELS = {"KV transfer time vs TTFT (p50/p99, 5m)": "AB", "Requests waiting for KV transfer": "A",
             "KV transfer throughput and failures (5m)": "AB"}
NO_DATA: dict[tuple[str, str, str], tuple[str, bool]] = {
    **{(OVERVIEW, title, ref): ("prefill/decode disaggregation only: no replica of the fleet runs a PD pair "
                                "(tests/test_dashboards_live.py checks these on its pd-transfer demo)", True)
       for title, refs in PD_PANELS.items() for ref in refs},
    **{(OVERVIEW, title, ref): ("speculative decoding: the simulator's engines do not draft tokens, so no replica "
                                "exports the spec-decode families", True)
       for title in ("Speculative decoding: acceptance ratio and length",
                     "Speculative decoding: draft and accepted tokens/s (5m)") for ref in "AB"},
    (OVERVIEW, "Probe errors by reason", "A"):
        ("the panel draws reasons with errors only (> 0); the probed replicas' probes succeed unless the machine "
         "is so loaded that one times out", False),
    **{(FLEET_BOARD, title, ref): (routers.NO_ROUTER, True)
       for title, refs in routers.ROUTING_ROW.items() for ref in refs},
}


@dataclass
class Store:
    name: str  # central | prometheus-a | prometheus-b
    url: str  # base of /api/v1/query
    cluster: str | None  # None: every cluster (the central store)


@dataclass
class FleetUnderTest:
    fleet: object  # deploy/fleet.py Fleet
    receiver: WebhookReceiver
    stores: dict[str, Store]
    started: float  # time.monotonic() when the replicas were launched
    client: httpx.Client

    def query(self, store: Store, expr: str) -> list[dict]:
        response = self.client.get(f"{store.url}/api/v1/query", params={"query": expr})
        body = response.json()
        assert body.get("status") == "success", (
            f"{store.name}: {expr}\n-> {body.get('errorType')}: {body.get('error')}")
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return result

    def time_range(self) -> str:
        return f"{max(60, int(time.monotonic() - self.started) + 15)}s"


def _has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[FleetUnderTest]:
    directory = tmp_path_factory.mktemp("fleet")
    names = [f"r{i}" for i in range(REPLICAS)] + ["prometheus-a", "prometheus-b", "prometheus-ha", "vm", "vmalert",
                                                   "am", "sink"]
    free = free_ports(names)
    ports = fleet_launcher.Ports([free[f"r{i}"] for i in range(REPLICAS)],
                                 {"a": free["prometheus-a"], "b": free["prometheus-b"]},
                                 free["vm"], free["vmalert"], free["am"], free["sink"], free["prometheus-ha"])
    receiver = WebhookReceiver()
    opts = fleet_launcher.FleetOptions(replicas=REPLICAS, die_after_s=DIE_AFTER_S, time_scale=TIME_SCALE,
                                       interval=INTERVAL, webhook=receiver.url, ha_cluster=HA_CLUSTER)
    the_fleet, procs = fleet_launcher.plan(directory, opts, ports)
    started = time.monotonic()
    client = httpx.Client(timeout=20)
    try:
        fleet_launcher.start(the_fleet, procs, timeout_s=90)
        stores = {"central": Store("central", the_fleet.central, None),
                  **{f"prometheus-{c}": Store(f"prometheus-{c}", url, c) for c, url in the_fleet.prometheus.items()},
                  **{name: Store(name, url, HA_CLUSTER) for name, url in the_fleet.ha_prometheus.items()}}
        under_test = FleetUnderTest(the_fleet, receiver, stores, started, client)
        # Data flows: every replica's engine is up in its cluster's Prometheus and in the central store.
        every = {(r.cluster, r.instance) for r in the_fleet.replicas}

        def flowing() -> bool:
            central = {(m["metric"].get("cluster"), m["metric"]["instance"]) for m in under_test.query(
                stores["central"], 'llm_engine_up{job="llm-exporter"} == 1')}
            local = {(s.cluster, m["metric"]["instance"]) for s in stores.values() if s.cluster for m in
                     under_test.query(s, 'llm_engine_up{job="llm-exporter"} == 1')}
            return central >= every and local >= every

        assert wait_until(flowing, timeout=90, interval=1.0), f"data never reached every store\n{logs(directory)}"
        yield under_test
    finally:
        fleet_launcher.stop(directory)
        receiver.close()
        client.close()


# ------------------------------------------------------------------------------------------------
# Grafana's variables
# ------------------------------------------------------------------------------------------------
def boards_under_test() -> dict[str, dict]:
    """The fleet board and the overview (dashboards/*.json as generated from this checkout)."""
    built = {name: json.loads(text) for name, text in boards.build_all().items()}
    return {name: built[name] for name in (FLEET_BOARD, OVERVIEW) if name in built}


def _label_values(ft: FleetUnderTest, store: Store, query: str) -> list[str]:
    """label_values(selector, label) as Grafana's Prometheus datasource runs it (series of the selector)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query)
    assert m, f"unsupported variable query {query}"
    selector, label = m.groups()
    result = ft.query(store, f"group by ({label}) ({selector})")
    return sorted({r["metric"][label] for r in result if label in r["metric"]})


def variables(ft: FleetUnderTest, store: Store, board: dict) -> dict[str, str]:
    """Each template variable at "All" (what the fleet view opens with), resolved in order: a variable
    with an allValue takes it; one without takes its values from the store, joined as a regex."""
    values = {"__rate_interval": RATE_INTERVAL, "__interval": INTERVAL, "__range": ft.time_range()}
    for var in board.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            values[name] = "central-store"
        elif kind == "adhoc":
            continue  # Grafana adds ad hoc filters to each query itself; none set: nothing to add
        elif kind == "query":
            if var.get("includeAll") and var.get("allValue"):
                values[name] = var["allValue"]
            else:
                found = _label_values(ft, store, substitute(str(var.get("query", "")), values))
                values[name] = "|".join(re.escape(v) for v in found) if var.get("multi") or var.get(
                    "includeAll") else (found[0] if found else "")
        else:  # custom, constant, interval, textbox: the current value
            current = var.get("current", {}).get("value")
            values[name] = current if isinstance(current, str) else "|".join(current or [])
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"no value for variable ${name} in {expr}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def board_queries(board: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every panel query of `board`."""
    return [(panel["title"], t["refId"], t["expr"]) for panel, t in boards.iter_exprs(board)]


def _left_to_full() -> dict[tuple[str, str, str], tuple[str, bool]]:
    """The panels the default profile leaves to `full` (exporter/catalog/profiles.py SERVES): the fleet's
    replicas run the default profile, so these may be empty (or partly: some of their queries read
    default families)."""
    out = {}
    for name, board in boards_under_test().items():
        for title, ref, _ in board_queries(board):
            if f"{name.removesuffix('.json')}:{title}" in profiles.SERVES["default"].except_panels:
                out[(name, title, ref)] = ("the default profile leaves this panel's families to --profile full", False)
    return out


NO_DATA.update(_left_to_full())


def test_no_data_list_names_real_panel_queries():
    known = {(name, title, ref) for name, board in boards_under_test().items()
             for title, ref, _ in board_queries(board)}
    assert set(NO_DATA) <= known, set(NO_DATA) - known


# ------------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(400)
@pytest.mark.parametrize("store_name", ["central", "prometheus-a", "prometheus-b"])  # not the HA twin: b's again
def test_every_board_query_has_data_on_every_store(fleet: FleetUnderTest, store_name: str):
    store = fleet.stores[store_name]
    pending: dict[tuple[str, str, str], str] = {}
    allowed: dict[tuple[str, str, str], str] = {}
    for name, board in boards_under_test().items():
        values = variables(fleet, store, board)
        for title, ref, expr in board_queries(board):
            key = (name, title, ref)
            (allowed if key in NO_DATA else pending)[key] = substitute(expr, values)
    assert len(boards_under_test()) >= 1 and pending
    deadline = time.monotonic() + DEADLINE_S
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            if _has_data(fleet.query(store, expr)):
                del pending[key]
        if pending:
            time.sleep(2.0)
    missing = "\n".join(f"  {' / '.join(k)}:\n    {e}" for k, e in pending.items())
    assert not pending, f"{store_name}: panel queries without data after {DEADLINE_S:.0f} s:\n{missing}"
    for key, expr in allowed.items():
        result = fleet.query(store, expr)  # still a valid query on this store
        reason, strict = NO_DATA[key]
        if strict:
            assert not _has_data(result), f"{' / '.join(key)} has data now; remove it from NO_DATA ({reason})"


INSTANCE_TABLE = "Instances: one row per replica"


def _instance_rows(fleet: FleetUnderTest, ref: str) -> list[dict]:
    """Rows (finite samples) of one column of the fleet board's instance table, on the central store."""
    board = boards_under_test()[FLEET_BOARD]
    store = fleet.stores["central"]
    expr = next(t["expr"] for panel, t in boards.iter_exprs(board)
                if panel["title"] == INSTANCE_TABLE and t["refId"] == ref)
    return [r for r in fleet.query(store, substitute(expr, variables(fleet, store, board)))
            if math.isfinite(float(r["value"][1]))]


@pytest.mark.timeout(300)
def test_the_instance_table_lists_every_replica_of_both_clusters(fleet: FleetUnderTest):
    """On the central store, the fleet board's instance table (every variable at All): its first column
    (the verdict) has one row per live replica of both clusters, each with its cluster and namespace (the
    instance label alone may repeat across clusters), and every other column's rows carry the labels of a
    verdict row, so Grafana's merge joins them into one row per replica."""
    from exporter.mixin.dashboards import fleet as fleet_board

    board = boards_under_test().get(FLEET_BOARD)
    assert board is not None, f"dashboards/{FLEET_BOARD} is not generated by this checkout"
    refs = [t["refId"] for panel, t in boards.iter_exprs(board) if panel["title"] == INSTANCE_TABLE]
    assert len(refs) >= 2, refs
    living = {(r.cluster, r.namespace, r.instance) for r in fleet.fleet.replicas if r.dies_after_s is None}

    def key(r: dict) -> tuple[str, ...]:
        return tuple(r["metric"].get(label, "") for label in fleet_board.REPLICA)

    def listed() -> set[tuple[str, str, str]]:
        return {(r["metric"].get("cluster"), r["metric"].get("namespace"), r["metric"].get("instance"))
                for r in _instance_rows(fleet, refs[0])}

    assert wait_until(lambda: listed() >= living, timeout=DEADLINE_S, interval=2.0), sorted(living - listed())
    verdicts = {key(r) for r in _instance_rows(fleet, refs[0])}
    for ref in refs[1:]:
        def joined(ref: str = ref) -> bool:
            rows = _instance_rows(fleet, ref)
            return bool(rows) and {key(r) for r in rows} <= verdicts and {r["metric"].get("cluster")
                                                                          for r in rows} == {"a", "b"}

        assert wait_until(joined, timeout=60, interval=2.0), (ref, [r["metric"] for r in _instance_rows(fleet, ref)])


@pytest.mark.timeout(600)
def test_the_dying_replica_raises_the_capacity_alert_through_alertmanager(fleet: FleetUnderTest):
    """The last replica is SIGKILLed DIE_AFTER_S after it started. vmalert, on the central store, fires
    the per-replica LLMExporterDown for it and the fleet's capacity-loss alert for its cluster; both reach
    the webhook through Alertmanager. The other replicas raise no LLMExporterDown."""
    dying = next(r for r in fleet.fleet.replicas if r.dies_after_s is not None)
    assert wait_until(lambda: fleet.query(fleet.stores[f"prometheus-{dying.cluster}"],
                                          f'up{{instance="{dying.instance}"}} == 0') != [],
                      timeout=DIE_AFTER_S + 60, interval=2.0), "the replica never died"

    def notified(name: str, **labels: str) -> bool:
        return any(a.status == "firing" for a in fleet.receiver.alerts(name, **labels))

    def both() -> bool:
        return notified("LLMExporterDown", instance=dying.instance) and notified(CAPACITY_ALERT)

    if not wait_until(both, timeout=ALERT_DEADLINE_S, interval=2.0):
        vmalert = fleet.client.get(f"{fleet.fleet.vmalert}/api/v1/alerts").json()
        pytest.fail(f"not notified: {[(a.name, a.status, a.labels) for a in fleet.receiver.alerts()]}\n"
                    f"vmalert: {json.dumps(vmalert)[:3000]}")
    # Its series ended (Prometheus' staleness markers, remote-written): the instance table drops it.
    assert wait_until(lambda: dying.instance not in {r["metric"].get("instance") for r in _instance_rows(
        fleet, "A")}, timeout=60, interval=2.0), "the dead replica is still listed on the central store"
    capacity = [a for a in fleet.receiver.alerts(CAPACITY_ALERT) if a.status == "firing"]
    # The capacity alert names the cluster that lost the replica (one page per fleet breach).
    assert {a.labels.get("cluster") for a in capacity} <= {dying.cluster, None}, capacity
    others = {a.labels.get("instance") for a in fleet.receiver.alerts("LLMExporterDown")} - {dying.instance}
    assert not others, others


BUCKET_ALERT = "LLMSLOThresholdNotABucketBound"


def _bucket_alert_rule() -> dict:
    """The LLMSLOThresholdNotABucketBound rule for `slo="ttft"` as vmalert runs it (the central variant,
    scaled like the fleet's)."""
    import yaml

    from exporter.mixin.alerts import generate

    cfg = {**generate.CONFIG, **fleet_launcher.CENTRAL_RULES_OVERRIDES}
    files = generate.render_scaled(pathlib.Path("/nonexistent"), TIME_SCALE, cfg)
    slo = yaml.safe_load(next(text for path, text in files.items() if path.name == "slo.yaml"))
    return next(r for g in slo["groups"] for r in g["rules"]
                if r.get("alert") == BUCKET_ALERT and r["labels"]["slo"] == "ttft")


def _active(fleet: FleetUnderTest, name: str) -> list[tuple[str, str]]:
    """(store, state) of every pending or firing `name` on vmalert and each cluster's Prometheus."""
    out = [("vmalert", a.get("state", "")) for a in fleet.client.get(f"{fleet.fleet.vmalert}/api/v1/alerts").json()
           ["data"]["alerts"] if a.get("name") == name]
    for store in fleet.stores.values():
        if store.cluster is None or store.name not in ("prometheus-a", "prometheus-b"):
            continue
        alerts = fleet.client.get(f"{store.url}/api/v1/alerts").json()["data"]["alerts"]
        out += [(store.name, a["state"]) for a in alerts if a["labels"].get("alertname") == name]
    return out


@pytest.mark.timeout(400)
def test_the_shipped_slo_thresholds_raise_no_bucket_bound_alert(fleet: FleetUnderTest):
    """The shipped TTFT target (2.5 s) is not one of SGLang's edges (2, 4): the exporter writes a bucket
    at 2.5 holding the count at 2 (exporter/buckets.py), so LLMSLOThresholdNotABucketBound is neither
    pending nor firing anywhere, over at least its window and `for` since the fleet started. The rule's
    first half (a TTFT histogram with traffic) holds for the SGLang replicas: without the bucket it fires."""
    rule = _bucket_alert_rule()
    central = fleet.stores["central"]
    traffic = rule["expr"].split("\nunless\n")[0]
    engine_of = {r.instance: r.profile.engine_format for r in fleet.fleet.replicas}

    def sglang_with_traffic() -> set[str]:
        return {m["metric"].get("instance", "") for m in fleet.query(central, traffic)
                if engine_of.get(m["metric"].get("instance", "")) == "sglang"}
    assert wait_until(lambda: sglang_with_traffic(), timeout=120, interval=2.0), traffic
    sglang = {r.instance for r in fleet.fleet.replicas if r.profile.engine_format == "sglang"}
    edge = {m["metric"]["instance"] for m in fleet.query(
        central, 'llm_time_to_first_token_seconds_bucket{job="llm-exporter", le="2.5"}')}
    state = {m["metric"]["instance"] for m in fleet.query(
        central, 'llm_exporter_slo_threshold_edge{job="llm-exporter", slo="ttft", state="lower_edge"} == 1')}
    assert sglang_with_traffic() <= edge & state, (sglang, edge, state)
    settle = duration_seconds(str(rule["for"])) + duration_seconds(_rate_window(rule)) + 10
    end = max(time.monotonic() + 6, fleet.started + settle)
    while True:
        active = _active(fleet, BUCKET_ALERT)
        assert not active, f"{BUCKET_ALERT} is active: {active}"
        if time.monotonic() >= end:
            break
        time.sleep(2)


def _rate_window(rule: dict) -> str:
    """The rate window of the rule's expression (`[1h]` scaled)."""
    found = re.search(r"\[(\w+)\]", rule["expr"])
    assert found, rule["expr"]
    return found.group(1)


def _remote_written(url: str, client: httpx.Client) -> float:
    """Samples a Prometheus server has sent by remote write (its own /metrics; the fleet's servers do
    not scrape themselves)."""
    text = client.get(f"{url}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(
        r"^prometheus_remote_storage_samples_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.timeout(300)
def test_the_ha_pair_is_stored_once_in_the_central_store(fleet: FleetUnderTest):
    """Cluster b is scraped by two Prometheus servers, external labels equal but `prometheus_replica`,
    both remote-writing everything. The central store drops that label on ingestion and keeps one sample
    per series and scrape interval (-dedup.minScrapeInterval): each exporter of b is one series there
    (the instances either server sees, none twice), with no more samples in a window than one scraper
    takes, and the fleet's replica count for b (vmalert's rule over the store) equals the count b's own
    Prometheus records. Without the label dropped the store would keep both servers' copies as two
    series: every count and sum over b twice what each server of the pair holds, which the pair's own
    counts (summed here) show."""
    central = fleet.stores["central"]
    pair = [s for s in fleet.stores.values() if s.cluster == HA_CLUSTER]
    assert len(pair) == 2, pair
    window_s, interval_s = 30, duration_seconds(INTERVAL)
    # Both servers of the pair write: neither is a cold standby, so the store gets every sample twice.
    urls = [s.url for s in pair]
    assert wait_until(lambda: all(_remote_written(u, fleet.client) > 0 for u in urls), timeout=60, interval=2.0)

    def instances(store: Store, selector: str) -> list[str]:
        return sorted(r["metric"]["instance"] for r in fleet.query(store, f"llm_exporter_build_info{selector}"))

    state: dict[str, object] = {}

    def stored_once() -> bool:
        seen = [instances(s, "") for s in pair]
        stored = instances(central, f'{{cluster="{HA_CLUSTER}"}}')
        state.update(seen=seen, stored=stored)
        return bool(stored) and seen[0] == seen[1] == stored  # sorted lists: a duplicate would differ

    assert wait_until(stored_once, timeout=60, interval=2.0), state
    assert fleet.query(central, 'llm_exporter_build_info{prometheus_replica!=""}') == [], "the replica label stayed"
    # Without dropping the label: two series per exporter, as the pair holds them together.
    assert sum(len(instances(s, "")) for s in pair) == 2 * len(state["stored"])  # type: ignore[arg-type]

    def one_sample_per_interval() -> bool:
        stored = {r["metric"]["instance"]: float(r["value"][1]) for r in fleet.query(
            central, f'count_over_time(llm_exporter_build_info{{cluster="{HA_CLUSTER}"}}[{window_s}s])')}
        written: dict[str, float] = {}
        for s in pair:
            for r in fleet.query(s, f"count_over_time(llm_exporter_build_info[{window_s}s])"):
                written[r["metric"]["instance"]] = written.get(r["metric"]["instance"], 0.0) + float(r["value"][1])
        state.update(samples_stored=stored, samples_written=written)
        # Dedup keeps one sample per discrete interval: at most window/interval + 1 (+1 for the edges),
        # where the pair wrote about twice that.
        return bool(stored) and all(n <= window_s / interval_s + 2 and n < written.get(i, 0.0)
                                    for i, n in stored.items())

    assert wait_until(one_sample_per_interval, timeout=60, interval=2.0), state

    def counted_once() -> bool:
        rule = "model:llm_replicas_up:count"
        fleet_count = [float(r["value"][1]) for r in fleet.query(central, f'sum({rule}{{cluster="{HA_CLUSTER}"}})')]
        own = [float(r["value"][1]) for r in fleet.query(pair[0], f"sum({rule})")]
        live = len(instances(pair[0], ""))
        state.update(fleet_count=fleet_count, own=own, live=live)
        return fleet_count == own == [float(live)]

    assert wait_until(counted_once, timeout=60, interval=2.0), state


@pytest.mark.timeout(400)
def test_a_silent_cluster_pages_through_alertmanager(fleet: FleetUnderTest):
    """Every exporter of cluster a is killed (SIGKILL, as nodes that vanish): its Prometheus still
    scrapes and remote-writes, but no exporter of a answers. The fleet-wide LLMExporterAbsent cannot
    see it (cluster b is there); LLMExporterClusterAbsent, on the central store, pages for cluster a
    alone. Last in this file: cluster a stays silent."""
    directory = fleet.fleet.directory
    silenced = [r for r in fleet.fleet.replicas if r.cluster == SILENT_CLUSTER]
    for r in silenced:
        pid = fleet_launcher.stack._alive(directory, r.name)  # only a process this fleet started
        assert pid is not None, f"{r.name} is not running"
        os.kill(pid, signal.SIGKILL)
    central = fleet.stores["central"]
    assert wait_until(lambda: fleet.query(
        central, f'llm_exporter_build_info{{cluster="{SILENT_CLUSTER}"}}') == [], timeout=60, interval=2.0)

    def paged() -> bool:
        return any(a.status == "firing" for a in fleet.receiver.alerts(CLUSTER_ALERT, cluster=SILENT_CLUSTER))

    if not wait_until(paged, timeout=ALERT_DEADLINE_S, interval=2.0):
        vmalert = fleet.client.get(f"{fleet.fleet.vmalert}/api/v1/alerts").json()
        pytest.fail(f"not notified: {[(a.name, a.status, a.labels) for a in fleet.receiver.alerts()]}\n"
                    f"vmalert: {json.dumps(vmalert)[:3000]}")
    page = next(a for a in fleet.receiver.alerts(CLUSTER_ALERT, cluster=SILENT_CLUSTER) if a.status == "firing")
    assert page.labels.get("severity") == "critical", page.labels
    assert {a.labels.get("cluster") for a in fleet.receiver.alerts(CLUSTER_ALERT)} == {SILENT_CLUSTER}
    assert not fleet.receiver.alerts("LLMExporterAbsent"), "the fleet-wide alert fired with cluster b up"
