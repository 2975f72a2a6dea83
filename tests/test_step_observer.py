"""What a step observer (`rag_lookahead.engine.observe`) is told adds up to what the calls did.

Tiny random models; counts and shapes only, never how long anything took.
"""

from __future__ import annotations

import threading
import warnings

import pytest

from rag_lookahead import GenerationParams
from rag_lookahead.engine.observe import StepLog, StepObserver, observe_steps
from rag_lookahead.testing import run_together, tiny_engine

PROMPTS = [[(7 * j + 3 * row) % 50 + 3 for j in range(30)] * 3 for row in range(3)]


def test_the_steps_released_every_token_of_every_call() -> None:
    engine = tiny_engine()
    params = GenerationParams(max_new_tokens=12, eos_token_id=())
    with observe_steps(StepLog()) as log:
        completions = run_together(engine, [(p, params) for p in PROMPTS], stagger=2)
    assert isinstance(log, StepLog)
    new_tokens = sum(c.stats.new_tokens for c in completions)
    assert sum(step.released for step in log.steps) == new_tokens
    assert {step.kind for step in log.steps} <= {"batch", "fused", "row", "prompt", "plain"}
    assert any(step.kind in ("batch", "fused") and len(step.rows) > 1 for step in log.steps)
    # Every call was heard of as it was queued, and as it ended, with its stats.
    assert len(log.queued_calls) == len(log.ended_calls) == len(PROMPTS)
    assert {e.call for e in log.queued_calls} == {e.call for e in log.ended_calls}
    assert {e.thread for e in log.queued_calls} == {threading.get_ident()}
    ended = sorted(e.stats.new_tokens for e in log.ended_calls if e.stats is not None)
    assert ended == sorted(c.stats.new_tokens for c in completions)
    for iteration in log.iterations:
        assert iteration.seconds >= iteration.forward_seconds >= 0
    assert len({iteration.loop for iteration in log.iterations}) == 1  # one engine, one loop


def test_a_row_forwards_part_of_what_its_drafter_proposed() -> None:
    engine = tiny_engine()
    with observe_steps(StepLog()) as log:
        engine.complete(PROMPTS[0], max_new_tokens=16, eos_token_id=())
    assert isinstance(log, StepLog)
    drafted = [row for step in log.steps for row in step.rows if not row.prompt]
    assert drafted and all(row.proposed is not None for row in drafted)
    for row in drafted:
        assert row.proposed is not None
        assert len(row.forwarded.tree) <= len(row.proposed.tree)
        assert row.forwarded.tree.tokens[0] == row.proposed.tree.tokens[0]  # the root: the last token
        assert 1 <= row.released <= len(row.forwarded.tree)
    prompts = [row for step in log.steps for row in step.rows if row.prompt]
    assert sum(len(row.forwarded) for row in prompts) == len(PROMPTS[0])


def test_nothing_is_told_outside_the_block_and_a_failing_observer_is_dropped() -> None:
    engine = tiny_engine()

    class Failing(StepObserver):
        told = 0

        def iteration(self, record: object) -> None:  # type: ignore[override]
            Failing.told += 1
            raise RuntimeError("a bug in a benchmark")

    log = StepLog()
    # (told in the model's thread: leaving the block waits for the iteration under way)
    with pytest.warns(UserWarning, match="step observer"), observe_steps(log), observe_steps(Failing()):
        answer = engine.complete(PROMPTS[1], max_new_tokens=8, eos_token_id=())
    assert Failing.told == 1
    assert log.iterations  # the other observer goes on being told
    told = len(log.iterations)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = engine.complete(PROMPTS[1], max_new_tokens=8, eos_token_id=())
    assert len(log.iterations) == told
    assert again.token_ids == answer.token_ids
