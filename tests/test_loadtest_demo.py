"""`llm-exporter loadtest --demo` end to end: the real command as a subprocess against the twin's
OpenAI API with the embedded exporter, its JSON against the schema, and its HTML in headless Chromium."""

from __future__ import annotations

import json
import pathlib
import re
import struct
import subprocess
import sys
import zlib

import jsonschema
import pytest

from exporter.probe.report import REPORT_SCHEMA

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = pathlib.Path("/usr/bin/chromium")
LEVELS = (1, 8, 32)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("loadtest")
    command = [sys.executable, "-m", "exporter.cli", "loadtest", "--demo", "--concurrency", ",".join(map(str, LEVELS)),
               "--duration", "10s", "--warmup", "2s", "--json", str(out / "out.json"), "--html", str(out / "out.html")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    print(done.stdout)  # the table, for the log
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


@pytest.mark.timeout(300)
def test_demo_sweep_has_percentiles_and_a_verdict_per_step(sweep):
    out, done = sweep
    report = json.loads((out / "out.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert [s["level"] for s in report["steps"]] == list(LEVELS)
    # The load generator says where it ran and what CPU it took: the planner counts it against a CPU engine.
    client = report["config"]["client"]
    assert client["loopback_target"] is True and client["cpus"] >= 1
    for step in report["steps"]:
        assert 0 < step["client"]["cpu_cores"] <= client["cpus"] + 0.5, step["client"]
        assert step["requests"]["ok"] > 0 and step["requests"]["failed"] == 0, step["requests"]
        assert step["in_flight"]["max"] == step["level"]
        for kind in ("ttft", "tpot", "itl", "e2e"):
            lat = step["latency_s"][kind]
            assert lat["p50"] is not None and lat["p50"] <= lat["p95"] <= lat["p99"], (kind, lat)
        assert step["throughput"]["output_tokens"] == 128 * step["requests"]["ok"]  # ignore_eos: exactly K
        server = step["server"]
        assert server["polls"] >= 8 and server["verdict"] and server["verdict_last"] and server["evidence"]
        assert server["kv_usage_max"] is not None and server["running_max"] is not None
        # The client's TTFT includes what the engine's does (HTTP, the event loops): never less.
        if server["ttft_mean_s"] is not None:
            assert step["latency_s"]["ttft"]["mean"] >= server["ttft_mean_s"] * 0.95, (step["latency_s"]["ttft"],
                                                                                       server["ttft_mean_s"])
    assert report["steps"][2]["throughput"]["output_tokens_per_s"] > report["steps"][0]["throughput"][
        "output_tokens_per_s"]
    assert report["recommendation"]["text"] and report["recommendation"]["kv"]["method"] is not None
    # The recommendation says only what was measured: no knee, no "set by the SLO knee"; no measured
    # limit, no number but the levels to test next (printed as the user would type them).
    rec = report["recommendation"]
    if report["knee"] is None:
        assert "SLO knee" not in rec["text"] and "knee: none within the steps tested" in done.stdout
    if rec["max_concurrency"] is None and rec["slo"]["bounded"] is False:
        assert rec["next_levels"] and f"--concurrency {','.join(map(str, rec['next_levels']))}" in done.stdout
    else:
        assert f"max concurrency {rec['max_concurrency']}" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "level" and len([ln for ln in lines[2:5] if ln.strip()]) == 3
    assert "knee:" in done.stdout and "recommendation:" in done.stdout
    assert "loadtest: step 3/3 (32)" in done.stderr


def test_demo_html_plots_one_point_per_step(sweep):
    out, _ = sweep
    page = (out / "out.html").read_text()
    assert "<script" not in page and not re.search(r'(src|href)=|url\(|@import', page)
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert [s.count('class="pt"') for s in svgs] == [3 * len(LEVELS), 4 * len(LEVELS), 2 * len(LEVELS),
                                                     2 * len(LEVELS)]
    assert all(s.count('class="band"') == len(LEVELS) for s in svgs)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of an 8-bit RGB or RGBA PNG (what Chromium writes), unfiltered."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, len(r), bpp)]


def test_demo_html_in_headless_chromium(sweep, tmp_path):
    # Never skipped for a missing binary (docs/testing.md): `make test` installs it through `make debs`.
    assert CHROMIUM.exists(), ("/usr/bin/chromium is missing: install the Debian package `chromium` (`make debs` "
                               "does) to screenshot the load-test page")
    out, _ = sweep
    shot = tmp_path / "loadtest.png"
    result = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", "--window-size=1200,1600", (out / "out.html").as_uri()],
        capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert len(data) > 20_000, "screenshot too small to hold the page"
    width, height, pixels = png_pixels(data)
    assert (width, height) == (1200, 1600)
    colors = set(pixels)
    # Text, plot lines, the verdict bands' tints and the table: far more than a blank or broken page.
    assert len(colors) > 200, len(colors)
    print(f"load-test page screenshot: {shot} ({len(colors)} colors)")
