"""Histogram merging: the pieces of the normalization that treat a histogram as one series.

A histogram's buckets, _sum and _count arrive as separate samples; the pass (normalize.py) merges
them per normalized label set, and these functions make that merge sound: `format_le` writes every
bucket bound the way Prometheus does after unit conversion (so "1" and "1.0", or 250 ms and 0.25 s,
become one bucket and merge), and `histogram_fault` checks a whole merged series before it is
emitted (a histogram is emitted or dropped whole, never cut).
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

from prometheus_client.utils import floatToGoString

from exporter.catalog.base import MAX_VALUE
from exporter.sources.engines.drops import (
    HISTOGRAM_BAD_LE,
    HISTOGRAM_COUNT_MISMATCH,
    HISTOGRAM_FRACTIONAL,
    HISTOGRAM_INCOMPLETE,
    HISTOGRAM_NO_INF,
    HISTOGRAM_NOT_MONOTONIC,
    NEGATIVE_COUNTER,
    NON_FINITE,
    OUT_OF_RANGE,
)

BAD_LE_TEXT = "bad"
"""The `le` of a bucket whose bound is not a number, until its histogram is dropped whole."""
_INF = math.inf


def format_le(raw: str, scale: float) -> str | None:
    """Prometheus float formatting of a bucket bound after unit conversion ("0.001", "2.5", "1.0",
    "+Inf"): what Prometheus 3 normalizes `le` to, so "1" and "1.0" are one series. Decimal keeps
    "250" ms exactly "0.25" s."""
    try:
        number = float(raw)
    except ValueError:
        return None
    if math.isnan(number):
        return None
    if math.isinf(number):
        return floatToGoString(number)
    if scale != 1.0:
        try:
            number = float(Decimal(raw.strip()) * Decimal(repr(scale)))
        except InvalidOperation:
            number *= scale
    return floatToGoString(number)


def histogram_fault(family: str, members: list) -> str | None:
    """Why one histogram series (its buckets, _sum and _count after merging) is not valid, or None:
    what a strict OpenMetrics parser and histogram_quantile() need. O(buckets), once per page that
    takes the full pass; replays use _Checks."""
    bucket_name = family + "_bucket"
    count_name = family + "_count"
    buckets: list[tuple[float, float]] = []
    count = total = None
    for (name, labels), value in members:
        if value - value != 0.0:
            return NON_FINITE
        if name == bucket_name:
            le = next((v for k, v in labels if k == "le"), BAD_LE_TEXT)
            if le == BAD_LE_TEXT:
                return HISTOGRAM_BAD_LE
            buckets.append((float(le), value))
        elif name == count_name:
            count = value
        else:
            total = value
    buckets.sort()
    if not buckets or buckets[-1][0] != _INF:
        return HISTOGRAM_NO_INF
    if count is None or total is None:
        return HISTOGRAM_INCOMPLETE
    if count < 0.0 or total < 0.0 or buckets[0][1] < 0.0:
        return NEGATIVE_COUNTER
    # The largest count is _count once the checks below pass; bounds past the ceiling (but +Inf) too.
    if count > MAX_VALUE or total > MAX_VALUE or max(value for _, value in buckets) > MAX_VALUE \
            or (len(buckets) > 1 and not -MAX_VALUE <= buckets[-2][0] <= MAX_VALUE) \
            or buckets[0][0] < -MAX_VALUE:
        return OUT_OF_RANGE
    previous = 0.0
    for _, value in buckets:
        if value < previous:
            return HISTOGRAM_NOT_MONOTONIC
        previous = value
    if count != previous:
        return HISTOGRAM_COUNT_MISMATCH
    if not count.is_integer() or not all(value.is_integer() for _, value in buckets):
        return HISTOGRAM_FRACTIONAL
    return None
