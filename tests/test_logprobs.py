"""``logprobs=True``: the raw log probabilities of every released token, read off the forward
that verified it, so that lookahead reports what plain decoding reports."""

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine, StreamChunk
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.planning.costs import CostCurve
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.testing import (
    ASCII_VOCAB,
    FAMILIES,
    AsciiTokenizer,
    CharTokenizer,
    run_together,
    tiny_engine,
    tiny_model,
)

NEW_TOKENS = 24
PROMPT = [5, 17, 33, 2, 9]
# Tree and one-token forwards round differently: the same numbers, up to float32 rounding.
ATOL = 1e-4
GREEDY = GenerationParams(max_new_tokens=NEW_TOKENS, logprobs=True, top_logprobs=5)
SAMPLED = GenerationParams(
    max_new_tokens=NEW_TOKENS,
    do_sample=True,
    temperature=1.3,
    top_p=0.9,
    seed=11,
    logprobs=True,
    top_logprobs=3,
)


def drafting_engine(family: str, reference: list[int]) -> LookaheadEngine:
    """An engine whose trie holds the plain answer: most of it is drafted and accepted."""
    engine = LookaheadEngine(
        tiny_model(family), CharTokenizer(), LookaheadConfig(mode="trie"), cost_curve=CostCurve.flat()
    )
    engine.trie.insert(PROMPT + reference, OUTPUT_OWNER)
    return engine


def assert_same(got: list[TokenLogprob], want: list[TokenLogprob]) -> None:
    assert [t.token_id for t in got] == [t.token_id for t in want]
    for a, b in zip(got, want, strict=True):
        assert a.token == b.token
        assert a.logprob == pytest.approx(b.logprob, abs=ATOL)
        assert [t.logprob for t in a.top_logprobs] == pytest.approx(
            [t.logprob for t in b.top_logprobs], abs=ATOL
        )
        assert [t.token_id for t in a.top_logprobs] == [t.token_id for t in b.top_logprobs]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lookahead_reports_the_plain_engines_logprobs(family: str, params: GenerationParams) -> None:
    plain = LookaheadEngine(tiny_model(family), CharTokenizer(), LookaheadConfig(mode="off"))
    want = plain.complete(PROMPT, params)
    engine = drafting_engine(family, want.token_ids)
    got = engine.complete(PROMPT, params)
    assert got.token_ids == want.token_ids
    assert sum(got.stats.accepted_per_step) > 0  # drafts were verified, and their rows read
    assert want.logprobs is not None and got.logprobs is not None
    assert len(got.logprobs) == len(got.token_ids) == NEW_TOKENS
    assert_same(got.logprobs, want.logprobs)


def test_they_are_the_models_raw_log_softmax() -> None:
    model = tiny_model("llama")
    engine = drafting_engine("llama", [])
    # Sampling, hot and cut: the numbers are still the model's own distribution's.
    completion = engine.complete(PROMPT, SAMPLED)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + completion.token_ids])).logits[0]  # [L, V]
    raw = torch.log_softmax(logits.float(), dim=-1)[len(PROMPT) - 1 : -1]  # [new, V]
    assert completion.logprobs is not None
    for row, token, reported in zip(raw, completion.token_ids, completion.logprobs, strict=True):
        assert reported.logprob == pytest.approx(row[token].item(), abs=ATOL)
        best = row.topk(3)
        assert [t.token_id for t in reported.top_logprobs] == best.indices.tolist()
        assert [t.logprob for t in reported.top_logprobs] == pytest.approx(best.values.tolist(), abs=ATOL)


def test_greedy_tokens_are_their_positions_most_likely() -> None:
    completion = drafting_engine("qwen2", []).complete(PROMPT, GREEDY)
    assert completion.logprobs is not None
    for item in completion.logprobs:
        assert item.top_logprobs[0].token_id == item.token_id
        assert item.top_logprobs[0].logprob == item.logprob
        assert len(item.top_logprobs) == 5 and item.logprob <= 0


def test_top_logprobs_zero_reports_the_token_alone() -> None:
    completion = tiny_engine().complete([1, 2, 3], max_new_tokens=6, logprobs=True)
    assert completion.logprobs is not None and len(completion.logprobs) == 6
    assert all(not item.top_logprobs for item in completion.logprobs)


def test_nothing_is_computed_when_they_are_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("log-softmax computed for a call that did not ask")

    monkeypatch.setattr("rag_lookahead.engine.request.raw_logprobs", refuse)
    engine = tiny_engine()
    stream = engine.stream([1, 2, 3], max_new_tokens=8)
    chunks = list(stream.chunks())
    assert all(chunk.logprobs is None for chunk in chunks)
    assert stream.logprobs is None and engine.complete([1, 2], max_new_tokens=4).logprobs is None


def test_they_stay_aligned_with_the_tokens_across_a_stop_string() -> None:
    engine = tiny_engine()
    tokenizer = AsciiTokenizer()
    plain = engine.plain().complete([4, 5, 6], max_new_tokens=20).text
    stop = plain[7:9]  # cut inside the answer: the stop string's tokens end the call
    stream = engine.stream([4, 5, 6], max_new_tokens=20, stop_strings=[stop], logprobs=True, top_logprobs=2)
    chunks = list(stream.chunks())
    assert stream.stats.finish_reason == "stop_string"
    for chunk in chunks:
        assert chunk.logprobs is not None
        assert [t.token_id for t in chunk.logprobs] == chunk.token_ids
        assert [t.token for t in chunk.logprobs] == [tokenizer.decode([i]) for i in chunk.token_ids]
    assert stream.logprobs is not None
    assert [t.token_id for t in stream.logprobs] == stream.token_ids


def test_they_stay_aligned_at_an_eos_inside_an_accepted_draft() -> None:
    model = tiny_model("llama", 0, ASCII_VOCAB)
    plain = LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode="off"))
    answer = plain.complete([7, 8, 9], max_new_tokens=16).token_ids
    eos = answer[5]  # the call ends at its first appearance, in the middle of a drafted step
    want = plain.complete([7, 8, 9], max_new_tokens=16, eos_token_id=eos, logprobs=True)
    engine = LookaheadEngine(
        model, AsciiTokenizer(), LookaheadConfig(mode="trie"), cost_curve=CostCurve.flat()
    )
    engine.trie.insert([7, 8, 9, *answer], OUTPUT_OWNER)
    got = engine.complete([7, 8, 9], max_new_tokens=16, eos_token_id=eos, logprobs=True)
    assert got.stats.finish_reason == want.stats.finish_reason == "eos"
    assert got.logprobs is not None and want.logprobs is not None
    assert got.token_ids == want.token_ids and len(got.logprobs) == len(got.token_ids)
    assert_same(got.logprobs, want.logprobs)


def test_calls_batched_together_each_get_their_own() -> None:
    engine = tiny_engine()
    jobs = [
        ([1, 2, 3], GREEDY),
        ([4, 5], GenerationParams(max_new_tokens=NEW_TOKENS)),
        ([9, 9, 8], SAMPLED),
    ]
    alone = [engine.plain().complete(prompt, params) for prompt, params in jobs]
    together = run_together(engine, jobs, stagger=2)
    for got, want in zip(together, alone, strict=True):
        assert got.token_ids == want.token_ids
        if want.logprobs is None:
            assert got.logprobs is None
        else:
            assert got.logprobs is not None
            assert_same(got.logprobs, want.logprobs)


def test_a_chunk_still_unpacks_as_token_ids_and_text() -> None:
    chunk = StreamChunk([1, 2], "ab", [TokenLogprob("a", -0.1, 1), TokenLogprob("b", -0.2, 2)])
    token_ids, text = chunk
    assert (token_ids, text) == ([1, 2], "ab") == (chunk[0], chunk[1]) and len(chunk) == 2
    assert StreamChunk([3], "c").logprobs is None


def test_the_openai_shape() -> None:
    item = TokenLogprob("é", -0.5, 7, (TokenLogprob("é", -0.5, 7), TokenLogprob("e", -1.5, 3)))
    assert item.to_openai() == {
        "token": "é",
        "logprob": -0.5,
        "bytes": [195, 169],
        "top_logprobs": [
            {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
            {"token": "e", "logprob": -1.5, "bytes": [101]},
        ],
    }


def test_a_zero_probability_is_written_as_openai_can_carry_it() -> None:
    item = TokenLogprob(
        "a", float("-inf"), 1, (TokenLogprob("b", 0.0, 2), TokenLogprob("a", float("-inf"), 1))
    )
    shape = item.to_openai()
    assert shape["logprob"] == -9999.0 and shape["top_logprobs"][1]["logprob"] == -9999.0
    assert item.logprob == float("-inf")  # the number itself stays as computed


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_logprobs": -1}, "top_logprobs must be from 0 to 20"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be from 0 to 20"),
        ({"top_logprobs": 3}, "needs logprobs=True"),
        ({"logprobs": 1}, "logprobs must be True or False"),
        ({"logprobs": True, "top_logprobs": 2.0}, "top_logprobs must be an integer"),
        ({"logprobs": True, "top_logprobs": True}, "top_logprobs must be an integer"),
    ],
)
def test_bad_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationParams(**fields)  # type: ignore[arg-type]
