"""Capture a live engine's /metrics page after real traffic: `python -m tests.live.capture vllm|llamacpp`.

Starts the engine from the cache (tests/live/engines.py), reads its idle page, drives a handful of
completions (non-streaming, streaming, chat, a burst over the seq/slot cap sharing a long prefix, one client
abort), then writes `tests/fixtures/live/<fixture_tag>__live.prom` and prints a JSON summary: ready time,
/v1/models, the families on the idle and the live page, and which ones only traffic made appear.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

from tests.live import engines
from tests.live.tiny_models import TEXT
from tests.live.traffic import burst, complete, get_json

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "live"
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)", re.M)

# Long enough (about 300 tokens) to fill two of vLLM's 128-token CPU KV blocks: prefix caching only reuses
# whole blocks, and a 30-token system prompt gave 0 hits. llama.cpp reuses any common prefix in a slot.
SHARED_PREFIX = (
    "You are a careful assistant for operators of a large language model server. Answer briefly, name the "
    "metric you read, and say what limits throughput. Background: " + " ".join(TEXT.split()[:260]) + "\n"
)
QUESTIONS = [
    "Why is the time to first token high?",
    "What does a preemption cost?",
    "When does prefix caching help?",
    "Is the cache full?",
    "Should I add replicas?",
    "What is the decode rate?",
    "Why do requests wait?",
    "Is the host processor saturated?",
    "What does the queue time histogram show?",
    "How many requests are running?",
    "What is the prompt throughput?",
    "Where does the latency go?",
]


def families(page: str) -> dict[str, str]:
    """Family name -> type, from the page's # TYPE lines."""
    return dict(_TYPE.findall(page))


def sampled_families(page: str) -> set[str]:
    """The families that have at least one sample: a labelled family with no child yet shows its # TYPE
    line alone (prometheus_client), which is not the same as a series being there."""
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in page.splitlines() if line and line[0] != "#"}
    suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created", "_info")
    return {f for f in families(page) if any(f + s in names for s in suffixes)}


def drive(base_url: str) -> list[dict]:
    """The traffic both captures share; returns what each step saw, for the fixture README."""
    steps: list[dict] = []

    def record(label: str, results) -> None:
        results = results if isinstance(results, list) else [results]
        steps.append({
            "step": label,
            "requests": len(results),
            "statuses": sorted({r.status for r in results}),
            "prompt_tokens": sum(r.prompt_tokens or 0 for r in results),
            "completion_tokens": sum(r.completion_tokens or 0 for r in results),
            "aborted": sum(r.aborted for r in results),
            "seconds": round(max(r.seconds for r in results), 2),
        })

    record("completion, not streamed", [complete(base_url, f"Tell me about metric {i}.", max_tokens=16)
                                        for i in range(3)])
    record("completion, streamed", [complete(base_url, f"Stream a note about cache block {i}.", max_tokens=16,
                                             stream=True) for i in range(3)])
    record("chat, not streamed", complete(base_url, messages=[{"role": "user", "content": "What is a KV cache?"}],
                                          max_tokens=16))
    record("chat, streamed", complete(base_url, messages=[{"role": "user", "content": "Explain queueing."}],
                                      max_tokens=16, stream=True))
    # 12 at once is over vLLM's --max-num-seqs 8 and llama.cpp's 4 slots, and the shared system prompt gives
    # the prefix caches something to hit.
    record("burst of 12 with a shared prefix, not streamed",
           burst(base_url, [SHARED_PREFIX + q for q in QUESTIONS], max_tokens=48))
    record("burst of 12 with a shared prefix, streamed",
           burst(base_url, [SHARED_PREFIX + q for q in reversed(QUESTIONS)], max_tokens=48, stream=True))
    record("client abort after 3 chunks", complete(base_url, SHARED_PREFIX + "Abort me.", max_tokens=200,
                                                   stream=True, abort_after_chunks=3))
    return steps


# vLLM declares its roofline counters (estimated_flops/read/write_bytes_per_gpu) always, but counts only
# with this flag; the capture turns it on so the fixture holds real values.
CAPTURE_EXTRA_ARGS = {"vllm": ("--enable-mfu-metrics",), "llamacpp": ()}


def capture(which: str, *, out_dir: pathlib.Path = FIXTURES, settle_s: float = 2.0) -> dict:
    release = engines.VLLM if which == "vllm" else engines.LLAMACPP
    start = engines.start_vllm if which == "vllm" else engines.start_llamacpp
    port = engines.free_port()
    summary: dict = {"engine": release.key, "fixture_tag": release.fixture_tag}
    with start(port, extra_args=CAPTURE_EXTRA_ARGS[which]) as engine:
        summary["ready_seconds"] = engine.ready_seconds
        summary["command"] = engine.process.args
        idle = engines.http_get(engine.base_url + "/metrics")[1].decode()
        summary["v1_models"] = get_json(engine.base_url, "/v1/models")[1]
        summary["traffic"] = drive(engine.base_url)
        # Engines publish some series once per step or per logging interval: let the last step land.
        time.sleep(settle_s)
        status, body = engines.http_get(engine.base_url + "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        live = body.decode()
        summary["log"] = str(engine.log_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{release.fixture_tag}__live.prom"
    path.write_text(live)
    idle_f, live_f = families(idle), families(live)
    summary["page"] = str(path)
    summary["families_live"] = live_f
    summary["families_only_after_traffic"] = sorted(set(live_f) - set(idle_f))
    summary["families_only_idle"] = sorted(set(idle_f) - set(live_f))
    # Declared on the idle page but with no sample until traffic made one.
    summary["samples_only_after_traffic"] = sorted(sampled_families(live) - sampled_families(idle))
    summary["declared_without_samples_live"] = sorted(set(live_f) - sampled_families(live))
    if which == "vllm":
        info = [ln for ln in live.splitlines() if ln.startswith("vllm:cache_config_info")]
        summary["cache_config_info"] = info
    return summary


def llamacpp_without_metrics() -> dict:
    """What /metrics answers when llama-server runs without --metrics (the doctor must explain it)."""
    port = engines.free_port()
    with engines.start_llamacpp(port, metrics=False) as engine:
        status, body = engines.http_get(engine.base_url + "/metrics")
    return {"status": status, "body": body.decode(errors="replace")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.live.capture", description=__doc__.split("\n")[0])
    parser.add_argument("engine", choices=("vllm", "llamacpp", "llamacpp-no-metrics"))
    parser.add_argument("--out", type=pathlib.Path, default=FIXTURES)
    args = parser.parse_args(argv)
    if args.engine == "llamacpp-no-metrics":
        print(json.dumps(llamacpp_without_metrics(), indent=2))
    else:
        print(json.dumps(capture(args.engine, out_dir=args.out), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
