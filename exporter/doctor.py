"""`llm-exporter doctor`: where is the bottleneck, as a terminal report.

    llm-exporter doctor --url http://HOST:9480           ask a running exporter (/api/v1/diagnosis)
    llm-exporter doctor --engine http://HOST:8000/metrics --duration 10s [--model llama-3.1-8b]
                                                          sample an engine directly for a short window
    add --json for machines.

Exit status: 0 healthy (every target at its own roof or idle, SLOs met), 1 degraded (a constraint
such as KV capacity, host CPU, interconnect or throttling limits a target, an SLO is missed, or a
target is unreachable), 3 cannot tell (no answer, no targets, or not enough data yet). 2 stays
the usual status for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import httpx

from exporter.config import GPU_BACKENDS, ConfigError, load_config, parse_duration, redact_url

EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_CONFIG = 2
EXIT_UNKNOWN = 3
STATUS_EXIT = {"healthy": EXIT_HEALTHY, "degraded": EXIT_DEGRADED}

VERDICT_WORDS = {
    "idle": "idle (waiting for work)", "compute": "compute (tensor FLOPS, prefill)",
    "memory_bandwidth": "HBM bandwidth (decode)", "kv_capacity": "KV cache capacity",
    "host_cpu": "host CPU", "interconnect": "interconnect (PCIe/NVLink)",
    "power_thermal": "power / thermal throttling",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "doctor", help="say where the bottleneck is: ask an exporter or sample an engine",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running llm-exporter (reads /api/v1/diagnosis)")
    where.add_argument("--engine", dest="engines", action="append", metavar="URL[,kind=K][,name=N]",
                       help="engine /metrics URL to sample directly; repeat for several")
    parser.add_argument("--duration", default="10s", help="sampling window with --engine (default 10s)")
    parser.add_argument("--interval", default="1s", help="sampling interval with --engine (default 1s)")
    parser.add_argument("--model", help="model shape: a built-in name or a config.json path")
    parser.add_argument("--tensor-parallel", dest="tensor_parallel", help="GPUs per engine replica")
    parser.add_argument("--gpu-backend", dest="gpu_backend", choices=GPU_BACKENDS, default="auto",
                        help="GPU source with --engine (default auto: NVML when present)")
    parser.add_argument("--no-host", dest="host_enabled", action="store_const", const=False,
                        help="do not read the host's CPU and PCIe state with --engine")
    parser.add_argument("--slo-ttft", dest="slo_ttft", help="TTFT SLO threshold (default 2.5s)")
    parser.add_argument("--slo-tbt", dest="slo_tbt", help="time-between-tokens SLO threshold (default 100ms)")
    parser.add_argument("--timeout", default="5s", help="HTTP timeout with --url (default 5s)")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    return parser


# --- getting a diagnosis ----------------------------------------------------------------------

def fetch_diagnosis(url: str, timeout_s: float) -> dict[str, Any]:
    """GET <exporter>/api/v1/diagnosis. Raises RuntimeError with a readable reason."""
    endpoint = url.rstrip("/") + "/api/v1/diagnosis"
    try:
        response = httpx.get(endpoint, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise RuntimeError(f"cannot reach {endpoint}: {type(error).__name__}: {error}") from None
    if response.status_code != 200:
        raise RuntimeError(f"{endpoint} answered HTTP {response.status_code}")
    try:
        doc = response.json()
    except ValueError:
        raise RuntimeError(f"{endpoint} did not answer JSON (is it an llm-exporter?)") from None
    if not isinstance(doc, dict):
        raise RuntimeError(f"{endpoint} answered an unexpected document")
    return doc


async def sample_engines(config: Any, duration_s: float) -> dict[str, Any]:
    """Run the exporter's own sources, collector and deriver in-process for `duration_s`."""
    from exporter.app import build_sources, make_collector

    sources = build_sources(config)
    collector = make_collector(config, sources)
    try:
        deadline = time.monotonic() + duration_s
        while True:
            started = time.monotonic()
            await collector.collect_once()
            if started + config.interval_s > deadline:
                break
            await asyncio.sleep(max(0.0, config.interval_s - (time.monotonic() - started)))
    finally:
        await collector.close()
    return collector.derive.diagnosis()  # type: ignore[attr-defined]


# --- the report -------------------------------------------------------------------------------

def exit_code(diagnosis: Mapping[str, Any]) -> int:
    if not diagnosis.get("ready", False):
        return EXIT_UNKNOWN
    return STATUS_EXIT.get(str(diagnosis.get("status")), EXIT_UNKNOWN)


def _scores_line(scores: Mapping[str, float]) -> str:
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {value:.2f}" for name, value in ranked)


def render_report(diagnosis: Mapping[str, Any], source: str, out: TextIO) -> None:
    status = str(diagnosis.get("status", "unknown"))
    out.write(f"llm-exporter doctor: {source}\nstatus: {status.upper()}\n")
    targets = diagnosis.get("targets", {}) or {}
    for name in sorted(targets):
        t = targets[name]
        verdict = t.get("verdict")
        what = " ".join(x for x in (t.get("engine"), t.get("model")) if x)
        out.write(f"\ntarget {name}" + (f" ({what})" if what else "") + "\n")
        out.write(f"  bottleneck: {VERDICT_WORDS.get(verdict or '', 'cannot tell yet')}")
        out.write(f"   [{t.get('status', 'unknown')}]\n")
        for reason in t.get("degraded_because", []) or []:
            out.write(f"  degraded: {reason}\n")
        if t.get("evidence"):
            out.write("  why:\n")
            for line in t["evidence"]:
                out.write(f"    - {line}\n")
        if t.get("remedies"):
            out.write("  first things to try:\n")
            for i, line in enumerate(t["remedies"], 1):
                out.write(f"    {i}. {line}\n")
        if t.get("scores"):
            out.write(f"  scores: {_scores_line(t['scores'])}\n")
        for line in t.get("omitted", []) or []:
            out.write(f"  not shown: {line}\n")
    for down in diagnosis.get("unreachable", []) or []:
        out.write(f"\ntarget {down.get('target')}: UNREACHABLE ({down.get('reason')})\n")
    for note in diagnosis.get("notes", []) or []:
        out.write(f"\nnote: {note}\n")
    if not targets and not diagnosis.get("unreachable"):
        out.write("\nno targets to diagnose\n")


def _engine_config(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    flags = {"engines": args.engines, "interval": args.interval, "model": args.model,
             "tensor_parallel": args.tensor_parallel, "gpu_backend": args.gpu_backend,
             "host_enabled": args.host_enabled, "slo_ttft": args.slo_ttft, "slo_tbt": args.slo_tbt,
             "log_level": "error"}
    return load_config(flags, env)


def command_doctor(args: argparse.Namespace, env: Mapping[str, str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.url:
            source = f"{redact_url(args.url)} (exporter)"
            diagnosis = fetch_diagnosis(args.url, parse_duration(args.timeout, "timeout"))
        else:
            config = _engine_config(args, env)
            duration = parse_duration(args.duration, "duration")
            source = ", ".join(redact_url(t.url) for t in config.engines) + f" (sampled for {duration:g}s)"
            diagnosis = asyncio.run(sample_engines(config, duration))
    except ConfigError as error:
        print(f"llm-exporter doctor: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except RuntimeError as error:
        if args.json:
            json.dump({"status": "unknown", "exit_code": EXIT_UNKNOWN, "error": str(error)}, out, indent=2)
            out.write("\n")
        else:
            out.write(f"llm-exporter doctor: cannot tell: {error}\n")
        return EXIT_UNKNOWN
    code = exit_code(diagnosis)
    try:
        if args.json:
            json.dump({"status": diagnosis.get("status", "unknown"), "exit_code": code, "source": source,
                       "diagnosis": diagnosis}, out, indent=2, default=str)
            out.write("\n")
        else:
            render_report(diagnosis, source, out)
        out.flush()
    except BrokenPipeError:
        pass  # `doctor | head`: the reader left; the exit status still says what was found
    return code
