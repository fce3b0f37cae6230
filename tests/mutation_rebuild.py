"""pytest plugin for `make mutation` (tests/mutation.py): rebuilds, before each test, what a
mutated module computes at import.

mutmut 3 imports the code once, in its own process, and forks a child per mutant that only then
selects the mutant: code run at import has already run unmutated. alias_tables.py compiles the engine
tables (`TABLES`, from `_compile_kind`, `_compile`, `_alias_routes`, `_applies`) at import, so
without this every mutant of the compiler survived whatever the tests asserted. Rebuilding them
costs about 3 ms a test, so it is done only where tests/mutation.py asks for it
(LLM_EXPORTER_MUTATION_REBUILD names the module)."""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

ALIAS_TABLES = "exporter.sources.engines.alias_tables"


def _alias_tables() -> None:
    # table_for() reads the module's TABLES at call time, so replacing it reaches every caller.
    tables = sys.modules.get(ALIAS_TABLES)
    if tables is not None:
        tables.TABLES = MappingProxyType({kind: tables._compile_kind(spec) for kind, spec in tables.SPECS.items()})


REBUILD = {ALIAS_TABLES: _alias_tables}


def pytest_runtest_setup(item) -> None:
    rebuild = REBUILD.get(os.environ.get("LLM_EXPORTER_MUTATION_REBUILD", ""))
    if rebuild is not None:
        rebuild()
