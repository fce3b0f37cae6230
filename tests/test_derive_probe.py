"""The probe stage's judgement (exporter/derive/probe.py) at its thresholds; the real process
(tests/test_probe_run.py) shows the same through /api/v1/diagnosis and `doctor`."""

from __future__ import annotations

import pytest

from exporter.derive.probe import ProbeCheck
from exporter.slo import PROBE_FAILING_RATIO, PROBE_GAP


def check(client: float | None, engine: float | None, *, requests: float = 10, failed: float = 0) -> ProbeCheck:
    reasons = (("timeout", failed),) if failed else ()
    return ProbeCheck(300.0, failed < requests, requests, failed, reasons, client, engine)


@pytest.mark.parametrize(("client", "engine", "too_large"), [
    (PROBE_GAP.gap_seconds + 0.2 + 0.01, 0.2, True),  # over both the seconds and the factor
    (PROBE_GAP.gap_seconds + 0.2 - 0.01, 0.2, False),  # under the seconds
    (2.0 + PROBE_GAP.gap_seconds + 0.01, 2.0, False),  # over the seconds, under the factor
    (3.0, None, False),  # no engine mean: the engine finished nothing in the window
    (None, 0.2, False),  # no successful probe request
])
def test_the_gap_needs_both_the_seconds_and_the_factor(client, engine, too_large):
    got = check(client, engine)
    assert got.gap_too_large is too_large
    assert bool([line for line in got.degraded() if line.startswith("clients wait")]) is too_large


def test_failing_is_more_than_the_alerts_share_of_requests():
    at = check(0.1, 0.1, requests=10, failed=10 * PROBE_FAILING_RATIO)
    over = check(0.1, 0.1, requests=10, failed=10 * PROBE_FAILING_RATIO + 1)
    assert not at.failing and over.failing
    assert over.degraded() == ["the probe's requests to the engine's API fail: 6 of 10 over the last 5 minutes "
                               "(timeout 6); its clients are likely failing too"]
    assert not check(None, None, requests=0).failing
    assert check(None, None, requests=0).words() == "probe: no request finished over the last 5 minutes"
