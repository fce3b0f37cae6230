"""Why the normalization drops a series: the `reason` label of llm_exporter_series_dropped_total.

NormalizedScrape.drops counts a page's drops by these reasons (with the parser's label-limit
reasons, exposition.py); each reason that a value decides has a note phrase here. A leaf of the
engine package: the pass (normalize.py) and the histogram check (histograms.py) both read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

CARDINALITY = "cardinality"
NON_FINITE = "non_finite"
NEGATIVE_COUNTER = "negative_counter"
HISTOGRAM_BAD_LE = "histogram_bad_le"
HISTOGRAM_NO_INF = "histogram_no_inf"
HISTOGRAM_INCOMPLETE = "histogram_incomplete"
HISTOGRAM_NOT_MONOTONIC = "histogram_not_monotonic"
HISTOGRAM_COUNT_MISMATCH = "histogram_count_mismatch"
HISTOGRAM_FRACTIONAL = "histogram_fractional_count"
OUT_OF_RANGE = "out_of_range"
DUPLICATE = "duplicate"
FAULT_NOTES: Mapping[str, str] = MappingProxyType({
    NON_FINITE: "a non-finite", NEGATIVE_COUNTER: "a negative", HISTOGRAM_BAD_LE: "a bad le in a",
    HISTOGRAM_NO_INF: "an incomplete (no +Inf bucket)", HISTOGRAM_INCOMPLETE: "an incomplete (no _count or _sum)",
    HISTOGRAM_NOT_MONOTONIC: "a non-monotonic (counts fall as le rises)",
    HISTOGRAM_COUNT_MISMATCH: "an inconsistent (_count is not the +Inf bucket)",
    HISTOGRAM_FRACTIONAL: "a fractional-count",
    OUT_OF_RANGE: "an out-of-range", DUPLICATE: "a duplicated",
})
VALUE_FAULTS = frozenset({NEGATIVE_COUNTER, HISTOGRAM_NOT_MONOTONIC, HISTOGRAM_COUNT_MISMATCH, HISTOGRAM_FRACTIONAL,
                          OUT_OF_RANGE})
"""Faults decided by values that a plan's keys and mask do not fix: a page with one is not planned."""
