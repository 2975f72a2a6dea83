"""The batch bound: many clients decoding together, priced on recorded greedy answers.

Greedy verification accepts exactly the longest draft path that matches the recorded answer
(`matched`), so a batch of rows can be replayed without the model, as one row is by
`replay.py`, and each step priced with a grid of batched forward costs
(`CostGrid`: milliseconds by rows and tokens per row). The serialised engine is the same
replay with one client: each answer alone, in order, on the grid's one-row curve.

The model, kept simple on purpose:

- All questions arrive at once; ``clients`` rows decode together. A row whose answer is
  complete leaves after its step and the next question takes its place in the next step, with
  its first token already decided by its prefill. Prefills are not priced and stall nothing
  (the concurrency benchmark's decode rate leaves them out too); once the questions run out,
  the batch drains and its last steps have fewer rows. Optionally (``join_chunk``) a joining
  row first waits for its prompt's chunks, one chunk between two steps as the engine prefills
  apart on a CPU: the steps meanwhile have fewer rows, the chunks themselves are not priced.
- A step costs ``grid(rows, width)``: every row is padded to the widest row's tokens. The
  rows' context lengths and host work between forwards are not priced.
- The rows' drafters share one trie and the planner's acceptance statistics, as the engine's
  calls do: a row's drafter is made when it joins and closed when it leaves, and its accepted
  tokens enter the trie's output branches as they are decided, for the other rows too.
- Policies: ``plain`` verifies no drafts; ``auto`` plans each row as a call alone would (the
  one-row curve), and the batch pays for the widest; ``joint`` is the engine's batch plan
  (`plan_batch`: the width with the most expected tokens per millisecond of the batch
  forward); ``oracle`` takes, at every step, the width with the most accepted tokens per
  millisecond for the whole batch, each row verifying the accepted part of its draft cut to
  that width. The oracle is greedy step by step, over the same drafts: a bound for any plan of
  these drafts at each step, not for other drafts or schedules.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.compose import build_drafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.planning.costs import CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner, plan_batch

__all__ = [
    "BATCH_POLICIES",
    "GRID_SHAPES",
    "CostGrid",
    "Priced",
    "batch_bounds",
    "load_grid",
    "matched",
    "price_batch",
    "reshaped",
]

BATCH_POLICIES = ("plain", "auto", "joint", "oracle")
GRID_SHAPES = ("measured", "flat", "free-rows", "free-width")
GRID_FORMAT = "rag-lookahead-step-grid"


def matched(tree: DraftTree, answer: Sequence[int]) -> list[int]:
    """Tree nodes accepted when the model's next tokens are ``answer`` (root first)."""
    nodes = [0]
    # The last known token can only be the model's own (bonus) token, never a matched draft.
    for token in answer[:-1]:
        child = tree.child(nodes[-1], token)
        if child is None:
            break
        nodes.append(child)
    return nodes


@dataclass(frozen=True)
class CostGrid:
    """Milliseconds of a forward by rows and tokens per row (width), from measured cells.

    Between measured widths a row count's curve is linear (`CostCurve`; past the widest, the
    line from width 1 to the widest goes on). Between measured row counts the two nearest are
    interpolated linearly; past the most rows, the cost grows in proportion to the rows.
    """

    rows: tuple[int, ...]  # row counts measured, increasing, from 1
    curves: tuple[CostCurve, ...]  # milliseconds by width, one curve per row count

    def __post_init__(self) -> None:
        if not self.rows or self.rows[0] != 1 or list(self.rows) != sorted(set(self.rows)):
            raise ValueError("a cost grid needs increasing row counts starting at 1 (the one-row curve)")
        if len(self.rows) != len(self.curves):
            raise ValueError("a cost grid needs one curve per row count")

    def __call__(self, rows: int, width: int) -> float:
        if rows < 1 or width < 1:
            raise ValueError(f"a forward has at least one row and one token per row, not {rows} x {width}")
        if rows >= self.rows[-1]:
            return self.curves[-1](width) * rows / self.rows[-1]
        high = next(i for i, n in enumerate(self.rows) if n >= rows)
        if self.rows[high] == rows:
            return self.curves[high](width)
        low = high - 1
        frac = (rows - self.rows[low]) / (self.rows[high] - self.rows[low])
        return self.curves[low](width) + frac * (self.curves[high](width) - self.curves[low](width))

    def one_row(self) -> CostCurve:
        """The one-row curve in seconds, as the planner takes it."""
        curve = self.curves[0]
        return CostCurve(curve.sizes, tuple(ms / 1000 for ms in curve.seconds))

    @classmethod
    def from_cells(
        cls,
        rows: Sequence[int],
        widths: Sequence[int] | Sequence[Sequence[int]],
        ms: Sequence[Sequence[float]],
    ) -> CostGrid:
        """A grid from ``ms[i][j]``, the cost of ``rows[i]`` rows of ``widths[j]`` tokens each
        (or of ``widths[i][j]``, where each row count was measured at its own widths)."""
        row_widths = [_ints(w) for w in widths] if widths and not isinstance(widths[0], int) else None
        if row_widths is None:
            row_widths = [_ints(widths)] * len(rows)
        if len(ms) != len(rows) or len(row_widths) != len(rows):
            raise ValueError("a cost grid needs one list of cells per row count")
        if any(len(cells) != len(w) for cells, w in zip(ms, row_widths, strict=True)):
            raise ValueError("a cost grid needs one cell per width")
        curves = (
            CostCurve(tuple(w), tuple(float(c) for c in cells))
            for w, cells in zip(row_widths, ms, strict=True)
        )
        return cls(tuple(rows), tuple(curves))


def _ints(values: object) -> list[int]:
    if not isinstance(values, Sequence) or not all(isinstance(v, int) for v in values):
        raise ValueError(f"widths must be whole numbers, not {values!r}")
    return list(values)


def load_grid(path: Path) -> CostGrid:
    """A grid written by ``benchmarks/step_costs.py --json``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != GRID_FORMAT:
            raise ValueError(f"not a {GRID_FORMAT} file")
        return CostGrid.from_cells(data["rows"], data["widths"], data["ms"])
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: cannot read a cost grid ({err})") from err


def reshaped(grid: CostGrid, shape: str) -> CostGrid:
    """``grid`` as measured, or a hypothetical shape from it: ``flat`` (every forward costs one
    row's single token), ``free-rows`` (rows cost nothing: each width as on one row) or
    ``free-width`` (tokens per row cost nothing: each row count as at one token a row)."""
    cells: dict[str, Callable[[int, int], float]] = {
        "measured": grid,
        "flat": lambda rows, width: grid(1, 1),
        "free-rows": lambda rows, width: grid(1, width),
        "free-width": lambda rows, width: grid(rows, 1),
    }
    if shape not in cells:
        raise ValueError(f"unknown grid shape {shape!r}; choose from {list(GRID_SHAPES)}")
    cell, widths = cells[shape], [curve.sizes for curve in grid.curves]
    ms = [[cell(n, w) for w in sizes] for n, sizes in zip(grid.rows, widths, strict=True)]
    return CostGrid.from_cells(grid.rows, widths, ms)


@dataclass(frozen=True)
class Priced:
    """A replayed run: new tokens (the first of each answer included, as the benchmark counts
    them), forwards, rows summed over forwards, and the priced decode milliseconds."""

    tokens: int
    steps: int
    row_steps: int
    ms: float

    @property
    def tokens_per_s(self) -> float:
        return 1000 * self.tokens / self.ms if self.ms else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "decode_tok_s": round(self.tokens_per_s, 2),
            "forwards": self.steps,
            "mean_rows": round(self.row_steps / max(self.steps, 1), 2),
        }


@dataclass
class _Row:
    answer: list[int]
    drafter: Drafter
    context: list[int]
    chunks: int  # prompt chunks left to prefill before it decodes
    done: int = 1  # the first token comes from the prefill


class _Replay:
    """One replayed run's shared state: the trie, the planner, the grid and the policy."""

    def __init__(self, config: LookaheadConfig, grid: CostGrid, policy: str, max_new_tokens: int) -> None:
        if policy not in BATCH_POLICIES:
            raise ValueError(f"unknown batch policy {policy!r}; choose from {list(BATCH_POLICIES)}")
        self.config, self.grid, self.policy = config, grid, policy
        self.max_new_tokens = max_new_tokens
        self.trie = TokenTrie(config.max_query_length, config.branch_length, config.max_trie_nodes)
        self.planner = StepPlanner(config, CostModel(grid.one_row()))

    def join(self, item: dict[str, Any], chunk: int | None) -> _Row:
        prompt, answer = list(item["prompt"]), list(item["output"])
        chunks = -(-len(prompt) // chunk) if chunk is not None else 0
        row = _Row(answer, build_drafter(self.config, self.trie, [prompt]), prompt + answer[:1], chunks)
        row.drafter.observe(answer[:1])
        return row

    def proposal(self, row: _Row) -> DraftTree:
        budget = min(self.config.decoding_length, self.max_new_tokens - row.done - 1)
        if budget <= 0 or self.policy == "plain":
            return DraftTree.root_only(row.context[-1])
        return row.drafter.propose(row.context, budget).tree

    def plan(self, rows: list[_Row], trees: list[DraftTree]) -> list[DraftTree]:
        """What each row verifies this step."""
        by_width = partial(self.grid, len(rows))  # this step's cost by tokens per row
        if self.policy == "oracle":
            return _oracle(trees, [r.answer[r.done :] for r in rows], by_width)
        if self.policy == "joint" and len(rows) > 1:
            ranked = [self.planner.rank(StepDraft(tree)) for tree in trees]
            return plan_batch(ranked, by_width, self.config.max_tokens_per_forward)
        return [self.planner.plan(StepDraft(tree), room=1 << 62).tree for tree in trees]

    def advance(self, row: _Row, tree: DraftTree) -> None:
        nodes = matched(tree, row.answer[row.done :])
        self.planner.learn(tree, nodes)
        emitted = row.answer[row.done : row.done + len(nodes)]
        row.drafter.observe(emitted)
        row.context += emitted
        row.done += len(emitted)


def _oracle(
    trees: list[DraftTree], answers: list[list[int]], cost: Callable[[int], float]
) -> list[DraftTree]:
    """Each row's accepted path, cut to the width with the most accepted tokens (all rows) per
    unit of ``cost``."""
    paths = [matched(tree, answer) for tree, answer in zip(trees, answers, strict=True)]
    widest = max(len(path) for path in paths)
    rates = [(sum(min(len(p), w) for p in paths) / cost(w), -w) for w in range(1, widest + 1)]
    width = -max(rates)[1]  # ties: the narrower
    return [tree.subtree(path[1:width]) for tree, path in zip(trees, paths, strict=True)]


def price_batch(
    recorded: dict[str, Any],
    config: LookaheadConfig,
    grid: CostGrid,
    policy: str,
    clients: int,
    join_chunk: int | None = None,
) -> Priced:
    """``recorded``'s answers decoded ``clients`` at a time under ``policy``, priced on ``grid``
    (``clients=1``: the serialised engine). With ``join_chunk``, a joining prompt is prefilled
    as the engine does on a CPU: in chunks of that many tokens, one chunk between two steps
    (the first joining prompt's), all of it at once while no row decodes; unpriced either way."""
    if clients < 1 or (join_chunk is not None and join_chunk < 1):
        raise ValueError(f"clients and join_chunk must be at least 1, not {clients} and {join_chunk}")
    answers = recorded["answers"]
    run = _Replay(config, grid, policy, int(recorded["max_new_tokens"]))
    waiting, joining, rows = deque(answers), deque[_Row](), list[_Row]()
    steps = row_steps = 0
    ms = 0.0
    while rows := _admit(run, rows, joining, waiting, clients, join_chunk):
        trees = run.plan(rows, [run.proposal(row) for row in rows])
        ms += grid(len(rows), max(len(tree) for tree in trees))
        for row, tree in zip(rows, trees, strict=True):
            run.advance(row, tree)
        steps, row_steps = steps + 1, row_steps + len(rows)
        if joining:
            joining[0].chunks -= 1
    return Priced(sum(len(item["output"]) for item in answers), steps, row_steps, ms)


def _admit(
    run: _Replay,
    rows: list[_Row],
    joining: deque[_Row],
    waiting: deque[dict[str, Any]],
    clients: int,
    chunk: int | None,
) -> list[_Row]:
    """The rows of the next step: those still decoding, then the joining ones whose prompts
    are prefilled, the next questions taking the free places. A finished row's drafter is
    closed (its outputs stay in the trie); an answer done at its prefill never takes a step."""
    rows = [row for row in rows if not _ended(row)]
    while True:
        while waiting and len(rows) + len(joining) < clients:
            joining.append(run.join(waiting.popleft(), chunk))
        if not joining or (joining[0].chunks > 0 and rows):
            return rows
        row = joining.popleft()
        if not _ended(row):
            rows.append(row)


def _ended(row: _Row) -> bool:
    if row.done < len(row.answer):
        return False
    row.drafter.close()
    return True


def batch_bounds(
    recorded: dict[str, Any],
    config: LookaheadConfig,
    grid: CostGrid,
    clients: int,
    policies: Sequence[str] = BATCH_POLICIES,
    join_chunk: int | None = None,
) -> dict[str, dict[str, float]]:
    """The serialised engine (one client: ``plain``, ``auto``, ``oracle``) and ``clients`` at
    once under each of ``policies``, with each batch's decode rate over the serialised
    engine's (``auto``, and its ``oracle``); ``join_chunk`` as for `price_batch`."""
    alone = {p: price_batch(recorded, config, grid, p, 1) for p in ("plain", "auto", "oracle")}
    out = {f"serialised {p}": priced.summary() for p, priced in alone.items()}
    for policy in policies:
        priced = price_batch(recorded, config, grid, policy, clients, join_chunk)
        out[f"{clients} clients {policy}"] = {
            **priced.summary(),
            "vs_serialised_auto": round(priced.tokens_per_s / alone["auto"].tokens_per_s, 3),
            "vs_serialised_oracle": round(priced.tokens_per_s / alone["oracle"].tokens_per_s, 3),
        }
    return out
