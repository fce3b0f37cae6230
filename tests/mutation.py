"""`make mutation`: mutmut 3 over the modules whose numbers users act on, each against only the fast
test files that cover it (docs/testing.md "Mutation testing").

mutmut reads one configuration per directory (pyproject's [tool.mutmut]) and writes its mutants
next to it, so each module runs in a scratch copy of the checkout with its own configuration: the
shared working tree never gets a `mutants/` folder, and one module's runs never reuse another's
test selection. The copies stay under $LLM_EXPORTER_MUTATION_DIR (default
~/.cache/llm-exporter/mutation/<module>) for `mutmut show NAME` there; each run starts from no
mutants, since mutmut's cache keys a mutant's verdict on the mutated code alone and would keep a
survivor that a new test now kills.

    python -m tests.mutation [MODULE ...]    # default: every module in MODULES, in order
    python -m tests.mutation --list

Prints killed / total per module and the surviving mutants' names (`mutmut show NAME` in the
module's folder shows the diff).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = ("-m", "not slow")


@dataclass(frozen=True)
class Module:
    mutate: tuple[str, ...]  # files mutated (globs relative to the checkout)
    tests: tuple[str, ...]  # pytest arguments: the fast test files (and -k / -m) that cover them
    # A module whose import-time results tests/mutation_rebuild.py rebuilds before each test (in the
    # mutant's process), or "": mutmut selects the mutant after the import, so code run at import
    # (the engines' compiled alias tables) would otherwise never run mutated.
    rebuild: str = ""
    # mutmut mutant-name patterns (fnmatch) this module's score is over, or () for every mutant of
    # the files: a file whose other functions belong to another concern scores only its part.
    only: tuple[str, ...] = ()
    # Score a seeded random sample of this many of the chosen mutants (0: all of them): for a module
    # whose mutants each run seconds of tests (the planner's calibrations), where all would take hours.
    sample: int = 0


CALIBRATION = ("hardware", "decode_step_s", "prefill_s", "_decode_batch", "_context", "_between", "calibrate",
               "_replay_point", "_fit", "_refine", "_batch_factors", "_fold", "_by_batch", "_clamp", "_interval")

DERIVE_TESTS = ("tests/test_derive_formulas.py", "tests/test_derive_stages.py", "tests/test_derive_verdict.py",
                "tests/test_mutation_catches.py", "tests/test_hbm_figures.py", "tests/test_gpu_health.py", *FAST,
                "-k", "not running_exporter and not faults_demo")  # real-process twins of unit tests

MODULES: dict[str, Module] = {
    # Quantiles and SLO attainment from the window's bucket deltas; the window itself.
    "quantiles": Module(("exporter/derive/quantiles.py",),
                        ("tests/test_derive_formulas.py", "tests/test_mutation_catches.py",
                         "tests/test_derive_verdict.py", "tests/test_derive_stages.py", *FAST,
                         "-k", "not running_exporter")),
    "window": Module(("exporter/derive/window.py",),
                     ("tests/test_derive_formulas.py", "tests/test_derive_verdict.py", "tests/test_mutation_catches.py",
                      *FAST, "-k", "not running_exporter")),
    # The derived numbers the verdict and the boards show: KV bytes and capacity, throughput, MFU and
    # bandwidth, the roofline position, GPU health.
    **{name: Module((f"exporter/derive/{name}.py",), DERIVE_TESTS)
       for name in ("kv", "throughput", "roofline", "health")},
    # SLO thresholds, burn-rate windows and factors, and the rules built from them.
    "slo": Module(("exporter/slo.py", "exporter/mixin/alerts/slo.py"),
                  ("tests/test_alerts.py", "tests/test_units.py", *FAST)),
    # Histogram and counter normalization of engine pages.
    # The pass (normalize.py) and the parts it was split into (page reading, alias tables, histogram
    # merging, drop reasons, per-target state): the same code as before the split.
    "normalize": Module(tuple(f"exporter/sources/engines/{name}.py"
                              for name in ("normalize", "page", "alias_tables", "histograms", "drops", "state")),
                        ("tests/test_engines_normalize.py", "tests/test_engines_conformance.py",
                         "tests/test_hardening_numbers.py", "tests/test_hardening_engines_r3.py", *FAST),
                        rebuild="exporter.sources.engines.alias_tables"),
    # The planner's calibration on observed operating points: the fit, its refinement by replay, the
    # per-batch factors and the step costs it fits (model.py's replay engine and workload shapes are
    # the prediction side, not scored here).
    "planner-model": Module(("exporter/planner/model.py",),
                            ("tests/test_planner.py", "tests/test_planner_model_edges.py", *FAST),
                            only=tuple(f"exporter.planner.model.x_{name}__mutmut_*" for name in CALIBRATION),
                            sample=150),
}

MUTMUT = "mutmut==3.8.1"
# What the tests read beside exporter/ and alerts/ (generated files, rules, boards, docs).
ALSO_COPY = ("dashboards", "deploy", "docs", "bench", "Makefile", "constraints.txt", ".ci")


def scratch_root() -> Path:
    base = os.environ.get("LLM_EXPORTER_MUTATION_DIR")
    return Path(base) if base else Path.home() / ".cache" / "llm-exporter" / "mutation"


def toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(name: str, module: Module) -> Path:
    """A copy of the checkout (no .git, no venv) with this module's [tool.mutmut]."""
    work = scratch_root() / name
    shutil.rmtree(work / "mutants", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    patterns = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")

    def ignore(folder: str, names: list[str]) -> set[str]:
        # Symlinks left out: the host and network fixture trees hold device -> parent loops, as
        # the real /sys, which mutmut's own copy of tests/ would follow without end. No module
        # here is tested on them.
        return set(patterns(folder, names)) | {n for n in names if os.path.islink(os.path.join(folder, n))}
    for top in ("exporter", "alerts", "tests", *ALSO_COPY):
        src, dst = ROOT / top, work / top
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = re.sub(r"\n\[tool\.mutmut\].*?(?=\n\[|\Z)", "", pyproject, flags=re.S)
    pyproject += ("\n[tool.mutmut]\n"
                  'source_paths = ["exporter", "alerts"]\n'
                  f"only_mutate = {toml_list(module.mutate)}\n"
                  f"also_copy = {toml_list([t for t in ALSO_COPY if (ROOT / t).exists()])}\n"
                  f"pytest_add_cli_args_test_selection = {toml_list(module.tests)}\n"
                  # No timeouts of pytest-timeout in the mutants: mutmut times a mutant out itself.
                  'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:timeout", '
                  '"-p", "tests.mutation_rebuild"]\n')
    (work / "pyproject.toml").write_text(pyproject)
    return work


def counts(work: Path) -> dict[str, int]:
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())


def results(work: Path) -> dict[str, str]:
    """mutmut's verdict by mutant name (killed, survived, no tests, not checked, ...)."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, check=True,
                         capture_output=True, text=True).stdout
    verdicts: dict[str, str] = {}
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            verdicts[name] = status
    return verdicts


def matching(names, patterns: tuple[str, ...]) -> list[str]:
    return [n for n in names if not patterns or any(fnmatch.fnmatch(n, p) for p in patterns)]


def chosen_counts(work: Path, patterns: tuple[str, ...]) -> dict[str, int]:
    verdicts = results(work)
    tally: dict[str, int] = {}
    for name in matching(verdicts, patterns):
        tally[verdicts[name]] = tally.get(verdicts[name], 0) + 1
        tally["total"] = tally.get("total", 0) + 1
    return tally


def sampled(work: Path, patterns: tuple[str, ...], size: int, seed: int, env: dict[str, str]) -> tuple[str, ...]:
    """`size` mutant names drawn with `seed` from those matching `patterns` (all mutants without).
    mutmut names its mutants only once it has generated them, with the tests' coverage: one run of
    a single mutant does both, and the sample's run then reuses them."""
    one = patterns[0].replace("*", "1") if patterns else "*__mutmut_1"
    first = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1", one],
                           cwd=work, check=False, env=env, capture_output=True, text=True)
    names = sorted(matching(results(work), patterns))
    if not names:
        raise SystemExit(f"no mutants to sample in {work}:\n{first.stdout[-2000:]}{first.stderr[-2000:]}")
    random.Random(seed).shuffle(names)
    print(f"   sample: {min(size, len(names))} of {len(names)} mutants (seed {seed})", flush=True)
    return tuple(sorted(names[:size]))


def survivors(work: Path) -> list[str]:
    return [name for name, status in results(work).items() if status in ("survived", "no tests")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    p.add_argument("--list", action="store_true")
    p.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--sample", type=int, default=None, help="score a seeded random sample of N mutants per module "
                   "(0: all; default: the module's own, all but planner-model)")
    p.add_argument("--seed", type=int, default=46)
    args = p.parse_args(argv)
    if args.list:
        for name, m in MODULES.items():
            print(f"{name}: {' '.join(m.mutate)}  <-  {' '.join(m.tests)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        p.error(f"unknown module(s) {', '.join(unknown)}; --list shows them")
    rows = []
    for name in args.modules or list(MODULES):
        module = MODULES[name]
        work = prepare(name, module)
        print(f"== {name}: mutmut in {work}", flush=True)
        env = {**os.environ, "LLM_EXPORTER_MUTATION_REBUILD": module.rebuild}
        size = module.sample if args.sample is None else args.sample
        chosen = module.only
        if size:
            chosen = sampled(work, module.only, size, args.seed, env)
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *chosen],
                       cwd=work, check=False, env=env)
        stats = counts(work) if not chosen else None
        left = survivors(work)
        if stats is None:  # mutmut's totals count the mutants left out too: count the chosen ones
            stats = chosen_counts(work, chosen)
        killed, total = stats.get("killed", 0), stats.get("total", 0)
        rows.append((name, killed, total, left, stats))
    print("\nmodule            killed / total      %   survived  (stats)")
    for name, killed, total, left, stats in rows:
        pct = 100.0 * killed / total if total else 0.0
        print(f"{name:<17} {killed:>6} / {total:<6} {pct:5.1f}%  {len(left):>5}     {stats}")
        for mutant in left:
            print(f"    {mutant}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
