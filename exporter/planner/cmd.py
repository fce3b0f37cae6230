"""`llm-exporter plan`: arguments, the sources, the table, --json and --html. docs/planner.md."""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.planner.limits import (
    MAX_BATCHED_TOKENS,
    MAX_CPU_THREADS,
    MAX_CPUS,
    MAX_NUM_SEQS,
    MAX_PRICE,
    MAX_TOKENS_PER_REQUEST,
    MAX_TP,
)
from exporter.planner.model import DTYPES, KV_DTYPES, PlanError, Setup, cpu_device, gpu_device
from exporter.planner.observe import Observed, ObserveError, observe_exporter, read_loadtest
from exporter.planner.plan import CANDIDATE_KEYS, Candidate, parse_candidate, plan
from exporter.slo import TBT, TTFT

EXIT_OK, EXIT_CONFIG = 0, 2
USAGE = """\
    llm-exporter plan --from http://127.0.0.1:9480 [--window 60s]   a running exporter
    llm-exporter plan --from loadtest.json                          a load test's report
      [--model NAME|config.json] [--gpu NAME | --cpu-threads N] [--dtype f16] [--kv-dtype f16] [--tp N]
      [--max-num-seqs N] [--candidate KEY=VALUE,...]... [--json FILE|-] [--html FILE]

Candidate keys: """ + ", ".join(f"{k} ({h})" for k, (_, h) in CANDIDATE_KEYS.items()) + """.

Exit status: 0 planned, 2 bad arguments, a bad candidate or nothing to calibrate on.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan", help="what-if planner: calibrate on the running deployment, predict other GPUs, dtypes, limits",
        description="Calibrate the twin's step cost on what the deployment did, then replay its workload under "
                    "each candidate configuration.\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, metavar="URL|FILE",
                        help="a running llm-exporter (http://...) or a load-test JSON")
    parser.add_argument("--window", default="60s", help="with an exporter: how long to observe (default 60s)")
    parser.add_argument("--target", help="with an exporter: the engine target (default: the busiest)")
    parser.add_argument("--output-tokens", dest="output_tokens", type=float, default=None,
                        help="with an exporter of an engine that counts no finished requests (llama.cpp): the "
                             "tokens each request generates")
    parser.add_argument("--model", help="model shape: a built-in name or a Hugging Face config.json (default: "
                                        "the model the source names)")
    device = parser.add_mutually_exclusive_group()
    device.add_argument("--gpu", dest="gpu_name", help="the deployment's GPU (default: the one the source names)")
    device.add_argument("--cpu-threads", dest="cpu_threads", type=int,
                        help="the deployment runs on CPU with this many engine threads (llama.cpp -t, vLLM CPU)")
    parser.add_argument("--cpu-cores", dest="cpu_cores", type=float, metavar="N",
                        help="CPUs free for a CPU engine (default: from a load test run on the engine's host, "
                             "its CPUs less the load generator's own use; else every thread gets a core)")
    parser.add_argument("--tp", type=int, default=None, help="GPUs per replica (default: the source's, else 1)")
    parser.add_argument("--dtype", default="bf16", choices=tuple(DTYPES), help="the deployment's weight dtype")
    parser.add_argument("--kv-dtype", dest="kv_dtype", default="f16", choices=tuple(KV_DTYPES),
                        help="the deployment's KV-cache dtype")
    parser.add_argument("--max-num-seqs", dest="max_num_seqs", type=int, default=256,
                        help="the deployment's running-sequence limit (vLLM --max-num-seqs, llama.cpp -np)")
    parser.add_argument("--max-batched-tokens", dest="max_batched_tokens", type=int, default=8192,
                        help="tokens per step (vLLM --max-num-batched-tokens, llama.cpp -b)")
    parser.add_argument("--gpu-price-per-hour", dest="price", type=float, default=None,
                        help="price of one GPU-hour, for the cost per million tokens")
    parser.add_argument("--candidate", action="append", default=[], metavar="KEY=VALUE,...",
                        help="a configuration to predict (repeatable; keys below)")
    parser.add_argument("--slo-ttft", dest="slo_ttft", type=float, default=TTFT.threshold_seconds,
                        help=f"TTFT SLO in seconds (default {TTFT.threshold_seconds:g})")
    parser.add_argument("--slo-tpot", dest="slo_tpot", type=float, default=TBT.threshold_seconds,
                        help=f"TPOT SLO in seconds (default {TBT.threshold_seconds:g})")
    parser.add_argument("--no-rate-search", dest="rate_search", action="store_false",
                        help="skip the search for the highest rate within the SLOs (faster)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out", metavar="FILE", help="write the plan as JSON (- for stdout)")
    parser.add_argument("--html", dest="html_out", metavar="FILE", help="write the plan as one HTML page")
    return parser


def _observe(args: argparse.Namespace) -> Observed:
    from exporter.settings import parse_duration

    source = args.source
    if source.startswith(("http://", "https://")):
        from exporter.config import ConfigError
        from exporter.targets import refuse_userinfo

        try:
            refuse_userinfo(source, "from", "")
            window = parse_duration(args.window, "window")
        except ConfigError as error:
            raise PlanError(str(error)) from None
        return asyncio.run(observe_exporter(source, window, target=args.target, output_tokens=args.output_tokens))
    return read_loadtest(source)


def check_flags(args: argparse.Namespace) -> None:
    """The flags within the planner's bounds (limits.py), each refused in one line naming it, before
    any source is read or replay sized by them."""
    ranges = (("--tp", args.tp, 1, MAX_TP), ("--max-num-seqs", args.max_num_seqs, 1, MAX_NUM_SEQS),
              ("--max-batched-tokens", args.max_batched_tokens, 1, MAX_BATCHED_TOKENS),
              ("--cpu-threads", args.cpu_threads, 1, MAX_CPU_THREADS), ("--cpu-cores", args.cpu_cores, 1, MAX_CPUS),
              ("--output-tokens", args.output_tokens, 1, MAX_TOKENS_PER_REQUEST),
              ("--gpu-price-per-hour", args.price, 0, MAX_PRICE))
    for flag, value, lo, hi in ranges:
        if value is not None and not lo <= value <= hi:  # NaN and the infinities too
            shown = f"{value:g}" if isinstance(value, float) or abs(value) < 1e15 else f"{str(value)[:12]}..."
            raise PlanError(f"{flag} {shown} is out of range: {lo:g}..{hi:g}")
    if not (0 < args.slo_ttft < 3600 and 0 < args.slo_tpot < 60):
        raise PlanError("--slo-ttft must be in (0, 3600) s and --slo-tpot in (0, 60) s")


def base_setup(args: argparse.Namespace, observed: Observed) -> Setup:
    from exporter.specs.models import UnsupportedModel, load_model

    name = args.model or observed.model
    if not name:
        raise PlanError("the source names no model: give --model NAME or --model path/config.json")
    try:
        model = load_model(name)
    except KeyError:
        raise PlanError(f"model {name!r} is not a built-in shape: give --model path/config.json") from None
    except (UnsupportedModel, OSError, ValueError) as error:
        raise PlanError(f"model {name!r}: {error}") from None
    if args.cpu_threads is not None:
        device = cpu_device(args.cpu_threads)
    elif gpu_name := args.gpu_name or observed.gpu_name:
        device = gpu_device(gpu_name)
    else:
        raise PlanError("the source names no GPU: give --gpu NAME, or --cpu-threads N for a CPU engine")
    tp = (args.tp or max(1, observed.gpu_count)) if device.kind == "gpu" else 1
    if not 1 <= tp <= MAX_TP:
        raise PlanError(f"the source sees {observed.gpu_count} GPUs, more than {MAX_TP} per replica: give --tp N")
    setup = Setup(device, model, tp=tp, max_num_seqs=args.max_num_seqs, max_batched_tokens=args.max_batched_tokens,
                  price_per_gpu_hour=args.price)
    return setup.with_dtype(args.dtype, args.kv_dtype)


def command_plan(args: argparse.Namespace, env: Mapping[str, str], out: Any = None, err: Any = None) -> int:
    from exporter.termsafe import terminal_safe

    out, err = out or sys.stdout, err or sys.stderr
    try:
        check_flags(args)
        candidates: list[Candidate] = [parse_candidate(text, i) for i, text in enumerate(args.candidate)]
        observed = _observe(args)
        base = base_setup(args, observed)
        doc = plan(observed, base, candidates, ttft_slo=args.slo_ttft, tpot_slo=args.slo_tpot, seed=args.seed,
                   search_rate=args.rate_search, cpu_cores=args.cpu_cores)
    except (PlanError, ObserveError) as error:
        print(f"llm-exporter plan: {terminal_safe(str(error))}", file=err)
        return EXIT_CONFIG
    if args.json_out == "-":
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write(render_table(doc))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
    if args.html_out:
        with open(args.html_out, "w") as f:
            f.write(render_html(doc))
    return EXIT_OK


# --- rendering -------------------------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f}%"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines) + "\n"


def render_table(doc: Mapping[str, Any]) -> str:
    from exporter.termsafe import terminal_safe

    base, cal = doc["base"], doc["calibration"]
    text = [f"Plan from {terminal_safe(str(doc['source']))}: {terminal_safe(str(base['model']))} on {base['tp']} x "
            f"{terminal_safe(str(base['device']))}\n",
            f"Calibration: bandwidth {cal['bandwidth_efficiency']} of peak, decode compute "
            f"{cal['decode_compute_efficiency']}, prefill compute {cal['prefill_compute_efficiency']}, step overhead "
            f"{_ms(cal['step_overhead_seconds'])} ms, host {_ms(cal['host_seconds_per_request'])} ms per request\n\n",
            f"Replay: {doc['replay_mode']}; the current rows and every candidate replay this way.\n\n",
            *(f"Note: {terminal_safe(note)}.\n\n" for note in doc["observed"].get("notes", ())),
            "Current configuration, predicted against observed (check these errors before trusting the rest):\n"]
    rows = []
    compared = {"ttft": "p50", "tpot": "p50"}
    for c in doc["current"]:
        o, p, e = c["observed"], c["predicted"], c["error"]
        compared = c["compared"]
        centre = {k: f"{k}_{compared[k]}_s" for k in ("ttft", "tpot")}
        rows.append([c["point"], f"{_ms(o[centre['ttft']])} / {_ms(p[centre['ttft']])}", _pct(e["ttft"]),
                     f"{_ms(o['ttft_p50_s'])} / {_ms(p['ttft_p50_s'])}",
                     f"{_ms(o['ttft_p99_s'])} / {_ms(p['ttft_p99_s'])}",
                     f"{_ms(o[centre['tpot']])} / {_ms(p[centre['tpot']])}", _pct(e["tpot"]),
                     f"{_num(o['output_tokens_per_s'])} / {_num(p['output_tokens_per_s'])}",
                     _pct(e["output_tokens_per_s"])])
    # The first column of each latency is the statistic the source measured exactly (the engine's
    # mean where it has one) and the error is on it; p50 and p99 are the source's own percentiles (a
    # load test's requests, or the exporter's histogram buckets), '-' where it has none.
    text.append(_table(["point", f"TTFT {compared['ttft']} ms obs/pred", "err", "TTFT p50 ms obs/pred",
                        "TTFT p99 ms obs/pred", f"TPOT {_tpot_statistic(compared)} ms obs/pred", "err",
                        "tok/s obs/pred", "err"], rows))
    if doc["candidates"]:
        text.append("\nCandidates:\n")
        rows = []
        for c in doc["candidates"]:
            p = c["predicted"]
            rows.append([terminal_safe(c["name"])[:40], f"{_ms(p['ttft_p50_s'])}/{_ms(p['ttft_p99_s'])}",
                         f"{_ms(p['tpot_p50_s'])}/{_ms(p['tpot_p99_s'])}", _num(p["output_tokens_per_s"]),
                         _num(p["goodput_share"], "{:.0%}"), _num(c["max_rate_within_slo_rps"], "{:.2f}"),
                         _num(c["kv"]["headroom_vs_max_num_seqs"], "{:.2f}x"),
                         _num(c["cost_per_million_tokens"], "${:.2f}"), _num(c["energy_joules_per_token"], "{:.2f}"),
                         p["verdict"]])
        text.append(_table(["candidate", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "tok/s", "goodput", "max req/s",
                            "KV headroom (x max_num_seqs)", "$/1M tok", "J/tok", "verdict"], rows))
    stopped = [(c["point"], c["predicted"]["replay_stopped"]) for c in doc["current"]]
    stopped += [(terminal_safe(c["name"])[:40], c["predicted"]["replay_stopped"]) for c in doc["candidates"]]
    for name, why in stopped:
        if why:
            text.append(f"\nNote: {name}: {why}; its figures are of what finished before.")
    text.append("\nAssumptions: " + " ".join(doc["assumptions"]) + "\n")
    return "".join(text)


# One unit per quantity on the page: latencies in ms (the table's unit), throughput in tokens/s.
HTML_UNITS = {"ms": 1000.0, "tokens/s": 1.0}


def _bars(title: str, items: Sequence[tuple[str, float | None, float | None]], unit: str) -> str:
    """An SVG of paired bars: observed (grey) and predicted (blue) per label, values in `unit` (a key
    of HTML_UNITS: the values come in seconds or tokens/s), each bar labelled with its value and unit."""
    scale = HTML_UNITS[unit]
    items = [(label, None if a is None else a * scale, None if b is None else b * scale) for label, a, b in items]
    values = [v for _, a, b in items for v in (a, b) if v is not None]
    top = max(values) if values else 1.0
    h, bar = 28 * len(items) + 30, 10
    parts = [f'<svg width="720" height="{h}" role="img" aria-label="{html.escape(title)} ({html.escape(unit)})">',
             f'<text x="0" y="14" font-size="13">{html.escape(title)} ({html.escape(unit)})</text>']
    for i, (label, obs, pred) in enumerate(items):
        y = 24 + 28 * i
        parts.append(f'<text x="0" y="{y + 14}" font-size="11">{html.escape(label[:28])}</text>')
        for j, (value, color) in enumerate(((obs, "#999"), (pred, "#36c"))):
            if value is None:
                continue
            w = 400 * value / top if top else 0
            parts.append(f'<rect x="180" y="{y + j * (bar + 1)}" width="{w:.1f}" height="{bar}" fill="{color}"/>'
                         f'<text x="{184 + w:.1f}" y="{y + j * (bar + 1) + 9}" font-size="10">'
                         f'{value:.4g} {html.escape(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _tpot_statistic(compared: Mapping[str, str]) -> str:
    """The TPOT statistic compared, in words: a mean says what it is over (requests or tokens)."""
    if compared["tpot"] != "mean":
        return compared["tpot"]
    return "mean per request" if compared.get("tpot_mean_over") == "requests" else "mean per token"


def render_html(doc: Mapping[str, Any]) -> str:
    rows = doc["current"]

    def calibration(which: str) -> tuple[str, list[tuple[str, float | None, float | None]]]:
        """The statistic each error is on (the source's mean or p50), observed against predicted."""
        kinds = {c["compared"][which] for c in rows}
        kind = kinds.pop() if len(kinds) == 1 else "p50"
        key = f"{which}_{kind}_s"
        words = _tpot_statistic(rows[0]["compared"]) if which == "tpot" and kind == "mean" and rows else kind
        return f"{which.upper()} {words}", [(c["point"], c["observed"][key], c["predicted"][key]) for c in rows]

    ttft_title, ttft = calibration("ttft")
    tpot_title, tpot = calibration("tpot")
    tps = [(c["point"], c["observed"]["output_tokens_per_s"], c["predicted"]["output_tokens_per_s"]) for c in rows]
    # The current configuration first, as the replay predicts it (blue), then every candidate.
    now = rows[-1]["predicted"] if rows else None
    def ladder(key: str) -> list[tuple[str, float | None, float | None]]:
        first = [(f"current ({rows[-1]['point']})", None, now[key])] if now else []
        return first + [(c["name"], None, c["predicted"][key]) for c in doc["candidates"]]
    body = [
        "<!doctype html><html><head><meta charset='utf-8'><title>llm-exporter plan</title>",
        "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto}pre{white-space:pre-wrap}</style>",
        "</head><body><h1>What-if plan</h1>",
        f"<p>Replay: {html.escape(str(doc.get('replay_mode', '')))}.</p>",
        *(f"<p><strong>Note:</strong> {html.escape(str(note))}.</p>" for note in doc["observed"].get("notes", ())),
        "<h2>1. Calibration: the current configuration, observed (grey) and predicted (blue)</h2>",
        "<p>Read these errors first: every prediction below inherits them.</p>",
        _bars(ttft_title, ttft, "ms"), _bars(tpot_title, tpot, "ms"), _bars("output", tps, "tokens/s"),
        "<h2>2. Candidates, predicted, beside the current configuration</h2>",
        _bars("output", ladder("output_tokens_per_s"), "tokens/s"), _bars("TTFT p50", ladder("ttft_p50_s"), "ms"),
        _bars("TPOT p50", ladder("tpot_p50_s"), "ms"),
        "<h2>Table</h2><pre>", html.escape(render_table(doc)), "</pre>",
        "<h2>JSON</h2><pre>", html.escape(json.dumps(doc, indent=2)), "</pre></body></html>\n"]
    return "".join(body)
