"""The README and the docs are a user's guide that runs: every Python block of README.md and of
every page under docs/ runs as written (on a tiny random model in place of the built-in ones, in
a folder with ``docs/`` and ``docs.index``), and the few that cannot run here say why in a
marker before them (`rag_lookahead.testing.readme`)."""

from pathlib import Path
from types import ModuleType

import pytest

from rag_lookahead.testing.readme import (
    Block,
    docs_hook,
    markdown_files,
    python_blocks,
    readme_folder,
    run_block,
    undefined_names,
)

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [block for path in markdown_files(ROOT) for block in python_blocks(path, ROOT)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    with readme_folder(tmp_path_factory.mktemp("readme"), ROOT / "tests" / "fixtures" / "stdlib") as path:
        yield path


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run"], ids=lambda b: b.where)
def test_the_block_runs_as_written(block: Block, folder) -> None:
    run_block(block)


# Skipped here: blocks that need a server, and those the integrations' suites run.
NOT_RUN_HERE = [b for b in BLOCKS if b.kind in ("skip", "langchain", "llama_index")]


@pytest.mark.parametrize("block", NOT_RUN_HERE, ids=lambda b: b.where)
def test_a_block_that_is_not_run_here_defines_every_name_it_uses(block: Block) -> None:
    compile(block.code, block.where, "exec")
    assert undefined_names(block) == [], f"{block.where} is skipped: {block.reason}"


def test_fragments_are_few_and_compile() -> None:
    fragments = [b for b in BLOCKS if b.kind == "fragment"]
    assert len(fragments) <= 2, [b.where for b in fragments]
    for block in fragments:
        compile(block.code, block.where, "exec")


def test_the_docs_pages_are_read_and_named_by_their_path() -> None:
    files = markdown_files(ROOT)
    assert files[0] == ROOT / "README.md"
    assert ROOT / "docs" / "guide" / "python-api.md" in files
    assert any(b.where.startswith("docs/guide/python-api.md:") and b.kind == "run" for b in BLOCKS)


def _repo_links() -> ModuleType:
    """The mkdocs hook that checks the docs' links out of docs/."""
    return docs_hook(ROOT, "repo_links")


def test_every_relative_link_names_a_file_and_a_heading_there() -> None:
    # The pages are read on GitHub: a link is a path into the repository, an anchor GitHub's.
    links = _repo_links()
    pages = [*markdown_files(ROOT), *(ROOT / "benchmarks").rglob("*.md")]
    pages += (ROOT / "integrations").glob("*/README.md")
    broken = []
    for page in pages:
        for target, anchor, path in links.relative_links(page.read_text("utf-8"), page):
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}{anchor}")
            elif anchor and path.suffix == ".md" and anchor[1:] not in links.github_anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target}{anchor} (no such heading)")
    assert broken == []


def test_an_undefined_name_is_found() -> None:
    block = Block("x.md:1", "import json\n\nprint(json.dumps(retrieved_text))\n", "skip", "a test")
    assert [line.split(": ", 1)[1] for line in undefined_names(block)] == [
        "F821 Undefined name `retrieved_text`"
    ]


@pytest.mark.parametrize(
    ("markdown", "error"),
    [
        ("<!-- readme-test: skipped: typo -->\n```python\nx = 1\n```\n", "must read"),
        ("<!-- readme-test: skip -->\n```python\nx = 1\n```\n", "must read"),  # no reason
        ("<!-- readme-test: skip: a server -->\n```sh\nls\n```\n", "before a non-python block"),
        ("<!-- readme-test: skip: a server -->\nSome text.\n```python\nx = 1\n```\n", "not right before"),
        ("```python\nx = 1\n", "never closes"),
    ],
)
def test_a_marker_that_would_go_unnoticed_is_an_error(markdown: str, error: str, tmp_path) -> None:
    (tmp_path / "x.md").write_text(markdown)
    with pytest.raises(ValueError, match=error):
        python_blocks(tmp_path / "x.md")


def test_blocks_keep_the_markdown_line_numbers_and_their_marker(tmp_path) -> None:
    text = "# Title\n\n<!-- readme-test: skip: a server -->\n\n```python\nx = 1\n```\n"
    text += "\n  ```python\n  y = 2\n  ```\n"  # indented, in a list item
    (tmp_path / "x.md").write_text(text)
    first, second = python_blocks(tmp_path / "x.md")
    assert (first.where, first.kind, first.reason) == ("x.md:5", "skip", "a server")
    assert python_blocks(tmp_path / "x.md", tmp_path.parent)[0].where == f"{tmp_path.name}/x.md:5"
    assert first.code.splitlines()[5] == "x = 1"  # line 6 of the file
    assert (second.where, second.kind, second.code.strip()) == ("x.md:9", "run", "y = 2")
