"""`python -m exporter.catalog [--check]`: write docs/metrics.md from the catalogue.

--check exits 1 when the committed file differs from what the catalogue produces."""

from __future__ import annotations

import pathlib
import sys

from exporter.catalog import all_areas, profiles

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

INTRO = """# Metrics

Generated from `exporter/catalog/` by `python -m exporter.catalog`; do not edit by hand
(`make docs` rewrites it, and the test suite fails when it is stale).

Conventions: every name starts with `llm_`, values are in base units (seconds, bytes, watts, joules,
hertz, ratios 0..1), counters end in `_total`. A series a source cannot provide is omitted, never
reported as a made-up zero. When a source fails, its series disappear from /metrics (they are not
served stale) and `llm_exporter_source_up{source}` goes to 0.
"""


def _profile_cell(name: str) -> str:
    """`minimal`, or `default (reason=a|b); full` where a family's series are split between profiles."""
    rows = [e for e in profiles.ENTRIES if e.family == name]
    bar = "\\|"  # a table cell
    return "; ".join(e.profile + (f" ({e.only[0]}={bar.join(sorted(e.only[1]))})" if e.only else "") for e in rows)


def _family_table(families) -> list[str]:
    lines = ["| name | type | unit | labels | profile | source | meaning |", "|---|---|---|---|---|---|---|"]
    for fam in sorted(families, key=lambda f: f.name):
        labels = ", ".join(f"`{label}`" for label in fam.labels) or "-"
        help_text = fam.help.replace("|", "\\|")
        lines.append(f"| `{fam.name}` | {fam.type} | {fam.unit} | {labels} | {_profile_cell(fam.name)} | "
                     f"{fam.source} | {help_text} |")
    return lines


PROFILES_INTRO = """
## Profiles

`--profile` chooses which families /metrics writes (`exporter/catalog/families.csv` lists every family,
the smallest profile that writes it and why; the `profile` column above). Each profile writes its own
families and those of the smaller ones; some families write a few of their series in a smaller profile
and the rest in a bigger one (`llm_gpu_clock_event_active{reason=...}`). Sources, the derive stages, the
verdict and the status page see every family whatever the profile: it decides only what is stored.

- `minimal`: the verdict, the SLO burn-rate alerts, the hardware fault alerts, the fleet board and the
  exporter's own health. Its engine histograms are re-bucketed to a few edges (the SLO thresholds among
  them) unless `--histogram-buckets engine`.
- `default`: every shipped rule and every board panel but the detail panels listed below, at most 30
  series per GPU.
- `full`: every family and series, per-CPU host series included.

`--families FILE` writes exactly what a copy of families.csv lists (delete the rows you do not want; a
row may name some series only, `family{label=a|b}`), whatever `--profile` says.

Budgets, measured by `make bench` (docs/benchmarks.md, "Profiles: series per replica"): a 1-GPU vLLM
replica adds at most 150 series to the store under `minimal` and 450 under `default`, the recording
rules' series of the replica included; `default` adds at most 30 series per GPU. tests/test_profiles.py
fails when a rule or panel shipped for a profile reads a family (or a series) the profile leaves out.
"""


def _serves_markdown() -> list[str]:
    lines = []
    for name, spec in profiles.SERVES.items():
        rules = ", ".join(f"`{r}`" for r in spec.rules)
        boards = ", ".join(f"`{b}`" for b in spec.boards)
        lines.append(f"- `{name}` serves rules {rules}; boards {boards}.")
        if spec.except_panels:
            lines.append(f"  Panels it leaves to a bigger profile: {', '.join(f'`{p}`' for p in spec.except_panels)}.")
    return lines


def render_markdown() -> str:
    parts = [INTRO]
    for title, families in all_areas():
        if not families:
            continue
        parts.append(f"\n## {title}\n")
        parts.extend(_family_table(families))
        parts.append("")
    parts.append(PROFILES_INTRO)
    parts.extend(_serves_markdown())
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
