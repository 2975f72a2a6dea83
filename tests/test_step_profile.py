"""The step profile (`benchmarks/step_profile.py`) on a tiny random model: its split of a step
adds up. Nothing here asserts on how long anything took."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

# The benchmark scripts are lab tools beside the package, not part of the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from step_profile import CATEGORIES, main

CONFIGS = ("plain-1", "plain-3", "lookahead-1", "lookahead-3")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """The JSON report and the printed table of one quick run (``trie`` drafts: no costs to
    measure first)."""
    out = tmp_path_factory.mktemp("step-profile") / "profile.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--quick", "--rows", "3", "--mode", "trie", "--out", str(out)]) == 0
    return json.loads(out.read_text()), printed.getvalue()


def test_every_configuration_is_profiled_over_steps_that_ran_the_model(
    report: tuple[dict[str, Any], str],
) -> None:
    runs = report[0]["runs"]
    assert tuple(runs) == CONFIGS
    for name, run in runs.items():
        assert run["steps"] >= 1, name
        assert run["rows"] == (1 if name.endswith("-1") else 3)
        assert run["ms"]["forward"] > 0, name  # the model's layers ran inside the window
        assert run["mode"] == ("off" if name.startswith("plain") else "trie")


def test_the_categories_add_up_to_the_profiled_step(report: tuple[dict[str, Any], str]) -> None:
    for name, run in report[0]["runs"].items():
        assert set(run["ms"]) == set(CATEGORIES)
        rounding = 0.001 * len(CATEGORIES)  # each figure is rounded to a microsecond
        assert sum(run["ms"].values()) == pytest.approx(run["step_ms"], abs=rounding), name
        assert sum(run["share"].values()) == pytest.approx(1.0, abs=rounding), name
        assert all(ms >= 0 for ms in run["ms"].values()), name


def test_the_report_says_where_it_was_measured(report: tuple[dict[str, Any], str]) -> None:
    header = report[0]
    for key in ("cpu", "cpus", "torch", "transformers", "commit", "model", "dtype", "threads"):
        assert key in header, key
    assert header["quick"] is True


def test_the_table_has_a_column_per_configuration_and_a_row_per_category(
    report: tuple[dict[str, Any], str],
) -> None:
    lines = report[1].splitlines()
    assert lines[0] == "| per step | " + " | ".join(CONFIGS) + " |"
    assert {line.split(" | ")[0].removeprefix("| ") for line in lines[2:]} >= set(CATEGORIES)
