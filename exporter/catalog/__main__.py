"""`python -m exporter.catalog [--check]`: write docs/metrics.md from the catalogue.

--check exits 1 when the committed file differs from what the catalogue produces."""

from __future__ import annotations

import pathlib
import sys

from exporter.catalog import all_areas

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

INTRO = """# Metrics

Generated from `exporter/catalog/` by `python -m exporter.catalog`; do not edit by hand
(`make docs` rewrites it, and the test suite fails when it is stale).

Conventions: every name starts with `llm_`, values are in base units (seconds, bytes, watts, joules,
hertz, ratios 0..1), counters end in `_total`. A series a source cannot provide is omitted, never
reported as a made-up zero. When a source fails, its series disappear from /metrics (they are not
served stale) and `llm_exporter_source_up{source}` goes to 0.
"""


def _family_table(families) -> list[str]:
    lines = ["| name | type | unit | labels | source | meaning |", "|---|---|---|---|---|---|"]
    for fam in sorted(families, key=lambda f: f.name):
        labels = ", ".join(f"`{label}`" for label in fam.labels) or "-"
        help_text = fam.help.replace("|", "\\|")
        lines.append(f"| `{fam.name}` | {fam.type} | {fam.unit} | {labels} | {fam.source} | {help_text} |")
    return lines


def render_markdown() -> str:
    parts = [INTRO]
    for title, families in all_areas():
        if not families:
            continue
        parts.append(f"\n## {title}\n")
        parts.extend(_family_table(families))
        parts.append("")
    coverage = _engine_coverage()
    if coverage:
        parts.append("\n## Engine coverage\n")
        parts.append("Which engine provides which normalized family (generated from the alias tables in "
                     "`exporter/sources/engines/`). An empty cell means the engine does not expose it, "
                     "and the series is omitted for that engine.\n")
        parts.append(coverage)
    return "\n".join(parts).rstrip() + "\n"


def _engine_coverage() -> str:
    from exporter.sources.engines.coverage import coverage_table

    return coverage_table()


def main(argv: list[str]) -> int:
    text = render_markdown()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
