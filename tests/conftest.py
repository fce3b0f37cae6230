"""Shared test helpers: golden files (`pytest --update-golden` rewrites them)."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current output")


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
