"""`make bench`: run every benchmark module in one process, side by side, print one table and
write it to docs/benchmarks.md. Ratios matter more than absolute numbers on shared machines."""

from __future__ import annotations

import importlib
import pathlib
import platform
import sys
import time

MODULES = ("bench.bench_parser", "bench.bench_normalize", "bench.bench_metrics", "bench.bench_gpu", "bench.bench_host", "bench.bench_derive", "bench.bench_fetch", "bench.bench_soak")


def main(argv: list[str]) -> int:
    selected = [m for m in MODULES if not argv or any(a in m for a in argv)]
    rows: list[tuple[str, str, str]] = []
    for module_name in selected:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            rows.append((module_name, "not available", str(error)))
            continue
        started = time.perf_counter()
        for label, value in module.run():
            rows.append((module_name.split(".")[-1], label, value))
        print(f"# {module_name} took {time.perf_counter() - started:.1f}s", file=sys.stderr)
    width = max(len(r[1]) for r in rows) + 2
    lines = [f"{'benchmark':<16}{'measure':<{width}}value", "-" * (width + 30)]
    lines += [f"{group:<16}{label:<{width}}{value}" for group, label, value in rows]
    table = "\n".join(lines)
    print(table)
    header = (
        "# Benchmarks\n\nWritten by `make bench` on "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}). Each row is measured in the same run as its comparison.\n\n"
    )
    if not argv:
        pathlib.Path("docs/benchmarks.md").write_text(header + "```\n" + table + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
