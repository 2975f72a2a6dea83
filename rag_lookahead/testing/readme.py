"""The READMEs' and the docs' Python blocks, run by the three test suites as a reader would run them.

Every fenced ``python`` block of a markdown file (``README.md`` and every page under ``docs/``:
`markdown_files`) is run as written, each in a namespace of its
own, unless an HTML comment right before it says otherwise (the reason is shown in the rendered
file's source and in the test report)::

    <!-- readme-test: skip: needs a server on 127.0.0.1:8000 -->      not run; its names checked
    <!-- readme-test: fragment: the options of a call, not a program -->   only compiled
    <!-- readme-test: langchain: needs the LangChain package -->   run by that integration's
    <!-- readme-test: llama_index: needs the LlamaIndex package -->   suite, not the core's

They run in `readme_folder`: a working folder holding ``docs/`` (the reader's documents) and
``docs.index`` (what ``rag-lookahead index docs/ --out docs.index`` makes of them), with the
built-in models replaced by a tiny random model, so that what a block loads by default loads in
a moment and its answers are gibberish — the blocks show calls, not answers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal
from unittest import mock

__all__ = [
    "KINDS",
    "Block",
    "docs_hook",
    "integration_blocks",
    "integration_tests",
    "markdown_files",
    "python_blocks",
    "readme_folder",
    "run_block",
    "undefined_names",
]

Kind = Literal["run", "skip", "fragment", "langchain", "llama_index"]
KINDS: tuple[Kind, ...] = ("run", "skip", "fragment", "langchain", "llama_index")

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(
    r"^\s*<!--\s*readme-test:\s*(?P<kind>skip|fragment|langchain|llama_index)\s*:\s*(?P<reason>.+?)\s*-->\s*$"
)
_ANY_MARKER = re.compile(r"^\s*<!--\s*readme-test")


@dataclass(frozen=True)
class Block:
    """One ``python`` block: where it starts, its code (dedented), and what the test does with it."""

    where: str  # "README.md:75" or "docs/guide/rag.md:12", the line of its opening fence
    code: str  # preceded by blank lines, so that a traceback gives the markdown file's line numbers
    kind: Kind
    reason: str = ""


def docs_hook(root: Path, name: str) -> ModuleType:
    """The docs site's mkdocs hook ``name`` of the checkout at ``root``, loaded from its file
    (``docs/mkdocs/hooks/<name>.py``: it needs no mkdocs to load)."""
    path = root / "docs" / "mkdocs" / "hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_files(root: Path) -> list[Path]:
    """The repository's user documentation whose blocks the suites run: ``README.md``, then
    every page under ``docs/`` (in path order)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def python_blocks(markdown: Path, root: Path | None = None) -> list[Block]:
    """Every fenced ``python`` block of ``markdown``, with the marker before it if any; a
    block's place is named by its path under ``root`` when given (else the file's name).

    A marker that is malformed, or that stands before no ``python`` block, is an error rather
    than a block that runs (or skips) unnoticed.
    """
    name = markdown.relative_to(root).as_posix() if root is not None else markdown.name
    lines = markdown.read_text("utf-8").splitlines()
    blocks: list[Block] = []
    marker: tuple[Kind, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if _ANY_MARKER.search(line):
            found = _MARKER.match(line)
            if found is None:
                raise ValueError(
                    f"{name}:{i + 1}: a readme-test marker must read "
                    f"'<!-- readme-test: KIND: REASON -->' with a KIND of {KINDS[1:]}"
                )
            marker = (next(k for k in KINDS if k == found["kind"]), found["reason"])
        elif fence is not None and fence["lang"]:
            end = _closing_fence(lines, i, fence["indent"], name)
            if fence["lang"] == "python":
                indent = len(fence["indent"])
                code = "\n" * (i + 1) + "\n".join(text[indent:] for text in lines[i + 1 : end]) + "\n"
                kind, reason = marker or ("run", "")
                blocks.append(Block(f"{name}:{i + 1}", code, kind, reason))
            elif marker is not None:
                raise ValueError(f"{name}:{i + 1}: a readme-test marker before a non-python block")
            marker = None
            i = end
        elif line.strip() and marker is not None:
            raise ValueError(f"{name}:{i + 1}: a readme-test marker not right before its block")
        i += 1
    return blocks


def _closing_fence(lines: list[str], start: int, indent: str, name: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].rstrip() == f"{indent}```":
            return j
    raise ValueError(f"{name}:{start + 1}: a code block that never closes")


def integration_blocks(root: Path, package: Kind) -> tuple[list[Block], list[Block]]:
    """An integration's README blocks (``integrations/<package>/README.md``), and those its
    suite runs: its own runnable ones and those of the root README and the docs
    (`markdown_files`) marked ``package``."""
    own = python_blocks(root / "integrations" / package / "README.md", root)
    runs = [b for b in own if b.kind == "run"]
    marked = [b for path in markdown_files(root) for b in python_blocks(path, root) if b.kind == package]
    return own, runs + marked


def integration_tests(root: Path, package: Kind) -> type:
    """An integration suite's README tests, as a test class for its test module
    (``TestReadme = integration_tests(ROOT, "langchain")``): each block its suite runs
    (`integration_blocks`) runs as written, in one `readme_folder`, and every other block of
    its own README says why not and defines the names it uses. Needs pytest."""
    import pytest

    own, runs = integration_blocks(root, package)

    class TestReadme:
        @pytest.fixture(scope="class")
        def folder(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
            docs = root / "tests" / "fixtures" / "stdlib"
            with readme_folder(tmp_path_factory.mktemp("readme"), docs) as path:
                yield path

        @pytest.mark.parametrize("block", runs, ids=lambda b: b.where)
        def test_the_block_runs_as_written(self, block: Block, folder: Path) -> None:
            run_block(block)

        def test_every_block_runs_or_says_why_not_and_defines_its_names(self) -> None:
            assert {b.kind for b in own} <= {"run", "skip"}
            for block in [b for b in own if b.kind == "skip"]:
                assert undefined_names(block) == [], f"{block.where} is skipped: {block.reason}"

    return TestReadme


def run_block(block: Block) -> dict[str, Any]:
    """Run ``block`` as a script of its own (in the current folder); its namespace afterwards."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block.code, block.where.split(":")[0], "exec"), namespace)
    return namespace


def undefined_names(block: Block) -> list[str]:
    """The names ``block`` uses but never defines or imports (ruff's F821, without the
    project's configuration), as ``"line: message"``; needs ruff (the dev extra)."""
    from ruff.__main__ import find_ruff_bin  # type: ignore[import-untyped]

    command = [find_ruff_bin(), "check", "--isolated", "--select", "F821", "--output-format", "concise"]
    result = subprocess.run(
        [*command, "--stdin-filename", "block.py", "-"],
        input=block.code,
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.split("block.py:", 1)[1] for line in result.stdout.splitlines() if "block.py:" in line]


@contextlib.contextmanager
def readme_folder(folder: Path, docs: Path) -> Iterator[Path]:
    """``folder`` as the working folder of the READMEs' blocks, while the context lasts:
    ``docs/`` (a copy of ``docs``) and ``docs.index`` built from it with the default embedder,
    and every built-in model (``from_pretrained()``, ``ChatLookahead()``, ``LookaheadLLM()``
    ...) a tiny random model, converted into ``folder / "cache"`` (costs measured there too)."""
    from rag_lookahead import models
    from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder

    shutil.copytree(docs, folder / "docs", dirs_exist_ok=True)
    cache = {"XDG_CACHE_HOME": str(folder / "cache"), "HF_HUB_OFFLINE": "1"}
    with (
        mock.patch.dict(os.environ, cache),
        mock.patch.object(models, "_convert_into", _save_tiny_builtin),
        _chdir(folder),
    ):
        index, _ = DocumentIndex.build([Path("docs")], SentenceTransformerEmbedder())
        index.save("docs.index")
        yield folder


@contextlib.contextmanager
def _chdir(folder: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def _save_tiny_builtin(target: Path, model: Any, progress: bool) -> None:
    """In place of a built-in model's conversion: a tiny random llama over bytes, with a long
    enough context for the READMEs' prompts (one token per byte) and a padding token."""
    import torch
    from transformers import AutoModelForCausalLM

    from rag_lookahead.testing import BYTE_VOCAB, byte_fast_tokenizer, tiny_config

    del model, progress
    tokenizer = byte_fast_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    tiny = AutoModelForCausalLM.from_config(
        tiny_config("llama", BYTE_VOCAB + 1, max_position_embeddings=8192, pad_token_id=BYTE_VOCAB)
    )
    tiny.generation_config.eos_token_id = BYTE_VOCAB
    tiny.generation_config.pad_token_id = BYTE_VOCAB
    tiny.save_pretrained(target)
    tokenizer.save_pretrained(target)
