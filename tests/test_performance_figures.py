"""``docs/performance-figures.md`` is generated from the committed run, never edited by hand."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import figures_markdown

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_figures_page_is_what_the_committed_run_generates() -> None:
    doc = json.loads((DOCS / "performance-figures.json").read_text())
    page = (DOCS / "performance-figures.md").read_text()
    assert page == figures_markdown(doc, "performance-figures.json"), (
        "regenerate: python -m bench.report docs/performance-figures.json > docs/performance-figures.md"
    )
    assert "## Targets" in page and doc["targets"], "the committed run has no targets"
