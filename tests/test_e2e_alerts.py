"""End to end on loopback, real servers: the twin -> `llm-exporter run` (1 s interval, GPU from the
twin) -> Prometheus (the generated rules, 1 s scrape and evaluation) -> Alertmanager (the generated
routing and inhibition) -> a webhook receiver in this process. tests/fullstack.py starts it all
through deploy/stack.py's launcher; read its docstring for the test-only settings (rules with every
window and `for` scaled by 0.01, the twin at 10x real time, the engine behind a proxy that can die).

The tests run in file order on ONE stack, each leaving the scenario where the next expects it:

1. overload: the TTFT fast-burn page (critical, to the pager) and the TTFT p99 alert (warning, to
   the ticket queue) arrive with severity, target and model labels and numbers in the description;
   until the engine dies that stays one page (the slow pair joining updates it).
2. the engine killed while overload still burns: LLMEngineDown pages; the target's latency/SLO
   alerts that Prometheus still fires stay active in Alertmanager (nothing inhibits them: a resolve
   while inhibited is dropped, alertmanager#2754) and none opens a page or ticket while it is down;
   GPU and host series keep flowing.
3. engine back and the twin back to decode-heavy: the backlog drains and both alerts resolve (the
   drain takes about 2.8x as long as the surge lasted: that is queueing, not a delay in the pipeline).
   They may resolve early, during the engine's gap, and fire again: recovery is read from the state.
4. thermal-throttle: LLMGPUSlowdownWhileServing fires and the verdict, read through Prometheus,
   flips to llm_bottleneck{resource="power_thermal"} == 1.
5. the engine restarted (its counters start from zero): rate() of prompt and generation tokens
   and the exporter's own tokens/s stay within their pre-restart range, Prometheus saw the reset,
   and no new alert fires.
6. the exporter restarted: engine counters it passes through never go backwards and stay within
   what the twin itself counted (nothing lost, nothing double counted); the only counters
   Prometheus sees reset are the exporter's own llm_exporter_*_total, which rate() handles.
"""

from __future__ import annotations

import math
import re
import time

import pytest

from exporter.mixin.alerts.lib import nominal
from exporter.simulator.scenarios import SCENARIOS
from tests.fullstack import TARGET, TWIN_SPEED, FullStack, full_stack, logs, outage_check, timeline
from tests.support import wait_until

TTFT_BURN = "LLMTimeToFirstTokenErrorBudgetBurn"
TTFT_P99 = "LLMTimeToFirstTokenP99High"
SLOWDOWN = "LLMGPUSlowdownWhileServing"
ENGINE_DOWN = "LLMEngineDown"
# The target's alerts an outage must not page or ticket again (alerts/generate.py: slo, latency,
# saturation), and which no inhibition may hide (exporter/mixin/alerts/alertmanager.py).
ENGINE_ALERTS = ("LLMTimeToFirstTokenErrorBudgetBurn", "LLMTimeBetweenTokensErrorBudgetBurn",
             "LLMSLOThresholdNotABucketBound", "LLMTimeToFirstTokenP99High", "LLMTimeBetweenTokensP99High",
             "LLMKVCacheNearlyFull", "LLMPreemptionsHappening", "LLMRequestQueueGrowing",
             "LLMKVCacheHeadroomExhausted")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fullstack")
    with full_stack(directory) as s:
        yield s


def _wait(stack: FullStack, predicate, timeout: float, what: str) -> None:
    if not wait_until(predicate, timeout=timeout, interval=0.25):
        received = [(r.name, r.status, r.labels.get("long", "")) for r in stack.receiver.alerts()]
        raise AssertionError(f"{what} within {timeout:g}s.\nreceived: {received}\n"
                             f"firing in Prometheus: {[a['alertname'] for a in stack.firing()]}\n"
                             f"{logs(stack.directory)}")


def _seconds(text: str) -> float:
    """Prometheus' humanizeDuration back to seconds: '7.5s', '1m 19s', '2h 3m 4s', '250ms'."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"([\d.]+)([dhms])", text)
    assert parts, text
    return sum(float(n) * units[u] for n, u in parts)


def _model(stack: FullStack) -> str:
    return stack.query(f'llm_requests_running{{target="{TARGET}"}}')[0]["metric"]["model"]


@pytest.mark.timeout(120)
def test_overload_pages_the_ttft_burn_and_the_p99_alert_with_labels_and_numbers(stack: FullStack):
    fast = stack.scaled["burn_rates"][0]  # the 1h/5m pair, scaled
    model = _model(stack)
    # Baseline (decode-heavy): the rules have data and nothing pages.
    _wait(stack, lambda: stack.value("target_model:llm_time_to_first_token_seconds:p99_"
                                     f"{nominal(stack.scaled['rate_window'])}") is not None, 20, "no TTFT p99 recorded")
    assert not stack.receiver.alerts(status="firing"), stack.receiver.alerts()
    assert stack.value(f'llm_bottleneck{{target="{TARGET}",resource="power_thermal"}}') == 0.0

    stack.scenario("overload")  # SURGE_DELAY_S of normal load, then arrivals at 2x capacity
    stack.marks["overload"] = time.monotonic()
    _wait(stack, lambda: stack.receiver.alerts(TTFT_BURN, status="firing", long=fast["long"])
          and stack.receiver.alerts(TTFT_P99, status="firing"), 60, "the TTFT page and p99 alert did not arrive")

    page = stack.receiver.alerts(TTFT_BURN, status="firing", long=fast["long"])[0]
    assert page.receiver == "/pager"
    assert page.labels["severity"] == "critical" and page.labels["slo"] == "ttft"
    assert page.labels["target"] == TARGET and page.labels["model"] == model
    burn = re.search(r": ([\d.]+)x the sustainable error rate over (\w+) \(and over (\w+)\)",
                     page.annotations["description"])
    assert burn, page.annotations["description"]
    # Burning faster than the pair's factor, and at most 100x (every request bad, 1% budget).
    assert fast["factor"] < float(burn.group(1)) <= 100.0, page.annotations["description"]
    assert (burn.group(2), burn.group(3)) == (fast["long"], fast["short"])
    assert "within 2.5s" in page.annotations["description"] and page.annotations["runbook_url"].endswith(
        "#" + TTFT_BURN.lower())

    tail = stack.receiver.alerts(TTFT_P99, status="firing")[0]
    assert tail.receiver == "/ticket"
    assert tail.labels["severity"] == "warning"
    assert tail.labels["target"] == TARGET and tail.labels["model"] == model
    p99 = re.search(r"p99 time to first token over \w+ is (.+?) \(threshold 5s\)", tail.annotations["description"])
    assert p99, tail.annotations["description"]
    assert _seconds(p99.group(1)) > 5.0, tail.annotations["description"]


@pytest.mark.timeout(90)
def test_engine_killed_pages_engine_down_and_opens_nothing_else(stack: FullStack):
    slow = stack.scaled["burn_rates"][1]  # 6h/30m pair: its short window outlives the engine's last sample
    if "overload" not in stack.marks:  # run on its own (-k): start the overload test 1 leaves running
        stack.scenario("overload")
        stack.marks["overload"] = time.monotonic()
    # Overload is still on: wait until the slow-burn alert fires too, so some latency alert is
    # still firing in Prometheus while the engine is down (the shorter windows empty within seconds).
    _wait(stack, lambda: any(a["alertname"] == TTFT_BURN and a.get("long") == slow["long"] for a in stack.firing()),
          60, "the slow TTFT burn never fired")
    # One breach, one page: the slow pair joining is an update of the same group's notification, and
    # the fast pair's short window emptying and filling again does not re-page (keep_firing_for and
    # the burn inhibitions, exporter/mixin/alerts/alertmanager.py).
    pages = stack.receiver.pages(TTFT_BURN, since=stack.marks["overload"], target=TARGET, receiver="/pager")
    notified = stack.receiver.notified(TTFT_BURN, since=stack.marks["overload"], target=TARGET)
    assert len(pages) == 1, [(n.status, n.alerts) for n in notified]
    # What Prometheus already had pending or firing may still arrive; nothing else may open.
    outage = outage_check(stack, ENGINE_ALERTS, TARGET, stack.marks["overload"])
    stack.proxy.stop()
    killed = time.monotonic()
    try:
        _wait(stack, lambda: stack.receiver.alerts(ENGINE_DOWN, status="firing", since=killed), 20,
              "LLMEngineDown did not arrive")
        down = stack.receiver.alerts(ENGINE_DOWN, status="firing", since=killed)[0]
        assert down.receiver == "/pager" and down.labels["severity"] == "critical"
        assert down.labels["target"] == TARGET

        # The alerts that fired before the outage stay active, not inhibited: their resolve has to
        # reach the pager or ticket that opened for them.
        def shown() -> list[dict]:
            return [a for a in stack.am_alerts() if a["labels"]["alertname"] in ENGINE_ALERTS
                    and a["labels"].get("target") == TARGET]

        _wait(stack, lambda: any(a["labels"]["alertname"] == TTFT_BURN for a in shown()), 5,
              "Alertmanager shows none of the target's TTFT burn alerts")
        assert not (breaches := outage()), f"while {ENGINE_DOWN} fires: {breaches}"

        # The other sources keep flowing while the engine is down; the fault is in self-health.
        assert stack.value(f'llm_engine_up{{target="{TARGET}"}}') == 0.0
        assert stack.value(f'llm_exporter_source_up{{source="engine:{TARGET}"}}') == 0.0
        assert stack.value(f'llm_exporter_collect_errors_total{{source="engine:{TARGET}",reason="connection"}}') > 0
        for family in ("llm_gpu_up", "llm_gpu_power_watts", "llm_host_memory_available_bytes"):
            age = stack.value(f"time() - max(timestamp({family}))")
            assert age is not None and age < 5, f"{family} stopped flowing ({age})"
        assert stack.value(f'count(llm_time_to_first_token_seconds_count{{target="{TARGET}"}})') is None

        # The outage is one page: none of the target's alerts opens a page or ticket while it is down
        # (updates and resolves of those already open may arrive).
        time.sleep(4)
        assert not (breaches := outage()), f"while the engine was down: {breaches}\n{timeline(stack)}"
    finally:
        stack.proxy.start()
        # The surge ends, its queue stays and drains (test 3 times it), as on a real engine.
        stack.scenario("decode-heavy", keep_backlog=True)
        stack.marks["recovered"] = time.monotonic()


# How long the backlog takes to drain, per second the surge lasted (decode-heavy leaves 15% of
# capacity to work it off; the twin alone measured 2.8). The surge lasts as long as tests 1-2 wait
# for their alerts, longer on a slow machine, so the drain is given time in proportion.
DRAIN_PER_SURGE_SECOND = 4.0
# The overload scenario's normal traffic before the surge, in wall seconds.
SURGE_DELAY_S = (SCENARIOS["overload"].workload.surge_after_s or 0.0) / TWIN_SPEED


@pytest.mark.timeout(400)
def test_overload_alerts_resolve_after_back_to_decode_heavy(stack: FullStack):
    since = stack.marks.get("recovered")
    if since is None:
        stack.scenario("decode-heavy", keep_backlog=True)
        since = time.monotonic()
    surge_s = max(0.0, since - stack.marks.get("overload", since) - SURGE_DELAY_S)
    fast = stack.scaled["burn_rates"][0]
    _wait(stack, lambda: stack.receiver.alerts(ENGINE_DOWN, status="resolved", since=since), 20,
          "LLMEngineDown did not resolve")

    # Recovery is read from the state, not from the first "resolved": the alerts also resolve while
    # the engine is down (their series vanish) and fire again when it is back with the backlog.
    p99_rule = f'target_model:llm_time_to_first_token_seconds:p99_{nominal(stack.scaled["rate_window"])}'

    def drained() -> bool:
        waiting, p99 = stack.value(f'llm_requests_waiting{{target="{TARGET}"}}'), stack.value(p99_rule)
        return waiting == 0.0 and p99 is not None and p99 < 5.0

    _wait(stack, drained, 30 + DRAIN_PER_SURGE_SECOND * surge_s,
          f"the backlog of a {surge_s:.0f} s surge did not drain ({p99_rule} < 5 s, nothing waiting)")

    def resolved() -> bool:
        active = {a["alertname"] for a in stack.alerts_since(0) if a.get("target") == TARGET
                  and (a["alertname"] == TTFT_P99 or (a["alertname"] == TTFT_BURN and a.get("long") == fast["long"]))}
        return (not active
                and stack.receiver.last_status(TTFT_BURN, long=fast["long"]) == "resolved"
                and stack.receiver.last_status(TTFT_P99) == "resolved"
                and bool(stack.receiver.alerts(TTFT_BURN, status="resolved", since=since, long=fast["long"]))
                and bool(stack.receiver.alerts(TTFT_P99, status="resolved", since=since)))

    _wait(stack, resolved, 40, "the TTFT page and p99 alert did not resolve once the backlog drained")


@pytest.mark.timeout(60)
def test_thermal_throttle_fires_the_slowdown_alert_and_flips_the_verdict(stack: FullStack):
    switched = time.monotonic()
    stack.scenario("thermal-throttle")
    try:
        _wait(stack, lambda: stack.receiver.alerts(SLOWDOWN, status="firing", since=switched), 40,
              "the slowdown alert did not arrive")
        alert = stack.receiver.alerts(SLOWDOWN, status="firing", since=switched)[0]
        assert alert.receiver == "/ticket" and alert.labels["severity"] == "warning"
        assert alert.labels["gpu"] == "0" and alert.labels["reason"] in stack.scaled["slowdown_reasons"]
        assert "throttled" in alert.annotations["summary"]
        _wait(stack, lambda: stack.value(f'llm_bottleneck{{target="{TARGET}",resource="power_thermal"}}') == 1.0,
              20, "the verdict did not flip to power_thermal")
        assert stack.value(f'sum(llm_bottleneck{{target="{TARGET}"}})') == 1.0  # exactly one verdict
    finally:
        stack.scenario("decode-heavy")


def _max_rate(stack: FullStack, family: str, over: str) -> float:
    w = stack.scaled["rate_window"]
    value = stack.value(f'max_over_time(rate({family}{{target="{TARGET}"}}[{w}])[{over}:1s])')
    assert value is not None and math.isfinite(value), family
    return value


@pytest.mark.timeout(60)
def test_engine_restart_resets_counters_without_a_rate_spike_or_an_alert(stack: FullStack):
    _wait(stack, lambda: stack.value(f'llm_bottleneck{{target="{TARGET}",resource="power_thermal"}}') == 0.0, 30,
          "the GPU did not cool down")
    families = ("llm_prompt_tokens_total", "llm_generation_tokens_total")
    before = {f: _max_rate(stack, f, "15s") for f in families}
    derived_before = stack.value(f'max_over_time(llm_decode_tokens_per_second{{target="{TARGET}"}}[15s])')
    firing_before = {(r.name, r.labels.get("gpu", ""), r.labels.get("long", "")) for r in stack.receiver.alerts()
                     if stack.receiver.last_status(r.name, **r.labels) == "firing"}
    # Also pending before the restart (a burn alert still counting the throttled minutes above):
    # when it fires after the restart, the restart did not cause it.
    firing_before |= {(a["alertname"], a.get("gpu", ""), a.get("long", "")) for a in stack.alerts_since(0)}
    counter_before = stack.twin_engine()["generation_tokens_total"]
    restarted_wall = time.time()
    stack.restart_engine()
    restarted = time.monotonic()
    assert stack.twin_engine()["generation_tokens_total"] < counter_before  # the twin really reset
    time.sleep(12)
    since = f"{int(time.monotonic() - restarted) + 1}s"
    assert stack.value(f'resets(llm_generation_tokens_total{{target="{TARGET}"}}[{since}])') >= 1
    for family in families:
        after = _max_rate(stack, family, since)
        assert after <= 1.5 * before[family], (
            f"{family}: rate {after:.0f}/s after the restart, {before[family]:.0f} before")
    derived_after = stack.value(f'max_over_time(llm_decode_tokens_per_second{{target="{TARGET}"}}[{since}])')
    assert derived_after <= 1.5 * derived_before, (derived_after, derived_before)
    new = [(r.name, r.labels) for r in stack.receiver.alerts(status="firing", since=restarted)
           if (r.name, r.labels.get("gpu", ""), r.labels.get("long", "")) not in firing_before]
    assert not new, new
    started = stack.alerts_since(restarted_wall)  # pending or firing, active since the restart
    assert not started, started


@pytest.mark.timeout(60)
def test_exporter_restart_loses_and_double_counts_nothing(stack: FullStack):
    passthrough = ("llm_generation_tokens_total", "llm_prompt_tokens_total", "llm_time_to_first_token_seconds_count",
                   "llm_gpu_energy_joules_total")
    time.sleep(2)  # the engine restart of the previous test stays outside the window below
    start_wall, start = time.time(), time.monotonic()
    twin_before = stack.twin_engine()["generation_tokens_total"]
    old_pid = stack.exporter_pid()
    stack.restart_exporter()
    assert stack.exporter_pid() not in (None, old_pid)
    _wait(stack, lambda: (stack.value('llm_exporter_collections_total') or 1e9) < 20
          and stack.value('up{job="llm-exporter"}') == 1.0, 20, "Prometheus did not scrape the new exporter")
    time.sleep(4)
    twin_after = stack.twin_engine()["generation_tokens_total"]
    window = f"{int(time.monotonic() - start) + 3}s"  # from just before the restart (the engine restarted >10 s ago)

    # Raw samples of the pass-through counter across the restart: never backwards, and inside
    # what the twin itself counted between the two reads around the window.
    samples = [(float(t), float(v)) for t, v in
               stack.query(f'llm_generation_tokens_total{{target="{TARGET}"}}[{window}]')[0]["values"]
               if float(t) >= start_wall]
    assert len(samples) >= 4, samples
    values = [v for _, v in samples]
    assert values == sorted(values), values
    assert twin_before <= values[0] and values[-1] <= twin_after, (twin_before, values, twin_after)
    for family in passthrough:
        assert stack.value(f"max(resets({family}[{window}]))") == 0.0, family

    # The exporter's own counters restart from zero: Prometheus sees that reset, rate() absorbs it.
    family = "llm_exporter_collections_total"
    assert stack.value(f"resets({family}[{window}])") >= 1
    rate = stack.value(f"max_over_time(rate({family}[5s])[{window}:1s])")
    assert rate is not None and rate < 3.0, rate  # ~1 collection per second, no spike
    # resets() drops __name__, so each counter family is asked on its own.
    counters = stack.query('count by (__name__) ({job="llm-exporter",__name__=~".+_total"})')
    went_back = [c["metric"]["__name__"] for c in counters
                 if not c["metric"]["__name__"].startswith("llm_exporter_")
                 and (stack.value(f'max(resets({c["metric"]["__name__"]}[{window}]))') or 0) > 0]
    assert not went_back, went_back
    derived = stack.value(f'max_over_time(llm_decode_tokens_per_second{{target="{TARGET}"}}[{window}])')
    derived_before = stack.value(
        f'max_over_time(llm_decode_tokens_per_second{{target="{TARGET}"}}[60s] offset {window})')
    assert derived is not None and derived_before is not None
    assert derived < 1.5 * derived_before, (derived, derived_before)

