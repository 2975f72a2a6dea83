"""``mode="auto"`` on a busy machine: a cost curve distorted by a load (injected, never timed
here) keeps near-certain drafts in, the steps re-fit it, and the stats say why a step drafted
nothing."""

import pytest

from rag_lookahead import LookaheadEngine, rag_messages
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.planning.acceptance import AcceptanceModel
from rag_lookahead.planning.costs import CostCurve, CostModel, CurveCheck, StepCalibration
from rag_lookahead.protocol import usage
from rag_lookahead.streaming.stats import UNDRAFTED_REASONS, DecodeStats, StepRecorder
from rag_lookahead.testing.models import ASCII_VOCAB, AsciiTokenizer, CharTokenizer, tiny_model

SIZES = tuple(range(1, 18))
# A load that spared the one-token forwards and hindered the wider ones, unevenly: every draft
# looks three times dearer than its token or more, so this shape alone drafts nothing.
DISTORTED = (1.0, *(3.0 + 0.4 * k + (0.5 if k % 3 == 0 else 0.0) for k in SIZES[1:]))
PASSAGE_QUESTION = "Who is the Navy Cross awarded to?"


def loaded_curve() -> CostCurve:
    return CostCurve(SIZES, DISTORTED, loaded=True)


def steep_trusted_curve() -> CostCurve:
    return CostCurve(SIZES, DISTORTED)


def readme_engine(curve: CostCurve | None, mode: str = "auto", tmp_path=None) -> LookaheadEngine:
    """The README's "Use it" engine, the built-in model replaced by a tiny random one."""
    model = tiny_model("llama", 0, ASCII_VOCAB)
    config = LookaheadConfig(mode=mode, min_query_length=1)  # type: ignore[arg-type]
    return LookaheadEngine(model, AsciiTokenizer(), config, cost_curve=curve, cache_dir=tmp_path)


def copied_passage(engine: LookaheadEngine) -> tuple[list[dict[str, str]], str, list[int]]:
    """The README's messages, and a passage the answer copies word for word: the tiny model's
    own answer (its documents are what it drafts from, as a retrieved passage's would be)."""
    messages = rag_messages(PASSAGE_QUESTION, context="The Navy Cross is awarded for heroism.")
    plain = engine.plain().complete(messages, max_new_tokens=48)
    return messages, plain.text, plain.token_ids


def test_the_readme_block_drafts_more_than_a_token_per_forward_under_a_loaded_curve(tmp_path) -> None:
    engine = readme_engine(loaded_curve(), tmp_path=tmp_path)
    messages, passage, plain_ids = copied_passage(engine)
    stream = engine.stream(messages, max_new_tokens=48, documents=[passage])
    text = "".join(stream)
    stats = stream.stats
    assert stream.token_ids == plain_ids and text == passage  # lossless
    # Counted, not timed: the answer's tokens after the prefill took fewer forwards than
    # two-thirds of their number (more than 1.5 tokens a forward).
    assert 2 * (stats.new_tokens - 1) > 3 * stats.steps
    assert stats.drafting_off_reason is None


def test_the_same_shape_trusted_drafts_nothing_and_the_stats_say_why(tmp_path) -> None:
    engine = readme_engine(steep_trusted_curve(), tmp_path=tmp_path)
    engine.planner.acceptance = AcceptanceModel(explore_every=10**9)  # no periodic exploring step
    messages, passage, plain_ids = copied_passage(engine)
    completion = engine.complete(messages, max_new_tokens=48, documents=[passage])
    stats = completion.stats
    assert completion.token_ids == plain_ids
    assert stats.steps == stats.new_tokens - 1  # a forward a token: nothing drafted
    assert stats.drafting_off_reason == "not_worth_it"
    assert set(stats.undrafted_steps) <= {"not_worth_it", "no_draft"}
    assert sum(stats.undrafted_steps.values()) == stats.steps
    lookahead = usage(stats)["lookahead"]  # the server's usage extension says it too
    assert lookahead["drafting_off_reason"] == "not_worth_it"
    assert lookahead["undrafted_steps"] == dict(stats.undrafted_steps)


def test_a_plain_engine_and_an_unmatched_draft_name_their_reasons() -> None:
    model = tiny_model("llama")
    prompt = [5, 17, 33, 2]
    off = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="off"))
    stats = off.complete(prompt, max_new_tokens=8).stats
    assert stats.undrafted_steps == {"mode_off": stats.steps} and stats.drafting_off_reason == "mode_off"
    trie = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    stats = trie.complete([90, 91], max_new_tokens=2).stats  # nothing in the trie yet to match
    assert stats.undrafted_steps == {"no_draft": stats.steps}
    assert stats.as_dict()["drafting_off_reason"] == "no_draft"


def test_a_step_that_drafts_counts_no_reason_and_a_call_that_drafts_has_none() -> None:
    recorder = StepRecorder(4)
    recorder.plan("not_worth_it")
    recorder.step(0, 0, "none")
    recorder.plan(None)
    recorder.step(3, 2, "trie")
    recorder.step(0, 0, "none")  # no plan said why: nothing was proposed
    stats = recorder.stats()
    assert stats.undrafted_steps == {"not_worth_it": 1, "no_draft": 1}
    assert stats.drafting_off_reason is None
    assert DecodeStats(1, 1, 0, (), (), (), 0.0, 0.0, None).drafting_off_reason is None
    assert set(stats.undrafted_steps) <= set(UNDRAFTED_REASONS)


def test_a_curve_in_doubt_drafts_into_untimed_widths_until_the_steps_time_them() -> None:
    costs = CostModel.given(loaded_curve())
    assert costs.in_doubt and costs.calibration is not None
    explored = costs.explored(context=100)
    assert explored is not None and explored(16) == explored(1)  # no width timed: none dearer
    for _ in range(3):  # the steps time one token (1.0 against the curve's 1.0), then width 2
        costs.observe(1, 1.0, context=100)
    assert costs.explored(context=100)(16) == pytest.approx(1.0)
    for _ in range(3):
        costs.observe(2, 1.2, context=100)  # 1.2x one token, where the curve said 3.8x
    explored = costs.explored(context=100)
    assert explored(2) == pytest.approx(1.2) and explored(3) == pytest.approx(1.2 / 3.8 * DISTORTED[2])
    assert explored(8) == explored(3)  # widths 4-15 not timed yet: priced as the width below
    priced = costs.priced(context=100)
    assert priced is not None and priced(8) > explored(8)  # the calibrated curve, as it is


def test_a_trusted_curve_is_read_as_it_is() -> None:
    costs = CostModel.given(steep_trusted_curve())
    assert not costs.in_doubt and costs.calibration is None
    assert costs.explored(context=100) == steep_trusted_curve()


def test_one_token_forwards_slower_than_the_curve_put_its_shape_in_doubt() -> None:
    curve = CostCurve((1, 2, 4), (1.0, 2.5, 3.0))
    costs = CostModel(curve, check=CurveCheck(samples=4, context=256), calibration=StepCalibration())
    for _ in range(4):
        costs.observe(1, 1.3, context=300)  # slower, but within what a load now explains
    assert not costs.in_doubt
    for _ in range(4):
        costs.observe(1, 2.0, context=2000)  # after a far longer context: proves nothing
    assert not costs.in_doubt
    for _ in range(4):
        costs.observe(1, 2.0, context=600)  # its one-token time was a quiet moment's
    assert costs.in_doubt
    assert not costs.retire_contradicted()  # nothing to measure again: the steps re-fit it


def test_a_retired_curve_stays_in_doubt() -> None:
    costs = CostModel(
        CostCurve((1, 2), (2.0, 3.0)), check=CurveCheck(samples=2), calibration=StepCalibration()
    )
    for _ in range(2):
        costs.observe(1, 0.5, context=10)  # far faster than the curve: a load that has gone
    assert costs.retire_contradicted() and costs.check is None
    assert costs.in_doubt
