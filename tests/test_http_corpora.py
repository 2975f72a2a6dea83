"""Corpora on the local server (``/v1/corpora``) and `ServerEngine(kind="rag-lookahead")`.

A corpus is a scope of the served engine: its documents enter the trie when it is created and
leave it (the trie back to its size) when it is deleted or expires; a call naming it drafts
from it and keeps it alive to its end. Real HTTP on 127.0.0.1 with the tiny model; expiry with
a fake clock, or a tiny TTL and a bounded wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.rag import DEFAULT_EMBEDDER, DocumentIndex, RagPipeline, RetrievalConfig
from rag_lookahead.rag.embedding import default_embedder_path
from rag_lookahead.remote import ServerEngine
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.serve.corpora import Corpora
from rag_lookahead.serve.errors import ApiError
from rag_lookahead.serve.metrics import ServerMetrics
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, save_tiny_model, tiny_model
from rag_lookahead.testing.local_server import WAIT_S, LiveServer, error_of, wait_until
from rag_lookahead.testing.long_texts import InsertWatch

MODEL = "tiny"
KEY = "test-key"
MESSAGES = [{"role": "user", "content": "Tell me about the normans."}]
DOCUMENTS = [
    "The Normans were the people who gave their name to Normandy, a region in France.",
    "They descended from Norse raiders and pirates from Denmark, Iceland and Norway.",
]
MORE = ["In 1066 the Normans conquered England at the battle of Hastings."]
N = 16
CORPUS = Path(__file__).parent / "fixtures" / "corpus"


def new_engine() -> LookaheadEngine:
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=8)
    return LookaheadEngine(model, ascii_fast_tokenizer(), config)


class Recording:
    """The served engine's calls: the documents and scope each was given."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self.calls: list[dict[str, Any]] = []
        stream = engine.stream

        def recording(*args: Any, **kwargs: Any) -> Any:
            scope = kwargs.get("scope")
            self.calls.append(
                {
                    "documents": list(kwargs.get("documents") or ()),
                    "scope": scope,
                    "scope_sequences": len(scope.sequences) if scope is not None else 0,
                    "scope_nodes": engine.trie.count_owned(scope.owner) if scope is not None else 0,
                }
            )
            return stream(*args, **kwargs)

        engine.stream = recording  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def served() -> LookaheadEngine:
    return new_engine()


@pytest.fixture(scope="module")
def recording(served: LookaheadEngine) -> Recording:
    return Recording(served)


@pytest.fixture(scope="module")
def live(served: LookaheadEngine, recording: Recording) -> Iterator[LiveServer]:
    with LiveServer(create_app(served, ServeSettings(model_name=MODEL))) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> LookaheadEngine:
    """The same model in process: the answers the server must give."""
    return new_engine()


def assert_error(
    response: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> None:
    error = error_of(response, status)
    assert code is None or error["code"] == code, error
    assert param is None or error["param"] == param, error


def scope_owners(engine: LookaheadEngine) -> set[str]:
    return engine.trie.owners() - {OUTPUT_OWNER}


def gauge(live: LiveServer, name: str) -> float:
    for line in httpx.get(f"{live.url}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split(" ")[1])
    raise AssertionError(f"no {name} in /metrics")


# ---------------------------------------------------------------------------- the routes


def test_a_corpus_feeds_the_calls_naming_it_then_leaves_the_trie(
    live: LiveServer, served: LookaheadEngine, recording: Recording, reference: LookaheadEngine
) -> None:
    size = len(served.trie)
    created = httpx.post(f"{live.url}/v1/corpora", json={"documents": DOCUMENTS}).json()
    assert created["object"] == "corpus" and created["id"].startswith("corpus-")
    assert created["documents"] == 2 and created["bytes"] == sum(len(d) for d in DOCUMENTS)
    assert created["ttl_seconds"] == ServeSettings().corpus_ttl_s and created["in_use"] == 0
    assert len(served.trie) > size and len(scope_owners(served)) == 1
    assert gauge(live, "rag_lookahead_corpora") == 1

    expected = reference.complete(MESSAGES, max_new_tokens=N).text  # lossless: drafts never change it
    client = live.client()
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=N,
        temperature=0,
        extra_body={"corpus": created["id"]},
    )
    assert out.choices[0].message.content == expected
    call = recording.calls[-1]
    assert call["scope_sequences"] == 2 and call["scope_nodes"] > 0  # it drafted from the corpus
    streamed = client.completions.create(
        model=MODEL, prompt="The Normans", max_tokens=N, stream=True, extra_body={"corpus": created["id"]}
    )
    assert (
        "".join(c.choices[0].text for c in streamed)
        == reference.complete("The Normans", max_new_tokens=N).text
    )

    grown = httpx.post(f"{live.url}/v1/corpora/{created['id']}/documents", json={"documents": MORE}).json()
    assert grown["documents"] == 3 and grown["bytes"] == created["bytes"] + len(MORE[0])
    described = httpx.get(f"{live.url}/v1/corpora/{created['id']}").json()
    assert described["documents"] == 3 and 0 < described["expires_in_seconds"] <= described["ttl_seconds"]

    outputs = len(served.trie)
    deleted = httpx.delete(f"{live.url}/v1/corpora/{created['id']}").json()
    assert deleted == {"id": created["id"], "object": "corpus.deleted", "deleted": True}
    assert not scope_owners(served) and len(served.trie) < outputs
    assert gauge(live, "rag_lookahead_corpora") == 0 and gauge(live, "rag_lookahead_corpus_bytes") == 0
    # Gone: every route and a request naming it answer 404 in OpenAI's shape.
    assert_error(httpx.get(f"{live.url}/v1/corpora/{created['id']}"), 404, "corpus_not_found")
    assert_error(httpx.delete(f"{live.url}/v1/corpora/{created['id']}"), 404, "corpus_not_found")
    url = f"{live.url}/v1/corpora/{created['id']}/documents"
    assert_error(httpx.post(url, json={"documents": MORE}), 404, "corpus_not_found")
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"corpus": created["id"]})
    assert info.value.code == "corpus_not_found" and info.value.param == "corpus"  # type: ignore[attr-defined]


def test_the_trie_returns_to_its_size(served: LookaheadEngine, live: LiveServer) -> None:
    """No leftover branches: created and deleted with no call in between, the trie is as it was."""
    size = len(served.trie)
    corpus = httpx.post(f"{live.url}/v1/corpora", json={"documents": [*DOCUMENTS, *MORE]}).json()
    assert len(served.trie) > size
    httpx.delete(f"{live.url}/v1/corpora/{corpus['id']}")
    assert len(served.trie) == size and not scope_owners(served)


def test_an_unused_corpus_expires(served: LookaheadEngine, live: LiveServer) -> None:
    """The server's sweeper removes a corpus left unused past its TTL (asked for per corpus)."""
    size = len(served.trie)
    corpus = httpx.post(f"{live.url}/v1/corpora", json={"documents": DOCUMENTS, "ttl_seconds": 0.2}).json()
    assert corpus["ttl_seconds"] == 0.2
    wait_until(lambda: httpx.get(f"{live.url}/v1/corpora/{corpus['id']}").status_code == 404)
    wait_until(lambda: len(served.trie) == size)  # the sweeper, not the GET, may have removed it
    assert not scope_owners(served)


def test_the_corpus_routes_need_the_api_key(served: LookaheadEngine) -> None:
    app = create_app(served, ServeSettings(model_name=MODEL, api_key=KEY))

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
            assert_error(
                await http.post("/v1/corpora", json={"documents": DOCUMENTS}), 401, "invalid_api_key"
            )
            assert_error(await http.get("/v1/corpora/corpus-1"), 401, "invalid_api_key")
            assert_error(await http.delete("/v1/corpora/corpus-1"), 401, "invalid_api_key")
            auth = {"Authorization": f"Bearer {KEY}"}
            created = await http.post("/v1/corpora", json={"documents": DOCUMENTS}, headers=auth)
            assert created.status_code == 200
            assert (await http.delete(f"/v1/corpora/{created.json()['id']}", headers=auth)).status_code == 200

    asyncio.run(run())
    assert not scope_owners(served)


def test_corpora_are_bounded_in_number_and_bytes(served: LookaheadEngine) -> None:
    app = create_app(served, ServeSettings(model_name=MODEL, max_corpora=2, max_corpus_bytes=100))

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
            too_big = await http.post("/v1/corpora", json={"documents": ["x" * 60, "y" * 41]})
            assert_error(too_big, 413, "corpus_too_large", "documents")
            first = (await http.post("/v1/corpora", json={"documents": ["a" * 60]})).json()
            assert_error(
                await http.post("/v1/corpora", json={"documents": ["b" * 41]}), 429, "corpus_storage_full"
            )
            second = (await http.post("/v1/corpora", json={"documents": ["b" * 40]})).json()
            assert_error(await http.post("/v1/corpora", json={"documents": []}), 429, "too_many_corpora")
            grown = await http.post(f"/v1/corpora/{second['id']}/documents", json={"documents": ["c" * 61]})
            assert_error(grown, 413, "corpus_too_large")
            await http.delete(f"/v1/corpora/{first['id']}")
            third = await http.post("/v1/corpora", json={"documents": ["d" * 60]})  # room again
            assert third.status_code == 200, third.text
            for corpus in (second, third.json()):
                await http.delete(f"/v1/corpora/{corpus['id']}")

    asyncio.run(run())
    assert not scope_owners(served)


HOSTILE_BODIES: list[tuple[Any, str | None]] = [
    ({"documents": "one string"}, "documents"),
    ({"documents": {"a": "b"}}, "documents"),
    ({"documents": 5}, "documents"),
    ({"documents": ["ok", 7]}, "documents[1]"),
    ({"documents": [["nested"]]}, "documents[0]"),
    ({"documents": [{"text": "x"}]}, "documents[0]"),
    ({"documents": DOCUMENTS, "ttl_seconds": -1}, "ttl_seconds"),
    ({"documents": DOCUMENTS, "ttl_seconds": 0}, "ttl_seconds"),
    ({"documents": DOCUMENTS, "ttl_seconds": True}, "ttl_seconds"),
    ({"documents": DOCUMENTS, "ttl_seconds": "60"}, "ttl_seconds"),
    ({"documents": DOCUMENTS, "ttl_seconds": 1e9}, "ttl_seconds"),  # past the server's TTL
    ({"documents": DOCUMENTS, "id": "mine"}, "id"),  # ids are the server's: unguessable
    ([DOCUMENTS], None),
    ("documents", None),
]


@pytest.mark.parametrize(("body", "param"), HOSTILE_BODIES)
def test_hostile_corpus_bodies_are_400(
    served: LookaheadEngine, live: LiveServer, body: Any, param: str | None
) -> None:
    before = len(served.trie)
    assert_error(httpx.post(f"{live.url}/v1/corpora", json=body), 400, param=param)
    assert len(served.trie) == before and gauge(live, "rag_lookahead_corpora") == 0


def test_hostile_corpus_requests(served: LookaheadEngine, live: LiveServer) -> None:
    base = f"{live.url}/v1/corpora"
    assert_error(
        httpx.post(base, content=b'{"documents": ["a"], "ttl_seconds": NaN}'), 400, param="ttl_seconds"
    )
    assert_error(httpx.post(base, content=b"{not json"), 400, "invalid_json")
    lone = b'{"documents": ["caf\\u00e9", "ab\\ud800cd"]}'  # a lone surrogate, escaped in JSON
    assert_error(httpx.post(base, content=lone), 400, param="documents[1]")
    corpus = httpx.post(base, json={"documents": []}).json()  # empty: documents may come later
    assert corpus["documents"] == 0
    assert_error(httpx.post(f"{base}/{corpus['id']}/documents", json={}), 400, "missing_parameter")
    assert_error(
        httpx.post(f"{base}/{corpus['id']}/documents", json={"documents": [1]}), 400, param="documents[0]"
    )
    # Huge counts: many empty documents hold nothing; many short ones count their bytes.
    emptied = httpx.post(f"{base}/{corpus['id']}/documents", json={"documents": [""] * 100_000}).json()
    assert (emptied["documents"], emptied["bytes"]) == (0, 0)
    for bad_id in ("corpus-" + "0" * 32, "%00", "x" * 5000):
        assert httpx.get(f"{base}/{bad_id}").status_code == 404
    for value in (5, "", ["a"], {"id": corpus["id"]}):
        response = httpx.post(
            f"{live.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "corpus": value}
        )
        assert_error(response, 400, param="corpus")
    httpx.delete(f"{base}/{corpus['id']}")
    assert not scope_owners(served)


def test_many_documents_over_the_bound_are_refused_whole(served: LookaheadEngine) -> None:
    app = create_app(served, ServeSettings(model_name=MODEL, max_corpus_bytes=50_000))
    before = len(served.trie)

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
            many = await http.post("/v1/corpora", json={"documents": ["ab"] * 30_000})
            assert_error(many, 413, "corpus_too_large")

    asyncio.run(run())
    assert len(served.trie) == before


# ---------------------------------------------------------------------------- in use


def gated(engine: LookaheadEngine, go: threading.Event) -> threading.Event:
    """Hold the engine's forwards past the second until ``go``; the event returned is set once
    a forward waits."""
    forward = engine.runner.forward
    calls, waiting = [0], threading.Event()

    def gated_forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 2 and not go.is_set():
            waiting.set()
            go.wait(60)
        return forward(*args, **kwargs)

    engine.runner.forward = gated_forward  # type: ignore[method-assign]
    return waiting


def test_a_corpus_deleted_while_in_use_goes_after_the_call(reference: LookaheadEngine) -> None:
    engine = new_engine()
    go = threading.Event()
    waiting = gated(engine, go)
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as live:
        size = len(engine.trie)
        corpus = httpx.post(f"{live.url}/v1/corpora", json={"documents": DOCUMENTS}).json()
        owner = next(iter(scope_owners(engine)))
        body = {
            "model": MODEL,
            "prompt": "The Normans",
            "max_tokens": N,
            "stream": True,
            "corpus": corpus["id"],
        }
        lines: list[str] = []

        def read() -> None:
            with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=60) as response:
                lines.extend(line for line in response.iter_lines() if line.startswith("data:"))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            wait_until(waiting.is_set)
            assert httpx.get(f"{live.url}/v1/corpora/{corpus['id']}").json()["in_use"] == 1
            assert httpx.delete(f"{live.url}/v1/corpora/{corpus['id']}").json()["deleted"]
            # Gone for new requests, but its branches stay while the call drafts from them.
            assert httpx.get(f"{live.url}/v1/corpora/{corpus['id']}").status_code == 404
            assert engine.trie.count_owned(owner) > 0
        finally:
            go.set()
            reader.join(60)
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[5:]) for line in lines[:-1]]
        text = "".join(c["text"] for event in events for c in event["choices"])
        assert text == reference.complete("The Normans", max_new_tokens=N).text
        wait_until(lambda: owner not in engine.trie.owners())
        assert not scope_owners(engine)
        # The call's own output stays (as every call's does); the corpus's branches are gone.
        assert engine.trie.count_owned(owner) == 0 and len(engine.trie) >= size


def test_a_server_that_stops_removes_its_corpora() -> None:
    engine = new_engine()
    size = len(engine.trie)
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as live:
        httpx.post(f"{live.url}/v1/corpora", json={"documents": DOCUMENTS})
        assert scope_owners(engine)
    assert not scope_owners(engine) and len(engine.trie) == size


# ---------------------------------------------------------------------------- the registry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_expiry_by_a_fake_clock(served: LookaheadEngine) -> None:
    """Unused past its TTL a corpus goes; a call using it keeps it, and its end restarts the TTL."""
    clock = Clock()
    corpora = Corpora(served, ServeSettings(corpus_ttl_s=10), ServerMetrics(), clock)
    size = len(served.trie)
    kept = corpora.create(DOCUMENTS)["id"]
    short = corpora.create(MORE, ttl_s=2)["id"]
    clock.now += 5
    assert corpora.sweep() == 1  # the short one
    with pytest.raises(ApiError) as info:
        corpora.lease(short)
    assert (info.value.status, info.value.param) == (404, "corpus")
    lease = corpora.lease(kept)
    clock.now += 60
    assert corpora.sweep() == 0 and corpora.describe(kept)["expires_in_seconds"] is None  # in use
    lease.release()
    lease.release()  # idempotent
    clock.now += 9
    assert corpora.sweep() == 0 and corpora.describe(kept)["expires_in_seconds"] == pytest.approx(1)
    clock.now += 1
    assert corpora.sweep() == 1 and corpora.count == 0
    assert len(served.trie) == size and not scope_owners(served)


def test_settings_for_corpora_are_checked() -> None:
    for bad in (
        {"corpus_ttl_s": 0},
        {"corpus_ttl_s": float("nan")},
        {"corpus_ttl_s": True},
        {"corpus_ttl_s": 1e12},
    ):
        with pytest.raises(ValueError, match="corpus_ttl_s"):
            ServeSettings(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_corpora"):
        ServeSettings(max_corpora=0)
    with pytest.raises(ValueError, match="max_corpus_bytes"):
        ServeSettings(max_corpus_bytes=-1)


def test_serve_takes_the_corpus_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from rag_lookahead import cli
    from rag_lookahead.serve import run

    ran: dict[str, Any] = {}
    monkeypatch.setattr(run, "run_app", lambda app, host, port: ran.update(app=app))
    argv = ["serve", "--backend", "local", "--model", str(save_tiny_model(tmp_path / "m"))]
    flags = ["--corpus-ttl-seconds", "30", "--max-corpora", "3", "--max-corpus-bytes", "4096"]
    assert cli.main([*argv, *flags]) == 0
    settings = ran["app"].settings  # (the StartingApp's, which its app serves with)
    assert (settings.corpus_ttl_s, settings.max_corpora, settings.max_corpus_bytes) == (30, 3, 4096)
    assert cli.main(["serve", "--backend", "vllm", "--model", "m", "--corpus-ttl-seconds", "3"]) == 2


# ---------------------------------------------------------------------------- ServerEngine


def test_server_engine_sends_documents_and_scopes(
    live: LiveServer, served: LookaheadEngine, recording: Recording, reference: LookaheadEngine
) -> None:
    """`ServerEngine(kind="rag-lookahead")`: a call's documents travel in its request, a scope
    is a corpus (created with its first documents, grown by `add`, deleted at close)."""
    engine = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
    assert engine.drafts_from_documents
    expected = reference.complete(MESSAGES, max_new_tokens=N).text
    out = engine.complete(MESSAGES, max_new_tokens=N, documents=DOCUMENTS)
    assert out.text == expected and recording.calls[-1]["documents"] == DOCUMENTS
    size = len(served.trie)
    with engine.scope() as scope:
        assert not scope.corpus_ids  # nothing to load yet: no corpus
        scope.add(DOCUMENTS)
        scope.add(MORE)
        (corpus_id,) = scope.corpus_ids
        assert httpx.get(f"{live.url}/v1/corpora/{corpus_id}").json()["documents"] == 3
        assert engine.complete(MESSAGES, max_new_tokens=N, scope=scope).text == expected
        assert recording.calls[-1]["scope_sequences"] == 3 and recording.calls[-1]["scope_nodes"] > 0
    assert httpx.get(f"{live.url}/v1/corpora/{corpus_id}").status_code == 404
    assert not scope_owners(served)
    assert len(served.trie) >= size  # the call's own output stays, as in process


def test_a_scope_whose_corpus_expired_closes_quietly(served: LookaheadEngine) -> None:
    with LiveServer(create_app(served, ServeSettings(model_name=MODEL, corpus_ttl_s=0.2))) as live:
        engine = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
        scope = engine.scope(DOCUMENTS)
        wait_until(lambda: not scope_owners(served))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            scope.close()  # its DELETE answers 404: gone either way, nothing to retry
        assert engine._corpus is not None and not engine._corpus.stranded


def test_a_scope_whose_corpus_expired_loads_it_again(
    served: LookaheadEngine, recording: Recording, reference: LookaheadEngine
) -> None:
    """A call of a scope whose corpus the server dropped (unused past its TTL) loads the
    scope's documents again and is answered, drafting from them."""
    app = create_app(served, ServeSettings(model_name=MODEL))
    corpora = app.state.lookahead.corpora
    clock = corpora._clock = Clock()  # the server's time, moved by the test
    with LiveServer(app) as live:
        engine = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
        with engine.scope(DOCUMENTS) as scope:
            (first,) = scope.corpus_ids
            clock.now += ServeSettings().corpus_ttl_s
            assert corpora.sweep() == 1 and not scope_owners(served)
            out = engine.complete(MESSAGES, max_new_tokens=N, scope=scope)
            assert out.text == reference.complete(MESSAGES, max_new_tokens=N).text
            (second,) = scope.corpus_ids
            assert second != first and recording.calls[-1]["scope_sequences"] == 2
        assert corpora.count == 0 and not scope_owners(served)


def test_server_engine_refuses_what_the_server_would(live: LiveServer) -> None:
    engine = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
    with pytest.raises(ValueError, match="eos_token_id"):
        engine.complete("Hi", max_new_tokens=2, eos_token_id=(3,))
    assert engine.complete("Hi", max_new_tokens=2, top_k=5, do_sample=True, seed=1).text is not None


# ---------------------------------------------------------------------------- RagPipeline


class HashEmbedder:
    """The default embedder's name and tokenizer (chunking) with vectors from a hash of each
    text: an index without loading the embedding model."""

    name = DEFAULT_EMBEDDER
    dimension = 8

    def __init__(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(default_embedder_path())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        seeds = [int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) for text in texts]
        rows = np.stack([np.random.default_rng(seed).normal(size=self.dimension) for seed in seeds])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)  # [N, D]


def test_a_pipeline_on_the_server_keeps_its_drafts(tmp_path: Path) -> None:
    """`RagPipeline(engine=ServerEngine(...))`: the chunks the prompt leaves out reach the served
    call as its documents, and the answer is the in-process pipeline's."""
    directory = save_tiny_model(tmp_path / "tiny")
    index = DocumentIndex.build([CORPUS], HashEmbedder())[0]
    retrieval = RetrievalConfig(top_k=4, min_score=-1.0, max_context_tokens=1500)
    question = "How often should a sourdough starter be fed?"

    def wide() -> LookaheadEngine:
        engine = LookaheadEngine.from_pretrained(str(directory), config=LookaheadConfig(mode="trie"))
        engine.model.config.max_position_embeddings = 4096  # room for the sources (rotary: it takes it)
        return engine

    expected = RagPipeline(wide(), index, retrieval).ask(question, max_new_tokens=N)
    served = wide()
    recording = Recording(served)
    with LiveServer(create_app(served, ServeSettings(model_name=MODEL))) as live:
        engine = ServerEngine(
            live.base_url,
            MODEL,
            "rag-lookahead",
            max_retries=0,
            tokenizer=str(directory),
            context_window=4096,
        )
        rag = RagPipeline(engine, index, retrieval)
        query = rag.prepare(question, N)
        assert query.documents  # some chunks did not fit the prompt: only the drafts carry them
        answer = rag.ask(question, max_new_tokens=N)
    assert answer.text == expected.text
    assert recording.calls[-1]["documents"] == list(query.documents)
    assert not scope_owners(served)


# ---------------------------------------------------------------------------- long documents (issue 60)

# 12,000 printable characters (one token each) with a period of 997: many slices of text work.
LONG = "".join(chr(33 + (i * 37 + 11) % 997 % 94) for i in range(12_000))


def _chat(url: str) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "documents": [LONG], "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=WAIT_S)


def _completion(url: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The Normans", "documents": [LONG], "max_tokens": 4}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_S)


def _corpus(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/corpora", json={"documents": [LONG]}, timeout=WAIT_S)


def _corpus_extended(url: str) -> httpx.Response:
    corpus = httpx.post(f"{url}/v1/corpora", json={"documents": DOCUMENTS}).json()["id"]
    return httpx.post(f"{url}/v1/corpora/{corpus}/documents", json={"documents": [LONG]}, timeout=WAIT_S)


def _call_naming_a_long_corpus(url: str) -> httpx.Response:
    corpus = httpx.post(f"{url}/v1/corpora", json={"documents": [LONG] * 3}, timeout=WAIT_S).json()["id"]
    body = {"model": MODEL, "prompt": "The Normans", "corpus": corpus, "max_tokens": 4}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_S)


# (case, the request of long documents, what takes them in and is watched: the trie's inserts or
# a call's own index of its texts)
LONG_DOCUMENT_CASES: list[tuple[str, Callable[[str], httpx.Response], str]] = [
    ("a chat request's documents", _chat, "trie"),
    ("a completion's documents", _completion, "trie"),
    ("a new corpus", _corpus, "trie"),
    ("documents added to a corpus", _corpus_extended, "trie"),
    ("a call naming a long corpus", _call_naming_a_long_corpus, "index"),
]


@pytest.mark.parametrize(
    ("case", "request_", "watched"), LONG_DOCUMENT_CASES, ids=[c[0] for c in LONG_DOCUMENT_CASES]
)
def test_a_stream_steps_while_long_documents_go_in(
    monkeypatch: pytest.MonkeyPatch, case: str, request_: Callable[[str], httpx.Response], watched: str
) -> None:
    """Long documents enter the trie (or a call's own index) in slices in the model's thread,
    and a stream decoding meanwhile steps between every few of them: it never waits for all of
    them at once (a request of 3.5 MB once held the streams for its whole insert)."""
    engine = new_engine()
    watch = InsertWatch(engine, 100)  # a long text's part: not the stream's tokens, nor DOCUMENTS

    no_eos = {str(ASCII_VOCAB): -100}  # the stream lasts its max_tokens
    body = {"model": MODEL, "prompt": "The Normans", "max_tokens": 300, "stream": True, "logit_bias": no_eos}
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as live:
        with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=WAIT_S) as stream:
            events = (line for line in stream.iter_lines() if line.startswith("data:"))
            assert next(events)  # the stream's call is decoding
            watch.start(monkeypatch, watched)
            response = request_(live.url)
            monkeypatch.undo()
            assert list(events)[-1] == "data: [DONE]"
        assert response.status_code == 200, response.text
        assert len(set(watch.held)) >= 3, watch.held  # the stream stepped between the slices
        live.app.state.lookahead.corpora.close()
        wait_until(lambda: not scope_owners(engine))  # nothing of the documents is left
