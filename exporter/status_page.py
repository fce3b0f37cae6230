"""The status page at `/`: the verdict, its evidence and the numbers behind it, server-rendered.

Plain HTML with inline CSS and inline SVG, no scripts and no external assets (the exporter runs in
air-gapped clusters); a meta refresh keeps it live. Input is the JSON-ready dict of
Deriver.diagnosis(), so the page shows exactly what /api/v1/diagnosis says.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.catalog.derived import RESOURCES
from exporter.derive.bottleneck import UNKNOWN_VERDICT_WORDS, VERDICT_WORDS, pct
from exporter.slo import latency_text

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f5f6f8;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;flex-wrap:wrap;gap:4px 20px;align-items:baseline}
header h1{font-size:18px;margin:0}header a{color:#9cc3ff}
main{padding:16px 20px;display:grid;gap:16px}
section.target{background:#fff;border-radius:8px;padding:14px 18px;box-shadow:0 1px 3px #0002}
h2{margin:0 0 8px;font-size:17px}h3{font-size:14px;margin:12px 0 4px;color:#445}
.verdict{display:inline-block;padding:3px 10px;border-radius:12px;font-weight:600;color:#fff}
.healthy{background:#2e7d32}.degraded{background:#c62828}.unknown{background:#757575}.unhealthy{background:#6a1b9a}
.faults{border-left:4px solid #6a1b9a;background:#f6effa;padding:6px 12px;margin:8px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:12px}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right}th{color:#556;font-weight:500}
td:first-child,th:first-child{text-align:left}
table.tails td,.nw{white-space:nowrap}.grid>div{min-width:0;overflow-x:auto}
.bar{background:#e4e7ec;border-radius:4px;height:12px;width:160px;display:inline-block;vertical-align:middle}
.bar span{display:block;height:12px;border-radius:4px;background:#3b6fd8}
.bar span.hot{background:#c62828}
ul{margin:4px 0;padding-left:20px}.muted{color:#667}
.gpus{display:flex;flex-wrap:wrap;gap:10px}.gpus>div{flex:1 1 480px;max-width:760px}
svg.roofline{display:block;width:100%;height:auto}
"""



def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, fmt: str = "{:.0f}", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '<span class="muted">-</span>'
    return _nowrap(fmt.format(value) + unit)


def _nowrap(text: str) -> str:
    """Escaped, with no line break between the number and its unit ("36 ms", never "36" then "ms")."""
    number, space, unit = text.partition(" ")
    return esc(number) + ("&nbsp;" if space else "") + esc(unit)


def _bar(ratio: float | None, hot_at: float = 0.9) -> str:
    if ratio is None:
        return '<span class="muted">-</span>'
    width = max(0.0, min(1.0, ratio)) * 100
    hot = ' class="hot"' if ratio >= hot_at else ""
    return (f'<span class="nw"><span class="bar"><span{hot} style="width:{width:.1f}%"></span></span> '
            f'{esc(pct(ratio))}</span>')


def _log_pos(value: float, lo: float, hi: float, size: float) -> float:
    return (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * size


def roofline_svg(gpu: Mapping[str, Any], width: int = 640, height: int = 280) -> str:
    """A log-log roofline of one GPU: the bandwidth and compute roofs and the decode point
    (modelled intensity and FLOP/s). Without a model point it shows the GPM bandwidth share.
    Drawn in a `width` x `height` viewBox; the page's CSS (svg.roofline) scales it to its column."""
    bw, peak = gpu.get("peak_bandwidth_bytes_per_second"), gpu.get("peak_flops")
    pad_l, pad_b, pad_t, pad_r = 58, 40, 12, 16
    w, h = width - pad_l - pad_r, height - pad_b - pad_t
    title = esc(f"GPU{gpu.get('gpu')} {gpu.get('name', '')}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="roofline" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="roofline {title}">'
             f'<title>roofline {title}</title>',
             f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafbfc" stroke="#ccd"/>']
    if not bw or not peak:
        parts.append(f'<text x="{pad_l + 12}" y="{pad_t + 28}" font-size="14" fill="#667">no peak spec for this GPU'
                     '</text></svg>')
        return "".join(parts)
    x_lo, x_hi = 0.1, 10_000.0
    y_hi = peak * 2
    y_lo = y_hi / 1e5

    def xy(x: float, y: float) -> tuple[float, float]:
        x = min(max(x, x_lo), x_hi)
        y = min(max(y, y_lo), y_hi)
        return pad_l + _log_pos(x, x_lo, x_hi, w), pad_t + h - _log_pos(y, y_lo, y_hi, h)

    ridge = peak / bw
    points = [xy(x_lo, bw * x_lo), xy(ridge, peak), xy(x_hi, peak)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    parts.append(f'<polyline points="{path}" fill="none" stroke="#1d2330" stroke-width="2.5"/>')
    ticks = (0.1, 1, 10, 100, 1000, 10000)
    for tick in ticks:
        tx, _ = xy(tick, y_lo)
        # The outermost labels are anchored inside the plot so neither is clipped by the SVG's edge.
        anchor = "end" if tick == ticks[-1] else "start" if tick == ticks[0] else "middle"
        parts.append(f'<text x="{tx:.1f}" y="{pad_t + h + 17}" font-size="13" text-anchor="{anchor}" fill="#667">'
                     f'{tick:g}</text>')
    parts.append(f'<text x="{pad_l + w / 2:.0f}" y="{height - 4}" font-size="13" text-anchor="middle" fill="#667">'
                 'FLOP/byte</text>')
    parts.append(f'<text x="6" y="{pad_t + 14}" font-size="13" fill="#667">{peak / 1e12:.0f}</text>')
    parts.append(f'<text x="6" y="{pad_t + 30}" font-size="11" fill="#667">TFLOP/s</text>')
    intensity, achieved = gpu.get("intensity_flops_per_byte"), gpu.get("achieved_flops")
    if intensity and achieved:
        px, py = xy(intensity, achieved)
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="7" fill="#3b6fd8"><title>decode (model): '
                     f'{intensity:.1f} FLOP/byte, {achieved / 1e12:.1f} TFLOP/s</title></circle>')
    gpm = gpu.get("gpm_ratio")
    if gpm is not None and intensity:
        # The measured bandwidth at the modelled intensity: where GPM says the decode point sits.
        gx, gy = xy(intensity, gpm * bw * intensity)
        parts.append(f'<circle cx="{gx:.1f}" cy="{gy:.1f}" r="6" fill="none" stroke="#c62828" stroke-width="2.5">'
                     f'<title>GPM: HBM at {gpm * 100:.0f}% of peak</title></circle>')
    label = []
    if gpu.get("model_ratio") is not None:
        label.append(f"model {gpu['model_ratio'] * 100:.0f}%")
    if gpm is not None:
        label.append(f"GPM {gpm * 100:.0f}%")
    parts.append(f'<text x="{pad_l + 10}" y="{pad_t + h - 10}" font-size="14" fill="#1d2330">HBM '
                 f'{esc(", ".join(label) or "-")}</text></svg>')
    return "".join(parts)




def _latency(seconds: Any, kind: str) -> str:
    if seconds is None or (isinstance(seconds, float) and not math.isfinite(seconds)):
        return '<span class="muted">-</span>'
    return _nowrap(latency_text(float(seconds), kind))


def _tails(numbers: Mapping[str, Any]) -> str:
    rows = []
    for kind, title in (("ttft", "TTFT"), ("tbt", "TBT"), ("e2e", "E2E")):
        tail = numbers.get(kind)
        if not isinstance(tail, Mapping):
            continue
        q = tail.get("quantiles", {})
        slo = ""
        attained, bound = tail.get("slo_attainment"), tail.get("slo_bound_used")
        if tail.get("not_applicable"):
            slo = f'<span class="muted" title="{esc(tail["not_applicable"])}">not applicable</span>'
        elif tail.get("slo_no_recent_traffic"):
            slo = '<span class="muted">no recent traffic</span>'
        elif attained is not None and bound is not None:
            slo = f"{esc(pct(attained))}&nbsp;&le;&nbsp;{_nowrap(latency_text(bound, kind))}"
        rows.append(f"<tr><td>{title}</td><td>{_latency(q.get('0.5'), kind)}</td>"
                    f"<td>{_latency(q.get('0.95'), kind)}</td><td>{_latency(q.get('0.99'), kind)}</td>"
                    f"<td>{slo or '-'}</td><td>{_num(tail.get('window_count'))}</td></tr>")
    if not rows:
        return '<p class="muted">no latency histograms in the window yet</p>'
    return ('<table class="tails"><tr><th></th><th>p50</th><th>p95</th><th>p99</th><th>SLO</th><th>n</th></tr>'
            + "".join(rows) + "</table>")


def _model_check(n: Mapping[str, Any]) -> str:
    """The planner's cost model on this window (exporter/derive/modelcheck.py): its error is what a
    `plan` calibration absorbs; a change in it is drift."""
    predicted, observed = n.get("model_tpot_predicted_s"), n.get("model_tpot_observed_s")
    error = n.get("model_tpot_error")
    if predicted is None or observed is None or error is None:
        return '<span class="muted">-</span>'
    tps = n.get("model_tps_error")
    return (f"{predicted * 1e3:.2f}&nbsp;ms / {observed * 1e3:.2f}&nbsp;ms ({error * 100:+.0f}%; decode tok/s "
            f"{_num(None if tps is None else tps * 100, '{:+.0f}', '%')}), {esc(str(n.get('model_bound', '')))}-bound")


NOT_FOR_DECODE = '<span class="muted">none: decode role (the prefill instance computes the prompts)</span>'


def _throughput(n: Mapping[str, Any]) -> str:
    share = n.get("prefill_time_share")
    phase = "-" if share is None else f"prefill {share * 100:.0f}% / decode {(1 - share) * 100:.0f}%"
    decode_role = n.get("role") == "decode"
    prefill = NOT_FOR_DECODE if decode_role else _num(n.get('prefill_tokens_per_second'), '{:,.0f}', ' tok/s')
    return ("<table>"
            f"<tr><td>prefill (new prompt tokens)</td>"
            f"<td>{prefill}</td></tr>"
            f"<tr><td>decode</td><td>{_num(n.get('decode_tokens_per_second'), '{:,.0f}', ' tok/s')}</td></tr>"
            f"<tr><td>batch (mean running)</td><td>{_num(n.get('mean_batch'), '{:.1f}')}</td></tr>"
            f"<tr><td>waiting</td><td>{_num(n.get('waiting'))}</td></tr>"
            f"<tr><td>decode steps/s</td><td>{_num(n.get('decode_steps_per_second'), '{:.1f}')}</td></tr>"
            f"<tr><td>engine time</td><td>{esc(phase)}</td></tr>"
            f"<tr><td>prefill MFU</td><td>{NOT_FOR_DECODE if decode_role else _bar(n.get('prefill_mfu'), 2.0)}"
            "</td></tr>"
            f"<tr><td>MFU (engine's estimate: every step, recomputation after preemptions included)</td>"
            f"<td>{_bar(n.get('engine_flops_ratio'), 2.0)}</td></tr>"
            f"<tr><td>HBM (engine's estimate)</td><td>{_bar(n.get('engine_hbm_ratio'), 2.0)}</td></tr>"
            f"<tr><td>speculative acceptance</td><td>{_bar(n.get('spec_decode_acceptance'), 2.0)}</td></tr>"
            f"<tr><td>cost model (llm-exporter plan): TPOT predicted / observed</td>"
            f"<td>{_model_check(n)}</td></tr>"
            f"<tr><td>energy</td><td>{_num(n.get('joules_per_token'), '{:.3g}', ' J/token')}</td></tr>"
            f"<tr><td>cost</td><td>{_num(n.get('cost_per_million_tokens'), '{:.3g}', ' per 1M tokens')}"
            + (' <span class="muted">(in the currency of --gpu-price-per-hour)</span>'
               if n.get("cost_per_million_tokens") is not None else "") + "</td></tr>"
            "</table>")


def _kv(n: Mapping[str, Any]) -> str:
    used_b, bpt = n.get("kv_used_tokens"), n.get("kv_bytes_per_token")
    gib = used_b * bpt / 2**30 if used_b is not None and bpt else None
    return ("<table>"
            f"<tr><td>occupancy</td><td>{_bar(n.get('kv_usage_ratio'))}</td></tr>"
            f"<tr><td>used / capacity</td><td>{_num(n.get('kv_used_tokens'), '{:,.0f}')} / "
            f"{_num(n.get('kv_capacity_tokens'), '{:,.0f}', ' tokens')}</td></tr>"
            f"<tr><td>used bytes</td><td>{_num(gib, '{:.1f}', ' GiB')}</td></tr>"
            f"<tr><td>bytes/token</td><td>{_num(bpt and bpt / 1024, '{:.0f}', ' KiB')}</td></tr>"
            f"<tr><td>headroom</td><td>{_num(n.get('kv_headroom_sequences'), '{:.0f}', ' sequences')}</td></tr>"
            f"<tr><td>preemptions</td><td>{_num(n.get('preemptions_per_second'), '{:.3g}', '/s')}</td></tr>"
            "</table>")


def _scores(scores: Mapping[str, float], verdict: str | None) -> str:
    rows = []
    for resource in RESOURCES:
        if resource not in scores:
            continue
        mark = " &#9664;" if resource == verdict else ""
        rows.append(f"<tr><td>{esc(resource)}</td><td>{_bar(scores[resource], 2.0)}{mark}</td></tr>")
    return "<table>" + "".join(rows) + "</table>" if rows else '<p class="muted">no scores yet</p>'


def _list(items: Sequence[str], empty: str = "none") -> str:
    if not items:
        return f'<p class="muted">{esc(empty)}</p>'
    return "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


def _notes(notes: Sequence[str]) -> str:
    """What the status leaves out on purpose, e.g. an SLO with no recent traffic to judge it on."""
    return "".join(f'<p class="muted note">{esc(n)}</p>' for n in notes)


def _unaccounted(names: Sequence[str]) -> str:
    """The engine's families its table does not know: what an engine upgrade changed."""
    if not names:
        return ""
    return ("<h3>Engine families not understood</h3><p class=\"muted note\">Neither mapped nor ignored by this "
            "engine's table (a newer release?); boards built on renamed families may go blank. See "
            "docs/engines.md.</p>" + _list(names))


def _faults(words: Sequence[str], title: str = "GPU needs service") -> str:
    """A GPU fault comes before the bottleneck: the GPU, the event, when, and what to do."""
    if not words:
        return ""
    return (f'<div class="faults" data-faults="{len(words)}"><p><span class="verdict unhealthy">unhealthy</span> '
            f'<b>{esc(title)}</b></p>{_list(words)}</div>')


def _bottleneck_evidence(t: Mapping[str, Any]) -> list[str]:
    """The evidence without the GPU faults, which have their own block above the bottleneck."""
    faults = set(t.get("unhealthy_because") or ())
    return [line for line in t.get("evidence", []) if line not in faults]


def _target(t: Mapping[str, Any]) -> str:
    verdict = t.get("verdict")
    status = t.get("status", "unknown")
    words = VERDICT_WORDS.get(verdict or "", (UNKNOWN_VERDICT_WORDS,) * 2)[0]
    also = "".join(f', and as much <span class="verdict {esc(status)}" data-verdict="{esc(r)}">'
                   f'{esc(VERDICT_WORDS.get(r, (r, r))[0])}</span>' for r in t.get("also_limiting") or [])
    n = t.get("numbers", {})
    gpus = "".join(f"<div>{roofline_svg(g)}</div>" for g in t.get("gpus", []))
    because = t.get("degraded_because") or []
    return (
        f'<section class="target" id="target-{esc(t.get("target"))}">'
        f'<h2>{esc(t.get("target"))} <span class="muted">{esc(t.get("engine", ""))} {esc(t.get("model", ""))}'
        f'</span></h2>'
        f'{_faults(t.get("unhealthy_because") or [])}'
        f'<p>Bottleneck: <span class="verdict {esc(status)}" data-verdict="{esc(verdict or "")}">{esc(words)}</span>'
        f'{also} <span class="muted">{esc(status)}{": " + esc("; ".join(because)) if because else ""}</span></p>'
        f'{_notes(t.get("notes") or [])}'
        f'{_notes([t["probe"]["words"]] if t.get("probe") else [])}'
        f'<div class="grid"><div><h3>Evidence</h3>{_list(_bottleneck_evidence(t), "no evidence yet")}'
        f'<h3>First things to try</h3>{_list(t.get("remedies", []), "-")}</div>'
        f'<div><h3>Scores</h3>{_scores(t.get("scores", {}), verdict)}</div></div>'
        f'<div class="grid"><div><h3>Latency tails (window)</h3>{_tails(n)}</div>'
        f'<div><h3>Throughput</h3>{_throughput(n)}</div><div><h3>KV cache</h3>{_kv(n)}</div></div>'
        f'<h3>Roofline per GPU</h3><div class="gpus">{gpus or "<p class=muted>no GPUs for this target</p>"}</div>'
        f'{"<h3>Not shown</h3>" + _list(t["omitted"]) if t.get("omitted") else ""}'
        f'{_unaccounted(t.get("unaccounted_families") or [])}'
        "</section>"
    )


def render(diagnosis: Mapping[str, Any], *, refresh_s: int = 5, version: str = "") -> str:
    status = diagnosis.get("status", "unknown")
    taken = diagnosis.get("taken_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(taken)) if taken else "not yet"
    targets = diagnosis.get("targets", {})
    body = "".join(_target(targets[name]) for name in sorted(targets))
    unassigned = [f.get("words", "") for f in diagnosis.get("gpu_faults_unassigned", [])]
    if unassigned:
        body = (f'<section class="target">{_faults(unassigned, "GPU not assigned to a target needs service")}'
                "</section>") + body
    down = diagnosis.get("unreachable", [])
    if down:
        body += ('<section class="target"><h2>Unreachable targets</h2>'
                 + _list([f"{d['target']}: {d['reason']}" + (f" ({d['message']})" if d.get("message") else "")
                          for d in down]) + "</section>")
    if not targets and not down:
        body += f'<section class="target"><h2>No targets</h2>{_list(diagnosis.get("notes", []))}</section>'
    notes = [n for n in diagnosis.get("notes", []) if targets or down]
    if notes:
        body += f'<section class="target"><h3>Notes</h3>{_list(notes)}</section>'
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{int(refresh_s)}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>llm-exporter: {esc(status)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>llm-exporter {esc(version)}</h1><span class="verdict {esc(status)}" id="overall">'
        f'{esc(status)}</span><span>{esc(when)}</span>'
        '<a href="/metrics">/metrics</a><a href="/api/v1/diagnosis">/api/v1/diagnosis</a>'
        '<a href="/api/v1/snapshot">/api/v1/snapshot</a><a href="/healthz">/healthz</a><a href="/readyz">/readyz</a>'
        '</header>'
        f"<main>{body}</main></body></html>"
    )
