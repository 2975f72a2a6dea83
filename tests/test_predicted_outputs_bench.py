"""The Predicted Outputs benchmark (`benchmarks/predicted_outputs.py`) on a tiny random model:
every method answers as greedy ``generate`` does, and the report says where its files come
from. Nothing here asserts on how long anything took."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

# The benchmark scripts are lab tools beside the package, not part of the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from predicted_outputs import TASKS, main


def test_a_quick_run_answers_as_greedy_and_gives_its_sources(tmp_path: Path) -> None:
    out = tmp_path / "predicted-outputs.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--quick", "--out", str(out)]) == 0  # 1 when any answer is not greedy's
    report = json.loads(out.read_text())
    single, together = report["single_stream"], report["clients_2"]
    assert list(single) == ["greedy", "prompt_lookup", "lookahead", "lookahead+prediction"]
    assert list(together) == ["plain", "lookahead", "lookahead+prediction", "prompt_lookup"]
    for figures in (*single.values(), *together.values()):
        assert figures["identical_to_greedy"] == 2 and figures["divergences"] == []
    for figures in (single["lookahead+prediction"], together["lookahead+prediction"]):
        assert {"accepted_prediction_tokens", "rejected_prediction_tokens"} <= set(figures)
    for task, source in zip(TASKS, report["tasks"], strict=False):
        assert source["path"] == task.path and len(source["sha256"]) == 64
        assert source["python" if task.source == "stdlib" else "commit"]


def test_every_task_s_excerpt_is_found() -> None:
    for task in TASKS:
        code, source = task.excerpt()
        assert code.lstrip().startswith(task.start) and source["lines"] == task.lines, task.path
