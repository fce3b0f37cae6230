"""Words and units a user reads (issue 39, item 5): one unit per quantity across the status page and
the boards (rates per second, TTFT and e2e in seconds, time between tokens in milliseconds, as the
evidence writes them), and the status page laid out for its width: no value cell breaks between a
number and its unit, and the roofline chart takes a real share of the page, measured in headless
Chromium on a page rendered from a real diagnosis (a fast-forwarded twin, no live processes)."""

from __future__ import annotations

import html
import json
import pathlib
import re
import subprocess

import pytest

from exporter.status_page import render

CHROMIUM = pathlib.Path("/usr/bin/chromium")
PAGE_WIDTH = 1400
ROOFLINE_MIN_SHARE = 0.4  # of the page's width

# Measures the rendered page and writes the result into the DOM, which --dump-dom prints. A cell
# "wraps" when its text lays out on more than one line box. The page itself carries no script.
MEASURE = """<script>
const rect = (e) => e.getBoundingClientRect();
const lines = (cell) => {  // line boxes: the content's boxes grouped where they overlap vertically
  const range = document.createRange();
  range.selectNodeContents(cell);
  const boxes = [...range.getClientRects()].filter((r) => r.width > 0).sort((a, b) => a.top - b.top);
  let count = 0, bottom = -Infinity;
  for (const r of boxes) {
    if (r.top >= bottom - 1) { count += 1; bottom = r.bottom; } else { bottom = Math.max(bottom, r.bottom); }
  }
  return count;
};
// The latency tails' cells, and every other cell that holds one number and its unit (a bar and its share).
const single = /^[-+]?[\\d.,]+(e[-+]?\\d+)?[\\s\\u00a0]?[^\\s\\d]*$/;
const cells = [...document.querySelectorAll('td')].filter((c) => c.cellIndex > 0 && /\\d/.test(c.textContent)
  && (c.closest('table.tails') || single.test(c.textContent.trim())));
const out = {
  page: document.documentElement.clientWidth,
  scroll: document.documentElement.scrollWidth,
  rooflines: [...document.querySelectorAll('svg.roofline, .gpus svg')].map((s) => rect(s).width),
  wrapped: cells.filter((c) => lines(c) > 1).map((c) => c.textContent),
  cells: cells.length,
};
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


@pytest.fixture(scope="module")
def diagnosis() -> dict:
    """A real Deriver's diagnosis of a kv-pressure twin: seconds-long TTFTs, millisecond token gaps,
    preemptions, one GPU with its roofline."""
    from tests.test_derive_twin import Harness

    harness = Harness("kv-pressure")
    harness.run(40)
    return harness.deriver.diagnosis()


def measure(page_html: str, tmp_path: pathlib.Path, width: int = PAGE_WIDTH) -> dict:
    assert CHROMIUM.exists(), ("/usr/bin/chromium is missing: install the Debian package `chromium` "
                               "(`make debs` does) to check the status page")
    page = tmp_path / "status.html"
    page.write_text(page_html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    done = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--hide-scrollbars", f"--window-size={width},1000", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.e2e  # a browser (tests/conftest.py TIERS)
def test_status_page_fits_its_width_in_chromium(diagnosis: dict, tmp_path: pathlib.Path) -> None:
    measured = measure(render(diagnosis), tmp_path)
    print(f"status page at {PAGE_WIDTH} px: {measured}")
    assert measured["page"] == PAGE_WIDTH, measured
    assert measured["rooflines"], "no roofline chart on the page"
    for width in measured["rooflines"]:
        assert width >= ROOFLINE_MIN_SHARE * measured["page"], (
            f"roofline {width:.0f} px wide on a {measured['page']} px page (at least {ROOFLINE_MIN_SHARE:.0%})")
    assert measured["cells"] >= 10, measured
    assert not measured["wrapped"], f"value cells broken across lines: {measured['wrapped']}"
    assert measured["scroll"] <= measured["page"], "the page scrolls sideways"


def test_a_number_and_its_unit_never_part(diagnosis: dict) -> None:
    """Whatever the width: the unit is joined to its number by a no-break space, and the latency
    tails' cells do not wrap at all."""
    page = render(diagnosis)
    assert "table.tails td,.nw{white-space:nowrap}" in page
    tails = page.split('<table class="tails">', 1)[1].split("</table>", 1)[0]
    values = re.findall(r"<td>([^<]*)</td>", tails)
    with_units = [v for v in values if re.search(r"\d(&nbsp;| )(ms|s)\b", v)]
    assert with_units, tails
    assert all("&nbsp;" in v and " " not in v for v in with_units), with_units


def test_latencies_are_written_in_one_unit_per_quantity(diagnosis: dict) -> None:
    """As the evidence writes them: TTFT and e2e in seconds, the time between tokens in milliseconds,
    whatever their size (a 0.5 s TTFT is "0.5 s", not "500 ms"; a 1.2 s gap is "1.2e+03 ms")."""
    from exporter.slo import latency_text as _latency_text

    assert _latency_text(0.5, "ttft") == "0.5 s" and _latency_text(12.3, "ttft") == "12.3 s"
    assert _latency_text(0.036, "tbt") == "36 ms" and _latency_text(0.0042, "tbt") == "4.2 ms"
    assert _latency_text(3.5, "e2e") == "3.5 s"
    tails = render(diagnosis).split('<table class="tails">', 1)[1].split("</table>", 1)[0]
    rows = {row.split("</td>", 1)[0]: row for row in tails.split("<tr><td>")[1:]}
    assert "&nbsp;ms" not in rows["TTFT"] and "&nbsp;s<" in rows["TTFT"], rows["TTFT"]
    assert "&nbsp;ms" in rows["TBT"] and "&nbsp;s<" not in rows["TBT"].replace("&nbsp;s&", ""), rows["TBT"]


RATE_PER_MINUTE = re.compile(r"/min\b|per minute|\[1m\]\) \* 60|\* ?60\b")


@pytest.mark.parametrize("path", ["exporter/status_page.py", *sorted(
    str(p.relative_to(pathlib.Path(__file__).parent.parent))
    for p in (pathlib.Path(__file__).parent.parent / "dashboards").glob("*.py"))])
def test_rates_are_per_second_on_the_page_and_the_boards(path: str) -> None:
    """Prometheus' convention and the evidence's: a rate is per second. No page or board shows one
    per minute (a preemption rate read 6.61/s on a panel and 396.6/min in the evidence)."""
    text = (pathlib.Path(__file__).parent.parent / path).read_text(encoding="utf-8")
    found = [line.strip() for line in text.splitlines() if RATE_PER_MINUTE.search(line)]
    assert not found, f"{path}: rates per minute: {found}"


def test_preemptions_read_per_second_on_the_page_the_evidence_and_the_board(diagnosis: dict) -> None:
    """One figure in one unit: the page's preemption rate is the evidence's, per second, and the
    board's panel is per second too."""
    from exporter.mixin.dashboards.generate import DASHBOARDS, iter_panels
    from exporter.mixin.dashboards.overview import FILENAME, PER_S

    row = render(diagnosis).split("<td>preemptions</td>", 1)[1].split("</tr>", 1)[0]
    shown = re.search(r"<td>([\d.e+-]+)/s</td>", row)
    assert shown, row
    evidence = [line for line in diagnosis["targets"]["t"]["evidence"] if "preemptions" in line]
    assert evidence == [f"{shown.group(1)} preemptions/s (sequences evicted for lack of KV blocks)"], evidence
    panels = [p for p in iter_panels(DASHBOARDS[FILENAME]()) if "preemption" in p.get("title", "").lower()]
    assert panels
    for panel in panels:
        assert panel["fieldConfig"]["defaults"]["unit"] == PER_S, (panel["title"], panel["fieldConfig"])
