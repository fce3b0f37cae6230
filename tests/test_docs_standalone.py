"""What a user reads stands alone: the CLI's help is for users, and the docs cite nothing that is not
in the repository and hedge nothing they could have checked."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def test_help_speaks_to_users_not_developers() -> None:
    done = subprocess.run([sys.executable, "-m", "exporter.cli", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    assert "main() calls" not in done.stdout and "which tests call" not in done.stdout
    assert "Prometheus sidecar" in done.stdout


def test_docs_cite_only_what_the_repository_has_and_hedge_nothing() -> None:
    for path in USER_DOCS:
        text = path.read_text()
        for phrase in ("source documents", "shared/seeds", "shared/reference", "as far as I could tell",
                       "not checked in detail"):
            assert phrase not in text, (path.name, phrase)
