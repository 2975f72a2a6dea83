"""The batch replay's pricing on synthetic answers and grids: no model, no clock (every
"millisecond" here is a grid cell's price, so the assertions are on sums of prices)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

# The replay tools are lab tools beside the benchmark scripts, not part of the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from batch_replay import (
    BATCH_POLICIES,
    CostGrid,
    batch_bounds,
    load_grid,
    price_batch,
    reshaped,
)

from rag_lookahead.config import LookaheadConfig

CONFIG = LookaheadConfig(mode="auto")
WIDTHS = (1, 2, 4, 8, 16)


def grid(cell: Any, rows: tuple[int, ...] = (1, 8)) -> CostGrid:
    return CostGrid.from_cells(rows, WIDTHS, [[cell(n, w) for w in WIDTHS] for n in rows])


def recorded(lengths: list[int], copy: bool = False) -> dict[str, Any]:
    """Answers of ``lengths`` tokens; with ``copy`` each answer is a span of its prompt, so the
    drafts (the prompt's own text) are accepted."""
    answers = []
    for i, length in enumerate(lengths):
        prompt = [1000 * (i + 1) + j for j in range(60)]
        output = prompt[20 : 20 + length] if copy else [900 + (i * 7 + j) % 50 for j in range(length)]
        answers.append({"prompt": prompt, "output": output})
    return {"max_new_tokens": 64, "answers": answers}


def test_flat_grid_plain_batch_is_rows_times_one_row() -> None:
    flat = grid(lambda rows, width: 10.0)
    data = recorded([12] * 16)
    alone = price_batch(data, CONFIG, flat, "plain", 1)
    batch = price_batch(data, CONFIG, flat, "plain", 8)
    assert alone.steps == 16 * 11 and batch.steps == 2 * 11
    assert batch.tokens == alone.tokens
    assert 8 * batch.ms == pytest.approx(alone.ms)  # the same tokens for an eighth of the price


def test_rows_drain_at_the_end() -> None:
    # Two clients, answers of 5, 3 and 4 tokens (4, 2 and 3 steps after the prefill's token):
    # the third joins after the second's two steps; the last step has one row.
    costs = grid(lambda rows, width: {1: 7.0, 2: 10.0}.get(rows, 100.0) * width, rows=(1, 2, 8))
    priced = price_batch(recorded([5, 3, 4]), CONFIG, costs, "plain", 2)
    assert (priced.steps, priced.row_steps) == (5, 9)
    assert priced.ms == pytest.approx(4 * 10.0 + 7.0)
    assert priced.tokens == 12


def test_joins_wait_for_their_prompt_chunks() -> None:
    # Prompts of 60 tokens in chunks of 20: the first is prefilled at once (no row decodes), the
    # second one chunk after each of the first's steps, and decodes from the fourth step.
    costs = grid(lambda rows, width: {1: 7.0, 2: 10.0}.get(rows, 100.0), rows=(1, 2, 8))
    priced = price_batch(recorded([5, 5]), CONFIG, costs, "plain", 2, join_chunk=20)
    assert (priced.steps, priced.row_steps) == (7, 8)
    assert priced.ms == pytest.approx(6 * 7.0 + 10.0)
    instant = price_batch(recorded([5, 5]), CONFIG, costs, "plain", 2)
    assert (instant.steps, instant.row_steps) == (4, 8)


def test_an_answer_done_at_its_prefill_takes_no_step() -> None:
    priced = price_batch(recorded([1, 3]), CONFIG, grid(lambda rows, width: 5.0), "plain", 2)
    assert (priced.steps, priced.row_steps) == (2, 2)


@pytest.mark.parametrize("policy", BATCH_POLICIES)
def test_a_grid_linear_in_tokens_never_pays_for_drafts(policy: str) -> None:
    # Every token verified costs the same: no plan beats one token a row.
    linear = grid(lambda rows, width: 3.0 * rows * width)
    data = recorded([20, 9, 30, 14], copy=True)
    plain = price_batch(data, CONFIG, linear, "plain", 2)
    assert price_batch(data, CONFIG, linear, policy, 2).ms >= plain.ms - 1e-9


def test_oracle_gains_at_most_its_tokens_per_row_step() -> None:
    # Wider steps cost more: the oracle's gain over plain batching is at most the tokens each
    # row takes per forward.
    steep = grid(lambda rows, width: 20.0 + 2.0 * rows + rows * width)
    data = recorded([24] * 8, copy=True)
    plain = price_batch(data, CONFIG, steep, "plain", 4)
    oracle = price_batch(data, CONFIG, steep, "oracle", 4)
    decoded = oracle.tokens - len(data["answers"])
    assert oracle.steps < plain.steps
    assert oracle.tokens == plain.tokens
    assert plain.ms / oracle.ms <= decoded / oracle.row_steps + 1e-9  # the same tokens, priced


def test_flat_grid_oracle_takes_every_accepted_token() -> None:
    flat = grid(lambda rows, width: 1.0)
    data = recorded([30], copy=True)
    oracle = price_batch(data, CONFIG, flat, "oracle", 1)
    auto = price_batch(data, CONFIG, flat, "auto", 1)
    assert oracle.steps <= auto.steps < 29


def test_bounds_compare_with_the_serialised_engine() -> None:
    costs = grid(lambda rows, width: 10.0 + rows + 0.5 * rows * width)
    bounds = batch_bounds(recorded([10, 20, 15, 5], copy=True), CONFIG, costs, 2, ("plain", "oracle"))
    assert set(bounds) == {
        "serialised plain",
        "serialised auto",
        "serialised oracle",
        "2 clients plain",
        "2 clients oracle",
    }
    assert bounds["2 clients oracle"]["vs_serialised_auto"] > 0


def test_grid_interpolates_widths_and_rows() -> None:
    costs = CostGrid.from_cells((1, 8), (1, 4), [[10.0, 16.0], [80.0, 108.0]])
    assert costs(1, 2) == pytest.approx(12.0)
    assert costs(8, 4) == pytest.approx(108.0)
    assert costs(4, 1) == pytest.approx(10.0 + 3 / 7 * 70.0)
    assert costs(16, 1) == pytest.approx(160.0)  # past the most rows: in proportion
    assert costs(1, 7) == pytest.approx(22.0)  # past the widest: the line from width 1 goes on
    assert costs.one_row()(4) == pytest.approx(0.016)


def test_grid_rows_may_have_their_own_widths() -> None:
    costs = CostGrid.from_cells((1, 8), [[1, 2, 3], [1, 3]], [[10.0, 11.0, 15.0], [80.0, 90.0]])
    assert costs(1, 3) == pytest.approx(15.0)
    assert costs(8, 2) == pytest.approx(85.0)


def test_reshaped_grids() -> None:
    costs = grid(lambda rows, width: 10.0 * rows + width)
    assert reshaped(costs, "flat")(8, 16) == pytest.approx(11.0)
    assert reshaped(costs, "free-rows")(8, 4) == pytest.approx(14.0)
    assert reshaped(costs, "free-width")(8, 4) == pytest.approx(81.0)
    with pytest.raises(ValueError, match="unknown grid shape"):
        reshaped(costs, "round")


def test_load_grid(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    cells = {"rows": [1, 8], "widths": [1, 2], "ms": [[30.0, 31.0], [90.0, 95.0]]}
    path.write_text(json.dumps({"format": "rag-lookahead-step-grid", **cells}))
    assert load_grid(path)(8, 2) == pytest.approx(95.0)
    path.write_text(json.dumps({"format": "rag-lookahead-step-grid", **cells, "rows": [2, 8]}))
    with pytest.raises(ValueError, match="starting at 1"):
        load_grid(path)
    path.write_text(json.dumps(cells))
    with pytest.raises(ValueError, match="not a rag-lookahead-step-grid"):
        load_grid(path)


def test_bad_arguments() -> None:
    flat = grid(lambda rows, width: 1.0)
    with pytest.raises(ValueError, match="unknown batch policy"):
        price_batch(recorded([3]), CONFIG, flat, "greedy", 2)
    with pytest.raises(ValueError, match="clients"):
        price_batch(recorded([3]), CONFIG, flat, "plain", 0)
    with pytest.raises(ValueError, match="join_chunk"):
        price_batch(recorded([3]), CONFIG, flat, "plain", 2, join_chunk=0)
    with pytest.raises(ValueError, match="at least one row"):
        flat(0, 1)


def test_the_path_policy_accepts_what_the_oracle_does_for_fewer_verified_tokens() -> None:
    # One stream (`replay`): "path" verifies only the accepted part of each draft, so it takes
    # the oracle's tokens per forward at no greater price; on a curve that rises with the size,
    # a strictly better rate whenever a draft held something rejected.
    from replay import replay

    from rag_lookahead.planning.costs import CostCurve

    answers = recorded([40, 60, 30], copy=True)
    curve = CostCurve((1, 17), (1.0, 3.0))
    oracle = replay(answers, CONFIG, curve, "oracle")
    path = replay(answers, CONFIG, curve, "path")
    assert path["tokens_per_forward"] == oracle["tokens_per_forward"] > 1
    assert path["decode_speedup"] >= oracle["decode_speedup"]
