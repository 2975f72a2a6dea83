"""The local OpenAI-compatible server: real HTTP on 127.0.0.1 with the `openai` client (and
httpx against the ASGI app where no socket is needed).

Greedy answers over HTTP are the in-process engine's, streamed or not; every error comes in
OpenAI's shape with its status; a client that leaves mid-stream ends its call; one request's
failing grammar answers that request alone.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.streaming.stats import UNDRAFTED_REASONS
from rag_lookahead.streaming.stream import TextStream
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, save_tiny_model, tiny_model, weather_tool
from rag_lookahead.testing.local_server import DEAD_END_FORMAT as DEAD_END
from rag_lookahead.testing.local_server import (
    WAIT_S,
    LiveServer,
    error_of,
    logged_errors,
    served_engine,
    wait_until,
)

MODEL = "tiny"
KEY = "test-key"
MESSAGES = [{"role": "user", "content": "Tell me about the normans."}]
DOCUMENTS = ["The Normans were the people who gave their name to Normandy, a region in France."]
SCHEMA = {
    "type": "object",
    "properties": {"b": {"enum": ["xy", "zw"]}, "c": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["b", "c"],
    "additionalProperties": False,
}
N = 24


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LookaheadEngine:
    """Loaded as `rag-lookahead serve --model DIR` loads it."""
    directory = save_tiny_model(Path(tmp_path_factory.mktemp("tiny")))
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=8)
    return LookaheadEngine.from_pretrained(str(directory), config=config)


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    server = LiveServer(create_app(engine, ServeSettings(model_name=MODEL)))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return live.client()


def asgi(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


# ---------------------------------------------------------------------------- answers


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL, DEFAULT_EMBEDDER]  # the embedding model second
    assert client.models.retrieve(MODEL).owned_by == "rag-lookahead"


def test_greedy_chat_is_the_engine_s_answer(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    expected = engine.complete(MESSAGES, max_new_tokens=N)
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=N)  # type: ignore[arg-type]
    assert out.choices[0].message.content == expected.text
    assert out.choices[0].finish_reason == {"length": "length", "eos": "stop"}[expected.stats.finish_reason]  # type: ignore[index]
    assert out.usage is not None and out.usage.completion_tokens == expected.stats.new_tokens
    assert out.usage.prompt_tokens == expected.stats.prompt_tokens


def test_greedy_chat_streamed_is_the_engine_s_answer(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    expected = engine.complete(MESSAGES, max_new_tokens=N)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=N,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == expected.stats.new_tokens
    lookahead = chunks[-1].usage.model_extra["lookahead"]  # type: ignore[index]
    assert lookahead["finish_reason"] == expected.stats.finish_reason


def test_completions_whole_and_streamed(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    prompt = "The Normans were"
    expected = engine.complete(prompt, max_new_tokens=N).text
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0)
    assert out.object == "text_completion" and out.choices[0].text == expected
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    expected = engine.complete(MESSAGES, max_new_tokens=N, logprobs=True, top_logprobs=3)
    assert expected.logprobs is not None
    want = [item.to_openai() for item in expected.logprobs]
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": N,
        "logprobs": True,
        "top_logprobs": 3,
    }
    out = client.chat.completions.create(**args)
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content is not None
    got = [item.model_dump() for item in out.choices[0].logprobs.content]
    assert got == want  # the same numbers, through JSON
    assert "".join(item["token"] for item in got) == expected.text
    chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
    streamed = [
        item.model_dump()
        for c in chunks
        if c.choices[0].logprobs
        for item in c.choices[0].logprobs.content or ()
    ]
    assert streamed == want
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_in_the_legacy_shape(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    prompt = "The Normans were"
    expected = engine.complete(prompt, max_new_tokens=N, logprobs=True, top_logprobs=2)
    assert expected.logprobs is not None
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, logprobs=2)
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens == [item.token for item in expected.logprobs]
    assert logprobs.token_logprobs == [item.logprob for item in expected.logprobs]
    assert logprobs.top_logprobs is not None and all(2 <= len(top) <= 3 for top in logprobs.top_logprobs)
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, logprobs=2, stream=True)
    offsets = [o for c in streamed if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset or ()]
    assert offsets == logprobs.text_offset


def test_bad_logprobs_are_400_naming_the_parameter(client: openai.OpenAI) -> None:
    for bad, param in (
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, **bad)  # type: ignore[arg-type]
        assert info.value.param == param  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", logprobs=21)
    assert info.value.param == "logprobs"  # type: ignore[attr-defined]


def test_documents_and_decode_stats(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    expected = engine.complete(MESSAGES, max_new_tokens=N, documents=DOCUMENTS).text
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=N,
        extra_body={"documents": DOCUMENTS},
    )
    assert out.choices[0].message.content == expected
    stats = out.usage.model_extra["lookahead"]  # type: ignore[union-attr,index]
    assert set(stats) >= {"steps", "tokens_per_step", "accepted_draft_tokens", "drafted_tokens"}
    assert stats["tokens_per_step"] >= 1
    # Why steps drafted nothing, counted; and why the call drafted on none, where it did not.
    assert sum(stats["undrafted_steps"].values()) <= stats["steps"]
    assert stats["drafting_off_reason"] in (None, *UNDRAFTED_REASONS)


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    )
    value = json.loads(out.choices[0].message.content or "")
    assert set(value) == {"b", "c"} and value["b"] in ("xy", "zw") and 0 <= value["c"] <= 99


def test_metrics(client: openai.OpenAI, live: LiveServer) -> None:
    client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8)
    text = httpx.get(f"{live.url}/metrics").text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["rag_lookahead_requests_running"] == 0
    assert values["rag_lookahead_requests_waiting"] == 0
    assert values["rag_lookahead_generated_tokens_total"] >= 8
    assert values["rag_lookahead_decode_steps_total"] >= 1
    assert "rag_lookahead_accepted_draft_tokens_total" in values
    assert values["rag_lookahead_time_to_first_token_seconds_count"] >= 1


def test_health(live: LiveServer) -> None:
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok"}


# ---------------------------------------------------------------------------- errors


def assert_error(
    response: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> None:
    error = error_of(response, status)
    assert (error["code"], error["param"]) == (code, param) or code is None


def test_bad_requests_are_400_naming_the_parameter(client: openai.OpenAI, live: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)  # type: ignore[arg-type]
    assert info.value.param == "temperature"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)  # type: ignore[arg-type]
    url = f"{live.url}/v1/chat/completions"
    assert_error(httpx.post(url, content=b"{not json"), 400, "invalid_json")
    assert_error(httpx.post(url, json=[1, 2]), 400)
    assert_error(httpx.post(url, json={"messages": MESSAGES, "bogus": 1}), 400, "unknown_parameter", "bogus")


def deep(levels: int) -> str:
    """A JSON array nested ``levels`` deep."""
    return "[" * levels + "]" * levels


def schema_nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


CHAT, COMPLETION = "/v1/chat/completions", "/v1/completions"
LONE = "\\ud800"  # a lone surrogate as JSON escapes it: valid JSON, no valid text
# Hostile bodies, raw: (route, body, status, code, param).
HOSTILE_REQUESTS: list[tuple[str, str, int, str | None, str | None]] = [
    (CHAT, '{"messages": ' + deep(50_000) + "}", 400, "invalid_json", None),
    (COMPLETION, '{"prompt": "Hi", "documents": ' + deep(100) + "}", 400, "invalid_json", None),
    (
        CHAT,
        json.dumps(
            {
                "messages": MESSAGES,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "d", "schema": schema_nested(400)},
                },
            }
        ),
        400,
        "invalid_json",
        None,
    ),
    (COMPLETION, '{"prompt": "Hi", "max_tokens": 1' + "0" * 5000 + "}", 400, "invalid_json", None),
    (CHAT, '{"messages": [{"role": "user", "content": "a' + LONE + 'b"}]}', 400, None, "messages[0].content"),
    (
        CHAT,
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "' + LONE + '"}]}]}',
        400,
        None,
        "messages[0].content[0].text",
    ),
    (
        CHAT,
        '{"messages": [{"role": "user", "content": "Hi", "name": "' + LONE + '"}]}',
        400,
        None,
        "messages[0].name",
    ),
    (
        CHAT,
        '{"messages": [{"role": "user", "content": "Hi"}], "documents": ["ok", "' + LONE + '"]}',
        400,
        None,
        "documents[1]",
    ),
    (COMPLETION, '{"prompt": "Hi ' + LONE + '"}', 400, None, "prompt"),
    (COMPLETION, '{"prompt": ["' + LONE + '"]}', 400, None, "prompt"),
    (COMPLETION, '{"prompt": "Hi", "documents": ["' + LONE + '"]}', 400, None, "documents[0]"),
    (COMPLETION, '{"prompt": "Hi", "stop": ["' + LONE + '"]}', 400, None, "stop"),
    (COMPLETION, '{"prompt": "Hi", "logit_bias": {"5": NaN}}', 400, None, "logit_bias"),
    (COMPLETION, '{"prompt": "Hi", "logit_bias": {"5": -Infinity}}', 400, None, "logit_bias"),
    (COMPLETION, '{"prompt": "Hi", "logit_bias": {"5": 1e400}}', 400, None, "logit_bias"),
    (COMPLETION, '{"prompt": "Hi", "logit_bias": {"1' + "0" * 5000 + '": 1}}', 400, None, "logit_bias"),
    (
        CHAT,
        '{"messages": ' + json.dumps(MESSAGES) + ', "logit_bias": {"5": 1, "05": 2}}',
        400,
        None,
        "logit_bias",
    ),
    (
        CHAT,
        '{"messages": ' + json.dumps(MESSAGES) + ', "logit_bias": {"' + LONE + '": 1}}',
        400,
        None,
        "logit_bias",
    ),
    # An unknown key is refused with a null too: a null is as absent only for a known key.
    (CHAT, '{"messages": ' + json.dumps(MESSAGES) + ', "foo": null}', 400, "unknown_parameter", "foo"),
    (COMPLETION, '{"prompt": "Hi", "foo": null}', 400, "unknown_parameter", "foo"),
    (
        CHAT,
        json.dumps(
            {
                "messages": MESSAGES,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "d", "schema": {"type": "strin"}},
                },
            }
        ),
        400,
        None,
        "response_format.json_schema.schema",
    ),
    # A completion's logprobs is OpenAI's legacy integer; true/false are the chat form.
    (COMPLETION, '{"prompt": "Hi", "logprobs": true}', 400, None, "logprobs"),
]


@pytest.mark.parametrize(("route", "body", "status", "code", "param"), HOSTILE_REQUESTS)
def test_hostile_requests_are_answered_as_the_client_s_error(
    live: LiveServer, route: str, body: str, status: int, code: str | None, param: str | None
) -> None:
    """Past the parser's stack or digit limit, or with text that is no text: a 4xx naming what
    is wrong (and where, when it is a field), never a 500."""
    response = httpx.post(f"{live.url}{route}", content=body.encode(), timeout=WAIT_S)
    error = error_of(response, status)
    assert (code is None or error["code"] == code) and error["param"] == param, error
    assert httpx.get(f"{live.url}/health").status_code == 200


def test_a_grammar_refused_at_its_start_is_400(client: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError, match="grammar"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=bad)  # type: ignore[arg-type]


def test_a_grammar_dead_end_answers_its_request_alone(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="dead end"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, response_format=DEAD_END)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="dead end"):
        for _ in client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=N,
            response_format=DEAD_END,
            stream=True,  # type: ignore[arg-type]
        ):
            pass
    assert (
        client.completions.create(model=MODEL, prompt="Still here", max_tokens=4).choices[0].text is not None
    )


def test_unknown_routes_and_models_are_404(client: openai.OpenAI, live: LiveServer) -> None:
    assert_error(httpx.get(f"{live.url}/v1/nothing"), 404, "not_found")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_a_body_over_the_limit_is_413(engine: LookaheadEngine) -> None:
    app = create_app(engine, ServeSettings(model_name=MODEL, max_body_bytes=1000))

    async def run() -> None:
        async with asgi(app) as http:
            big = {"messages": MESSAGES, "documents": ["x" * 2000]}
            assert_error(await http.post("/v1/chat/completions", json=big), 413, "body_too_large")

            async def chunked() -> Any:  # no Content-Length: counted as it arrives
                for _ in range(5):
                    yield b" " * 300

            assert_error(await http.post("/v1/completions", content=chunked()), 413, "body_too_large")

    asyncio.run(run())


def test_the_api_key(engine: LookaheadEngine) -> None:
    app = create_app(engine, ServeSettings(model_name=MODEL, api_key=KEY))

    async def run() -> None:
        async with asgi(app) as http:
            body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                response = await http.post("/v1/completions", json=body, headers=headers)
                assert_error(response, 401, "invalid_api_key")
                assert response.headers["www-authenticate"] == "Bearer"
            assert_error(await http.get("/v1/models"), 401, "invalid_api_key")
            assert_error(await http.get("/metrics"), 401, "invalid_api_key")
            auth = {"Authorization": f"Bearer {KEY}"}
            assert (await http.post("/v1/completions", json=body, headers=auth)).status_code == 200
            assert (await http.get("/metrics", headers=auth)).status_code == 200
            assert (await http.get("/health")).status_code == 200  # probes need no key

    asyncio.run(run())


def test_a_full_queue_is_429_and_closing_is_503(engine: LookaheadEngine) -> None:
    app = create_app(engine, ServeSettings(model_name=MODEL, max_running=1, max_waiting=0, retry_after_s=3))
    state = app.state.lookahead
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}

    async def run() -> None:
        async with asgi(app) as http:
            slot = await state.admission.enter()  # the one running request
            response = await http.post("/v1/completions", json=body)
            assert_error(response, 429, "queue_full")
            assert response.headers["retry-after"] == "3"
            slot.release()
            assert (await http.post("/v1/completions", json=body)).status_code == 200
            state.admission.close()
            assert_error(await http.post("/v1/completions", json=body), 503, "shutting_down")
            assert (await http.get("/health")).status_code == 503

    asyncio.run(run())


# ---------------------------------------------------------------------------- calls


def gated_engine(
    go: threading.Event | None = None,
) -> tuple[LookaheadEngine, list[TextStream], threading.Event]:
    """An engine whose forwards past the third wait until its first call's stream is closed
    (or ``go`` is set), the streams its calls returned, and an event set if a forward gave up
    waiting."""
    engine = served_engine()
    streams: list[TextStream] = []
    stream, forward = engine.stream, engine.runner.forward
    calls, gave_up = [0], threading.Event()

    def recording_stream(*args: Any, **kwargs: Any) -> TextStream:
        streams.append(stream(*args, **kwargs))
        return streams[-1]

    def gated_forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 3:
            deadline = time.monotonic() + WAIT_S
            while not streams[0]._closed and not (go is not None and go.is_set()):
                if time.monotonic() > deadline:
                    gave_up.set()  # nothing closed the stream: the test fails
                    break
                time.sleep(0.001)
        return forward(*args, **kwargs)

    engine.stream = recording_stream  # type: ignore[method-assign]
    engine.runner.forward = gated_forward  # type: ignore[method-assign]
    return engine, streams, gave_up


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_ends_its_call(stream: bool) -> None:
    """Only the server's close on the client's disconnect lets the gated call go on (to its
    end, at the next step): streamed, the client leaves after the first event; whole, it
    stops waiting for the answer (the answer cannot come before the call is closed)."""
    engine, streams, gave_up = gated_engine()
    app = create_app(engine, ServeSettings(model_name=MODEL))
    server = LiveServer(app)
    try:
        body = {"model": MODEL, "prompt": "The Normans", "max_tokens": 400, "stream": stream}
        url = f"{server.url}/v1/completions"
        if stream:
            with httpx.stream("POST", url, json=body) as response:
                assert next(line for line in response.iter_lines() if line.startswith("data:"))
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=httpx.Timeout(WAIT_S, read=0.5))
        wait_until(lambda: bool(streams) and streams[0].stats.finish_reason is not None)
        wait_until(lambda: app.state.lookahead.admission.running == 0)
        assert not gave_up.is_set()
        assert streams[0].stats.finish_reason == "abandoned"
        assert len(streams[0].token_ids) < 400
        assert engine.trie.owners() <= {OUTPUT_OWNER}  # the call's branches left the trie
    finally:
        server.stop()


def test_concurrent_requests_answer_as_alone(client: openai.OpenAI, engine: LookaheadEngine) -> None:
    """Eight requests at once, two of them with a grammar that dead-ends: the others' answers
    are their solo answers, and each failing one gets its own error."""
    prompts = [f"Question {i}: who were the Normans?" for i in range(6)]
    alone = [engine.complete([{"role": "user", "content": p}], max_new_tokens=N).text for p in prompts]
    results: list[Any] = [None] * 8

    def ask(i: int) -> None:
        extra: dict[str, Any] = {"response_format": DEAD_END} if i >= 6 else {}
        content = prompts[i] if i < 6 else "A dead end"
        try:
            out = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": content}],
                max_tokens=N,
                stream=i % 2 == 1,
                **extra,
            )
            if i % 2:
                results[i] = "".join(c.choices[0].delta.content or "" for c in out if c.choices)  # type: ignore[union-attr]
            else:
                results[i] = out.choices[0].message.content  # type: ignore[union-attr]
        except openai.APIError as err:
            results[i] = err

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert results[:6] == alone
    assert all(isinstance(r, openai.APIError) and "dead end" in str(r) for r in results[6:]), results[6:]
    assert engine.trie.owners() <= {OUTPUT_OWNER}


# ---------------------------------------------------------------------------- the command


def test_serve_local_runs_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rag-lookahead serve --backend local` loads the model and hands uvicorn the app, with the
    API key from the environment variable when no flag gives one."""
    from rag_lookahead import cli

    directory = save_tiny_model(tmp_path / "model")
    ran: dict[str, Any] = {}
    from rag_lookahead.serve import run

    def run_app(app: Any, host: str, port: int) -> None:  # the app built as the server would
        ran.update(app=app.build_now(), host=host, port=port)

    monkeypatch.setattr(run, "run_app", run_app)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: ran.update(threads=n))  # not this process's
    monkeypatch.setenv("RAG_LOOKAHEAD_API_KEY", KEY)
    argv = ["serve", "--backend", "local", "--model", str(directory), "--port", "8123", "--mode", "trie"]
    limits = ["--max-running", "2", "--max-waiting", "0", "--max-body-bytes", "5000", "--drain-seconds", "7"]
    reads = ["--header-timeout-seconds", "3", "--body-timeout-seconds", "4.5", "--keep-alive-seconds", "2"]
    pace = ["--min-body-rate", "2048", "--body-rate-grace-seconds", "1.5"]
    assert cli.main([*argv, *limits, *reads, *pace, "--max-connections", "9", "--threads", "3"]) == 0
    assert (ran["host"], ran["port"], ran["threads"]) == ("127.0.0.1", 8123, 3)
    state = ran["app"].state.lookahead
    settings = state.settings
    assert (settings.max_running, settings.max_waiting, settings.max_body_bytes) == (2, 0, 5000)
    assert settings.drain_s == 7
    assert (settings.header_timeout_s, settings.body_timeout_s, settings.keep_alive_s) == (3, 4.5, 2)
    assert (settings.min_body_rate, settings.body_rate_grace_s) == (2048, 1.5)
    assert settings.max_connections == 9
    assert settings.api_key == KEY and state.model_name == str(directory)
    assert state.engine.config.mode == "trie"

    async def run() -> None:
        async with asgi(ran["app"]) as http:
            assert (await http.get("/v1/models")).status_code == 401
            models = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            assert models.json()["data"][0]["id"] == str(directory)

    asyncio.run(run())
    assert cli.main([*argv, "--api-key", "flag-key"]) == 0
    assert ran["app"].state.lookahead.settings.api_key == "flag-key"  # the flag wins


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "vllm"], "needs --model"),
        (["--backend", "vllm", "--model", "m", "--api-key", "k"], "--api-key apply only to --backend local"),
        (["--backend", "sglang", "--model", "m", "--max-running", "2"], "--max-running apply only"),
        (["--backend", "local", "--launch"], "--launch apply only to --backend vllm and sglang"),
        (["--backend", "local", "--python", "/x/python"], "--python apply only"),
        (["--backend", "vllm", "--model", "m", "--drain-seconds", "3"], "--drain-seconds apply only"),
        (["--backend", "vllm", "--model", "m", "--min-body-rate", "0"], "--min-body-rate apply only"),
        (["--backend", "local", "--replicas", "2"], "--replicas apply only to --backend ray"),
        (["--backend", "local", "--ray-address", "auto"], "--ray-address apply only to --backend ray"),
        (
            ["--backend", "sglang", "--model", "m", "--replicas", "2"],
            "--replicas apply only to --backend local and ray",
        ),
        (["--backend", "ray", "--launch"], "--launch apply only to --backend vllm and sglang, not ray"),
        (["--backend", "vllm", "--model", "m", "--threads", "2"], "--threads apply only"),
        (["--backend", "ray", "--threads", "2"], "--threads apply only to --backend local"),
        (["--backend", "ray", "--max-connections", "9"], "--max-connections apply only to --backend local"),
        (["--backend", "ray", "--header-timeout-seconds", "3"], "--header-timeout-seconds apply only"),
        (["--backend", "ray", "--keep-alive-seconds", "3"], "--keep-alive-seconds apply only"),
        (
            ["--backend", "vllm", "--model", "m", "--body-timeout-seconds", "3"],
            "--body-timeout-seconds apply",
        ),
    ],
)
def test_serve_flags_belong_to_their_backend(argv: list[str], message: str, capsys: Any) -> None:
    from rag_lookahead import cli

    assert cli.main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "variable", "message"),
    [
        (" key", None, "--api-key must not start or end with a space"),
        ("key\t", None, "--api-key must be printable ASCII"),
        ("clé", None, "--api-key must be printable ASCII"),
        ("k\u00a0ey", None, "--api-key must be printable ASCII"),
        (None, "key ", "RAG_LOOKAHEAD_API_KEY must not start or end with a space"),
        (None, "clé", "RAG_LOOKAHEAD_API_KEY must be printable ASCII"),
    ],
)
def test_an_api_key_no_client_can_send_is_refused_at_start(
    flag: str | None,
    variable: str | None,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    """httpx and the OpenAI clients send a header's value in ASCII without its surrounding
    spaces: such a key would never match, so the command refuses it before loading anything."""
    from rag_lookahead import cli
    from rag_lookahead.serve import run

    monkeypatch.setattr(run, "run_app", lambda app, host, port: None)  # never serve
    if variable is not None:
        monkeypatch.setenv("RAG_LOOKAHEAD_API_KEY", variable)
    argv = ["serve", "--backend", "local", "--model", str(tmp_path / "nowhere")]
    assert cli.main([*argv, *(["--api-key", flag] if flag is not None else [])]) == 2
    assert message in capsys.readouterr().err


def test_an_empty_api_key_variable_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from rag_lookahead import cli

    monkeypatch.setenv("RAG_LOOKAHEAD_API_KEY", " ")
    assert cli.main(["serve", "--backend", "local"]) == 2
    assert "RAG_LOOKAHEAD_API_KEY is set but empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_running": 0}, "max_running"),
        ({"max_waiting": -1}, "max_waiting"),
        ({"max_body_bytes": True}, "max_body_bytes"),
        ({"retry_after_s": 0}, "retry_after_s"),
        ({"drain_s": -1}, "drain_s"),
        ({"drain_s": float("nan")}, "drain_s"),
        ({"api_key": ""}, "api_key"),
        ({"api_key": " key"}, "api_key"),
        ({"api_key": "clé"}, "api_key"),
        ({"model_name": ""}, "model_name"),
        ({"header_timeout_s": 0}, "header_timeout_s"),
        ({"body_timeout_s": float("nan")}, "body_timeout_s"),
        ({"body_timeout_s": "5"}, "body_timeout_s"),
        ({"min_body_rate": -1}, "min_body_rate"),
        ({"min_body_rate": 1.5}, "min_body_rate"),
        ({"body_rate_grace_s": float("nan")}, "body_rate_grace_s"),
        ({"body_rate_grace_s": -1}, "body_rate_grace_s"),
        ({"keep_alive_s": -1}, "keep_alive_s"),
        ({"keep_alive_s": 1e9}, "keep_alive_s"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": 2.5}, "max_connections"),
    ],
)
def test_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeSettings(**settings)
    assert "test-key" not in repr(ServeSettings(api_key=KEY))  # the key stays out of logs


# ---------------------------------------------------------------------------- tools

CITY = weather_tool({"enum": ["Paris", "Rome"]})


# A small template that writes calls as Llama 3.1 does, a bare JSON reply (the tiny ASCII
# vocabulary cannot spell the new lines of the Hermes and SmolLM2 blocks; SmolLM2's own
# template also outgrows the tiny model's 512-token window).
LLAMA3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == 'user' and loop.first and tools %}user: Use these functions:
{% for t in tools %}{{ t | tojson }}{% endfor %} {{ message.content }}{{ ' | ' }}
{%- elif message.tool_calls %}assistant: {% set call = message.tool_calls[0].function %}
{{- '{"name": "' + call.name + '", ' }}{{ '"parameters": ' }}{{ call.arguments | tojson }}{{ "}" }}{{ ' | ' }}
{%- elif message.role == 'tool' %}ipython: {{ message.content }}{{ ' | ' }}
{%- else %}{{ message.role }}: {{ message.content }} | {% endif %}
{%- endfor %}{% if add_generation_prompt %}assistant: {% endif %}"""


@pytest.fixture(scope="module")
def tool_server() -> Iterator[LiveServer]:
    """The tiny model under a chat template with tool calls."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    engine = LookaheadEngine(model, ascii_fast_tokenizer(LLAMA3_TEMPLATE), LookaheadConfig(mode="trie"))
    server = LiveServer(create_app(engine, ServeSettings(model_name=MODEL)))
    yield server
    server.stop()


def test_a_forced_tool_call_comes_back_as_tool_calls(tool_server: LiveServer) -> None:
    client = tool_server.client()
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [CITY],
        "max_tokens": 80,
    }
    out = client.chat.completions.create(**ask, tool_choice="required")  # type: ignore[call-overload]
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in (
        "Paris",
        "Rome",
    )
    streamed = list(client.chat.completions.create(**ask, tool_choice="required", stream=True))  # type: ignore[call-overload]
    calls = [c for chunk in streamed if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", call.function.arguments)
    ]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)


def test_a_forced_call_without_parallel_calls_is_exactly_one_call(tool_server: LiveServer) -> None:
    """``parallel_tool_calls: false`` on a forced call: its grammar allows one call, no more."""
    out = tool_server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[CITY],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
    )
    assert out.choices[0].finish_reason == "tool_calls"
    (call,) = out.choices[0].message.tool_calls or ()
    assert call.function.name == "get_weather"  # type: ignore[union-attr]


def test_tools_on_a_template_without_them_are_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[CITY])  # type: ignore[arg-type,list-item]
    assert info.value.code == "tools_not_supported" and info.value.param == "tools"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- stopping


def stream_lines(url: str, body: dict[str, Any], into: list[str]) -> threading.Thread:
    """A thread reading the stream ``body`` asks ``url`` for into ``into``, its data lines."""

    def read() -> None:
        with httpx.stream("POST", url, json=body, timeout=WAIT_S) as response:
            into.extend(line for line in response.iter_lines() if line.startswith("data:"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@dataclass
class Streaming:
    """A live server over a `gated_engine`, with one completion streaming from it."""

    server: LiveServer
    streams: list[TextStream]  # what the engine's calls returned
    gave_up: threading.Event  # set if a gated forward gave up waiting: the test fails
    lines: list[str]  # the stream's data lines so far
    reader: threading.Thread  # reading them


@contextmanager
def streaming(
    max_tokens: int = 200,
    go: threading.Event | None = None,
    request: tuple[str, dict[str, Any]] | None = None,
    **settings: Any,
) -> Iterator[Streaming]:
    """A server with ``settings`` over a `gated_engine` (``go`` lets its forwards on), once its
    completion of ``max_tokens`` (or ``request``: a route and its body) has streamed its first
    event; stopped at the end."""
    engine, streams, gave_up = gated_engine(go)
    lines: list[str] = []
    route, body = request or ("/v1/completions", {"prompt": "The Normans", "max_tokens": max_tokens})
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL, **settings))) as server:
        body = {"model": MODEL, **body, "stream": True}
        reader = stream_lines(f"{server.url}{route}", body, lines)
        wait_until(lambda: bool(lines))
        yield Streaming(server, streams, gave_up, lines, reader)


def assert_refused_while_draining(server: LiveServer) -> None:
    """New requests and /health get 503 over new connections (the listener stays open); the
    metrics are still scraped."""
    assert_error(httpx.get(f"{server.url}/health", timeout=WAIT_S), 503, "shutting_down")
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    assert_error(httpx.post(f"{server.url}/v1/completions", json=body, timeout=WAIT_S), 503, "shutting_down")
    assert_error(httpx.get(f"{server.url}/v1/models", timeout=WAIT_S), 503, "shutting_down")
    corpus = httpx.post(f"{server.url}/v1/corpora", json={"documents": ["x"]}, timeout=WAIT_S)
    assert_error(corpus, 503, "shutting_down")
    assert httpx.get(f"{server.url}/metrics", timeout=WAIT_S).status_code == 200


def test_a_stopping_server_drains() -> None:
    """Told to stop (SIGTERM), the server keeps listening and answers new requests and /health
    with 503 while a stream already running goes on to its end, ``[DONE]`` included; then it
    stops by itself."""
    go = threading.Event()
    with streaming(max_tokens=40, go=go) as run:
        run.server.server.handle_exit(signal.SIGTERM, None)
        assert_refused_while_draining(run.server)
        go.set()
        run.reader.join(WAIT_S)
        run.server.thread.join(WAIT_S)  # the drain over, it stops with nobody telling it to
        assert not run.server.thread.is_alive()
    assert not run.gave_up.is_set()
    assert run.lines[-1] == "data: [DONE]"
    assert json.loads(run.lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] in (
        "length",
        "stop",
    )
    assert run.streams[0].stats.finish_reason in ("length", "eos")  # ran to its own end


@pytest.mark.parametrize("stream", [True, False])
def test_what_runs_past_the_drain_is_cut_and_told_so(stream: bool) -> None:
    """A call still running when the drain ends is cut: a stream's last events are an error
    (no finish_reason) and ``[DONE]``, so an OpenAI client raises rather than taking the cut
    answer for whole; a whole reply is a 503."""
    engine, streams, gave_up = gated_engine()  # no forward past the third until it is cut
    server = LiveServer(create_app(engine, ServeSettings(model_name=MODEL, drain_s=0.2)))
    outcome: list[Any] = []

    def ask() -> None:
        try:
            out = server.client(timeout=WAIT_S).completions.create(
                model=MODEL, prompt="The Normans", max_tokens=200, stream=stream
            )
            outcome.append(list(out) if stream else out)  # type: ignore[call-overload]
        except openai.APIError as err:
            outcome.append(err)

    try:
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        wait_until(lambda: bool(streams))
        server.server.handle_exit(signal.SIGTERM, None)
        asker.join(WAIT_S)
        server.thread.join(WAIT_S)
        assert not server.thread.is_alive()
    finally:
        server.stop()
    assert not gave_up.is_set()
    (error,) = outcome
    assert isinstance(error, openai.APIError) and "drain" in error.message, error
    if not stream:
        assert isinstance(error, openai.InternalServerError) and error.status_code == 503
    assert streams[0].stats.finish_reason == "abandoned"


# (route, request) of a stream the server cuts as it stops
CUT_STREAMS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": "The Normans", "max_tokens": 200}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 200}),
    ("/v1/responses", {"input": "The Normans", "max_output_tokens": 200}),
]


@pytest.mark.parametrize(("route", "request_body"), CUT_STREAMS, ids=[c[0] for c in CUT_STREAMS])
def test_a_cut_stream_ends_with_an_error_never_as_an_answer(route: str, request_body: dict[str, Any]) -> None:
    """The events as sent: the answer's text so far, then an error in OpenAI's shape and the
    route's end: ``[DONE]`` for chat and completions; ``response.failed`` for Responses (what
    OpenAI ends a response the server could not finish with), never ``response.completed``."""
    with streaming(drain_s=0, request=(route, request_body)) as run:
        run.server.server.handle_exit(signal.SIGTERM, None)
        run.reader.join(WAIT_S)
    events = [json.loads(line.removeprefix("data: ")) for line in run.lines if line != "data: [DONE]"]
    if route != "/v1/responses":
        assert run.lines[-1] == "data: [DONE]"
        *answer, last = events
        assert (last["error"]["code"], last["error"]["type"]) == ("shutting_down", "service_unavailable")
        assert all(event["choices"][0]["finish_reason"] is None for event in answer)
        return
    *answer, error, failed = events
    assert (error["type"], error["code"]) == ("error", "shutting_down")
    assert error["error"]["type"] == "service_unavailable"
    assert failed["type"] == "response.failed"
    response = failed["response"]
    assert response["status"] == "failed" and response["error"]["code"] == "server_error"
    assert "drain" in response["error"]["message"] and response["incomplete_details"] is None
    assert [item["status"] for item in response["output"]] == ["incomplete"]  # the message cut
    assert not {"response.completed", "response.incomplete"} & {event["type"] for event in answer}
    assert [event["sequence_number"] for event in events] == list(range(len(events)))


def test_a_second_signal_cuts_at_once() -> None:
    with streaming(drain_s=600) as run:
        run.server.server.handle_exit(signal.SIGINT, None)
        assert_refused_while_draining(run.server)
        run.server.server.handle_exit(signal.SIGINT, None)  # a second Ctrl-C
        run.reader.join(WAIT_S)
        run.server.thread.join(WAIT_S)
        assert not run.server.thread.is_alive()
    assert run.lines[-1] == "data: [DONE]" and '"shutting_down"' in run.lines[-2]
    assert run.streams[0].stats.finish_reason == "abandoned"


# ---------------------------------------------------------------------------- readiness


def test_costs_are_measured_before_the_server_listens(tmp_path: Path) -> None:
    """With ``mode="auto"`` the forward costs are measured at startup, before uvicorn listens
    (`LiveServer` returns once it does), as `ask` measures them before answering: no request
    pays for them."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    engine = LookaheadEngine(model, ascii_fast_tokenizer(), LookaheadConfig(mode="auto"), cache_dir=tmp_path)
    measured = []
    measure = engine.measure_costs

    def recording(**kwargs: Any) -> Any:
        measured.append(kwargs)
        return measure(**kwargs)

    engine.measure_costs = recording  # type: ignore[method-assign]
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as server:
        assert len(measured) == 1 and engine.cost_curve is not None
        out = server.client().completions.create(model=MODEL, prompt="The Normans", max_tokens=8)
        assert out.choices[0].text
    assert len(measured) == 1  # the request measured nothing


# ---------------------------------------------------------------------------- slow and broken clients

SHORT_S = 0.3  # the read timeouts of the slow-client tests: short, for short tests
GAP_S = 0.02  # between a dripping client's bytes
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
PADDING = b"X-Padding: " + b"a" * 400 + b"\r\n"  # at GAP_S a byte, far past SHORT_S
BODY = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "documents": ["a" * 400]}).encode()
WHOLE = HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def received_until_closed(sock: socket.socket, dripped: bytes = b"") -> bytes:
    """Send ``dripped`` a byte every `GAP_S` until the server answers or closes; then what it
    sends until it closes the connection (failing if it has not after `WAIT_S`)."""
    for byte in dripped:
        if select.select([sock], [], [], GAP_S)[0]:
            break  # an answer, or the end
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
    sock.settimeout(WAIT_S)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open; it sent {received!r}") from None
    return received


@pytest.fixture(scope="module")
def guarded() -> Iterator[LiveServer]:
    settings = ServeSettings(model_name=MODEL, header_timeout_s=SHORT_S, body_timeout_s=SHORT_S)
    with LiveServer(create_app(served_engine(), settings)) as server:
        yield server


# (what is sent at once, what is dripped, how what the server sends back starts)
SLOW_CLIENTS: list[tuple[bytes, bytes, bytes]] = [
    (b"", b"", b""),  # connects and sends nothing
    (b"", HEAD + PADDING, b""),  # headers a byte at a time
    (HEALTH, HEAD + PADDING, b""),  # the same, as a kept-alive connection's next request
    (HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY), BODY, b"HTTP/1.1 408"),  # a body a byte at a time
]


def health_answer(sock: socket.socket) -> bytes:
    """The answer to `HEALTH`, read whole (its body is the last of it)."""
    received = b""
    while not received.endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


@pytest.mark.parametrize(("sent", "dripped", "answer"), SLOW_CLIENTS)
def test_slow_clients_are_cut_off(guarded: LiveServer, sent: bytes, dripped: bytes, answer: bytes) -> None:
    """A client that sends its request a byte at a time holds no connection past the read
    timeouts: the server closes it (a late body answered 408), and answers others meanwhile."""
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=WAIT_S) as sock:
        sock.sendall(sent)
        if sent == HEALTH:
            assert health_answer(sock).startswith(b"HTTP/1.1 200")
        received = received_until_closed(sock, dripped)
    assert received.startswith(answer), received
    if answer == b"HTTP/1.1 408":
        assert b'"body_timeout"' in received
    assert httpx.get(f"{guarded.url}/health", timeout=WAIT_S).json() == {"status": "ok"}
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=WAIT_S) as sock:
        sock.sendall(WHOLE)  # a whole request sent at once is in time
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


# A body's pace: a far deadline for the whole body, so that the minimum rate is what cuts.
PACED = {
    "header_timeout_s": SHORT_S,
    "body_timeout_s": 600.0,
    "min_body_rate": 1000,
    "body_rate_grace_s": SHORT_S,
}
CHUNKED_HEAD = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
CHUNKED_BODY = b"".join(b"1\r\n" + bytes([byte]) + b"\r\n" for byte in BODY) + b"0\r\n\r\n"

# (case, settings, the head sent at once, the body dripped, words of the 408's message)
DRIPPED_BODIES: list[tuple[str, dict[str, Any], bytes, bytes, str]] = [
    (
        "past the whole body's deadline",
        {"header_timeout_s": SHORT_S, "body_timeout_s": SHORT_S},
        HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY),
        BODY,
        "did not arrive within",
    ),
    (
        "slower than the minimum rate",
        PACED,
        HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY),
        BODY,
        "bytes a second",
    ),
    ("slower than the minimum rate, chunked", PACED, CHUNKED_HEAD, CHUNKED_BODY, "bytes a second"),
]


@pytest.mark.parametrize(
    ("case", "settings", "head", "dripped", "words"), DRIPPED_BODIES, ids=[c[0] for c in DRIPPED_BODIES]
)
def test_a_dripping_body_is_408_and_closed(
    case: str, settings: dict[str, Any], head: bytes, dripped: bytes, words: str
) -> None:
    """A body dripped a byte at a time is answered 408 and its connection closed, once past the
    whole body's deadline or, with a far deadline, once behind the minimum rate."""
    with LiveServer(create_app(served_engine(), ServeSettings(model_name=MODEL, **settings))) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
            sock.sendall(head)
            received = received_until_closed(sock, dripped)
        assert received.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in received, received
        assert words.encode() in received, received
        wait_until(lambda: not server.server.server_state.connections)


def test_dripping_clients_hold_no_connection() -> None:
    """Many clients dripping their bodies are each answered 408 and closed, behind the minimum
    rate long before the whole body's deadline, while a client that keeps the pace, pausing
    within its grace, is answered."""
    with LiveServer(create_app(served_engine(), ServeSettings(model_name=MODEL, **PACED))) as server:
        answers: list[bytes] = []

        def drip() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
                sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY))
                answers.append(received_until_closed(sock, BODY))

        drippers = [threading.Thread(target=drip, daemon=True) for _ in range(16)]
        for thread in drippers:
            thread.start()
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
            sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY[:300])
            time.sleep(SHORT_S / 3)  # within the grace: the rest comes well ahead of the pace
            sock.sendall(BODY[300:])
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        for thread in drippers:
            thread.join(WAIT_S)
        assert len(answers) == len(drippers)
        assert all(a.startswith(b"HTTP/1.1 408") and b"bytes a second" in a for a in answers), answers
        wait_until(lambda: not server.server.server_state.connections)


def test_connections_past_the_cap_are_refused() -> None:
    settings = ServeSettings(model_name=MODEL, max_connections=2)
    with LiveServer(create_app(served_engine(), settings)) as server:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) for _ in range(2)]
        try:
            wait_until(lambda: len(server.server.server_state.connections) == 2)
            with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as third:
                refused = received_until_closed(third)
            assert refused.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in refused
            held[0].sendall(HEALTH)  # the connections held are served
            assert health_answer(held[0]).startswith(b"HTTP/1.1 200")
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: not server.server.server_state.connections)
        assert httpx.get(f"{server.url}/health", timeout=WAIT_S).status_code == 200


def test_a_client_leaving_mid_body_is_no_error(live: LiveServer) -> None:
    """No "Exception in ASGI application" traceback per client that leaves mid-body: its
    request ends quietly."""
    tasks = live.server.server_state.tasks
    with logged_errors() as records:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", live.port), timeout=WAIT_S) as sock:
                sock.sendall(HEAD + b"Content-Length: 100000\r\n\r\n" + BODY)
                wait_until(lambda: bool(tasks))  # the app is reading the body
            wait_until(lambda: not tasks)
    assert not records, [record.getMessage() for record in records]
    assert httpx.get(f"{live.url}/health", timeout=WAIT_S).status_code == 200
