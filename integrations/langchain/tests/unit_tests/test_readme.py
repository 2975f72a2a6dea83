"""This package's README, and the root README's LangChain blocks, run as written (on a tiny
random model in place of the built-in ones; `rag_lookahead.readme_blocks`)."""

from pathlib import Path

import pytest

from rag_lookahead.readme_blocks import Block, integration_blocks, readme_folder, run_block, undefined_names

ROOT = Path(__file__).resolve().parents[4]
OWN, RUN = integration_blocks(ROOT, "langchain")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    with readme_folder(tmp_path_factory.mktemp("readme"), ROOT / "tests" / "fixtures" / "stdlib") as path:
        yield path


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.where)
def test_the_block_runs_as_written(block: Block, folder) -> None:
    run_block(block)


def test_every_block_runs_or_says_why_not_and_defines_its_names() -> None:
    assert {b.kind for b in OWN} <= {"run", "skip"}
    for block in [b for b in OWN if b.kind == "skip"]:
        assert undefined_names(block) == [], f"{block.where} is skipped: {block.reason}"
