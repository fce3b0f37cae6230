"""`llm-exporter loadtest`: the pure measures (percentiles, TPOT, goodput, knee, recommendation) on
hand-built data, the outputs (table, schema, HTML), and closed- and open-loop sweeps against a real
loopback streaming server with controlled delays (concurrency reached, counts exact), with a fake
exporter answering /api/v1/diagnosis and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import re
import time

import jsonschema
import pytest

from exporter.probe import loadtest as lt
from exporter.probe import loadtest_knee as lt_knee
from exporter.probe import loadtest_stats as lt_stats
from exporter.probe import loadtest_watch as lt_watch
from exporter.probe.report import REPORT_SCHEMA, plot_svg, render_html, render_table

# --- pure measures -------------------------------------------------------------------------------


def test_percentile_interpolates_between_closest_ranks():
    values = list(range(1, 101))
    assert lt_stats.percentile(values, 0.5) == pytest.approx(50.5)
    assert lt_stats.percentile(values, 0.95) == pytest.approx(95.05)
    assert lt_stats.percentile(values, 0.99) == pytest.approx(99.01)
    assert lt_stats.percentile([3.0], 0.99) == 3.0
    assert lt_stats.percentile([], 0.5) is None
    assert lt_stats.percentile([5, 1, 3], 0.5) == 3  # unsorted input
    summary = lt_stats.summarize([0.1, 0.2, 0.3, 0.4])
    assert summary.count == 4 and summary.mean == pytest.approx(0.25) and summary.p50 == pytest.approx(0.25)
    assert lt_stats.summarize([]).as_dict() == {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}


def test_tpot_is_the_mean_gap_after_the_first_token():
    assert lt_stats.tpot(ttft_s=0.5, e2e_s=1.5, completion_tokens=11) == pytest.approx(0.1)
    assert lt_stats.tpot(0.5, 0.5, 1) is None  # one token: no gap
    assert lt_stats.tpot(None, 1.0, 10) is None and lt_stats.tpot(0.5, None, 10) is None
    assert lt_stats.tpot(0.5, 1.0, None) is None


def test_goodput_needs_both_slos():
    assert lt_stats.meets_slo(0.3, 0.05, ttft_slo_s=2.5, tbt_slo_s=0.1)
    assert not lt_stats.meets_slo(3.0, 0.05, 2.5, 0.1)  # TTFT over
    assert not lt_stats.meets_slo(0.3, 0.15, 2.5, 0.1)  # TPOT over
    assert lt_stats.meets_slo(0.3, None, 2.5, 0.1)  # one token: TTFT alone
    assert not lt_stats.meets_slo(None, 0.05, 2.5, 0.1)


def test_reservoir_is_bounded_and_uniform():
    reservoir = lt_stats.Reservoir(1000, random.Random(1))
    for i in range(100_000):
        reservoir.add(float(i))
    assert len(reservoir.values) == 1000 and reservoir.seen == 100_000
    # A uniform sample of 0..99999: its median is near 50000 (rank error ~1/sqrt(1000)).
    assert 45_000 < lt_stats.percentile(reservoir.values, 0.5) < 55_000


def test_in_flight_time_weighted_mean_inside_the_window():
    flight = lt_stats.InFlight(window_start=10.0, window_end=20.0)
    flight.change(5.0, +1)  # before the window: counts from 10
    flight.change(12.0, +1)
    flight.change(18.0, -1)
    flight.change(25.0, -1)  # after: the window closes at 20
    # 1 in flight 10-12, 2 in 12-18, 1 in 18-20: (2 + 12 + 2) / 10
    assert flight.mean() == pytest.approx(1.6)
    assert flight.max == 2


def test_step_stats_counts_failures_by_reason_and_tokens_exactly():
    stats = lt_stats.StepStats(2.5, 0.1, random.Random(0), requests_cap=2, gaps_cap=3)
    good = lt.Failed("", ok=True, ttft_s=0.2, itl_s=(0.05, 0.05, 0.05), e2e_s=0.35, prompt_tokens=10,
                     completion_tokens=4)
    slow = lt.Failed("", ok=True, ttft_s=0.2, itl_s=(0.3,), e2e_s=0.5, prompt_tokens=10, completion_tokens=2)
    for outcome in (good, good, slow, lt.Failed("timeout"), lt.Failed("http_status"), lt.Failed("timeout")):
        stats.record(outcome, ended=1.0)
    assert stats.ok == 3 and stats.good == 2
    assert dict(stats.failed) == {"timeout": 2, "http_status": 1}
    assert stats.input_tokens == 30 and stats.output_tokens == 10
    assert len(stats.ttft.values) == 2 and stats.ttft.seen == 3  # the reservoir caps, the counters do not
    assert len(stats.itl.values) == 3 and stats.itl.seen == 7


# --- the exporter's readings ---------------------------------------------------------------------

METRICS = """# TYPE llm_kv_cache_usage_ratio gauge
llm_kv_cache_usage_ratio{target="a",engine="vllm",model="m",rank="0"} 0.5
llm_kv_cache_usage_ratio{target="a",engine="vllm",model="m",rank="1"} 0.6
llm_kv_cache_usage_ratio{target="b",engine="vllm",model="m",rank="0"} 0.9
llm_requests_waiting{target="a",engine="vllm",model="m"} 3
llm_requests_running{target="a",engine="vllm",model="m"} 8
llm_preemptions_total{target="a",engine="vllm",model="m"} 12
llm_time_to_first_token_seconds_sum{target="a",engine="vllm",model="m"} 4.5
llm_time_to_first_token_seconds_count{target="a",engine="vllm",model="m"} 30
llm_time_to_first_token_seconds_bucket{target="a",engine="vllm",model="m",le="+Inf"} 30
llm_requests_waiting{target="b",engine="vllm",model="m"} 99
"""


def test_read_metrics_keeps_one_target_max_kv_over_ranks():
    got = lt_watch.read_metrics(METRICS, "a")
    assert got == {"kv_usage": 0.6, "waiting": 3.0, "running": 8.0, "preemptions_total": 12.0,
                   "ttft_sum": 4.5, "ttft_count": 30.0}
    assert lt_watch.read_metrics(METRICS, "b") == {"kv_usage": 0.9, "waiting": 99.0}


def test_pick_target_prefers_the_named_then_the_busiest():
    diagnosis = {"targets": {"a": {"numbers": {"running": 1}}, "b": {"numbers": {"running": 5}}}}
    assert lt_watch.pick_target(diagnosis, None) == "b"
    assert lt_watch.pick_target(diagnosis, "a") == "a"
    assert lt_watch.pick_target(diagnosis, "zzz") is None
    assert lt_watch.pick_target({"targets": {}}, None) is None


def _poll(t, verdict, kv=None, preempt=None, waiting=None, running=None, ttft=(None, None)):
    return lt_watch.Poll(t, verdict, (f"evidence at {t}",), kv, waiting, running, preempt, ttft[0], ttft[1], None, None)


def test_server_summary_watermark_counter_reset_and_verdicts():
    polls = [_poll(0, "memory_bandwidth", 0.2, 10, 0, 4, (1.0, 10)),
             _poll(1, "memory_bandwidth", 0.5, 12, 2, 8, (2.0, 20)),
             _poll(2, "kv_capacity", 0.85, 3, 6, 8, (3.5, 30)),  # the counter restarted at 0: +3
             _poll(3, "kv_capacity", 0.7, 5, 4, 8, (4.0, 35))]
    s = lt_watch.server_summary(polls, errors=1, target="a", error=None)
    assert s["kv_usage_max"] == 0.85 and s["preemptions"] == 2 + 3 + 2
    assert s["waiting_mean"] == 3.0 and s["waiting_max"] == 6 and s["running_max"] == 8
    assert s["ttft_mean_s"] == pytest.approx(3.0 / 25)
    # A tie (2 each) goes to the later verdict; the last one and its evidence are kept.
    assert s["verdict"] == "kv_capacity" and s["verdict_last"] == "kv_capacity"
    assert s["verdicts"] == {"memory_bandwidth": 2, "kv_capacity": 2} and s["evidence"] == ["evidence at 3"]
    assert s["polls"] == 4 and s["poll_errors"] == 1
    empty = lt_watch.server_summary([], errors=3, target=None, error="exporter: timeout: x")
    assert empty["verdict"] is None and empty["kv_usage_max"] is None and empty["error"] == "exporter: timeout: x"


# --- knee and recommendation ---------------------------------------------------------------------

def step(level, *, ttft=0.2, itl=0.03, tpot=None, out=1000.0, verdict="memory_bandwidth", kv=0.3, running=None,
         ok=100, failed=0, mode="concurrency"):
    pct = lambda p50, p95: {"count": ok, "mean": p50, "p50": p50, "p95": p95, "p99": p95}  # noqa: E731
    return {"index": 0, "mode": mode, "level": level, "concurrency": level if mode == "concurrency" else None,
            "rate": level if mode == "rate" else None, "started_at": 0.0, "elapsed_s": 10.0,
            "requests": {"ok": ok, "failed": failed, "failed_by_reason": {"timeout": failed} if failed else {},
                         "dropped": 0, "recorded": ok},
            "in_flight": {"max": int(level), "mean": float(level)},
            "latency_s": {"ttft": pct(ttft / 2, ttft), "tpot": pct((tpot or itl) / 2, tpot or itl),
                          "itl": pct(itl / 2, itl), "e2e": pct(1.0, 2.0)},
            "throughput": {"requests_per_s": out / 100, "input_tokens_per_s": out, "output_tokens_per_s": out,
                           "input_tokens": int(out * 10), "output_tokens": int(out * 10)},
            "goodput": {"good": ok, "share": 1.0, "requests_per_s": out / 100},
            "server": {"target": "t", "polls": 10, "poll_errors": 0, "error": None, "kv_usage_max": kv,
                       "preemptions": 0, "waiting_mean": 0, "waiting_max": 0, "running_mean": running or level,
                       "running_max": running or level, "ttft_mean_s": None, "itl_mean_s": None,
                       "verdict": verdict, "verdict_last": verdict, "verdicts": {verdict: 10} if verdict else {},
                       "evidence": []},
            "notes": []}


def test_knee_at_the_first_tbt_crossing_names_the_verdict_change():
    steps = [step(1, itl=0.02, out=100), step(8, itl=0.05, out=700),
             step(24, itl=0.132, out=1500, verdict="kv_capacity"),
             step(32, itl=0.2, out=1600, verdict="kv_capacity")]
    knee = lt_knee.find_knee(steps, ttft_slo_s=2.5, tbt_slo_s=0.1)
    assert knee["index"] == 2 and knee["level"] == 24
    assert knee["verdict_before"] == "memory_bandwidth" and knee["verdict_at"] == "kv_capacity"
    assert knee["text"] == ("at concurrency 24 TBT (ITL) p95 crossed 100 ms (132 ms); "
                            "verdict moved memory_bandwidth -> kv_capacity")


def test_knee_from_ttft_from_tpot_without_itl_and_from_failures():
    knee = lt_knee.find_knee([step(1), step(4, ttft=3.1)], 2.5, 0.1)
    assert knee["index"] == 1 and "TTFT p95 crossed 2500 ms (3100 ms)" in knee["text"]
    assert "verdict stayed memory_bandwidth" in knee["text"]
    no_itl = step(4, tpot=0.15)
    no_itl["latency_s"]["itl"] = {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    assert "TBT (TPOT) p95 crossed 100 ms (150 ms)" in lt_knee.find_knee([step(1), no_itl], 2.5, 0.1)["text"]
    assert "20 of 100 requests failed" in lt_knee.find_knee([step(1, ok=80, failed=20)], 2.5, 0.1)["text"]


def test_knee_where_throughput_stops_rising_while_latency_rises():
    steps = [step(1, out=100, itl=0.02), step(8, out=700, itl=0.03), step(16, out=740, itl=0.06, verdict="scheduler")]
    knee = lt_knee.find_knee(steps, 2.5, 0.1)
    assert knee["index"] == 2
    assert "output throughput rose only +6% (700 -> 740 tok/s) while TPOT p50 rose" in knee["text"]
    assert knee["text"].endswith("verdict moved memory_bandwidth -> scheduler")
    # Throughput flat but latency flat too (a server already saturated at step 1 with spare SLO): no knee.
    assert lt_knee.find_knee([step(1, out=700), step(2, out=710)], 2.5, 0.1) is None


def test_recommendation_measured_from_the_kv_watermark_and_the_knee():
    steps = [step(1, kv=0.05), step(8, kv=0.4), step(16, kv=0.78), step(24, kv=0.93, itl=0.12, verdict="kv_capacity")]
    knee = lt_knee.find_knee(steps, 2.5, 0.1)
    rec = lt_knee.recommend(steps, knee)
    assert rec["kv"]["method"] == "measured" and rec["kv"]["max_concurrency"] == 16
    assert rec["slo"]["max_concurrency"] == 16
    assert rec["max_concurrency"] == 16 and rec["max_num_seqs"] == 16
    assert "set by the KV watermark and SLO knee" in rec["text"] and "--max-num-seqs 16" in rec["text"]


def test_recommendation_extrapolates_kv_when_no_step_reached_the_watermark():
    # 1% of the cache per running sequence: 0.8 at 80 sequences; the knee (none) says at least 32.
    steps = [step(1, kv=0.01), step(8, kv=0.08), step(32, kv=0.32)]
    rec = lt_knee.recommend(steps, lt_knee.find_knee(steps, 2.5, 0.1))
    assert rec["kv"]["method"] == "extrapolated" and rec["kv"]["max_concurrency"] == 80
    assert rec["kv"]["kv_per_sequence"] == pytest.approx(0.01)
    assert "linear extrapolation" in rec["kv"]["text"]
    assert rec["slo"]["max_concurrency"] == 32 and rec["slo"]["bounded"] is False
    # No knee and no step at the watermark: no limit was measured, so no number, and what to test next
    # (doubling up to the KV estimate); never "set by the SLO knee" when there was none.
    assert rec["max_concurrency"] is None and rec["max_num_seqs"] is None
    assert rec["next_levels"] == [64, 80]
    assert rec["text"].startswith("none yet: every step up to 32 met the SLOs") and "SLO knee" not in rec["text"]
    assert "--concurrency 64,80" in rec["text"]
    # A measured KV limit with no knee sets the number, and says which it is.
    steps = [step(1, kv=0.01), step(8, kv=0.5), step(32, kv=0.9)]
    rec = lt_knee.recommend(steps, lt_knee.find_knee(steps, 2.5, 0.1))
    assert rec["max_concurrency"] == 8 and "set by the KV watermark." in rec["text"]


def test_recommendation_edges():
    assert lt_knee.recommend([step(1, kv=None)], None)["kv"]["method"] is None
    first = [step(4, ttft=9.0), step(8, ttft=12.0)]
    rec = lt_knee.recommend(first, lt_knee.find_knee(first, 2.5, 0.1))
    assert rec["slo"]["max_concurrency"] is None and "test lower" in rec["slo"]["text"]
    full = [step(4, kv=0.9), step(8, kv=0.95)]
    assert "below the first step" in lt_knee.kv_recommendation(full)["text"]
    # Rate steps are sized by the sequences the engine held.
    rate = [step(1.0, mode="rate", kv=0.2, running=5), step(5.0, mode="rate", kv=0.85, running=21)]
    assert lt_knee.kv_recommendation(rate)["max_concurrency"] == 5


# --- config, workload and dataset bounds ---------------------------------------------------------

def test_sweep_config_bounds():
    lt.SweepConfig("concurrency", (1, 8, 32), warmup_s=1, duration_s=10).check()
    for bad in (lt.SweepConfig("concurrency", (1.5,), 0, 10), lt.SweepConfig("concurrency", (0,), 0, 10),
                lt.SweepConfig("rate", (0,), 0, 10), lt.SweepConfig("concurrency", (1,), 0, 601),
                lt.SweepConfig("concurrency", tuple(range(1, 40)), 0, 10),
                lt.SweepConfig("concurrency", (1,) * 30, 300, 600), lt.SweepConfig("bogus", (1,), 0, 1)):
        with pytest.raises(ValueError):
            bad.check()


def test_workload_fixed_lengths_and_dataset_cycle():
    work = lt.Workload(prompt_words=5, max_tokens=7)
    a, b = next(work), next(work)
    assert len(a.prompt.split()) == 5 and a.max_tokens == 7 and a.prompt != b.prompt  # no shared prefix
    assert a.prompt.split()[0] == f"r{work.run}x0" and b.prompt.split()[0] == f"r{work.run}x1"
    specs = [lt.RequestSpec(f"p{i}", i + 1) for i in range(3)]
    cycled = [next(d) for d in [lt.Workload(dataset=specs, seed=1)] for _ in range(6)]
    assert sorted(s.prompt for s in cycled[:3]) == ["p0", "p1", "p2"] and cycled[3:] == cycled[:3]


def test_dataset_is_bounded(tmp_path):
    good = tmp_path / "d.jsonl"
    good.write_text('{"prompt": "hi", "max_tokens": 4}\n\n{"prompt": "yo", "max_tokens": 2}\n')
    assert lt.load_dataset(str(good)) == [lt.RequestSpec("hi", 4), lt.RequestSpec("yo", 2)]
    big = tmp_path / "big.jsonl"
    big.write_text('{"prompt": "x", "max_tokens": 1}\n' * 50)
    with pytest.raises(lt.DatasetError, match="bytes, over"):
        lt.load_dataset(str(big), max_bytes=100)
    with pytest.raises(lt.DatasetError, match="more than 10 requests"):
        lt.load_dataset(str(big), max_lines=10)
    for text, match in (('{"prompt": 3}', "string"), ("nope", "not JSON"), ('{"prompt": "a", "max_tokens": 0}',
                                                                           "max_tokens"), ("", "no requests")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text + "\n")
        with pytest.raises(lt.DatasetError, match=match):
            lt.load_dataset(str(bad))
    with pytest.raises(lt.DatasetError):
        lt.load_dataset(str(tmp_path / "missing.jsonl"))


# --- outputs -------------------------------------------------------------------------------------

def _report(steps):
    knee = lt_knee.find_knee(steps, 2.5, 0.1)
    for i, s in enumerate(steps):
        s["index"] = i
    return {"schema": lt.SCHEMA_ID,
            "config": {"url": "http://x", "api": "completions", "model": "m", "workload": "w", "mode": "concurrency",
                       "levels": [s["level"] for s in steps], "warmup_s": 1.0, "duration_s": 5.0,
                       "request_timeout_s": 60.0, "max_in_flight": None, "slo": {"ttft_s": 2.5, "tbt_s": 0.1},
                       "kv_watermark": 0.8},
            "steps": steps, "knee": knee, "recommendation": lt_knee.recommend(steps, knee)}


def test_table_json_schema_and_html():
    steps = [step(1, itl=0.02, out=100, kv=0.1), step(8, itl=0.05, out=700, kv=0.5),
             step(24, itl=0.132, out=1500, verdict="kv_capacity", kv=0.9)]
    report = _report(steps)
    jsonschema.validate(json.loads(json.dumps(report)), REPORT_SCHEMA)
    table = render_table(report)
    assert table.splitlines()[0].split()[0] == "level" and len(table.splitlines()) == 2 + 3 + 3
    assert "knee: at concurrency 24" in table and "recommendation: max concurrency 8" in table
    page = render_html(report)
    assert "<script" not in page and not re.search(r'(src|href)=|url\(|@import', page)
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    # TTFT (3 series), TBT (4), throughput (2), requests/goodput (2): one point per step each.
    assert [s.count('class="pt"') for s in svgs] == [9, 12, 6, 6]
    assert all(s.count('class="band"') == 3 and s.count('class="knee"') == 1 for s in svgs)
    assert 'data-verdict="kv_capacity"' in page and "KV cache capacity" in page
    assert "max concurrency 8 per replica" in page


def test_html_escapes_server_supplied_text():
    s = step(1, verdict="<b>x</b>")
    s["server"]["evidence"] = ["<script>alert(1)</script>"]
    page = render_html(_report([s]))
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>x</b>" not in page


def test_plot_skips_missing_points():
    svg = plot_svg("t", [step(1), step(2)], [("a", [0.1, None])], "ms", scale=1000)
    assert svg.count('class="pt"') == 1 and "<polyline" not in svg


# --- sweeps against a real loopback streaming server ---------------------------------------------

class StreamServer:
    """An OpenAI-style /v1/completions streaming server on loopback: TTFT_S before the first chunk,
    GAP_S between chunks, exactly max_tokens chunks; a prompt holding FAIL gets HTTP 500. It counts
    what it served and the most requests it had in flight. It also answers as a fake exporter
    (/api/v1/diagnosis, /metrics) whose numbers follow its own load."""

    TTFT_S = 0.05
    GAP_S = 0.01

    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = self.ok = self.failed = self.preemptions = 0
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> StreamServer:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path = head.split(b" ")[:2]
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1)) if method == b"POST" else 0
            body = json.loads(await reader.readexactly(length)) if length else {}
            if path == b"/v1/completions":
                await self.complete(body, writer)
            else:
                await self.exporter(path, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def complete(self, body: dict, writer: asyncio.StreamWriter) -> None:
        if "FAIL" in body["prompt"]:
            self.failed += 1
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            await asyncio.sleep(self.TTFT_S)
            for i in range(body["max_tokens"]):
                if i:
                    await asyncio.sleep(self.GAP_S)
                writer.write(b'data: {"choices":[{"index":0,"text":" tok"}]}\n\n')
                await writer.drain()
            usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": body["max_tokens"]}
            writer.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
            await writer.drain()
            self.ok += 1
        finally:
            self.in_flight -= 1

    async def exporter(self, path: bytes, writer: asyncio.StreamWriter) -> None:
        verdict = "kv_capacity" if self.in_flight > 4 else "memory_bandwidth"
        if path == b"/api/v1/diagnosis":
            doc = {"ready": True, "targets": {"twin": {"verdict": verdict, "evidence": [f"{self.in_flight} running"],
                                                       "numbers": {"running": self.in_flight}}}}
            payload, kind = json.dumps(doc).encode(), b"application/json"
        else:
            self.preemptions += 1
            payload, kind = (f'llm_kv_cache_usage_ratio{{target="twin"}} {self.in_flight / 10}\n'
                             f'llm_requests_running{{target="twin"}} {self.in_flight}\n'
                             f'llm_requests_waiting{{target="twin"}} 0\n'
                             f'llm_preemptions_total{{target="twin"}} {self.preemptions}\n').encode(), b"text/plain"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
        await writer.drain()


async def raw_send(url: str, spec: lt.RequestSpec) -> lt.Failed:
    """A minimal streaming client: the sweep runs on any Send (the CLI's is exporter/probe/client.py)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = time.monotonic()
    payload = json.dumps({"prompt": spec.prompt, "max_tokens": spec.max_tokens, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(payload)).encode()
                 + b"\r\n\r\n" + payload)
    try:
        status = int((await reader.readline()).split()[1])
        if status != 200:
            return lt.Failed("http_status", status=status)
        times, usage = [], {}
        while line := await reader.readline():
            if line.startswith(b"data: {"):
                doc = json.loads(line[6:])
                if doc["choices"]:
                    times.append(time.monotonic())
                usage = doc.get("usage") or usage
        end = time.monotonic()
        return lt.Failed("", ok=True, status=200, ttft_s=times[0] - sent,
                         itl_s=tuple(b - a for a, b in zip(times, times[1:], strict=False)), e2e_s=end - sent,
                         prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"])
    finally:
        writer.close()


def test_closed_loop_sweep_reaches_its_concurrency_with_exact_counts():
    async def main():
        async with StreamServer() as server:
            dataset = [lt.RequestSpec("a b c", 5)] * 4 + [lt.RequestSpec("FAIL", 5)]
            config = lt.SweepConfig("concurrency", (1, 8), warmup_s=0.0, duration_s=1.5, request_timeout_s=10)
            watch = lt_watch.ExporterWatch(server.url, interval_s=0.25)
            steps_seen = []
            try:
                report = await lt.run_sweep(lambda spec: raw_send(server.url, spec), lt.Workload(dataset=dataset),
                                            config, watch=watch, progress=lambda i, n, lvl, st, done:
                                            steps_seen.append((i, done)))
            finally:
                await watch.aclose()
            return server, report, steps_seen

    server, report, progress = asyncio.run(main())
    jsonschema.validate(report, REPORT_SCHEMA)
    one, eight = report["steps"]
    # Counts are exact: with no warm-up every request the server saw is in a step.
    assert one["requests"]["ok"] + eight["requests"]["ok"] == server.ok
    assert one["requests"]["failed"] + eight["requests"]["failed"] == server.failed
    assert eight["requests"]["failed_by_reason"] == {"http_status": eight["requests"]["failed"]}
    for s in (one, eight):
        assert s["throughput"]["output_tokens"] == 5 * s["requests"]["ok"]
        assert s["throughput"]["input_tokens"] == 3 * s["requests"]["ok"]
    # Concurrency really was reached, on the client and on the server.
    assert one["in_flight"]["max"] == 1 and eight["in_flight"]["max"] == 8 and server.max_in_flight >= 7
    assert 6 < eight["in_flight"]["mean"] <= 8
    # A request is ~50 ms to the first token, then 4 gaps of ~10 ms.
    for s in (one, eight):
        lat = s["latency_s"]
        assert StreamServer.TTFT_S <= lat["ttft"]["p50"] < 0.5
        assert 0.005 < lat["itl"]["p50"] < 0.1 and 0.005 < lat["tpot"]["p50"] < 0.1
        assert lat["itl"]["count"] == 4 * s["requests"]["ok"]
        assert s["goodput"]["good"] == s["requests"]["ok"]  # all well within 2.5 s / 100 ms
    assert eight["throughput"]["output_tokens_per_s"] > 3 * one["throughput"]["output_tokens_per_s"]
    # The exporter's side, read during the steps.
    assert eight["server"]["polls"] >= 4 and eight["server"]["verdict"] == "kv_capacity"
    assert eight["server"]["running_max"] >= 5 and eight["server"]["kv_usage_max"] >= 0.5
    assert eight["server"]["preemptions"] >= 3
    assert one["server"]["verdict"] == "memory_bandwidth"
    assert (0, 1.0) in progress and (1, 1.0) in progress


def test_open_loop_rate_step_and_warmup_exclusion():
    async def main():
        async with StreamServer() as server:
            config = lt.SweepConfig("rate", (40.0,), warmup_s=0.5, duration_s=1.5, request_timeout_s=10,
                                    max_in_flight=3)
            report = await lt.run_sweep(lambda spec: raw_send(server.url, spec),
                                        lt.Workload(prompt_words=4, max_tokens=8), config)
            return server, report

    server, report = asyncio.run(main())
    (s,) = report["steps"]
    # ~40/s for 2 s against a 3-request cap (a request takes ~120 ms: at most ~25/s fit): some dropped.
    assert s["in_flight"]["max"] <= 3 and s["requests"]["dropped"] > 0
    assert s["requests"]["ok"] < server.ok  # warm-up requests were served, not recorded
    assert s["server"] is None and s["rate"] == 40.0 and s["concurrency"] is None


def test_sweep_through_the_probe_client():
    """The CLI's Send: exporter/probe/client.py's stream_completion, with usage and ignore_eos."""
    async def main():
        async with StreamServer() as server:
            send, close = lt.make_sender(server.url, api="completions", model="m", timeout_s=10)
            try:
                config = lt.SweepConfig("concurrency", (4,), warmup_s=0.0, duration_s=1.0, request_timeout_s=10)
                report = await lt.run_sweep(send, lt.Workload(prompt_words=6, max_tokens=6), config)
            finally:
                close()
            return server, report

    server, report = asyncio.run(main())
    (s,) = report["steps"]
    assert s["requests"]["ok"] == server.ok > 8 and s["requests"]["failed"] == 0
    assert s["in_flight"]["max"] == 4 and server.max_in_flight == 4
    assert s["throughput"]["output_tokens"] == 6 * server.ok and s["throughput"]["input_tokens"] == 6 * server.ok
    assert s["latency_s"]["ttft"]["p50"] >= StreamServer.TTFT_S and s["latency_s"]["itl"]["count"] == 5 * server.ok


def test_cli_arguments_are_checked(capsys):
    from exporter.cli import run

    assert run(["loadtest", "http://127.0.0.1:9", "--concurrency", "1,2.5"], {}) == 2
    assert "concurrency" in capsys.readouterr().err
    assert run(["loadtest", "http://127.0.0.1:9", "--duration", "20m"], {}) == 2
    assert run(["loadtest", "--demo", "--exporter", "http://127.0.0.1:9"], {}) == 2
    assert run(["loadtest", "http://127.0.0.1:9", "--api-key-env", "NOPE"], {}) == 2
    assert "NOPE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(["loadtest", "http://127.0.0.1:9", "--demo"], {})  # one or the other


def test_cli_against_a_loopback_server(tmp_path, capsys):
    """The whole command in-process: a server that refuses every request exits 1 with a table saying so,
    and no knee or recommendation (nothing succeeded to judge one on)."""
    from exporter.cli import run

    async def serve_and_run():
        async with StreamServer() as server:
            dataset = tmp_path / "fail.jsonl"
            dataset.write_text('{"prompt": "FAIL", "max_tokens": 3}\n')
            args = ["loadtest", server.url, "--dataset", str(dataset), "--concurrency", "2", "--warmup", "0s",
                    "--duration", "0.5s", "--json", str(tmp_path / "r.json")]
            return await asyncio.to_thread(run, args, {})

    assert asyncio.run(serve_and_run()) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    (s,) = report["steps"]
    assert s["requests"]["ok"] == 0 and s["requests"]["failed_by_reason"] == {"http_status": s["requests"]["failed"]}
    assert report["knee"] is None and report["recommendation"]["max_concurrency"] is None
    out = capsys.readouterr()
    assert "no successful request: no knee" in out.out and "knee:" not in out.out and "recommendation" not in out.out
    assert "loadtest: step 1/1 (2): 0 ok" in out.err
    assert "no request succeeded" in out.err and "HTTP 500 (Internal Server Error)" in out.err


def test_window_throughput_counts_only_tokens_inside_the_window():
    stats = lt_stats.StepStats(2.5, 0.1, random.Random(0))
    # Sent at 9, first token at 10.5, then a token every 0.5 s: tokens at 10.5, 11, ..., 12.5 (5 tokens).
    outcome = lt.Failed("", ok=True, ttft_s=1.5, itl_s=(0.5,) * 4, e2e_s=3.5, prompt_tokens=7, completion_tokens=5)
    stats.record_window(outcome, sent=9.0, ended=12.5, start=10.0, end=12.0)
    assert stats.window_output == 3 and stats.window_input == 7  # 10.5, 11, 11.5; the prompt at 10.5
    assert stats.window_done == 0  # ended after the window
    # Two tokens per chunk (usage 10 over 5 chunks): each chunk weighs 2.
    doubled = dataclasses.replace(outcome, completion_tokens=10)
    stats.record_window(doubled, sent=8.0, ended=11.5, start=10.0, end=12.0)  # tokens 9.5 .. 11.5
    assert stats.window_output == 3 + 2 * 4 and stats.window_input == 7 and stats.window_done == 1


def test_generated_prompts_differ_between_runs_so_no_run_reads_an_earlier_ones_cache() -> None:
    """Two load tests against one server: before, both sent r0, r1, ... with the same words, and the
    second's TTFT read the prefix cache (37-57 ms where the first read 510). A run number given is kept."""
    from exporter.probe.loadtest import Workload

    first, second = (Workload(prompt_words=16, max_tokens=4) for _ in range(2))
    a, b = [next(first).prompt for _ in range(5)], [next(second).prompt for _ in range(5)]
    assert first.run != second.run and not set(a) & set(b)
    assert all(len(p.split()) == 16 for p in a + b) and len(set(a)) == 5
    again = Workload(prompt_words=16, max_tokens=4, run=first.run)
    assert [next(again).prompt for _ in range(5)] == a
