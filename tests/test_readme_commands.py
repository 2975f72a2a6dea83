"""The README's shell commands work in the order given on a fresh clone: each `rag-lookahead`
command (of the docs' pages too) is one the CLI's parser accepts, the environment that
`make demo` set up is activated before the first of them, an index is built from files the
repository has before a command reads it; and the README stays short (at most 300 lines, no
dated run log outside its one generated table). Of the commands, the parser checks them all and
the ``index`` command runs as written, in a scratch folder; those that load the model do not run
here."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from rag_lookahead.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SH_BLOCK = re.compile(r"^```sh\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)
TABLE = re.compile(r"^<!-- tables:begin .*?^<!-- tables:end -->$", re.DOTALL | re.MULTILINE)
ACTIVATE = "source .venv/bin/activate"


def shell_lines(markdown: str) -> list[str]:
    """The lines of the ``sh`` blocks of ``markdown``, in order, continuation lines joined."""
    lines: list[str] = []
    for block in SH_BLOCK.finditer(markdown):
        pending = ""
        for line in block["body"].splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
    return lines


def commands(markdown: str) -> list[list[str]]:
    """Each ``rag-lookahead`` command of the ``sh`` blocks, as its words (comments dropped)."""
    words = [shlex.split(line, comments=True) for line in shell_lines(markdown)]
    return [w for w in words if w and w[0] in ("rag-lookahead", ".venv/bin/rag-lookahead")]


COMMANDS = commands(README.read_text(encoding="utf-8"))
# The docs' pages too: each command as the page names it ("docs/guide/rag.md: rag-lookahead ...").
DOC_COMMANDS = [
    (f"{page.relative_to(ROOT)}: {shlex.join(command)}", command)
    for page in sorted((ROOT / "docs").rglob("*.md"))
    for command in commands(page.read_text(encoding="utf-8"))
]


def test_the_readme_has_commands_to_check() -> None:
    assert {c[1] for c in COMMANDS} >= {"index", "ask", "chat", "serve", "demo"}


@pytest.mark.parametrize("command", COMMANDS, ids=shlex.join)
def test_every_command_is_one_the_cli_accepts(command: list[str]) -> None:
    build_parser().parse_args(command[1:])  # argparse exits (a test failure) on what it refuses


@pytest.mark.parametrize("command", [c for _, c in DOC_COMMANDS], ids=[name for name, _ in DOC_COMMANDS])
def test_every_command_of_the_docs_is_one_the_cli_accepts(command: list[str]) -> None:
    build_parser().parse_args(command[1:])


def test_the_environment_is_activated_before_the_first_command() -> None:
    lines = shell_lines(README.read_text(encoding="utf-8"))
    first = next(i for i, line in enumerate(lines) if line.startswith("rag-lookahead "))
    assert any(line.startswith(ACTIVATE) for line in lines[:first]), lines[: first + 1]


def test_an_index_is_built_from_files_here_before_a_command_reads_it() -> None:
    built: set[Path] = set()
    for command in COMMANDS:
        args = build_parser().parse_args(command[1:])
        if args.command == "index":
            missing = [str(p) for p in args.paths if not (ROOT / p).exists()]
            assert not missing, f"{shlex.join(command)}: no such file in the repository: {missing}"
            built.add(args.out)
        elif isinstance(getattr(args, "index", None), Path):
            assert args.index in built, f"{shlex.join(command)} reads an index built by no command before it"


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_no_dated_narrative_outside_the_generated_table() -> None:
    prose = TABLE.sub("", README.read_text(encoding="utf-8"))
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", prose) == []


def test_the_parser_is_argparse() -> None:
    # The checks above read the parser's namespace (`command`, `paths`, `out`, `index`).
    args = build_parser().parse_args(["index", "docs", "--out", "x.index"])
    assert isinstance(args, argparse.Namespace) and args.paths == [Path("docs")]


def test_the_readmes_index_command_runs_as_written_and_leaves_nothing_git_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's ``index`` command, word for word, in a scratch folder laid out as a clone
    (its README, and a ``docs/`` of one page, so that it runs in seconds): it builds the index
    it names, and what it leaves (the index, its lock) is ignored by the repository's
    ``.gitignore``."""
    import shutil
    import subprocess

    from rag_lookahead.cli import main

    [command] = [c for c in COMMANDS if c[1] == "index"]
    shutil.copy(README, tmp_path / "README.md")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\nThe trie drafts from retrieved text.\n")
    monkeypatch.chdir(tmp_path)
    assert main(command[1:]) == 0
    out = command[command.index("--out") + 1]
    left = sorted(path.name for path in tmp_path.iterdir())
    assert out in left
    # (a folder as git matches one: with its slash)
    made = [name + "/" * (tmp_path / name).is_dir() for name in left if name not in ("README.md", "docs")]
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *made], capture_output=True, text=True
    ).stdout.split()
    assert sorted(ignored) == sorted(made)
