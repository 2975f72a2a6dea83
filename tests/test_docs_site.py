"""The docs site's links out of docs/ land on rendered pages with their anchors
(docs/mkdocs/hooks/repo_links.py): a Markdown file outside docs/ is a page of the site at its
path in the repository, not a plain-text copy. The build itself runs where mkdocs is installed
(the docs extra; `make docs`), and is skipped elsewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rag_lookahead.testing.readme import docs_hook

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return docs_hook(ROOT, "repo_links")


def test_a_markdown_file_outside_docs_is_a_page_at_its_repository_path(hook: ModuleType) -> None:
    assert hook._copy_name(ROOT / "benchmarks" / "README.md", ROOT) == "_repo/benchmarks/README.md"
    assert (
        hook._copy_name(ROOT / "benchmarks" / "cpu-smollm2.png", ROOT) == "_repo/benchmarks/cpu-smollm2.png"
    )


def test_a_folder_link_goes_to_its_readme_where_it_has_one(hook: ModuleType) -> None:
    assert hook._readme_of(ROOT / "benchmarks" / "notes") == ROOT / "benchmarks" / "notes" / "README.md"
    assert hook._readme_of(ROOT / "benchmarks" / "cuda") == ROOT / "benchmarks" / "cuda"


def test_the_site_builds_strictly_and_its_links_keep_their_anchors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    config = (site / "guide" / "config" / "index.html").read_text("utf-8")
    assert 'href="../../_repo/benchmarks/#onednn-linear-layers-cpu_linear"' in config
    results = (site / "_repo" / "benchmarks" / "index.html").read_text("utf-8")
    assert 'id="onednn-linear-layers-cpu_linear"' in results  # GitHub's anchor, on the rendered page
    note = "_repo/benchmarks/notes/2026-12-05-the-direct-forward/"
    assert f'href="../../{note}#the-direct-forward"' in config  # a dated note, a page of its own
    assert 'id="the-direct-forward"' in (site / note / "index.html").read_text("utf-8")
    assert not list(site.rglob("*.md.txt"))


def _benchmark_pages() -> list[Path]:
    return [ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "notes").glob("*.md"))]


def _markdown_files() -> list[Path]:
    skipped = {".git", ".venv", "node_modules", "site"}
    return [path for path in sorted(ROOT.rglob("*.md")) if not skipped & set(path.relative_to(ROOT).parts)]


def test_every_anchor_into_the_results_page_and_its_notes_is_a_heading(hook: ModuleType) -> None:
    pages = set(_benchmark_pages())
    anchors = {page: hook.github_anchors(page) for page in pages}
    broken = []
    for path in _markdown_files():
        for target, anchor, resolved in hook.relative_links(path.read_text("utf-8"), path):
            if not anchor or resolved.suffix != ".md":
                continue
            unknown = resolved in pages and anchor[1:] not in anchors[resolved]
            gone = path in pages and not resolved.is_file()  # a page moved, its links not
            if unknown or gone:
                broken.append(f"{path.relative_to(ROOT)}: {target}{anchor}")
    assert broken == []


def test_the_docstrings_anchors_into_the_results_page_are_headings(hook: ModuleType) -> None:
    # Source files name the page by its path from the repository root, not as a Markdown link.
    named = re.compile(r"benchmarks/(?P<page>README\.md|notes/[\w.-]+\.md)#(?P<anchor>[\w-]+)")
    broken = []
    sources = [*ROOT.glob("rag_lookahead/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("tests/*.py")]
    for path in sources:
        for match in named.finditer(path.read_text("utf-8")):
            page = ROOT / "benchmarks" / match["page"]
            if not page.is_file() or match["anchor"] not in hook.github_anchors(page):
                broken.append(f"{path.relative_to(ROOT)}: {match[0]}")
    assert broken == []


def test_the_results_page_is_short_and_every_note_is_in_the_index() -> None:
    results = (ROOT / "benchmarks" / "README.md").read_text("utf-8")
    assert len(results.splitlines()) <= 650  # the tables of now; the investigations are notes
    index = (ROOT / "benchmarks" / "notes" / "README.md").read_text("utf-8")
    for note in sorted((ROOT / "benchmarks" / "notes").glob("*.md")):
        if note.name != "README.md":
            assert f"]({note.name})" in index, note.name
