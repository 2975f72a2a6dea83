"""The proof of losslessness: lookahead output == plain greedy `generate`, whatever is drafted."""

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.planning.costs import CostCurve
from rag_lookahead.testing import (
    ASCII_VOCAB,
    FAMILIES,
    VOCAB,
    AsciiTokenizer,
    CharTokenizer,
    greedy_reference,
    tiny_engine,
    tiny_model,
)

NEW_TOKENS = 24
# Injected forward costs: free drafting, a CPU-like curve, and one where drafting never pays.
CURVES = {
    "flat": CostCurve.flat(),
    "cpu": CostCurve((1, 2, 8, 16, 64), (1.0, 1.6, 1.65, 1.9, 3.5)),
    "steep": CostCurve((1, 2), (1.0, 50.0)),
}


def noisy_copies(reference: list[int], rng: random.Random, count: int) -> list[list[int]]:
    """Trie contents: pieces of the true continuation with mutations, plus random junk."""
    docs = []
    for _ in range(count):
        start = rng.randrange(len(reference))
        piece = reference[start : start + rng.randint(2, 16)]
        piece = [rng.randrange(VOCAB) if rng.random() < 0.15 else t for t in piece]
        docs.append(piece)
    docs.append([rng.randrange(VOCAB) for _ in range(rng.randint(0, 40))])
    return docs


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    seed=st.integers(0, 2**16),
    decoding_length=st.integers(1, 24),
    branch_length=st.integers(1, 8),
    query=st.integers(1, 3),
    mode=st.sampled_from(["trie", "auto", "jacobi"]),
    policy=st.sampled_from(["trie", "suffix"]),
    curve=st.sampled_from(sorted(CURVES)),
    window=st.tuples(st.integers(1, 5), st.integers(2, 5), st.integers(1, 4)),  # W, N, G
)
def test_engine_matches_greedy(
    family: str,
    prompt: list[int],
    seed: int,
    decoding_length: int,
    branch_length: int,
    query: int,
    mode: str,
    policy: str,
    curve: str,
    window: tuple[int, int, int],
) -> None:
    model = tiny_model(family)
    reference = greedy_reference(model, prompt, NEW_TOKENS)
    config = LookaheadConfig(
        mode=mode,  # type: ignore[arg-type]
        decoding_length=decoding_length,
        branch_length=branch_length,
        max_query_length=query,
        min_query_length=1,
        window_size=window[0],
        ngram_size=min(window[1], decoding_length + 1),
        guess_set_size=window[2],
        draft_policy=policy,  # type: ignore[arg-type]
    )
    engine = LookaheadEngine(model, CharTokenizer(), config, cost_curve=CURVES[curve])
    rng = random.Random(seed)
    for doc in noisy_copies(reference, rng, rng.randint(0, 6)):
        engine.trie.insert(doc, OUTPUT_OWNER)
    completion = engine.complete(prompt, max_new_tokens=NEW_TOKENS)
    assert completion.token_ids == reference
    stats = completion.stats
    assert stats.new_tokens == NEW_TOKENS and stats.finish_reason == "length"
    assert stats.steps == len(stats.accepted_per_step) == len(stats.drafted_per_step)
    assert all(a <= d for a, d in zip(stats.accepted_per_step, stats.drafted_per_step, strict=True))
    assert 1 + stats.steps + sum(stats.accepted_per_step) == NEW_TOKENS
    assert len(engine.trie) == engine.trie.count_owned(OUTPUT_OWNER)  # the call's branches are gone


@pytest.mark.parametrize("family", FAMILIES)
def test_the_full_continuation_in_the_trie_is_accepted_in_few_steps(family: str) -> None:
    model = tiny_model(family)
    prompt = [5, 17, 33, 2]
    reference = greedy_reference(model, prompt, NEW_TOKENS)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    engine.trie.insert(prompt + reference, OUTPUT_OWNER)
    completion = engine.complete(prompt, max_new_tokens=NEW_TOKENS)
    assert completion.token_ids == reference
    assert completion.stats.steps < NEW_TOKENS // 2
    assert engine.tree_verification


@pytest.mark.parametrize("policy", ["trie", "suffix"])
def test_documents_drive_drafts_and_are_eliminated(policy: str) -> None:
    model = tiny_model("llama")
    tokenizer = CharTokenizer()
    prompt = [9, 8, 7]
    reference = greedy_reference(model, prompt, NEW_TOKENS)
    config = LookaheadConfig(mode="trie", min_query_length=1, draft_policy=policy)  # type: ignore[arg-type]
    engine = LookaheadEngine(model, tokenizer, config)
    document = tokenizer.decode(prompt + reference)
    completion = engine.complete(prompt, max_new_tokens=NEW_TOKENS, documents=[document])
    assert completion.token_ids == reference
    assert sum(completion.stats.accepted_per_step) > NEW_TOKENS // 2
    assert engine.trie.owners() <= {OUTPUT_OWNER}


class RandomDrafter:
    """A user's own `Drafter`: random chains, with the true continuation now and then."""

    def __init__(self, truth: list[int], prompt_length: int, seed: int) -> None:
        self.truth, self.prompt_length = truth, prompt_length
        self.rng = random.Random(seed)
        self.proposed = 0
        self.closed = False

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        self.proposed += 1
        done = len(context) - self.prompt_length
        if self.rng.random() < 0.5:
            chain = self.truth[done : done + budget]
        else:
            chain = [self.rng.randrange(ASCII_VOCAB) for _ in range(self.rng.randint(0, budget))]
        tree = DraftTree.from_draft(context[-1], chain, list(range(-1, len(chain) - 1)), "mine")
        return StepDraft(tree)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("seed", range(3))
def test_a_users_own_drafter_changes_no_token(seed: int) -> None:
    # Free drafting: every draft is verified.
    engine = LookaheadEngine(
        tiny_model("llama", 0, ASCII_VOCAB), AsciiTokenizer(), cost_curve=CostCurve.flat()
    )
    rng = random.Random(seed)
    prompt = [rng.randrange(ASCII_VOCAB) for _ in range(8)]
    reference = engine.plain().complete(prompt, max_new_tokens=NEW_TOKENS).token_ids
    drafter = RandomDrafter(reference, len(prompt), seed)
    result = engine.complete(prompt, max_new_tokens=NEW_TOKENS, drafter=drafter)
    assert result.token_ids == reference
    assert drafter.proposed and drafter.closed and "mine" in result.stats.draft_sources
    assert sum(result.stats.accepted_per_step) > 0  # its true drafts were taken


def test_a_drafter_needs_an_engine_that_drafts() -> None:
    with pytest.raises(ValueError, match="mode is 'off'"):
        tiny_engine().plain().stream([1, 2], drafter=RandomDrafter([], 2, 0))
