"""The load test's outputs: the terminal table, the JSON schema, and the one self-contained HTML page.

The page has no scripts and no external resources (air-gapped clusters, as the status page): inline
CSS and inline SVG plots of the latency percentiles and the throughput per step, each with a band
per step colored and labelled by the exporter's verdict, the SLO lines and the knee marked.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.derive.bottleneck import VERDICT_WORDS
from exporter.probe.loadtest_knee import NO_SUCCESS, dig, succeeded

# --- the JSON schema (docs/loadtest.md shows it) -------------------------------------------------

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}
_PCT = {"type": "object", "required": ["count", "mean", "p50", "p95", "p99"],
        "properties": {"count": {"type": "integer"}, "mean": _NUM, "p50": _NUM, "p95": _NUM, "p99": _NUM}}
_SERVER = {
    "type": ["object", "null"],
    "required": ["target", "polls", "poll_errors", "kv_usage_max", "preemptions", "waiting_mean", "waiting_max",
                 "running_mean", "running_max", "ttft_mean_s", "itl_mean_s", "verdict", "verdict_last", "verdicts",
                 "evidence"],
    "properties": {
        "target": _STR, "polls": {"type": "integer"}, "poll_errors": {"type": "integer"}, "error": _STR,
        "kv_usage_max": _NUM, "preemptions": _NUM, "waiting_mean": _NUM, "waiting_max": _NUM,
        "running_mean": _NUM, "running_max": _NUM, "ttft_mean_s": _NUM, "itl_mean_s": _NUM,
        "verdict": _STR, "verdict_last": _STR,
        "verdicts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "evidence": {"type": "array", "items": {"type": "string"}},
        "last_poll_error": _STR,
    },
}
_STEP = {
    "type": "object",
    "required": ["index", "mode", "level", "concurrency", "rate", "started_at", "elapsed_s", "requests", "in_flight",
                 "latency_s", "throughput", "goodput", "server", "notes"],
    "properties": {
        "index": {"type": "integer"}, "mode": {"enum": ["concurrency", "rate"]}, "level": {"type": "number"},
        "concurrency": _INT, "rate": _NUM, "started_at": {"type": "number"}, "elapsed_s": _NUM,
        "requests": {"type": "object", "required": ["ok", "failed", "failed_by_reason", "dropped", "recorded"],
                     "properties": {"ok": {"type": "integer"}, "failed": {"type": "integer"},
                                    "failed_by_reason": {"type": "object",
                                                         "additionalProperties": {"type": "integer"}},
                                    "dropped": {"type": "integer"}, "recorded": {"type": "integer"}}},
        "in_flight": {"type": "object", "required": ["max", "mean"],
                      "properties": {"max": {"type": "integer"}, "mean": _NUM}},
        "latency_s": {"type": "object", "required": ["ttft", "tpot", "itl", "e2e"],
                      "properties": {k: _PCT for k in ("ttft", "tpot", "itl", "e2e")}},
        "throughput": {"type": "object",
                       "required": ["requests_per_s", "input_tokens_per_s", "output_tokens_per_s", "input_tokens",
                                    "output_tokens"],
                       "properties": {"requests_per_s": _NUM, "input_tokens_per_s": _NUM,
                                      "output_tokens_per_s": _NUM, "input_tokens": {"type": "integer"},
                                      "output_tokens": {"type": "integer"}}},
        "goodput": {"type": "object", "required": ["good", "share", "requests_per_s"],
                    "properties": {"good": {"type": "integer"}, "share": _NUM, "requests_per_s": _NUM}},
        "server": _SERVER,
        "notes": {"type": "array", "items": {"type": "string"}},
        "client": {"type": "object", "properties": {"cpu_cores": _NUM}},
    },
}
_LIMIT: dict[str, Any] = {"type": "object", "required": ["max_concurrency", "text"],
                          "properties": {"max_concurrency": _INT, "text": {"type": "string"}}}
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "llm-exporter loadtest report",
    "type": "object",
    "required": ["schema", "config", "steps", "knee", "recommendation"],
    "properties": {
        "schema": {"const": "llm-exporter-loadtest/1"},
        "config": {"type": "object",
                   "required": ["mode", "levels", "warmup_s", "duration_s", "request_timeout_s", "slo",
                                "kv_watermark"],
                   "properties": {"mode": {"enum": ["concurrency", "rate"]},
                                  "levels": {"type": "array", "items": {"type": "number"}, "minItems": 1},
                                  "warmup_s": {"type": "number"}, "duration_s": {"type": "number"},
                                  "request_timeout_s": {"type": "number"}, "max_in_flight": _INT,
                                  "slo": {"type": "object", "required": ["ttft_s", "tbt_s"],
                                          "properties": {"ttft_s": {"type": "number"}, "tbt_s": {"type": "number"}}},
                                  "kv_watermark": {"type": "number"},
                                  "client": {"type": "object",
                                             "properties": {"cpus": _INT, "loopback_target": {"type": "boolean"}}}}},
        "steps": {"type": "array", "items": _STEP},  # empty when the sweep stopped in its first step
        "knee": {"type": ["object", "null"], "required": ["index", "level", "reasons", "verdict_before",
                                                          "verdict_at", "text"],
                 "properties": {"index": {"type": "integer"}, "level": {"type": "number"},
                                "reasons": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                                "verdict_before": _STR, "verdict_at": _STR, "text": {"type": "string"}}},
        "recommendation": {
            "type": "object", "required": ["max_concurrency", "max_num_seqs", "kv", "slo", "next_levels", "text"],
            "properties": {"max_concurrency": _INT, "max_num_seqs": _INT, "text": {"type": "string"},
                           "next_levels": {"type": "array", "items": {"type": "integer"}},
                           "kv": {**_LIMIT, "required": ["method", "max_concurrency", "kv_per_sequence", "text"],
                                  "properties": {**_LIMIT["properties"],
                                                 "method": {"enum": ["measured", "extrapolated", None]},
                                                 "kv_per_sequence": _NUM}},
                           "slo": _LIMIT}},
        "stopped": {"type": ["object", "null"], "required": ["reason", "cause", "after", "text"],
                    "properties": {"reason": {"type": "string"}, "cause": {"type": "string"},
                                   "after": {"type": "integer"}, "text": {"type": "string"}}},
        "last_failure": {"type": ["object", "null"], "required": ["reason", "status"],
                         "properties": {"reason": {"type": "string"}, "status": _INT}},
    },
}


# --- the terminal table --------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _verdicts(step: Mapping[str, Any]) -> str:
    mode, last = dig(step, "server", "verdict"), dig(step, "server", "verdict_last")
    if mode is None:
        return "-" if dig(step, "server") is None else "(none)"
    return mode if last in (None, mode) else f"{mode} (last {last})"


TABLE_COLUMNS = ("level", "ok", "fail", "TTFT p50/95/99 ms", "TPOT p50/95 ms", "ITL p50/95/99 ms", "in tok/s",
                 "out tok/s", "req/s", "good", "KV max", "preempt", "wait avg/max", "verdict (most, last)")


def table_rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for step in report["steps"]:
        lat = step["latency_s"]
        level = f"{step['level']:g}" + ("/s" if step["mode"] == "rate" else "")
        share = dig(step, "goodput", "share")
        kv = dig(step, "server", "kv_usage_max")
        rows.append((
            level, str(step["requests"]["ok"]), str(step["requests"]["failed"] + step["requests"]["dropped"]),
            "/".join(_ms(lat["ttft"][q]) for q in ("p50", "p95", "p99")),
            "/".join(_ms(lat["tpot"][q]) for q in ("p50", "p95")),
            "/".join(_ms(lat["itl"][q]) for q in ("p50", "p95", "p99")),
            _num(step["throughput"]["input_tokens_per_s"]), _num(step["throughput"]["output_tokens_per_s"]),
            _num(step["throughput"]["requests_per_s"], "{:.2f}"),
            "-" if share is None else f"{share:.0%}",
            "-" if kv is None else f"{kv:.0%}",
            _num(dig(step, "server", "preemptions")),
            f"{_num(dig(step, 'server', 'waiting_mean'), '{:.1f}')}/{_num(dig(step, 'server', 'waiting_max'))}",
            _verdicts(step)))
    return rows


def render_table(report: Mapping[str, Any]) -> str:
    """One row per step, then the knee and the recommendation."""
    rows = [TABLE_COLUMNS, *table_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if i < len(row) - 1 else cell for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                    strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.extend(_conclusion(report))
    for step in report["steps"]:
        lines.extend(f"note ({step['mode']} {step['level']:g}): {note}" for note in step.get("notes") or ())
    return "\n".join(lines) + "\n"


def _conclusion(report: Mapping[str, Any]) -> list[str]:
    """The knee and the recommendation; a sweep without one successful request has neither; a
    stopped one says why first."""
    lines = [f"stopped: {report['stopped']['text']}"] if report.get("stopped") else []
    if not succeeded(report):
        return [*lines, NO_SUCCESS]
    knee = report.get("knee")
    return [*lines, f"knee: {knee['text']}" if knee else "knee: none within the steps tested",
            f"recommendation: {report['recommendation']['text']}"]


# --- the HTML page -------------------------------------------------------------------------------

VERDICT_COLORS = {
    "idle": "#9e9e9e", "headroom": "#66bb6a", "compute": "#ef6c00", "memory_bandwidth": "#1e88e5",
    "kv_capacity": "#d81b60", "scheduler": "#8e24aa", "host_cpu": "#6d4c41", "interconnect": "#00897b",
    "power_thermal": "#e53935",
}
UNKNOWN_COLOR = "#cfd8dc"
SERIES_COLORS = ("#1565c0", "#ef6c00", "#c62828", "#2e7d32", "#6a1b9a", "#00838f")

W, H = 560, 312
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 34, 58


def _nice_max(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return 10 * exp


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def plot_svg(title: str, steps: Sequence[Mapping[str, Any]], series: Sequence[tuple[str, Sequence[float | None]]],
             unit: str, *, scale: float = 1.0, threshold: tuple[str, float] | None = None,
             knee: int | None = None) -> str:
    """A line plot, one x position per step, with a verdict band behind each step. `scale`
    multiplies values for display (1000: seconds shown in ms); `threshold` is (label, value)."""
    n = max(1, len(steps))
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    band = plot_w / n
    known = [v * scale for _, values in series for v in values if v is not None]
    # An SLO line far above every point would squash them into the floor: then it is named, not drawn.
    drawn = threshold is not None and (not known or threshold[1] * scale <= 3 * max(known))
    if threshold and drawn:
        known.append(threshold[1] * scale)
    top = _nice_max(max(known) * 1.08 if known else 1.0)

    def x(i: int) -> float:
        return LEFT + band * (i + 0.5)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - min(v, top) / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}">',
           f'<text x="{LEFT}" y="16" class="title">{_e(title)}</text>']
    for i, step in enumerate(steps):
        verdict = dig(step, "server", "verdict")
        color = VERDICT_COLORS.get(verdict or "", UNKNOWN_COLOR)
        words = VERDICT_WORDS.get(verdict, (verdict or "no verdict",))[0] if verdict else "no verdict"
        out.append(f'<rect class="band" data-verdict="{_e(verdict or "")}" x="{LEFT + band * i:.1f}" y="{TOP}" '
                   f'width="{band:.1f}" height="{plot_h}" fill="{color}" fill-opacity="0.16"/>')
        out.append(f'<text class="bandlabel" x="{x(i):.1f}" y="{TOP + 11}" text-anchor="middle" '
                   f'fill="{color}">{_e(words[:22])}</text>')
        level = f"{step['level']:g}" + ("/s" if step.get("mode") == "rate" else "")
        out.append(f'<text x="{x(i):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_e(level)}</text>')
    for k in range(5):
        v = top * k / 4
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="14" y="{TOP + plot_h / 2:.0f}" transform="rotate(-90 14 {TOP + plot_h / 2:.0f})" '
               f'text-anchor="middle">{_e(unit)}</text>')
    mode = steps[0].get("mode") if steps else "concurrency"
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h + 31}" text-anchor="middle">'
               f'{"request rate (requests/s)" if mode == "rate" else "concurrency (requests in flight)"}</text>')
    if threshold and not drawn:
        out.append(f'<text class="slolabel" x="{LEFT + plot_w - 4}" y="{TOP - 4}" text-anchor="end">'
                   f'{_e(threshold[0])}: above this scale</text>')
    elif threshold:
        label, value = threshold
        out.append(f'<line class="slo" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value * scale):.1f}" '
                   f'y2="{y(value * scale):.1f}"/>')
        out.append(f'<text class="slolabel" x="{LEFT + plot_w - 4}" y="{y(value * scale) - 4:.1f}" '
                   f'text-anchor="end">{_e(label)}</text>')
    if knee is not None and 0 <= knee < n:
        out.append(f'<line class="knee" x1="{x(knee):.1f}" x2="{x(knee):.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>')
        out.append(f'<text class="kneelabel" x="{x(knee) + 4:.1f}" y="{TOP + 26}">knee</text>')
    for s, (label, values) in enumerate(series):
        color = SERIES_COLORS[s % len(SERIES_COLORS)]
        points = [(x(i), y(v * scale)) for i, v in enumerate(values) if v is not None]
        if len(points) > 1:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                       + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        for px, py in points:
            out.append(f'<circle class="pt" data-series="{_e(label)}" cx="{px:.1f}" cy="{py:.1f}" r="3.5" '
                       f'fill="{color}"/>')
        out.append(f'<rect x="{LEFT + 8 + s * 92}" y="{H - 14}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{LEFT + 22 + s * 92}" y="{H - 9}">{_e(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _series(steps: Sequence[Mapping[str, Any]], *path: str) -> list[float | None]:
    return [dig(step, *path) for step in steps]


def plots(report: Mapping[str, Any]) -> list[str]:
    """The page's plots: TTFT, time between tokens (ITL and TPOT), throughput, goodput."""
    steps = report["steps"]
    slo = report["config"]["slo"]
    knee = (report.get("knee") or {}).get("index")
    pct = ("p50", "p95", "p99")
    return [
        plot_svg("Time to first token", steps, [(f"TTFT {q}", _series(steps, "latency_s", "ttft", q)) for q in pct],
                 "ms", scale=1000, threshold=(f"TTFT SLO {slo['ttft_s'] * 1000:g} ms", slo["ttft_s"]), knee=knee),
        plot_svg("Time between tokens", steps,
                 [*((f"ITL {q}", _series(steps, "latency_s", "itl", q)) for q in pct),
                  ("TPOT p50", _series(steps, "latency_s", "tpot", "p50"))],
                 "ms", scale=1000, threshold=(f"TBT SLO {slo['tbt_s'] * 1000:g} ms", slo["tbt_s"]), knee=knee),
        plot_svg("Throughput", steps, [("output tok/s", _series(steps, "throughput", "output_tokens_per_s")),
                                       ("input tok/s", _series(steps, "throughput", "input_tokens_per_s"))],
                 "tokens/s", knee=knee),
        plot_svg("Requests and goodput", steps, [("requests/s", _series(steps, "throughput", "requests_per_s")),
                                                 ("goodput/s", _series(steps, "goodput", "requests_per_s"))],
                 "requests/s", knee=knee),
    ]


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2933;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px}
.sub{color:#52606d}.plots{display:flex;flex-wrap:wrap;gap:12px}
.plot{border:1px solid #e4e7eb;border-radius:6px;background:#fff}
.plot text{font-size:11px;fill:#3e4c59}.plot .title{font-size:13px;font-weight:600}
.plot .grid{stroke:#e4e7eb}.plot .slo{stroke:#c62828;stroke-dasharray:6 4;stroke-width:1.5}
.plot .slolabel{fill:#c62828}.plot .knee{stroke:#111;stroke-width:2;stroke-dasharray:3 3}
.plot .kneelabel{font-weight:700;fill:#111}.plot .bandlabel{font-size:10px;font-weight:600}
table{border-collapse:collapse;font-size:12.5px}td,th{border:1px solid #e4e7eb;padding:3px 7px;text-align:right}
th{background:#f5f7fa}td.v{text-align:left}.box{background:#f5f7fa;border-left:4px solid #1565c0;padding:8px 12px}
.knee{border-left-color:#111}.chip{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
ul{margin:4px 0}
"""


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained page: config, the knee, the recommendation, plots, the table, evidence."""
    config = report["config"]
    steps = report["steps"]
    knee = report.get("knee")
    rec = report["recommendation"]
    what = ", ".join(f"{k} {config[k]}" for k in ("url", "api", "model", "workload") if config.get(k))
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>llm-exporter loadtest</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>llm-exporter loadtest</h1>",
             f'<p class="sub">{_e(what)}; {_e(config["mode"])} sweep '
             f'{_e(", ".join(f"{v:g}" for v in config["levels"]))}; warm-up {config["warmup_s"]:g}s, '
             f'{config["duration_s"]:g}s per step; SLOs TTFT {config["slo"]["ttft_s"] * 1000:g} ms, '
             f'TBT {config["slo"]["tbt_s"] * 1000:g} ms</p>',
             *([f'<p class="box knee"><b>Stopped.</b> {_e(report["stopped"]["text"])}</p>']
               if report.get("stopped") else []),
             *([f'<p class="box knee"><b>Knee.</b> {_e(knee["text"] if knee else "none within the steps tested")}</p>',
                f'<p class="box"><b>Recommendation.</b> {_e(rec["text"])}</p>'] if succeeded(report) else
               [f'<p class="box knee"><b>{_e(NO_SUCCESS[0].upper() + NO_SUCCESS[1:])}.</b></p>']),
             '<h2>Latency and throughput per step</h2><div class="plots">', *plots(report), "</div>",
             "<p>" + " ".join(f'<span class="chip" style="background:{c}"></span>{_e(VERDICT_WORDS[v][0])}&nbsp; '
                              for v, c in VERDICT_COLORS.items()) + "</p>",
             "<h2>Steps</h2><table><tr>" + "".join(f"<th>{_e(c)}</th>" for c in TABLE_COLUMNS) + "</tr>"]
    for row in table_rows(report):
        parts.append("<tr>" + "".join(f'<td{" class=v" if i == len(row) - 1 else ""}>{_e(c)}</td>'
                                      for i, c in enumerate(row)) + "</tr>")
    parts.append("</table><h2>The exporter's evidence at the end of each step</h2>")
    for step in steps:
        server = step.get("server") or {}
        level = f"{step['level']:g}" + ("/s" if step["mode"] == "rate" else "")
        head = f"{step['mode']} {level}: {server.get('verdict_last') or 'no verdict'}"
        if server.get("error"):
            head += f" (exporter: {server['error']})"
        head += "".join(f"; {note}" for note in step.get("notes") or ())
        parts.append(f"<p><b>{_e(head)}</b></p><ul>"
                     + "".join(f"<li>{_e(line)}</li>" for line in server.get("evidence") or ()) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
