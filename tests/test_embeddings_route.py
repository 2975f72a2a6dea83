"""``POST /v1/embeddings``: the built-in embedder (or ``--embedder``'s) behind the server.

The vectors are the embedder's own, as floats or base64, for every input shape OpenAI takes
(token ids read as OpenAI's ``cl100k_base`` tokens, or refused with the fix when tiktoken cannot
load them); the model is listed by ``/v1/models``; each request holds a running slot and is
embedded in the embedder's one thread; hostile requests get a 400 naming their field. A big
request is embedded in slices that running streams step between, and stops at the next slice
once its client has left.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tiktoken

from rag_lookahead import LookaheadEngine
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, SentenceTransformerEmbedder, default_embedder_path
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.serve.embeddings import MAX_INPUTS, SLICE_TOKENS
from rag_lookahead.testing import ASCII_VOCAB, save_tiny_model
from rag_lookahead.testing.local_server import WAIT_S, LiveServer, error_of, served_engine, wait_until

MODEL = "tiny"
TEXTS = ["The Normans gave their name to Normandy.", "A region in France.", ""]


class Watched:
    """The built-in embedder, noting for each call the server's running requests and the thread."""

    def __init__(self, embedder: SentenceTransformerEmbedder) -> None:
        self.inner = embedder
        self.name, self.dimension, self.tokenizer = embedder.name, embedder.dimension, embedder.tokenizer
        self.max_tokens = embedder.max_tokens
        self.app: Any = None
        self.seen: list[tuple[int, str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.append((self.app.state.lookahead.admission.running, threading.current_thread().name))
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture
def watched(engine: LookaheadEngine, embedder: SentenceTransformerEmbedder) -> Watched:
    watched = Watched(embedder)
    watched.app = create_app(engine, ServeSettings(model_name=MODEL), embedder=watched)
    return watched


def send(app: Any, body: Any, method: str = "POST", path: str = "/v1/embeddings") -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            # Escaped as JSON escapes it: a lone surrogate ("\ud800") travels as text.
            content = json.dumps(body) if body is not None else None
            return await http.request(
                method, path, content=content, headers={"content-type": "application/json"}
            )

    return asyncio.run(run())


def vectors(reply: dict[str, Any]) -> np.ndarray:
    data = reply["data"]
    assert [item["index"] for item in data] == list(range(len(data)))
    assert all(item["object"] == "embedding" for item in data)
    rows = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        if isinstance(item["embedding"], str)
        else np.array(item["embedding"], dtype=np.float32)
        for item in data
    ]
    return np.stack(rows)  # [N, D]


def tokens(embedder: SentenceTransformerEmbedder, texts: Sequence[str]) -> int:
    return sum(len(ids) for ids in embedder.tokenizer(list(texts)).input_ids)


def test_texts_are_the_embedder_s_vectors(watched: Watched, embedder: SentenceTransformerEmbedder) -> None:
    response = send(watched.app, {"model": DEFAULT_EMBEDDER, "input": TEXTS})
    assert response.status_code == 200, response.text
    reply = response.json()
    assert (reply["object"], reply["model"]) == ("list", DEFAULT_EMBEDDER)
    np.testing.assert_allclose(vectors(reply), embedder.embed(TEXTS), atol=1e-6)
    count = tokens(embedder, TEXTS)
    assert reply["usage"] == {"prompt_tokens": count, "total_tokens": count}
    # One request was running (this one), and the model ran in its own thread.
    assert watched.seen == [(1, "rag-lookahead-embedder_0")]


def test_one_string_base64_and_dimensions(watched: Watched, embedder: SentenceTransformerEmbedder) -> None:
    body = {"input": TEXTS[0], "encoding_format": "base64", "dimensions": embedder.dimension}
    reply = send(watched.app, body).json()
    assert isinstance(reply["data"][0]["embedding"], str)
    np.testing.assert_allclose(vectors(reply), embedder.embed(TEXTS[:1]), atol=1e-6)


class FakeEncoding:
    """Stands in for tiktoken's cl100k_base (which this machine cannot fetch): id i is chr(i)."""

    n_vocab = 128

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_token_ids_are_read_as_openai_s_tokens(
    watched: Watched, embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: FakeEncoding())
    ids = [[ord(c) for c in text] for text in TEXTS[:2]]
    reply = send(watched.app, {"input": ids}).json()
    np.testing.assert_allclose(vectors(reply), embedder.embed(TEXTS[:2]), atol=1e-6)
    one = send(watched.app, {"input": ids[0]}).json()  # one list of ids: one input
    np.testing.assert_allclose(vectors(one), embedder.embed(TEXTS[:1]), atol=1e-6)
    assert error_of(send(watched.app, {"input": [[65, 300]]}), 400)["param"] == "input[0]"


def test_token_ids_without_the_encoding_are_refused_with_the_fix(
    watched: Watched, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(name: str) -> Any:
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", unavailable)
    error = error_of(send(watched.app, {"input": [[9906, 1917]]}), 400)
    assert error["param"] == "input" and error["code"] == "token_ids_unsupported"
    assert "check_embedding_ctx_length=False" in error["message"] and "no network" in error["message"]
    assert not watched.seen  # never read as the embedder's own ids


def test_listed_by_models(watched: Watched) -> None:
    listed = send(watched.app, None, "GET", "/v1/models").json()["data"]
    assert [card["id"] for card in listed] == [MODEL, DEFAULT_EMBEDDER]
    assert send(watched.app, None, "GET", f"/v1/models/{DEFAULT_EMBEDDER}").json()["id"] == DEFAULT_EMBEDDER


def test_the_openai_client(engine: LookaheadEngine, embedder: SentenceTransformerEmbedder) -> None:
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL), embedder=embedder)) as live:
        out = live.client().embeddings.create(model=DEFAULT_EMBEDDER, input=TEXTS)  # base64 on the wire
    got = np.array([item.embedding for item in out.data], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(TEXTS), atol=1e-6)
    assert out.usage.prompt_tokens == tokens(embedder, TEXTS)


def test_the_built_in_embedder_by_default(
    engine: LookaheadEngine, embedder: SentenceTransformerEmbedder
) -> None:
    app = create_app(engine, ServeSettings(model_name=MODEL))
    reply = send(app, {"model": DEFAULT_EMBEDDER, "input": TEXTS[0]}).json()
    np.testing.assert_allclose(vectors(reply), embedder.embed(TEXTS[:1]), atol=1e-6)


def test_a_model_directory_is_named_by_its_path(
    engine: LookaheadEngine, embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    path = str(default_embedder_path())
    app = create_app(engine, ServeSettings(model_name=MODEL, embedder=path))
    reply = send(app, {"model": path, "input": TEXTS[0]}).json()
    assert reply["model"] == path
    np.testing.assert_allclose(vectors(reply), embedder.embed(TEXTS[:1]), atol=1e-6)
    assert error_of(send(app, {"model": DEFAULT_EMBEDDER, "input": "x"}), 404)["param"] == "model"
    missing = create_app(engine, ServeSettings(model_name=MODEL, embedder=str(tmp_path / "none")))
    assert error_of(send(missing, {"input": "x"}), 500)["code"] == "embedder_missing"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": {"text": "x"}}, "input"),
        ({"input": 3}, "input"),
        ({"input": [1, "a"]}, "input[0]"),
        ({"input": [[1], ["a"]]}, "input[1]"),
        ({"input": [[1], [-1]]}, "input[1]"),
        ({"input": [True]}, "input[0]"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
        ({"input": "\ud800"}, "input"),
        ({"input": ["ok", "\ud800"]}, "input[1]"),
        ({"input": ["ok", "word " * 300]}, "input[1]"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": "384"}, "dimensions"),
        ({"input": "x", "dimensions": True}, "dimensions"),
        ({"input": "x", "dimensions": 100}, "dimensions"),
        ({"input": "x", "user": 7}, "user"),
        ({"input": "x", "truncate": True}, "truncate"),
    ],
)
def test_hostile_requests(watched: Watched, body: dict[str, Any], param: str) -> None:
    assert error_of(send(watched.app, body), 400)["param"] == param


def test_other_models_and_bodies(watched: Watched) -> None:
    assert error_of(send(watched.app, {"model": MODEL, "input": "x"}), 404)["code"] == "model_not_found"
    assert error_of(send(watched.app, ["x"]), 400)["message"]
    assert send(watched.app, {"input": "x", "user": "u-1"}).status_code == 200  # bookkeeping only


def test_serve_takes_embedder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from rag_lookahead import cli
    from rag_lookahead.runtime import memory
    from rag_lookahead.serve import run

    ran: dict[str, Any] = {}
    # The app built as the server would (its own thread aside).
    monkeypatch.setattr(run, "run_app", lambda app, host, port: ran.update(app=app.build_now()))
    monkeypatch.setattr(memory, "retain_freed_memory", lambda: False)  # this process's allocator as is
    path = str(default_embedder_path())
    model = str(save_tiny_model(tmp_path / "model"))
    assert cli.main(["serve", "--backend", "local", "--model", model, "--embedder", path]) == 0
    state = ran["app"].state.lookahead
    assert state.settings.embedder == path and state.embeddings.name == path
    missing = str(tmp_path / "none")
    assert cli.main(["serve", "--backend", "local", "--embedder", missing]) == 2
    assert f"--embedder {missing!r} is not a directory" in capsys.readouterr().err
    assert cli.main(["serve", "--backend", "vllm", "--model", "m", "--embedder", path]) == 2
    assert "--embedder apply only to --backend local and ray" in capsys.readouterr().err


# ---------------------------------------------------------------------------- big requests


class Sliced:
    """The built-in embedder, run in the model's thread as it runs there, noting for each call
    the texts it was given and how many tokens ``engine``'s running calls hold by then."""

    def __init__(self, embedder: SentenceTransformerEmbedder, engine: LookaheadEngine) -> None:
        self.inner, self.engine = embedder, engine
        self.name, self.dimension, self.tokenizer = embedder.name, embedder.dimension, embedder.tokenizer
        self.max_tokens = embedder.max_tokens
        self.seen: list[tuple[int, int]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        def run() -> np.ndarray:
            running = self.engine.scheduler._rows.calls  # read in the loop's own thread: between steps
            self.seen.append((len(texts), sum(len(call.ids) for call in running)))
            return self.inner.embed(texts)

        return ModelThread.shared().call(run)


def model_tokens(embedder: SentenceTransformerEmbedder, texts: Sequence[str]) -> list[int]:
    return [len(ids) for ids in embedder.tokenizer(list(texts)).input_ids]


# (case, the texts of one request): each is several slices' worth of the embedder's tokens
BIG_REQUEST_CASES: list[tuple[str, list[str]]] = [
    ("many short texts", [f"Rollo {i} gave his name to Normandy." for i in range(400)]),
    ("a few long texts", ["The Normans " * 80 for _ in range(16)]),
    ("one long text among short ones", ["word " * 250, *(["A region in France."] * 600)]),
]


@pytest.mark.parametrize(("case", "texts"), BIG_REQUEST_CASES, ids=[c[0] for c in BIG_REQUEST_CASES])
def test_a_stream_steps_between_the_slices_of_a_big_request(
    engine: LookaheadEngine, embedder: SentenceTransformerEmbedder, case: str, texts: list[str]
) -> None:
    """Embedded while a stream decodes, a big request goes to the model's thread a slice at a
    time, and the stream's call steps between every two slices: it never waits for the whole
    request. The vectors are the embedder's all the same."""
    assert sum(model_tokens(embedder, texts)) > 3 * SLICE_TOKENS  # the case proves something
    sliced = Sliced(embedder, engine)
    app = create_app(engine, ServeSettings(model_name=MODEL), embedder=sliced)
    no_eos = {str(ASCII_VOCAB): -100}  # the stream lasts its max_tokens
    body = {"prompt": "The Normans", "max_tokens": 300, "stream": True, "logit_bias": no_eos}
    with LiveServer(app) as live, httpx.stream("POST", f"{live.url}/v1/completions", json=body) as stream:
        events = (line for line in stream.iter_lines() if line.startswith("data:"))
        assert next(events)  # the stream's call is decoding
        reply = httpx.post(f"{live.url}/v1/embeddings", json={"input": texts}, timeout=WAIT_S)
        assert list(events)[-1] == "data: [DONE]"
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(vectors(reply.json()), embedder.embed(texts), atol=1e-5)
    assert sum(count for count, _ in sliced.seen) == len(texts)
    held = [tokens for _, tokens in sliced.seen]
    assert len(held) >= 3 and all(a < b for a, b in itertools.pairwise(held)), held


class Leaving:
    """The built-in embedder, whose first call waits until ``left()`` (its request cancelled
    once its client has gone): the first slice of a request whose client leaves meanwhile."""

    def __init__(self, embedder: SentenceTransformerEmbedder) -> None:
        self.inner = embedder
        self.name, self.dimension, self.tokenizer = embedder.name, embedder.dimension, embedder.tokenizer
        self.max_tokens = embedder.max_tokens
        self.left: Callable[[], bool] = lambda: True
        self.seen: list[int] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not self.seen:
            deadline = time.monotonic() + WAIT_S  # a bound: the test fails, never hangs
            while not self.left() and time.monotonic() < deadline:
                time.sleep(0.01)
        self.seen.append(len(texts))
        return self.inner.embed(texts)


def test_a_request_whose_client_left_stops_at_the_next_slice(
    engine: LookaheadEngine, embedder: SentenceTransformerEmbedder
) -> None:
    """The client of a big request leaves while its first slice is embedded: the request ends
    there, its running slot is free, and the next request is embedded next, not after the rest
    of the one nobody waits for."""
    texts = BIG_REQUEST_CASES[0][1]
    leaving = Leaving(embedder)
    app = create_app(engine, ServeSettings(model_name=MODEL), embedder=leaving)
    admission = app.state.lookahead.admission
    leaving.left = lambda: admission.running == 0
    with LiveServer(app) as live:
        url = f"{live.url}/v1/embeddings"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={"input": texts}, timeout=httpx.Timeout(WAIT_S, read=0.5))
        wait_until(lambda: bool(leaving.seen))
        small = httpx.post(url, json={"input": "Rollo"}, timeout=WAIT_S)
    assert small.status_code == 200, small.text
    # The slice in hand when its client left, then the small request's.
    assert len(leaving.seen) == 2 and leaving.seen[0] < len(texts) and leaving.seen[1] == 1, leaving.seen
