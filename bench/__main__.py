"""`make bench`: run every benchmark module in one process, side by side, print one table and
write it to docs/benchmarks.md. Ratios matter more than absolute numbers on shared machines.

A module with a `section()` (bench_fleet) also writes a markdown section of its own after the table,
between `<!-- bench:NAME -->` markers; `python -m bench NAME` rewrites only that section."""

from __future__ import annotations

import importlib
import os
import pathlib
import platform
import sys
import time

MODULES = ("bench.bench_parser", "bench.bench_normalize", "bench.bench_metrics", "bench.bench_gpu", "bench.bench_host",
           "bench.bench_derive", "bench.bench_fetch", "bench.bench_podresources", "bench.bench_soak",
           "bench.bench_fleet", "bench.bench_buckets", "bench.bench_profiles", "bench.bench_store")
DOC = pathlib.Path("docs/benchmarks.md")


def _marked(name: str, text: str) -> str:
    return f"<!-- bench:{name} -->\n{text}<!-- /bench:{name} -->\n"


def _replace_section(doc: str, name: str, text: str) -> str:
    """`doc` with the section of `name` replaced (appended when absent)."""
    start, end = f"<!-- bench:{name} -->\n", f"<!-- /bench:{name} -->\n"
    if start in doc and end in doc:
        head, rest = doc.split(start, 1)
        return head + _marked(name, text) + rest.split(end, 1)[1]
    return doc.rstrip("\n") + "\n\n" + _marked(name, text)


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str]) -> int:
    load_before = _load()
    selected = [m for m in MODULES if not argv or any(a in m for a in argv)]
    rows: list[tuple[str, str, str]] = []
    sections: dict[str, str] = {}
    for module_name in selected:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            rows.append((module_name, "not available", str(error)))
            continue
        started = time.perf_counter()
        for label, value in module.run():
            rows.append((module_name.split(".")[-1], label, value))
        if hasattr(module, "section"):
            sections[module_name.split(".")[-1]] = module.section()
        print(f"# {module_name} took {time.perf_counter() - started:.1f}s", file=sys.stderr)
    width = max(len(r[1]) for r in rows) + 2
    lines = [f"{'benchmark':<16}{'measure':<{width}}value", "-" * (width + 30)]
    lines += [f"{group:<16}{label:<{width}}{value}" for group, label, value in rows]
    table = "\n".join(lines)
    print(table)
    header = (
        "# Benchmarks\n\nWritten by `make bench` (`.venv/bin/python -m bench [NAME...]` runs a subset and "
        "writes nothing) on "
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs: {_cpu_model()}; Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}; load average {load_before} before, "
        f"{_load()} after). Each row is measured in the same run as its comparison; on a shared "
        "machine the ratios mean more than the absolute numbers.\n\n"
    )
    for text in sections.values():
        print("\n" + text)
    if not argv:
        doc = header + "```\n" + table + "\n```\n"
        for name, text in sections.items():
            doc = _replace_section(doc, name, text)
        DOC.write_text(doc)
    elif sections and DOC.exists():
        doc = DOC.read_text()
        for name, text in sections.items():
            doc = _replace_section(doc, name, text)
        DOC.write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
