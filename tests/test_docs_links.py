"""The README and docs/ link only to files and headings that exist, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "logstore" / "FORMAT.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: Files generated on demand (docs/performance.md says how), so a link to them may not resolve yet.
GENERATED = {"performance-figures.md"}


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (lower case, punctuation dropped, spaces to dashes)."""
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    for target in _LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if path.name in GENERATED:
            continue
        assert path.exists(), f"{doc.name}: link to a missing file {target}"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.name}: link to a missing heading {target}"


def test_the_readme_is_a_newcomers_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 420
    assert "## Contents" in text and "## More" in text
    for needed in ("make serve PORT=", "make test", "pipx install .", "uv tool install .", '"command": "convmem"'):
        assert needed in text, needed


def test_no_round_by_round_history_in_the_docs() -> None:
    for doc in DOCS:
        text = doc.read_text()
        for phrase in ("this round", "fourth round", "third round", "second round", "first round", "issue 13"):
            assert phrase not in text.lower(), (doc.name, phrase)


def test_no_reference_to_issue_numbers_anywhere_in_the_tree() -> None:
    """The tracker's numbering is not in the tree: a reader cannot follow "issue N" anywhere."""
    found = []
    for path in sorted(REPO.rglob("*")):
        parts = set(path.relative_to(REPO).parts)
        if parts & {".venv", ".git", "node_modules", ".pytest_cache", ".hypothesis", "build", "dist"}:
            continue
        if path.suffix not in {".py", ".md", ".sql", ".toml", ".sh", ".txt"} or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\bissues? \d+", line, re.IGNORECASE) and path.name != "test_docs_links.py":
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)
