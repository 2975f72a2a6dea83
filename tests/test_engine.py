"""Stopping, streaming, fallbacks and bad input, on tiny in-process models."""

import warnings

import pytest
import torch
from transformers import LlamaForCausalLM

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming.stopping import Released, Stopping
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_config, tiny_model
from rag_lookahead.testing.holding import holding

PROMPT = [3, 14, 15, 9, 26]
N = 20


@pytest.fixture
def setup() -> tuple[LookaheadEngine, list[int]]:
    """An engine whose trie holds the whole greedy continuation: every step drafts it."""
    model = tiny_model("llama")
    reference = greedy_reference(model, PROMPT, N)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    engine.trie.insert(PROMPT + reference, OUTPUT_OWNER)
    return engine, reference


def test_eos_inside_an_accepted_draft_ends_exactly_there(setup) -> None:
    engine, reference = setup
    k = 7
    eos = reference[k]
    first = reference.index(eos)  # the first occurrence decides
    completion = engine.complete(PROMPT, max_new_tokens=N, eos_token_id=eos)
    assert completion.token_ids == reference[: first + 1]
    assert completion.stats.finish_reason == "eos"
    assert completion.stats.steps < first + 1  # it was inside a multi-token step


@pytest.mark.parametrize("limit", [1, 2, 5, 11])
def test_max_new_tokens_inside_a_draft(setup, limit: int) -> None:
    engine, reference = setup
    completion = engine.complete(PROMPT, max_new_tokens=limit)
    assert completion.token_ids == reference[:limit]
    assert completion.stats.new_tokens == limit and completion.stats.finish_reason == "length"


def test_multi_token_stop_string_cuts_after_its_last_token(setup) -> None:
    engine, reference = setup
    tokenizer = CharTokenizer()
    stop = tokenizer.decode(reference[6:9])
    first = tokenizer.decode(reference).find(stop)
    completion = engine.complete(PROMPT, max_new_tokens=N, stop_strings=[stop])
    assert completion.token_ids == reference[: first + 3]
    assert completion.text == tokenizer.decode(reference)[:first]
    assert completion.stats.finish_reason == "stop_string"


def test_a_stop_string_before_an_eos_in_the_same_step_is_the_finish_reason(setup) -> None:
    engine, reference = setup
    tokenizer = CharTokenizer()
    cut = next(k for k in range(4, N) if reference.index(reference[k]) == k and k > 6)
    stop = tokenizer.decode(reference[3:5])
    completion = engine.complete(PROMPT, max_new_tokens=N, stop_strings=[stop], eos_token_id=reference[cut])
    assert completion.stats.finish_reason == "stop_string"
    assert completion.stats.steps < 5  # stop and EOS were accepted in one multi-token step
    assert completion.text == tokenizer.decode(reference)[: tokenizer.decode(reference).find(stop)]


def test_stream_chunks_concatenate_to_the_text_and_hold_back_partial_stops(setup) -> None:
    engine, reference = setup
    text = CharTokenizer().decode(reference)
    never = text[4] + "\u00e9"  # starts like a character of the answer, never completes
    stream = engine.stream(PROMPT, max_new_tokens=N, stop_strings=[never])
    chunks = list(stream)
    assert "".join(chunks) == text == stream.text
    assert len(chunks) > 1
    assert not any(c.endswith(text[4]) for c in chunks[:-1])  # held back until decided
    assert stream.stats.finish_reason == "length"


def stopping(tokenizer, stop_strings=(), eos=(), max_new_tokens=100, context_window=None) -> Stopping:
    return Stopping(
        tokenizer,
        eos=eos,
        stop_strings=stop_strings,
        max_new_tokens=max_new_tokens,
        prompt_length=3,
        context_window=context_window,
    )


def test_stopping_holds_back_a_stop_prefix_until_decided() -> None:
    tok = CharTokenizer()
    stop = stopping(tok, stop_strings=[tok.decode([5, 6])])
    assert stop.release([1, 2, 5]) == Released([1, 2, 5], tok.decode([1, 2]), None)
    assert stop.release([7]) == Released([7], tok.decode([5, 7]), None)
    assert stop.release([5, 6, 8]) == Released([5, 6], "", "stop_string")


def test_stopping_cuts_at_eos_the_budget_and_the_context_window() -> None:
    tok = CharTokenizer()
    assert stopping(tok, eos=[9]).release([1, 9, 2]) == Released([1, 9], tok.decode([1, 9]), "eos")
    assert stopping(tok, max_new_tokens=2).release([1, 2, 3]).reason == "length"
    near_the_end = stopping(tok, context_window=6)  # the prompt has 3 tokens
    assert near_the_end.room() == 3
    assert near_the_end.release([1, 2, 3]) == Released([1, 2, 3], tok.decode([1, 2, 3]), "context_window")


def test_a_stop_string_wins_over_an_eos_later_in_the_same_step() -> None:
    tok = CharTokenizer()
    stop = stopping(tok, stop_strings=[tok.decode([2])], eos=[4])
    assert stop.release([1, 2, 3, 4]) == Released([1, 2], tok.decode([1]), "stop_string")


def test_stopping_never_splits_a_multibyte_character() -> None:
    class Bytes:
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    data = list("naïve 😀 ok".encode())
    stop = stopping(Bytes(), max_new_tokens=len(data))
    chunks = [stop.release([b]).text for b in data]
    assert "".join(chunks) == "naïve 😀 ok"
    assert not any("\ufffd" in c for c in chunks)


def test_abandoned_stream_releases_the_calls_branches(setup) -> None:
    engine, _ = setup
    with holding(engine, PROMPT) as hold:  # (its trie drafts all N tokens: a step or two)
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=["一丁七"])
        next(stream)
        assert len(engine.trie.owners()) == 2
        hold.release_soon()
        stream.close()
    assert engine.trie.owners() == {OUTPUT_OWNER}
    assert stream.stats.finish_reason == "abandoned"


def test_a_stream_dropped_without_close_releases_the_branches(setup) -> None:
    engine, _ = setup
    with holding(engine, PROMPT) as hold:
        stream = engine.stream(PROMPT, max_new_tokens=N, documents=["一丁七"])
        next(stream)
        assert len(engine.trie.owners()) == 2
        hold.release_soon()
        del stream
    assert engine.trie.owners() == {OUTPUT_OWNER}


def test_caches_that_cannot_be_rolled_back_are_refused() -> None:
    from transformers import DynamicCache

    from rag_lookahead.runtime.kv_cache import new_tree_cache, supports_tree

    sliding = DynamicCache(config=tiny_config("mistral", sliding_window=8))
    assert not supports_tree(sliding) and not supports_tree(None)
    cache = new_tree_cache()
    tiny_model("llama")(torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)
    assert supports_tree(cache)


def test_an_error_inside_generation_releases_the_branches() -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie"))
    assert engine.tree_verification
    params = GenerationParams(max_new_tokens=4)
    engine.model.forward = None  # type: ignore[assignment]
    try:
        stream = engine.stream([1, 2, 3], params, documents=["一丁"])
        with pytest.raises(TypeError):
            next(stream)
    finally:
        del engine.model.forward  # the class's forward again (and the direct one with it)
    assert engine.trie.owners() <= {OUTPUT_OWNER}


class MaskIgnoringLlama(LlamaForCausalLM):
    """A model that silently drops custom 4-D masks, as some attention kernels do."""

    def forward(self, *args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = None
        return super().forward(*args, attention_mask=attention_mask, **kwargs)


def test_a_model_that_cannot_verify_trees_decodes_plainly_with_one_warning() -> None:
    torch.manual_seed(0)
    model = MaskIgnoringLlama(tiny_config("llama")).eval()
    reference = greedy_reference(model, PROMPT, N)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    engine.trie.insert(PROMPT + reference, OUTPUT_OWNER)
    with pytest.warns(UserWarning, match="cannot verify draft trees"):
        first = engine.complete(PROMPT, max_new_tokens=N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = engine.complete(PROMPT, max_new_tokens=N)
    assert first.token_ids == second.token_ids == reference
    assert not engine.tree_verification and first.stats.steps == N - 1
    failures = []
    end = engine.scheduler._end
    engine.scheduler._end = lambda call, error=None: (failures.append(error), end(call, error))  # type: ignore[method-assign]
    engine.complete(PROMPT, max_new_tokens=N)  # decoded alone, outside the batch, to its end
    assert failures == [None]  # it ended once, without a failure along the way


def test_mode_off_is_plain_decoding() -> None:
    model = tiny_model("qwen2")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="off"))
    completion = engine.complete(PROMPT, max_new_tokens=N)
    assert completion.token_ids == greedy_reference(model, PROMPT, N)
    assert sum(completion.stats.drafted_per_step) == 0


@pytest.mark.parametrize(
    "prompt, kwargs, error",
    [
        ([], {}, ValueError),
        ("", {}, ValueError),
        ([1] * 600, {}, ValueError),  # the tiny models' context window is 512
        ([1, 2], {"max_new_tokens": 0}, ValueError),
        ([1, 2], {"max_new_tokens": -3}, ValueError),
        ([1, 2], {"temperature": -1.0}, ValueError),  # 0 is greedy
        ([{"role": "user", "content": "hi"}], {}, ValueError),  # no chat template
        ([1.5, 2], {}, TypeError),
    ],
)
def test_bad_input_is_a_clear_error_and_leaves_nothing_behind(prompt, kwargs, error) -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer())
    engine.tokenizer.encode = lambda text: []  # type: ignore[method-assign]
    with pytest.raises(error):
        engine.stream(prompt, **kwargs)
    assert len(engine.trie) == 0


def test_context_window_is_never_exceeded() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer())
    completion = engine.complete([1] * 505, max_new_tokens=50)
    assert completion.stats.finish_reason == "context_window"
    assert completion.stats.prompt_tokens + completion.stats.new_tokens == 512


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="min_query_length"):
        LookaheadConfig(min_query_length=3, max_query_length=2)
    with pytest.raises(ValueError, match="mode"):
        LookaheadConfig(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LookaheadConfig(decoding_length=0)
    with pytest.raises(ValueError):
        GenerationParams(top_p=1.5)
    assert GenerationParams(eos_token_id=4, stop_strings="x").eos_token_id == (4,)


def test_concurrent_calls_on_one_engine_match_their_solo_runs() -> None:
    import threading

    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    prompts = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 9], [8, 8, 8]]
    solo = {i: greedy_reference(model, p, N) for i, p in enumerate(prompts)}
    docs = {i: [CharTokenizer().decode(p + solo[i])] for i, p in enumerate(prompts)}
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = engine.complete(prompts[i], max_new_tokens=N, documents=docs[i]).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo
    assert engine.trie.owners() <= {OUTPUT_OWNER}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_verify_trees_in_their_own_dtype(dtype) -> None:
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config.eos_token_id = None
    reference = greedy_reference(model, PROMPT, N)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    engine.trie.insert(PROMPT + reference, OUTPUT_OWNER)
    completion = engine.complete(PROMPT, max_new_tokens=N)
    assert engine.tree_verification  # the probe's half-precision tolerance holds
    assert sum(completion.stats.accepted_per_step) > 0
    # Rounding differs between a tree forward and a one-token forward, so a near-tie may flip
    # (the README says so); on this model and prompt the answers agree.
    assert completion.token_ids == reference
