"""The command line before any model loads: arguments parsed (and refused) without importing
torch, `--version`, the demo's `--questions`, `measure`, and progress bars only on a terminal."""

import io
import subprocess
import sys

import pytest

import rag_lookahead
from rag_lookahead.cli import build_parser, main
from rag_lookahead.cli.settings import lookahead_config
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.progress import progress_bar
from rag_lookahead.testing import CharTokenizer, tiny_model


def _imported_modules(*argv: str) -> tuple[int, str, set[str]]:
    """Run the command in a fresh interpreter: its exit status, standard output and the
    modules it imported (``-X importtime`` lists every one on standard error)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rag_lookahead", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done.returncode, done.stdout, modules


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["--help"], 0),
        (["--version"], 0),
        (["ask", "--help"], 0),
        (["ask", "a question"], 2),  # --index is missing
        (["demo", "--questions", "0"], 2),
        (["bench", "--data", "x.jsonl", "--methods"], 2),
        (["no-such-command"], 2),
    ],
)
def test_arguments_are_parsed_and_refused_before_torch_is_imported(argv, status) -> None:
    code, _, modules = _imported_modules(*argv)
    assert code == status
    assert "rag_lookahead.cli" in modules  # the list is real
    assert not {"torch", "transformers", "faiss", "numpy"} & modules


def test_version_is_the_package_version() -> None:
    code, out, _ = _imported_modules("--version")
    assert code == 0 and out.strip() == f"rag-lookahead {rag_lookahead.__version__}"


def test_bad_settings_are_refused_before_the_command_runs(capsys) -> None:
    # An overlap past the chunk size: refused from the flags alone, nothing read or loaded.
    assert main(["index", "docs", "--out", "idx", "--chunk-size", "8", "--chunk-overlap", "8"]) == 2
    assert "overlap" in capsys.readouterr().err


def test_the_demo_takes_a_number_of_questions() -> None:
    assert build_parser().parse_args(["demo", "--questions", "3"]).questions == 3
    assert build_parser().parse_args(["demo"]).questions is None  # all of them
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--questions", "-1"])


def test_commands_that_load_an_engine_take_remeasure() -> None:
    for argv in (["ask", "q", "--index", "i"], ["chat", "--index", "i"], ["demo"], ["bench", "--data", "d"]):
        assert build_parser().parse_args(argv).remeasure is False
        assert build_parser().parse_args([*argv, "--remeasure"]).remeasure is True


def test_the_step_flags_reach_the_engine_s_config() -> None:
    defaults = LookaheadConfig()
    config = lookahead_config(build_parser().parse_args(["bench", "--data", "d"]))
    assert (config.step, config.max_model_len) == (defaults.step, defaults.max_model_len)
    argv = ["bench", "--data", "d", "--step", "captured", "--max-model-len", "1024"]
    config = lookahead_config(build_parser().parse_args(argv))
    assert (config.step, config.max_model_len) == ("captured", 1024)
    for bad in (["--step", "graphs"], ["--max-model-len", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "--data", "d", *bad])


def test_measure_times_the_costs_again_and_says_how_busy_the_machine_was(
    tmp_path, monkeypatch, capsys
) -> None:
    config = LookaheadConfig(max_batch_size=2, decoding_length=3, window_size=1, ngram_size=2)
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), config, cache_dir=tmp_path)
    made = []
    monkeypatch.setattr(
        "rag_lookahead.cli.benchmark.make_engine", lambda args, measure=True: made.append(measure) or engine
    )
    assert main(["measure"]) == 0
    out = capsys.readouterr().out
    assert made == [False]  # the engine is made without reading the cache: measured here
    assert "relative to one token" in out and "2 rows" in out and "While timing, the" in out
    assert len(list((tmp_path / "costs").glob("costs-*.json"))) == 2  # one row, and 2 rows


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stream", "enabled", "drawn"), [(Terminal, True, True), (io.StringIO, True, False)])
def test_progress_bars_are_drawn_only_on_a_terminal_and_when_asked(
    monkeypatch, stream, enabled, drawn
) -> None:
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    with progress_bar(enabled, "measuring", total=3) as bar:
        bar.update(3)
    assert ("measuring" in err.getvalue()) is drawn
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    with progress_bar(False, "measuring", total=3) as bar:  # the library's default
        bar.update(3)
    assert quiet.getvalue() == ""
