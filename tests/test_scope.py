"""Document scopes: documents shared by several calls, private to them, gone when closed."""

import gc
from dataclasses import replace
from typing import Any

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.engine.scope import DocumentScope
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model

PROMPT = [3, 14, 15, 9, 26]
N = 16


@pytest.fixture
def engine_and_document() -> tuple[LookaheadEngine, str, list[int]]:
    """An engine, and a document holding the prompt's whole greedy continuation."""
    model = tiny_model("llama")
    reference = greedy_reference(model, PROMPT, N)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    return engine, CharTokenizer().decode(PROMPT + reference), reference


def test_calls_in_a_scope_draft_from_its_documents_and_keep_them(engine_and_document) -> None:
    engine, document, reference = engine_and_document
    with engine.scope([document]) as scope:
        assert scope.owner in engine.trie.owners()
        for _ in range(2):  # several calls share the scope's branches
            completion = engine.complete(PROMPT, max_new_tokens=N, scope=scope)
            assert completion.token_ids == reference
            assert completion.stats.steps < N  # drafts from the document were accepted
            assert scope.owner in engine.trie.owners()
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_a_call_without_the_scope_never_sees_its_documents(engine_and_document) -> None:
    engine, document, reference = engine_and_document
    alone = LookaheadEngine(engine.model, engine.tokenizer, engine.config)
    with engine.scope([document]):
        completion = engine.complete(PROMPT, max_new_tokens=N)
    assert completion.token_ids == reference
    # Exactly the steps of an engine that never held the document.
    assert completion.stats.steps == alone.complete(PROMPT, max_new_tokens=N).stats.steps


def test_documents_added_later_are_eliminated_too(engine_and_document) -> None:
    engine, document, _ = engine_and_document
    scope = engine.scope()
    scope.add([document])
    assert engine.trie.count_owned(scope.owner) > 0
    scope.close()
    scope.close()  # idempotent
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    with pytest.raises(RuntimeError, match="closed"):
        scope.add(["x"])
    with pytest.raises(ValueError, match="closed"):
        engine.complete(PROMPT, max_new_tokens=2, scope=scope)


def test_a_scope_closed_while_its_documents_go_in_keeps_none_of_them(engine_and_document) -> None:
    """Documents go in a slice at a time (in the model's thread, between steps): a scope closed
    between two slices (by another thread) takes no slice more, and keeps none of them."""
    engine, document, _ = engine_and_document
    slices: list[object] = []

    def run(work: Any) -> None:
        slices.append(work())
        scope.close()  # as another thread would, between two slices

    scope = DocumentScope(engine.trie, engine.tokenizer.encode, run)
    with pytest.raises(RuntimeError, match="closed while its documents went in"):
        scope.add([document * 100])  # several slices' worth
    assert len(slices) == 1
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_an_unclosed_scope_is_eliminated_when_collected(engine_and_document) -> None:
    engine, document, _ = engine_and_document
    scope = engine.scope([document])
    del scope
    gc.collect()
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_an_error_inside_a_scope_still_eliminates_it(engine_and_document) -> None:
    engine, document, _ = engine_and_document
    with pytest.raises(KeyError), engine.scope([document]):
        raise KeyError("boom")
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_plain_is_the_same_model_decoding_plainly_with_the_same_runner_and_trie(engine_and_document) -> None:
    engine, _, reference = engine_and_document
    plain = engine.plain()
    assert plain.model is engine.model and plain.config.mode == "off"
    assert plain.runner is engine.runner and plain.trie is engine.trie  # forwards serialised, one trie
    completion = plain.complete(PROMPT, max_new_tokens=N)
    assert completion.token_ids == reference and not any(completion.stats.accepted_per_step)


def test_a_scope_of_another_engine_is_refused(engine_and_document) -> None:
    engine, document, _ = engine_and_document
    other = LookaheadEngine(engine.model, engine.tokenizer, engine.config)
    with engine.scope([document]) as scope:
        with pytest.raises(ValueError, match="another engine"):
            other.complete(PROMPT, max_new_tokens=2, scope=scope)
        assert engine.plain().complete(PROMPT, max_new_tokens=2, scope=scope).token_ids  # same trie
    assert other.trie.owners() <= {OUTPUT_OWNER}


def test_with_config_shares_the_trie_and_refuses_to_reshape_it(engine_and_document) -> None:
    engine, _, _ = engine_and_document
    auto = engine.with_config(replace(engine.config, mode="auto"))
    assert auto.trie is engine.trie and auto.runner is engine.runner and auto.config.mode == "auto"
    with pytest.raises(ValueError, match="branch_length is set per engine"):
        engine.with_config(replace(engine.config, branch_length=engine.config.branch_length + 1))
