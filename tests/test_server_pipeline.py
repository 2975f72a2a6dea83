"""`RagPipeline` on a server engine (a loopback stub): the same prompts, documents by kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rag_lookahead.models import default_model_dir
from rag_lookahead.rag import DocumentIndex, RagPipeline, RetrievalConfig, SentenceTransformerEmbedder
from rag_lookahead.remote import ServerEngine
from rag_lookahead.testing.stub_server import Answer, StubServer, stub_server

pytestmark = pytest.mark.slow
CORPUS = Path(__file__).parent / "fixtures" / "corpus"
QUESTION = "How often should a sourdough starter be fed?"


@pytest.fixture(scope="module")
def index() -> DocumentIndex:
    return DocumentIndex.build([CORPUS], SentenceTransformerEmbedder())[0]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with stub_server() as server:
        yield server


def pipeline(stub: StubServer, kind: Any, tokenizer: Any, index: DocumentIndex) -> RagPipeline:
    engine = ServerEngine(stub.base_url, "m", kind, max_retries=0, tokenizer=tokenizer, context_window=2048)
    # A tight budget leaves retrieved chunks out of the prompt: documents for the drafts.
    return RagPipeline(engine, index, RetrievalConfig(top_k=4, min_score=0.0, max_context_tokens=200))


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_pipeline_prompts_the_server_with_our_token_ids(stub, tokenizer, index, kind) -> None:
    rag = pipeline(stub, kind, tokenizer, index)
    stub.reply(Answer(("Twice", " a day."), usage=(180, 4)))
    query = rag.prepare(QUESTION, 16)
    assert query.documents  # some retrieved chunks did not fit
    answer = rag.ask(QUESTION, max_new_tokens=16)
    assert answer.text == "Twice a day." and answer.grounded
    assert answer.stats.prompt_tokens == 180
    body = stub.completions()[-1].body
    assert body["prompt"] == query.prompt_ids and body["max_tokens"] == 16
    adds = [r.body for r in stub.requests if r.path == "/add_external_corpus"]
    if kind == "sglang":  # what the prompt left out went to the server's corpus, and left it
        assert adds == [{"corpus_id": adds[0]["corpus_id"], "documents": list(query.documents)}]
    else:  # vLLM drafts only from the prompt: nothing is sent, nothing is refused
        assert adds == []
    assert stub.corpora == {}


def test_pipeline_needs_the_tokenizer(stub, index) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        RagPipeline(ServerEngine(stub.base_url, "m", "vllm"), index)
