"""The status page at `/`: rendered from the live diagnosis and checked in headless Chromium."""

from __future__ import annotations

import math
import pathlib
import re
import subprocess

import httpx
import pytest

from exporter.status_page import render, roofline_svg
from tests.test_doctor import live_kv_pressure

CHROMIUM = pathlib.Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def live():
    with live_kv_pressure() as twin:
        yield twin


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    assert CHROMIUM.exists(), ("/usr/bin/chromium is missing: install the Debian package `chromium` "
                               "(`make debs` does) to check the status page")
    base = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars"]
    return subprocess.run(base + list(args), capture_output=True, text=True, timeout=timeout, check=False)


def test_status_page_in_headless_chromium(live, tmp_path):
    html = httpx.get(live.exporter + "/", timeout=5).text
    # Self-contained: no scripts, no external stylesheets, images or fonts (air-gapped clusters).
    assert "<script" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert 'http-equiv="refresh"' in html
    assert 'data-verdict="kv_capacity"' in html
    assert "<svg" in html and "roofline" in html
    for heading in ("Evidence", "First things to try", "Latency tails", "Throughput", "KV cache", "Roofline per GPU"):
        assert heading in html

    dom = chromium("--dump-dom", live.exporter + "/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-verdict="kv_capacity"' in dom.stdout and "KV cache capacity" in dom.stdout

    shot = tmp_path / "status-page.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1280,1800", live.exporter + "/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000, "screenshot missing or blank"
    print(f"status page screenshot: {shot}")


def test_page_without_a_deriver_or_targets_still_renders():
    html = render({"ready": False, "status": "unknown", "targets": {}, "unreachable": [],
                   "notes": ["derivations are not enabled in this exporter"]})
    assert "derivations are not enabled" in html and "unknown" in html


def test_page_escapes_engine_supplied_text():
    html = render({"ready": True, "status": "degraded", "targets": {"<t>": {
        "target": "<t>", "model": "<script>alert(1)</script>", "verdict": "idle", "status": "healthy",
        "evidence": ["a < b"], "remedies": [], "scores": {"idle": 1.0}, "numbers": {}, "gpus": []}},
        "unreachable": [], "notes": []})
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_roofline_svg_places_the_decode_point_under_the_roof():
    gpu = {"gpu": "0", "name": "H100", "peak_bandwidth_bytes_per_second": 3.35e12, "peak_flops": 989.5e12,
           "intensity_flops_per_byte": 60.0, "achieved_flops": 60.0 * 2.3e12, "gpm_ratio": 0.7, "model_ratio": 0.69}
    svg = roofline_svg(gpu)
    assert svg.startswith("<svg") and "HBM model 69%, GPM 70%" in svg
    assert "no peak spec" in roofline_svg({"gpu": "1", "name": "mystery"})
    # Where the point is, read from the SVG alone: the roof polyline (bandwidth slope, ridge, flat
    # compute roof), the x-axis tick labels and the two circles (model point, GPM point).
    roof = [tuple(map(float, p.split(","))) for p in re.search(r'<polyline points="([^"]+)"', svg).group(1).split()]
    ticks = {float(t): float(x) for x, t in re.findall(r'<text x="([\d.]+)" y="\d+" font-size="13" '
                                                        r'text-anchor="\w+" fill="#667">([\d.]+)</text>', svg)}
    circles = [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)]
    assert len(roof) == 3 and len(circles) == 2, svg
    (x0, y0), (ridge_x, ridge_y), _ = roof
    (cx, cy), (gx, gy) = circles
    # x: intensity 60 sits at log10(6) of the way from the "10" tick to the "100" tick; left of the
    # ridge (989.5e12 / 3.35e12 = 295 FLOP/byte), so under the bandwidth roof, not the compute one.
    assert cx == pytest.approx(ticks[10] + (ticks[100] - ticks[10]) * math.log10(6), abs=0.5)
    assert x0 < cx < ridge_x and gx == cx
    # y (SVG y grows downwards): below the bandwidth roof at that x, by the decades between the
    # roof there (3.35e12 * 60) and the achieved 2.3e12 * 60, on the roof's own scale.
    roof_y = y0 + (ridge_y - y0) * (cx - x0) / (ridge_x - x0)
    px_per_decade = (y0 - ridge_y) / math.log10(989.5e12 / (3.35e12 * 0.1))
    assert cy > roof_y
    assert cy - roof_y == pytest.approx(math.log10(3.35 / 2.3) * px_per_decade, abs=1.0)
    assert gy - roof_y == pytest.approx(math.log10(1 / 0.7) * px_per_decade, abs=1.0)  # GPM: 70% of the roof


def test_page_says_no_recent_traffic_for_an_slo_without_requests():
    from tests.test_doctor import _restarted_diagnosis

    html = render(_restarted_diagnosis())
    assert "TTFT SLO: no recent traffic (no requests finished in the last 5 minutes)" in html
    assert "<td>no recent traffic" in html or '<span class="muted">no recent traffic</span>' in html
    assert 'class="verdict healthy"' in html


def test_the_demo_status_page_reads_as_one_consistent_page():
    """Issue 26: the real demo's page. Latencies in the same unit as the evidence (TTFT and e2e in
    seconds, the time between tokens in ms; issue 39),
    cost said to be in the price's currency, the roofline's last tick inside the picture and its y axis
    with a unit, and the prefill and MFU rows saying what they count."""
    import os
    import signal
    import sys

    from tests.support import free_port, wait_until

    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        def page() -> str:
            try:
                return httpx.get(base + "/", timeout=5).text
            except httpx.HTTPError:
                return ""
        assert wait_until(lambda: "per 1M tokens" in page() and '<table class="tails"><tr><th></th><th>p50' in page()
                          and "probe:" in page(), timeout=90, interval=1.0), page()[-2000:]
        html = page()
    finally:
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=30)
    tails = html[html.index("<th>p50</th>"):html.index("</table>", html.index("<th>p50</th>"))]
    assert re.search(r"<td>TBT</td><td>[\d.]+&nbsp;ms</td>", tails), tails  # not 0.0123s beside evidence in ms
    assert re.search(r"<td>TTFT</td><td>[\d.]+&nbsp;s</td>", tails), tails  # as the evidence: TTFT p99 0.2s
    assert not re.search(r"<td>0\.\d+s</td>", tails), tails
    assert "(in the currency of --gpu-price-per-hour)" in html
    assert 'text-anchor="end" fill="#667">10000</text>' in html and "TFLOP/s</text>" in html
    assert "prefill (new prompt tokens)" in html and "recomputation after preemptions included" in html
    probe = re.search(r"probe: [^<]*", html).group(0)
    assert " ms" in probe or " s" in probe, probe
    assert not re.search(r"TTFT mean \d\.\d+s", probe), probe
