"""Every benchmark script still starts: its imports resolve and its options parse (`--help`).

The scripts run only by hand, on a quiet machine; a renamed internal they import would otherwise
surface only then. Nothing here runs a model or times anything.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

# A script runs as __main__; its neighbours without that (the replay tools' library) are imported.
SCRIPTS = sorted(
    path
    for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")
    if "__main__" in path.read_text()
)


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) > 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_benchmark_script_parses_its_options(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # scripts import their neighbours
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    assert "usage:" in out.getvalue()


SHELL_SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").rglob("*.sh"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda path: path.name)
def test_a_shell_script_parses_and_its_python_imports_resolve(script: Path) -> None:
    """The GPU scripts run only where a GPU is lent: their syntax and the names their inline
    Python imports are checked here."""
    subprocess.run(["bash", "-n", str(script)], check=True)
    for names in re.findall(r"^from (rag_lookahead[\w.]*) import (.+)$", script.read_text(), re.MULTILINE):
        module = importlib.import_module(names[0])
        for name in names[1].split(","):
            assert hasattr(module, name.strip()), f"{script.name}: {names[0]} has no {name.strip()}"
