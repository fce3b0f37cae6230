"""The user's story on a real engine, end to end: vLLM (CPU) with a 10-block KV cache and a seq cap
of 8 -> `llm-exporter run` -> Prometheus with the generated rules rendered at TIME_SCALE -> the
generated Alertmanager routing -> a webhook receiver in this process (tests/fullstack.py).

1. overload and KV pressure: 24 closed-loop clients over the cap of 8. One TTFT page arrives (a
   paging burn pair, the fast one at a steep burn; the slow pair joins: an update, not a new page), and the KV-full
   and standing-queue tickets, which fit how the real gauges move (usage swinging as preemptions
   free blocks, a deep queue that stands rather than grows). Every alert of the target carries
   the same identifying labels. The dashboards' queries of recording rules have data on the
   scaled stack (the rules keep their nominal names).
2. the engine killed: LLMEngineDown pages; none of the target's SLO, latency and saturation alerts
   opens a page or ticket while it is down, and none is inhibited (Alertmanager drops the resolve
   of an alert that resolves while inhibited: a KV-full ticket once stayed open that way).
3. the engine restarted, light traffic: every page and ticket that opened (one per Alertmanager
   group, as pager and ticket systems key them) is resolved at the receiver, nothing fires.

The notification timeline is printed (pytest -s, or the report on failure) for the closing note.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import pathlib
import threading
import time

import httpx
import pytest
import yaml

from exporter.slo import BURN_RATES, duration_seconds
from tests.fullstack import FullStack, LiveEngine, full_stack, logs, outage_check, timeline
from tests.live import engines
from tests.live.traffic import complete
from tests.support import wait_until

pytestmark = [pytest.mark.live, pytest.mark.timeout(26 * 60)]

TIME_SCALE = 0.02  # 1h -> 1m12s, 5m -> 6s (10s: LiveEngine.min_window_s), the KV and queue windows 10m -> 12s
CLIENTS, CAP = 24, 8
MAX_MODEL_LEN = 1024
KV_ARGS = ("--num-gpu-blocks-override", "10", "--max-model-len", str(MAX_MODEL_LEN))
# The overload must breach the shipped 2.5 s TTFT SLO on any machine. A queued request waits about
# (waiting / running) decodes, 4-5 with 24 clients over this cache: so one decode, timed alone, must
# take at least this long. 300 tokens did on these 2 cores; a faster CI machine decoded them so quickly
# that the queue drained under 2.5 s, and no TTFT page came in 240 s while the KV tickets flapped.
OVERLOAD_TOKENS, DECODE_TARGET_S = 300, 1.5
PROMPT = "You are a terse assistant that answers questions about GPU inference servers. " * 4
TTFT_BURN = "LLMTimeToFirstTokenErrorBudgetBurn"
KV_FULL, STANDING, ENGINE_DOWN = "LLMKVCacheNearlyFull", "LLMRequestQueueStanding", "LLMEngineDown"
ENGINE_SCOPED = ("slo", "latency", "saturation")
IDENTITY = ("job", "instance", "target", "engine")  # on every alert of a target; `model` where the series has it


def _wait(stack: FullStack, predicate, timeout: float, what: str) -> None:
    if not wait_until(predicate, timeout=timeout, interval=0.5):
        raise AssertionError(f"{what} within {timeout:g}s.\n{timeline(stack)}\n"
                             f"firing in Prometheus: {sorted({a['alertname'] for a in stack.firing()})}\n"
                             f"{burn_inputs(stack)}\n{logs(stack.directory)}")


BURN_INPUTS = ("target_model:llm_time_to_first_token_seconds:slo_good_ratio_rate1h",
               "target_model:llm_time_to_first_token_seconds:slo_good_ratio_rate5m",
               "target_model:llm_time_to_first_token_seconds_count:rate1h",
               "target_model:llm_time_to_first_token_seconds_count:rate5m",
               "llm_requests_running", "llm_requests_waiting")


def burn_inputs(stack: FullStack) -> str:
    """What the TTFT page reads, every 10 s since the overload began (rules at their nominal names
    over scaled windows): says why a page did not come (a good ratio too high, a window without
    first tokens, traffic under the floor)."""
    start = time.time() - (time.monotonic() - stack.marks.get("overload", stack.marks.get("start", 0)))
    lines = ["burn inputs, every 10 s since the overload:"]
    for expr in BURN_INPUTS:
        try:
            body = stack.client.get(f"{stack.prometheus}/api/v1/query_range", params={
                "query": f'{expr}{{target="{stack.target}"}}', "start": start, "end": time.time(),
                "step": 10}).json()["data"]["result"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            lines.append(f"  {expr}: {e!r}")
            continue
        for r in body:
            lines.append(f"  {expr}: " + " ".join(f"{float(v):.3g}" for _, v in r["values"]))
    return "\n".join(lines)


def _engine_alert_names(stack: FullStack) -> set[str]:
    """The alerts of an engine target (the slo, latency and saturation areas), from the rendered rules."""
    return {r["alert"] for area in ENGINE_SCOPED
            for group in yaml.safe_load((stack.directory / "rules" / f"{area}.yaml").read_text())["groups"]
            for r in group["rules"] if "alert" in r}


def _niced(engine: engines.Engine) -> engines.Engine:
    """The engine's process group at nice 5. On two cores vLLM's busy worker threads otherwise starve
    Prometheus and the exporter, which on a real deployment run elsewhere or on spare cores."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, engine.process.pid, 5)
    return engine


def overload_tokens(url: str) -> tuple[int, float]:
    """(max_tokens of the overload's requests, seconds one decode of OVERLOAD_TOKENS took alone):
    OVERLOAD_TOKENS, or more where the machine decodes them in under DECODE_TARGET_S, up to what the
    model length leaves after the prompt."""
    c = complete(url, f"{PROMPT} Question 0-0: why is TTFT high?", max_tokens=OVERLOAD_TOKENS, timeout=120)
    assert c.status == 200 and c.completion_tokens and c.prompt_tokens, c
    room = MAX_MODEL_LEN - c.prompt_tokens - 16  # the clients' question numbers vary by a few tokens
    need = math.ceil(OVERLOAD_TOKENS * DECODE_TARGET_S / c.seconds)
    return max(OVERLOAD_TOKENS, min(need, room)), round(c.seconds, 2)


class ClosedLoop:
    """CLIENTS users, each sending the next request when the last one ended, until stop()."""

    def __init__(self, url: str, max_tokens: int = OVERLOAD_TOKENS) -> None:
        self.url, self.done, self.failed, self.max_tokens = url, 0, 0, max_tokens
        self.halt = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=CLIENTS)
        self.futures = [self.pool.submit(self._user, i) for i in range(CLIENTS)]

    def _user(self, i: int) -> None:
        n = 0
        while not self.halt.is_set():
            n += 1
            try:
                ok = complete(self.url, f"{PROMPT} Question {i}-{n}: why is TTFT high?", max_tokens=self.max_tokens,
                              stream=i % 2 == 0, timeout=120).status == 200
            except OSError:
                ok = False
                self.halt.wait(0.5)
            self.done, self.failed = self.done + ok, self.failed + (not ok)

    def stop(self) -> None:
        self.halt.set()
        self.pool.shutdown(wait=False, cancel_futures=True)


def verdict_shares(stack: FullStack, since_wall: float) -> dict[str, float]:
    """Share of the 2 s steps since `since_wall` that each resource was the verdict."""
    body = stack.client.get(f"{stack.prometheus}/api/v1/query_range", params={
        "query": f'llm_bottleneck{{target="{stack.target}"}} == 1', "start": since_wall, "end": time.time(),
        "step": 2}).json()["data"]["result"]
    counts = {r["metric"]["resource"]: len(r["values"]) for r in body}
    total = sum(counts.values()) or 1
    return {k: round(v / total, 2) for k, v in sorted(counts.items())}


def health(stack: FullStack, since_wall: float) -> dict:
    """How the pipeline itself kept up during the story: the verdict sequence, exporter scrapes
    failed or slow, engine scrapes failed (the exporter's view)."""
    span = f"{max(5, int(time.time() - since_wall))}s"
    body = stack.client.get(f"{stack.prometheus}/api/v1/query_range", params={
        "query": f'llm_bottleneck{{target="{stack.target}"}} == 1', "start": since_wall, "end": time.time(),
        "step": 2}).json()["data"]["result"]
    points = sorted((float(t), r["metric"]["resource"]) for r in body for t, _ in r["values"])
    sequence = [v for i, (_, v) in enumerate(points) if i == 0 or points[i - 1][1] != v]
    return {"verdicts": sequence,
            "exporter_scrapes_failed": stack.value(f'count_over_time((up{{job="llm-exporter"}} == 0)[{span}:1s])'),
            "exporter_scrape_max_s": stack.value(f'max_over_time(scrape_duration_seconds[{span}])'),
            "engine_down_cycles": stack.value(
                f'count_over_time((llm_engine_up{{target="{stack.target}"}} == 0)[{span}:2s])')}


def _dashboard_queries_of_recording_rules(stack: FullStack) -> tuple[list[str], list[str]]:
    """(queries of recording rules with data, without) over every dashboard panel: with data at one of
    the last few evaluation instants (a busy engine's page can miss a cycle, and a scaled 6 s window
    then holds a gap)."""
    from tests.test_dashboards_live import all_queries, substitute

    with_data, empty = [], []
    instance = stack.exporter.removeprefix("http://")
    for _, _, _, expr in all_queries():
        if "target_model:" not in expr:
            continue
        concrete = substitute(expr, instance=instance, model=".*").replace('"demo-0"', f'"{stack.target}"')
        now = time.time()
        found = any(stack.client.get(f"{stack.prometheus}/api/v1/query",
                                     params={"query": concrete, "time": now - back}).json()["data"]["result"]
                    for back in (0, 3, 6, 9))
        (with_data if found else empty).append(expr)
    return with_data, empty


def test_vllm_story_one_page_per_breach_kv_and_queue_tickets_engine_down_pages_once_all_resolve(
        tmp_path: pathlib.Path) -> None:
    engines.install_all()
    port = engines.free_port()
    engine = _niced(engines.start_vllm(port, log_dir=tmp_path, extra_args=KV_ARGS))
    load: ClosedLoop | None = None
    try:
        with full_stack(tmp_path / "stack", live=LiveEngine(port), time_scale=TIME_SCALE) as stack:
            target, rx, scaled = stack.target, stack.receiver, stack.scaled
            slow = scaled["burn_rates"][1]
            stack.marks["start"] = time.monotonic()
            for i in range(3):  # a healthy baseline: nothing pages
                assert complete(engine.base_url, f"baseline {i}", max_tokens=8).status == 200
            max_tokens, lone_decode_s = overload_tokens(engine.base_url)
            time.sleep(3)
            assert not rx.alerts(status="firing"), timeline(stack)

            # 1. Overload with KV pressure.
            overload, overload_wall = time.monotonic(), time.time()
            stack.marks["overload"] = overload
            load = ClosedLoop(engine.base_url, max_tokens)
            _wait(stack, lambda: rx.alerts(TTFT_BURN, status="firing", since=overload), 240, "no TTFT page")
            first_page = rx.alerts(TTFT_BURN, status="firing", since=overload)[0]
            _wait(stack, lambda: rx.alerts(KV_FULL, status="firing", since=overload)
                  and rx.alerts(STANDING, status="firing", since=overload), 120,
                  "the KV-full and standing-queue tickets did not arrive")
            # Keep the breach going until the slow pair takes the page over (an update of the group).
            _wait(stack, lambda: any(n.status == "firing" and (slow["long"], "firing") in n.alerts
                                     for n in rx.notified(TTFT_BURN, since=overload)), 120,
                  "the slow burn pair never joined the page")
            time.sleep(10)  # a few more group intervals of the breach, where flips used to re-notify
            breach = rx.notified(TTFT_BURN, since=overload, target=target)
            pages = rx.pages(TTFT_BURN, since=overload, target=target, receiver="/pager")
            # The verdicts since the KV ticket arrived, by share of time (before it, the baseline's idle
            # may still hold: it must lose 3 cycles in a row first).
            kv_wall = time.time() - (time.monotonic() - rx.alerts(KV_FULL, status="firing", since=overload)[0].at)
            verdicts = verdict_shares(stack, kv_wall)
            with_data, empty = _dashboard_queries_of_recording_rules(stack)
            report = {"overload_max_tokens": max_tokens, "lone_decode_s": lone_decode_s,
                      "ttft_page_s": round(first_page.at - overload, 1),
                      "kv_full_s": round(rx.alerts(KV_FULL, status="firing", since=overload)[0].at - overload, 1),
                      "standing_s": round(rx.alerts(STANDING, status="firing", since=overload)[0].at - overload, 1),
                      "ttft_notifications": len(breach), "ttft_pages": len(pages), "verdicts": sorted(verdicts),
                      "requests": load.done, "recording_rule_panels": (len(with_data), len(empty)),
                      "pipeline": health(stack, overload_wall)}
            assert len(pages) == 1, f"{report!s}\n{timeline(stack)}"
            assert len(breach) <= 6, f"the page was re-sent as the windows moved: {report}\n{timeline(stack)}"
            # A paging (critical) pair opens the page. Which one depends on how hard the machine lets the
            # overload burn: a steep burn crosses the fast pair's 14.4x, a milder one only the slow pair's
            # 6x (a loaded clean-clone run had only the slow pair, whose ticket-free page is as valid).
            paging = {b["long"] for b in scaled["burn_rates"] if b["severity"] == "critical"}
            assert pages[0].receiver == "/pager" and any((long, "firing") in pages[0].alerts for long in paging), \
                f"{report}\n{timeline(stack)}"
            for name in (KV_FULL, STANDING):
                ticket = rx.alerts(name, status="firing", since=overload)[0]
                assert ticket.receiver == "/ticket" and ticket.labels["severity"] == "warning", ticket
            # Mostly the KV cache, the seq cap it forces, or (vLLM on the CPU, two cores shared with
            # the clients and the monitoring: the CPU is this engine's compute) the host CPU; never idle
            # once the baseline's idle has given way. A cycle that reads the engine late on a busy
            # machine can show something else briefly: reported, not failed.
            sequence = report["pipeline"]["verdicts"]
            settled = sequence[1:] if sequence[:1] == ["idle"] else sequence
            busy = {k: v for k, v in verdicts.items() if k != "idle"}
            top = max(busy, key=busy.get) if busy else None
            report["verdict_shares"] = verdicts
            assert top in ("kv_capacity", "scheduler", "host_cpu") and "idle" not in settled, str(report)
            # Panels on recording rules read the nominal names (rate5m over 6s here): most have data.
            assert len(with_data) > 2 * len(empty), (report, empty)
            engine_alerts = _engine_alert_names(stack)
            for r in rx.alerts(status="firing"):
                if r.name in engine_alerts or r.name == ENGINE_DOWN:
                    missing = [k for k in (*IDENTITY, *(("model",) if r.name in engine_alerts else ()))
                               if not r.labels.get(k)]
                    assert not missing, f"{r.name} lacks {missing}: {r.labels}"

            # 2. The engine killed while the overload still burns. What Prometheus already had pending
            # or firing may still arrive during the outage; nothing else may open.
            outage = outage_check(stack, engine_alerts, target, overload)
            killed = time.monotonic()
            load.stop()
            engine.stop()
            _wait(stack, lambda: rx.alerts(ENGINE_DOWN, status="firing", since=killed), 30, "no LLMEngineDown page")
            down = rx.alerts(ENGINE_DOWN, status="firing", since=killed)[0]
            report["engine_down_s"] = round(down.at - killed, 1)
            assert down.receiver == "/pager" and down.labels["target"] == target

            # The outage is one page: none of the target's alerts opens a page or ticket while the
            # engine is down (resolves and updates of those already open may arrive), and none is
            # inhibited, so those resolves reach the receiver.
            report["active_during_outage"] = sorted({a["labels"]["alertname"] for a in stack.am_alerts()
                                                     if a["labels"]["alertname"] in engine_alerts
                                                     and a["labels"].get("target") == target})
            assert not (breaches := outage()), f"while {ENGINE_DOWN} fires: {breaches}\n{timeline(stack)}"
            time.sleep(4)
            assert not (breaches := outage()), f"while the engine was down: {breaches}\n{timeline(stack)}"

            # 3. Restart, light traffic, everything resolves.
            restarted = time.monotonic()
            engine = _niced(engines.start_vllm(port, log_dir=tmp_path, extra_args=KV_ARGS))
            report["restart_ready_s"] = round(time.monotonic() - restarted, 1)
            _wait(stack, lambda: stack.value(f'llm_engine_up{{target="{target}"}}') == 1.0, 30, "engine not up again")

            # Up, and no request finished in the window since (the exporter's window is scaled like the
            # rules', and the old process's requests left it while the engine restarted): the SLOs say
            # so instead of degrading the target, as the rules see nothing to burn either.
            def diagnosis() -> dict:
                return stack.client.get(f"{stack.exporter}/api/v1/diagnosis").json()["targets"].get(target, {})

            _wait(stack, lambda: (diagnosis().get("slo") or {}).get("ttft", {}).get("state") == "no_recent_traffic",
                  20, "the TTFT SLO did not say no recent traffic after the restart")
            after = diagnosis()
            assert after["status"] != "degraded" or not any("SLO" in why for why in after["degraded_because"]), after
            report["after_restart"] = after["slo"]["ttft"]["words"]
            for i in range(4):
                assert complete(engine.base_url, f"after restart {i}", max_tokens=8).status == 200

            def all_resolved() -> bool:
                still = [a for a in stack.alerts_since(0) if a.get("target") == target]
                return not still and not rx.open_groups()

            # The slow-burn ticket (3d/6h pair) may still open after the restart (on a busy machine the
            # overload finishes enough requests to clear the pair's traffic floor): the overload's errors,
            # and any slow request just sent, stay in its short window (6h, scaled) for that long, as they
            # would in production; the condition clears once they leave it, and the rule keeps firing
            # for one more short window (keep_firing_for). A CI run that waited only short + `for` saw
            # the ticket still firing. So wait for both windows, counted from the last request.
            slow = max(BURN_RATES, key=lambda b: duration_seconds(b.short))
            keep = duration_seconds(slow.short) if stack.scaled["burn_keep_firing"] else 0
            settle_s = 150 + (duration_seconds(slow.short) + keep) * TIME_SCALE
            _wait(stack, all_resolved, settle_s, "not every alert resolved after the restart")
            report["resolved_after_restart_s"] = round(time.monotonic() - restarted, 1)
            # One page (the slow-burn tickets, 1d/2h and 3d/6h, may open after it resolved: tickets).
            assert len(rx.pages(TTFT_BURN, since=overload, target=target, receiver="/pager")) == 1, timeline(stack)
            print("live story:", report)
            print(timeline(stack))
            print(burn_inputs(stack))
    finally:
        if load is not None:
            load.stop()
        engine.stop()
