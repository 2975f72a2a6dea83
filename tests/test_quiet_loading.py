"""The library prints nothing unless asked: transformers' own bars ("Loading weights", the GGUF
reader's "Converting and de-quantizing") follow the `progress=` rule, and where no bar can be
drawn, asked-for progress goes out as log lines, not onto standard error."""

import io
import logging
import sys
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from rag_lookahead.models import DEFAULT_MODEL, builtin_model_dir, load_model
from rag_lookahead.progress import PROGRESS_LOGGER, progress_bar, transformers_bars
from rag_lookahead.testing import save_tiny_model


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_loading_a_model_prints_nothing(model_dir, capfd) -> None:
    capfd.readouterr()
    load_model(str(model_dir))
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("progress", "stream", "shown"),
    [(True, Terminal, True), (True, io.StringIO, False), (False, Terminal, False)],
)
def test_transformers_bar_shows_only_if_asked_on_a_terminal(
    model_dir, monkeypatch, progress, stream, shown
) -> None:
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    load_model(str(model_dir), progress=progress)
    assert ("Loading weights" in err.getvalue()) is shown


@pytest.mark.parametrize("enabled", [True, False])
def test_transformers_switch_is_left_as_it_was(enabled, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", Terminal())
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        with transformers_bars(not enabled, gguf=True):
            assert hf_logging.is_progress_bar_enabled() is not enabled
        assert hf_logging.is_progress_bar_enabled() is enabled
        from transformers import modeling_gguf_pytorch_utils as reader

        assert reader.tqdm is not hf_logging.tqdm  # the GGUF reader's own tqdm, back in place
    finally:
        hf_logging.enable_progress_bar()  # transformers' default


def test_asked_for_progress_off_a_terminal_is_logged_not_written(monkeypatch, caplog) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    with progress_bar(True, "converting", total=3, unit="step") as bar:
        for _ in range(3):
            bar.update(1)
    assert list(progress_bar(True, "embedding", iterable=range(4))) == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER]
    # Each step of a short wait, once (not again on closing), then a long one's start and end.
    assert [line.split(" [")[0] for line in lines] == [
        "converting: 0/3",
        "converting: 1/3",
        "converting: 2/3",
        "converting: 3/3",
        "embedding: 0/4",
        "embedding: 4/4",
    ]
    assert err.getvalue() == ""
    caplog.clear()
    with progress_bar(False, "measuring", total=3) as bar:  # not asked: not even logged
        bar.update(3)
    assert caplog.records == [] and err.getvalue() == ""


@pytest.mark.slow
def test_loading_the_default_model_prints_nothing(capfd) -> None:
    builtin_model_dir(DEFAULT_MODEL)  # converted, as the other tests of the real model have it
    capfd.readouterr()
    load_model()
    assert capfd.readouterr() == ("", "")


@pytest.mark.slow
def test_converting_the_default_model_prints_nothing(tmp_path, capfd) -> None:
    capfd.readouterr()
    assert (builtin_model_dir(DEFAULT_MODEL, tmp_path) / "model.safetensors").is_file()
    assert capfd.readouterr() == ("", "")
