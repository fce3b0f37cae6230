"""Shared test helpers: golden files (`pytest --update-golden` rewrites them), and the test tiers.

Tiers (docs/testing.md): every test is in the fast unit tier unless its file is listed in TIERS, whose
tier marker (and `slow`) then goes on each of its tests; a single slow test elsewhere takes
`@pytest.mark.<tier>` itself. `pytest -m "not slow"` (`make test-fast`) runs the unit tier alone;
`pytest` runs everything.
"""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden"

# The live tier (tests/live: real engines, minutes to install and start) runs only from
# `make test-live`, which sets LLM_EXPORTER_LIVE=1; `make test` and `make test-fast` leave it out.
collect_ignore_glob = [] if os.environ.get("LLM_EXPORTER_LIVE") == "1" else ["live/*"]
# The fleet tier (tests/fleet: a simulated fleet, two Prometheus servers, VictoriaMetrics and vmalert,
# about 5 minutes) runs only from `make test-fleet`, which sets LLM_EXPORTER_FLEET=1.
if os.environ.get("LLM_EXPORTER_FLEET") != "1":
    collect_ignore_glob.append("fleet/*")
# The deploy tier (tests/deploy: the image under podman, the sidecar pod under `podman kube play`, the
# compose services as containers) runs only from `make test-deploy`, which sets LLM_EXPORTER_DEPLOY=1.
if os.environ.get("LLM_EXPORTER_DEPLOY") != "1":
    collect_ignore_glob.append("deploy/*")


# test file (or "file::test function") -> its tier: e2e (a whole stack, a browser, or the CLI's own
# processes end to end), process (real exporter processes and sockets under hostile load), fuzz
# (hypothesis over generated pages), soak (bounded-growth runs over a minute). The markers are declared
# in pyproject.toml.
TIERS: dict[str, str] = {
    "test_e2e_alerts.py": "e2e",
    "test_e2e_run.py": "e2e",
    "test_e2e_pd.py": "e2e",
    "test_probe_run.py::test_run_probes_an_engine_and_labels_its_series_like_the_engines": "e2e",
    "test_probe_run.py::test_a_failing_probe_shows_errors_by_reason_and_everything_else_is_still_served": "e2e",
    "test_probe_client.py::test_hostile_streams_leave_memory_bounded": "process",
    "test_dashboards_live.py": "e2e",
    "test_demo.py": "e2e",
    "test_loadtest_demo.py": "e2e",
    "test_deploy.py": "e2e",
    "test_status_page.py::test_status_page_in_headless_chromium": "e2e",
    "test_soak.py": "soak",
    "test_fuzz_normalize.py": "fuzz",
    "test_faults.py": "process",
    "test_planner_captured.py": "process",
    "test_security.py": "process",
    "test_security_targets.py": "process",
    "test_hardening_dns.py": "process",
    "test_hardening_auth.py": "process",
    "test_hardening_http.py": "process",
    "test_webconfig_reload_process.py": "process",
    "test_hardening_parse.py": "process",
    "test_hardening_scrape.py": "process",
    "test_hardening_mixin.py": "process",
    "test_host_net_live.py": "process",
    "test_host_net.py::test_thousands_of_interfaces_stay_bounded": "process",
}
SLOW_TIERS = ("e2e", "process", "fuzz", "soak")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current output")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A slow file renamed without its TIERS entry would land in the fast tier unnoticed: a stale name
    # here is the sign, so refuse it.
    missing = sorted(key for key in TIERS if not (ROOT / "tests" / key.split("::")[0]).exists())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py TIERS names files that do not exist: {missing}")
    for item in items:
        function = getattr(item, "originalname", item.name)
        for key in (item.path.name, f"{item.path.name}::{function}"):
            if key in TIERS:
                item.add_marker(TIERS[key])
        if any(item.get_closest_marker(t) is not None for t in SLOW_TIERS):
            item.add_marker("slow")


@pytest.fixture
def assert_golden(request: pytest.FixtureRequest):
    """assert_golden("gpu/h100__idle.metrics", text): compare byte for byte, or rewrite with --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(relative: str, text: str) -> None:
        path = GOLDEN / relative
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"golden file {path} missing; run `make golden` to create it"
        expected = path.read_text()
        assert text == expected, f"output differs from {path}; run `make golden` if the change is intended"

    return check
