"""pytest plugin for `make mutation` (tests/mutation.py): rebuilds, before each test, what a
mutated module computes at import.

mutmut 3 imports the code once, in its own process, and forks a child per mutant that only then
selects the mutant: code run at import has already run unmutated. normalize.py compiles its engine
tables (`TABLES`, from `_compile_kind`, `_compile`, `_alias_routes`, `_applies`) at import, so
without this every mutant of the compiler survived whatever the tests asserted. Rebuilding them
costs about 3 ms a test, so it is done only where tests/mutation.py asks for it
(LLM_EXPORTER_MUTATION_REBUILD names the module)."""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

NORMALIZE = "exporter.sources.engines.normalize"


def _normalize_tables() -> None:
    normalize = sys.modules.get(NORMALIZE)
    if normalize is not None:
        normalize.TABLES = MappingProxyType({kind: normalize._compile_kind(spec)
                                             for kind, spec in normalize.SPECS.items()})


REBUILD = {NORMALIZE: _normalize_tables}


def pytest_runtest_setup(item) -> None:
    rebuild = REBUILD.get(os.environ.get("LLM_EXPORTER_MUTATION_REBUILD", ""))
    if rebuild is not None:
        rebuild()
