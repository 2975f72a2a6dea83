"""benchmarks/README.md's tables say what the committed JSON does (`benchmarks/tables.py`).

No model and no timing: the tables are written from the JSON files in benchmarks/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_tables", BENCHMARKS / "tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(tables: ModuleType, *args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = tables.main(list(args))
    return code, err.getvalue()


def test_every_table_of_the_page_is_what_its_json_gives(tables: ModuleType) -> None:
    code, err = _main(tables, "--check")
    assert code == 0, err


def test_a_figure_changed_by_hand_is_named_with_its_table(tables: ModuleType, tmp_path: Path) -> None:
    page = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    begin = page.index("<!-- tables:begin cpu -->")
    row = page.index("| `llma_msmarco_rag.jsonl` |", begin)
    edited = page[:row] + page[row:].replace("**1.83x**", "**1.93x**", 1)
    assert edited != page
    copy = tmp_path / "README.md"
    copy.write_text(edited, encoding="utf-8")
    front = tmp_path / "front.md"
    front.write_text((BENCHMARKS.parent / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    pages = ("--readme", str(copy), "--front", str(front))
    code, err = _main(tables, "--check", *pages)
    assert code == 1
    assert "table 'cpu' differs" in err and "**1.93x**" in err and "**1.83x**" in err
    # A run without --check writes the table back as the JSON gives it.
    code, _ = _main(tables, "--no-charts", *pages)
    assert code == 0
    assert copy.read_text(encoding="utf-8") == page


def test_the_repository_readme_has_one_table_and_it_is_what_its_json_gives(tables: ModuleType) -> None:
    readme = (BENCHMARKS.parent / "README.md").read_text(encoding="utf-8")
    assert readme.count("<!-- tables:begin ") == 1
    assert tables.check(readme, tables.FRONT_TABLES) == []
    assert tables.render(readme, tables.FRONT_TABLES) == readme


def test_the_readme_table_has_every_machine_kinds_latest_run_against_a_peer(tables: ModuleType) -> None:
    rows = tables.peer_rows()
    assert {row.run.short for row in rows} >= {"Xeon", "Zen 5", "Zen 4", "H200"}
    for row in rows:
        assert row.alone.ratio is not None and row.alone.peer  # each compared with a peer alone
        assert row.identical == row.records  # lossless: every answer greedy's
    assert "against-peers.png" in tables.CHARTS


@pytest.mark.parametrize(
    ("page", "error"),
    [
        (
            "<!-- tables:begin no-such-table -->\n<!-- tables:end -->\n",
            "name no table in tables.py: no-such-table",
        ),
        ("nothing marked here\n", "with no <!-- tables:begin NAME --> marker in the README: "),
        ("<!-- tables:begin cpu -->\n| a |\n", "without its <!-- tables:end -->"),
    ],
)
def test_a_marker_and_its_table_go_together(tables: ModuleType, page: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        tables.render(page)


def test_a_marker_named_in_prose_is_not_a_marker(tables: ModuleType) -> None:
    page = "the tables sit between `<!-- tables:begin NAME -->` and `<!-- tables:end -->`\n"
    marked = "".join(f"<!-- tables:begin {name} -->\n<!-- tables:end -->\n" for name in tables.TABLES)
    rendered = tables.render(page + marked)
    assert rendered.startswith(page)
    assert tables.check(rendered) == []


def test_every_chart_is_drawn_from_json_that_is_here(tables: ModuleType, tmp_path: Path) -> None:
    assert {"cpu-smollm2.png", "concurrency-dolly_context_qa.png"} <= set(tables.CHARTS)
    for name in tables.CHARTS:
        assert (BENCHMARKS / name).is_file(), name  # each chart the page shows is committed
    pytest.importorskip("matplotlib")
    tables.CHARTS["cpu-smollm2.png"](tmp_path / "cpu.png")
    assert (tmp_path / "cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_results_page_and_its_notes_hold_every_table_between_them(tables: ModuleType) -> None:
    pages = [BENCHMARKS / "README.md", *sorted((BENCHMARKS / "notes").glob("*.md"))]
    split = tables.shares([page.read_text(encoding="utf-8") for page in pages])
    assert sorted(name for share in split for name in share) == sorted(tables.TABLES)
    assert "cpu" in split[0] and "vllm-peer" not in split[0]  # the peer's first table is a note's


def test_a_table_on_two_pages_or_on_none_is_refused(tables: ModuleType) -> None:
    every = "".join(f"<!-- tables:begin {name} -->\n<!-- tables:end -->\n" for name in tables.TABLES)
    with pytest.raises(ValueError, match="used on two pages .*: cpu"):
        tables.shares([every, "<!-- tables:begin cpu -->\n<!-- tables:end -->\n"])
    with pytest.raises(ValueError, match="no <!-- tables:begin NAME --> marker on any page: .*cpu"):
        tables.shares([every.replace("<!-- tables:begin cpu -->\n<!-- tables:end -->\n", "")])


def test_a_figure_changed_by_hand_in_a_note_is_named_with_its_table(
    tables: ModuleType, tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for note in (BENCHMARKS / "notes").glob("*.md"):
        text = note.read_text(encoding="utf-8")
        marker = "<!-- tables:begin vllm-peer -->\n\n|"
        text = text.replace(marker, marker + " x", 1)
        (notes / note.name).write_text(text, encoding="utf-8")
    code, err = _main(tables, "--check", "--notes", str(notes))
    assert code == 1
    assert "table 'vllm-peer' differs" in err
