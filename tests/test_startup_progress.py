"""Every wait of a first run says where it is: each stage's bar has a known total from its
start, counts up to it, and a pulse says it again while one step counts nothing. No wall clock
is read here: the pulse's clock is the test's."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.models import BUILTIN_MODELS, DEFAULT_MODEL, builtin_model_dir, convert_gguf
from rag_lookahead.planning.costs import measure_curve, sparse_sizes
from rag_lookahead.progress import PROGRESS_LOGGER, Pulse, progress_bar
from rag_lookahead.testing.models import ASCII_VOCAB, AsciiTokenizer, tiny_model
from rag_lookahead.tuning.tuner import ModelTuning


class _CountingBar:
    """A bar that keeps its total at each update."""

    def __init__(self) -> None:
        self.n = 0
        self.total: int | None = None
        self.totals: list[int | None] = []

    def update(self, k: int) -> None:
        self.n += k
        self.totals.append(self.total)

    def refresh(self) -> None:
        pass


def _counts(lines: list[str], what: str) -> list[tuple[int, int]]:
    """The (count, total) of each logged line of the bar ``what``."""
    found = (re.match(re.escape(what) + r".*?: (\d+)/(\d+) ", line) for line in lines)
    return [(int(m[1]), int(m[2])) for m in found if m]


@pytest.fixture
def progress_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> pytest.LogCaptureFixture:
    """The progress lines logged off a terminal (as the command line shows them in a pipe)."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    return caplog


def test_sparse_sizes_span_every_width_class_in_few_sizes() -> None:
    assert sparse_sizes(1) == (1,)
    assert sparse_sizes(6) == (1, 2, 3, 4, 6)
    assert sparse_sizes(41) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 41)
    for top in range(1, 300):
        sizes = sparse_sizes(top)
        assert sizes[0] == 1 and sizes[-1] == top
        assert {k.bit_length() for k in sizes} == set(range(1, top.bit_length() + 1))
        assert len(sizes) <= 2 * top.bit_length() + 1
    with pytest.raises(ValueError, match="max_tokens"):
        sparse_sizes(0)


def test_a_curve_timed_at_a_few_sizes_counts_to_a_total_known_from_its_start() -> None:
    timed: list[int] = []

    def forward(k: int) -> float:
        timed.append(k)
        return 1.0 + k / 10 + (0.5 if len(timed) % 7 == 0 else 0.0)  # a load now and then

    bar = _CountingBar()
    curve = measure_curve(forward, 12, bar=bar, sizes=sparse_sizes(12))
    assert set(timed) == {1, 2, 3, 4, 6, 8, 12} and curve.sizes == (1, 2, 3, 4, 6, 8, 12)
    assert len(set(bar.totals)) == 1 and bar.totals[0] is not None  # never grown
    assert bar.n == len(timed) <= bar.totals[0] and bar.total == bar.n  # full at the end
    assert curve(5) == pytest.approx((curve(4) + curve(6)) / 2)  # in between: interpolated
    with pytest.raises(ValueError, match="sizes"):
        measure_curve(forward, 12, sizes=(2, 12))


def test_a_pulse_beats_on_its_clock_until_stopped() -> None:
    beats: list[int] = []
    ticks = iter([False, False, False, True])
    pulse = Pulse(lambda: beats.append(1), every=10.0, wait=lambda _: next(ticks))
    pulse._thread.join(timeout=60)
    assert beats == [1, 1, 1]  # once per tick, none once the clock says stopped
    pulse.stop()


def test_a_pulsed_line_says_the_same_count_again(progress_log: pytest.LogCaptureFixture) -> None:
    with progress_bar(True, "converting", total=4, unit="step") as bar:
        bar.update(1)
        bar.pulse()  # one long step: said again with its time, not left silent
        bar.pulse()
        bar.update(3)
    assert _counts(progress_log.messages, "converting") == [(0, 4), (1, 4), (1, 4), (1, 4), (4, 4)]


def test_choosing_kernels_and_probing_show_bars_with_known_totals(
    progress_log: pytest.LogCaptureFixture,
) -> None:
    ModelTuning(tiny_model(), "auto", progress=True)
    timing = _counts(progress_log.messages, "timing the CPU kernels")
    probing = _counts(progress_log.messages, "probing the model's forwards")
    if timing:  # where oneDNN is available, "auto" times its kernels
        total = timing[0][1]
        assert {t for _, t in timing} == {total} and timing[-1] == (total, total)
    assert probing[0] == (0, 3) and probing[-1] == (3, 3) and {t for _, t in probing} == {3}
    assert [n for n, _ in probing] == sorted(n for n, _ in probing)


@pytest.mark.slow
def test_converting_the_default_model_counts_its_four_named_steps(
    progress_log: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    builtin_model_dir(DEFAULT_MODEL, tmp_path, progress=True)
    lines = [line for line in progress_log.messages if line.startswith("converting")]
    assert [n for n, _ in _counts(lines, "converting")][-1] == 4
    assert {t for _, t in _counts(lines, "converting")} == {4}
    for step in ("reading the tokenizer", "dequantizing the weights", "saving"):
        assert any(step in line for line in lines)
    # Its GGUF file carried alone (as to the GPU machine) converts to the same bytes.
    converted = builtin_model_dir(DEFAULT_MODEL, tmp_path)
    gguf = BUILTIN_MODELS[DEFAULT_MODEL].gguf(tmp_path)
    convert_gguf(gguf, tmp_path / "alone", DEFAULT_MODEL)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "alone" / name).read_bytes() == (converted / name).read_bytes()


def test_converting_a_gguf_file_names_a_built_in_model(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no built-in model"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out", "gpt-5")


def test_one_call_at_a_time_measures_one_rows_costs_only(
    progress_log: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    model = tiny_model("llama", 0, ASCII_VOCAB)
    config = LookaheadConfig(mode="auto", min_query_length=1)
    engine = LookaheadEngine(model, AsciiTokenizer(), config, cache_dir=tmp_path, progress=True)
    engine.measure_ahead(batches=False)  # as `demo`, `ask` and `chat` measure
    assert engine.cost_curve is not None and engine.costs.batch is None
    assert engine.costs.batched() is not None  # a batch priced by one row's curve meanwhile
    measuring = _counts(progress_log.messages, "measuring forward costs")
    totals = [t for _, t in measuring]
    assert measuring[0][0] == 0 and totals == sorted(totals, reverse=True)  # known from the first line
    assert measuring[-1][0] == measuring[-1][1]  # never grown; full at the end
    assert not _counts(progress_log.messages, "measuring costs of 2-row batches")
    fresh = LookaheadEngine(model, AsciiTokenizer(), config, cache_dir=tmp_path)
    fresh.measure_ahead()  # as `serve` measures: the batches too
    assert fresh.costs.batch is not None
