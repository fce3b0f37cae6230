"""Module layering: no import cycles among exporter.* modules, and the leaf modules stay leaves.

Imports are read from the source (module level and inside functions alike: a lazy import is still
a dependency, and a cycle through one is still a cycle); imports under `if TYPE_CHECKING:` are left
out, they never run. `from exporter.a import b` depends on exporter.a.b when that is a module."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"

# Cycles still there, each with why; remove an entry when its cycle is gone (the test says so).
ALLOWED_CYCLES: dict[frozenset[str], str] = {}
# Modules that import nothing from exporter/ (bar the ones listed): everything may use them.
LEAVES = {"exporter.safefile": set(), "exporter.jsonsafe": set(), "exporter.redact": {"exporter.safefile"},
          "exporter.yamlsafe": {"exporter.safefile"},
          # the one HTTP client: below every source, tool and command that fetches
          "exporter.httpclient": {"exporter.jsonsafe", "exporter.redact", "exporter.sources.base"},
          "exporter.settings": {"exporter.yamlsafe", "exporter.specs.gpus", "exporter.specs.models",
                                "exporter.slo"}}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, type_checking: bool = False) -> set[str]:
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the exporter modules it imports; with type_checking, the imports under `if
    TYPE_CHECKING:` count too (a circle a type checker has to untangle is one a reader has to)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = _imports(tree, name, path.name == "__init__.py", type_checking)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_cycles_among_exporter_modules():
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if c not in ALLOWED_CYCLES]
    assert not unexpected, f"import cycles: {unexpected}"
    gone = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not gone, f"these cycles are gone: remove them from ALLOWED_CYCLES: {gone}"


def test_no_import_cycles_even_through_type_checking_imports():
    found = cycles(import_graph(type_checking=True))
    assert not found, f"import cycles through TYPE_CHECKING imports: {[sorted(c) for c in found]}"


def test_leaf_modules_import_nothing_from_the_exporter():
    graph = import_graph()
    for leaf, allowed in LEAVES.items():
        assert graph[leaf] <= allowed, (leaf, sorted(graph[leaf] - allowed))


NORMALIZATION = tuple(f"exporter.sources.engines.{name}"
                      for name in ("normalize", "page", "alias_tables", "histograms", "drops", "state"))
"""The normalization pass and the modules it was split into."""


def test_config_does_not_reach_into_sources():
    graph = import_graph()
    for module in ("exporter.config", "exporter.settings"):
        upward = sorted(t for t in graph[module] if t.startswith(NORMALIZATION + ("exporter.sources.engines.auth",)))
        assert not upward, (module, upward)


# Import name -> the distribution in pyproject's `dependencies` that provides it.
RUNTIME_IMPORTS = {"h11": "h11", "yaml": "pyyaml", "prometheus_client": "prometheus-client",
                   "pynvml": "nvidia-ml-py", "bcrypt": "bcrypt", "certifi": "certifi", "grpc": "grpcio"}


def test_the_package_imports_only_the_standard_library_and_its_declared_dependencies():
    import sys
    import tomllib

    declared = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert set(RUNTIME_IMPORTS.values()) == declared, "RUNTIME_IMPORTS and pyproject's dependencies differ"
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        for target in _imports(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py"):
            top = target.split(".")[0]
            if top and top != "exporter" and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).add(name)
    undeclared = {top: sorted(users) for top, users in found.items() if top not in RUNTIME_IMPORTS}
    assert not undeclared, f"imports of packages that are not runtime dependencies: {undeclared}"
    # NVML is loaded by name (importlib.import_module("pynvml")), so that importing the GPU source needs no driver.
    lazily = {"pynvml"} if 'import_module("pynvml")' in (PACKAGE / "sources/gpu/nvml.py").read_text() else set()
    unused = sorted(dist for top, dist in RUNTIME_IMPORTS.items() if top not in found and top not in lazily)
    assert not unused, f"declared runtime dependencies nothing under exporter/ imports: {unused}"


# --- layers -------------------------------------------------------------------------------------------

# From the bottom (docs/developing.md, "Layers"): what every layer may read (the specs, the physics, the
# safe readers), the runtime (sources -> collect -> derive -> expose -> server), the tools (the twin,
# the load test, the planner, the mixin), and the commands that compose them. A module imports nothing from a
# layer above its own: the runtime runs beside an engine and carries none of the tools.
LAYERS = ("base", "runtime", "tools", "commands")
BASE = ("exporter.specs", "exporter.physics")
BASE_MODULES = {"exporter", "exporter.safefile", "exporter.jsonsafe", "exporter.redact", "exporter.yamlsafe",
                "exporter.termsafe"}
# The mixin (rules and dashboards) is a tool: it reads the catalogue, the SLOs and the verdict's
# thresholds from the runtime, and nothing the exporter runs may import it.
TOOLS = ("exporter.simulator", "exporter.planner", "exporter.probe", "exporter.mixin")
COMMANDS = {"exporter.app", "exporter.collectors", "exporter.cli", "exporter.doctor", "exporter.planner.cmd",
            "exporter.probe.loadtest_cmd", "exporter.mixin.cmd"}


def layer_of(module: str) -> int:
    if module in COMMANDS:
        return LAYERS.index("commands")
    if module.startswith(TOOLS):
        return LAYERS.index("tools")
    if module in BASE_MODULES or module.startswith(BASE):
        return LAYERS.index("base")
    return LAYERS.index("runtime")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({LAYERS[layer_of(m)]}) imports {d} ({LAYERS[layer_of(d)]})"
            for m, deps in sorted(graph.items()) for d in sorted(deps) if layer_of(d) > layer_of(m)]


def test_the_layer_finder_finds_an_upward_import():
    planted = {"exporter.derive.x": {"exporter.planner.model"}, "exporter.planner.model": {"exporter.physics.costs"}}
    assert upward_imports(planted) == ["exporter.derive.x (runtime) imports exporter.planner.model (tools)"]


def test_no_module_imports_from_a_layer_above_its_own():
    found = upward_imports(import_graph(type_checking=True))
    assert not found, "upward imports:\n" + "\n".join(found)


def test_no_code_of_ours_is_loaded_by_file_path():
    # The generators live in the package (exporter/mixin) and the deploy scripts are a package of the
    # checkout (deploy/__init__.py): each is imported by name, so there is one copy of each module and
    # no loader to repeat (there were four, one per importer, before).
    loaders = sorted(str(path.relative_to(ROOT)) for top in ("exporter", "tests", "bench", "deploy")
                     for path in (ROOT / top).rglob("*.py")
                     if "spec_from_file_location" in path.read_text() and path.name != "test_layering.py")
    assert not loaders, loaders
