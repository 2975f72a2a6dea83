"""The docs site's links out of docs/ land on rendered pages with their anchors
(docs/mkdocs/hooks/repo_links.py): a Markdown file outside docs/ is a page of the site at its
path in the repository, not a plain-text copy. The build itself runs where mkdocs is installed
(the docs extra; `make docs`), and is skipped elsewhere."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    path = ROOT / "docs" / "mkdocs" / "hooks" / "repo_links.py"
    spec = importlib.util.spec_from_file_location("repo_links", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert 'href="../../_repo/benchmarks/#the-direct-forward"' in config
    results = (site / "_repo" / "benchmarks" / "index.html").read_text("utf-8")
    assert 'id="the-direct-forward"' in results  # GitHub's anchor, on the rendered page
    assert not list(site.rglob("*.md.txt"))
