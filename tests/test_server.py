"""`ServerEngine` against a loopback stub of an OpenAI-compatible server (no network)."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from rag_lookahead import GenerationParams
from rag_lookahead.interface import Engine
from rag_lookahead.remote import (
    CorpusError,
    CorpusWarning,
    ServerConfig,
    ServerEngine,
    ServerError,
    ServerTimeout,
    server_command,
)
from rag_lookahead.remote.metrics import parse_speculation_counters
from rag_lookahead.structured import Grammar
from rag_lookahead.testing import tiny_engine
from rag_lookahead.testing.stub_server import Answer, Events, Failure, StubServer, stub_server

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won?"}]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with stub_server() as server:
        yield server


def engine(stub: StubServer, kind: Any = "vllm", **kwargs: Any) -> ServerEngine:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", 10.0)
    return ServerEngine(stub.base_url, "served-model", kind, **kwargs)


def last_body(stub: StubServer) -> dict[str, Any]:
    return stub.completions()[-1].body


# ---------------------------------------------------------------------------- request bodies


def test_chat_messages_go_to_chat_completions_greedy(stub: StubServer) -> None:
    engine(stub).complete(CHAT, max_new_tokens=12, stop_strings=["\n\n", "###"], seed=3)
    request = stub.completions()[-1]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer EMPTY"
    assert request.body == {
        "model": "served-model",
        "messages": CHAT,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 12,
        "temperature": 0.0,
        "seed": 3,
        "stop": ["\n\n", "###"],
    }


def test_text_and_token_ids_go_to_completions(stub: StubServer) -> None:
    server = engine(stub, api_key="secret")
    server.complete("Once upon a time")
    assert stub.completions()[-1].path == "/v1/completions"
    assert last_body(stub)["prompt"] == "Once upon a time"
    assert stub.completions()[-1].headers["authorization"] == "Bearer secret"
    server.complete([1, 2, 3])
    assert last_body(stub)["prompt"] == [1, 2, 3]


def test_sampling_fields_and_server_extras(stub: StubServer) -> None:
    params = GenerationParams(
        do_sample=True, temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.1, eos_token_id=[5, 6]
    )
    engine(stub, "sglang").complete("x", params)
    body = last_body(stub)
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 20)
    assert body["repetition_penalty"] == 1.1
    # The call's EOS replaces the model's, as in the local engine.
    assert body["ignore_eos"] is True and body["stop_token_ids"] == [5, 6]


@pytest.mark.parametrize(
    "override", [{"do_sample": True, "top_k": 5}, {"repetition_penalty": 1.2}, {"eos_token_id": 2}]
)
def test_a_plain_openai_server_refuses_fields_it_may_ignore(stub: StubServer, override: Any) -> None:
    with pytest.raises(ValueError, match="not OpenAI API fields"):
        engine(stub, "openai").stream("x", **override)
    assert not stub.completions()


def test_grammars_go_as_the_servers_structured_output_fields(stub: StubServer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    engine(stub, "openai").complete(CHAT, grammar=Grammar.json_schema(schema))
    assert last_body(stub)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }
    engine(stub, "openai").complete(CHAT, grammar=Grammar.json())
    assert last_body(stub)["response_format"] == {"type": "json_object"}
    engine(stub, "vllm").complete("x", grammar=Grammar.regex("[ab]+"))
    assert last_body(stub)["structured_outputs"] == {"regex": "[ab]+"}
    engine(stub, "sglang").complete("x", grammar=Grammar.regex("[ab]+"))
    assert last_body(stub)["regex"] == "[ab]+"
    sent = len(stub.completions())
    with pytest.raises(NotImplementedError, match="no request field"):
        engine(stub, "openai").stream("x", grammar=Grammar.regex("[ab]+"))
    with pytest.raises(NotImplementedError, match="no request field"):
        engine(stub, "vllm").stream("x", grammar=Grammar.sequence(Grammar.literal("<a>"), Grammar.json()))
    assert len(stub.completions()) == sent


def test_logprobs_are_asked_for_in_each_endpoints_shape(stub: StubServer) -> None:
    engine(stub).complete(CHAT, logprobs=True, top_logprobs=2)
    assert last_body(stub)["logprobs"] is True and last_body(stub)["top_logprobs"] == 2
    engine(stub).complete("x", logprobs=True, top_logprobs=3)
    assert last_body(stub)["logprobs"] == 3 and "top_logprobs" not in last_body(stub)
    engine(stub).complete(CHAT)
    assert "logprobs" not in last_body(stub)


# ---------------------------------------------------------------------------- answers


@pytest.mark.parametrize("prompt", [CHAT, "x"], ids=["chat", "completion"])
def test_the_servers_logprobs_come_with_their_text(stub: StubServer, prompt: Any) -> None:
    stub.reply(Answer(("The ", "answer", "."), logprobs=True), Answer(("a",)))
    completion = engine(stub).complete(prompt, logprobs=True, top_logprobs=2)
    assert completion.logprobs is not None
    assert [(t.token, t.logprob) for t in completion.logprobs] == [
        ("The ", -0.1),
        ("answer", -0.2),
        (".", -0.3),
    ]
    assert [t.token for t in completion.logprobs[0].top_logprobs] == ["The ", "?"]
    assert all(t.token_id is None for t in completion.logprobs)  # the API sends text only
    assert engine(stub).complete(prompt).logprobs is None


def test_a_stop_string_found_here_drops_the_tokens_past_it(stub: StubServer) -> None:
    stub.reply(Answer(("ab#", "#", "c#", "d###e"), logprobs=True))
    completion = engine(stub).complete(CHAT, stop_strings=["##"], logprobs=True)
    assert completion.text == "ab" and completion.stats.finish_reason == "stop_string"
    assert completion.logprobs is not None and [t.token for t in completion.logprobs] == ["ab#"]


def test_malformed_logprobs_are_the_servers_error(stub: StubServer) -> None:
    bad = {"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [{"token": 3, "logprob": "x"}]}}
    chunk = {"id": "e", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [bad]}
    stub.reply(Events(("data: " + json.dumps(chunk) + "\n\n",)))
    with pytest.raises(ServerError, match="malformed logprobs"):
        engine(stub).complete(CHAT, logprobs=True)


def test_streamed_text_is_reassembled_with_stats(stub: StubServer) -> None:
    pieces = ("Le ", "phare", " d\u2019Alexandrie", " 🗼", "")
    stub.reply(Answer(pieces, usage=(21, 9)))
    with engine(stub).stream(CHAT) as stream:
        assert list(stream) == ["Le ", "phare", " d\u2019Alexandrie", " 🗼"]
    assert stream.text == "Le phare d\u2019Alexandrie 🗼"
    assert stream.token_ids == []  # the API sends text only
    stats = stream.stats
    assert (stats.prompt_tokens, stats.new_tokens, stats.finish_reason) == (21, 9, "eos")
    assert stats.steps == 0 and stats.accepted_per_step == ()
    assert 0 <= stats.prefill_seconds <= stats.seconds


def test_without_usage_the_chunks_are_counted(stub: StubServer) -> None:
    stub.reply(Answer(("a", "b", "c"), usage=None))
    completion = engine(stub).complete("x")
    assert completion.text == "abc" and completion.stats.new_tokens == 3


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Answer(finish="stop"), "eos"),
        (Answer(finish="stop", stop_reason="###"), "stop_string"),  # vLLM
        (Answer(finish="stop", matched_stop="###"), "stop_string"),  # SGLang
        (Answer(finish="stop", stop_reason=2), "eos"),  # a stop token id
        (Answer(finish="length"), "length"),
        (Answer(finish="abort"), "abandoned"),
    ],
)
def test_finish_reasons(stub: StubServer, answer: Answer, reason: str) -> None:
    stub.reply(answer)
    assert engine(stub).complete("x", stop_strings="###").stats.finish_reason == reason


@pytest.mark.parametrize("answer", [Answer(finish=None), Answer(finish="content_filter")])
def test_a_stream_without_a_known_finish_is_an_error(stub: StubServer, answer: Answer) -> None:
    stub.reply(answer)
    with pytest.raises(ServerError):
        engine(stub).complete("x")


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, openai.BadRequestError), (404, openai.NotFoundError), (500, openai.InternalServerError)],
)
def test_http_errors_are_raised_when_the_call_starts(stub: StubServer, status: int, error: type) -> None:
    stub.reply(Failure(status, message="no such model"))
    with pytest.raises(error, match="no such model"):
        engine(stub).stream("x")
    assert len(stub.completions()) == 1


@pytest.mark.parametrize("status", [429, 503])
def test_rate_limits_and_overload_are_retried(stub: StubServer, status: int) -> None:
    busy = Failure(status, headers={"retry-after-ms": "1"})
    stub.reply(busy, busy, Answer(("ok",)))
    assert engine(stub, max_retries=2).complete("x").text == "ok"
    assert len(stub.completions()) == 3


def test_retries_run_out(stub: StubServer) -> None:
    stub.reply(*[Failure(429, headers={"retry-after-ms": "1"})] * 2)
    with pytest.raises(openai.RateLimitError):
        engine(stub, max_retries=1).stream("x")
    assert len(stub.completions()) == 2


def test_a_server_that_does_not_answer_times_out(stub: StubServer) -> None:
    stub.reply(Answer(stall=3.0))
    with pytest.raises(openai.APITimeoutError):
        engine(stub, timeout=0.2).stream("x")


def test_closing_the_stream_closes_the_http_response(stub: StubServer) -> None:
    stub.reply(Answer(("tok ",) * 5000, pause=0.005))
    stream = engine(stub).stream("x")
    assert next(stream) == "tok " and next(stream) == "tok "
    stream.close()
    assert stub.disconnected.wait(10)
    assert stub.pieces_sent < 5000
    assert stream.stats.finish_reason == "abandoned"


def test_dropping_a_stream_unread_closes_the_http_response(stub: StubServer) -> None:
    stub.reply(Answer(("tok ",) * 5000, pause=0.005))
    stream = engine(stub).stream("x")
    del stream
    gc.collect()
    assert stub.disconnected.wait(10)


# ---------------------------------------------------------------------------- SGLang corpora


def test_sglang_scope_documents_live_in_the_server_for_the_scope(stub: StubServer) -> None:
    server = engine(stub, "sglang")
    with server.scope(["The lighthouse stood on Pharos."]) as scope:
        (corpus_id,) = scope.corpus_ids
        assert stub.corpora == {corpus_id: ["The lighthouse stood on Pharos."]}
        assert server.list_corpora() == {corpus_id: 5}
        scope.add(["It was built by Sostratus."])
        assert len(stub.corpora) == 2
        server.complete("Who built it?", scope=scope)
    assert stub.corpora == {}
    posts = [r.body for r in stub.requests if r.path == "/add_external_corpus"]
    assert posts[0] == {"corpus_id": corpus_id, "documents": ["The lighthouse stood on Pharos."]}


def test_sglang_scope_is_removed_when_the_body_raises(stub: StubServer) -> None:
    server = engine(stub, "sglang")
    with pytest.raises(RuntimeError, match="body failed"), server.scope(["doc"]):
        assert stub.corpora
        raise RuntimeError("body failed")
    assert stub.corpora == {}
    assert [r.path for r in stub.requests].count("/remove_external_corpus") == 1


def test_sglang_call_documents_are_removed_after_the_call(stub: StubServer) -> None:
    server = engine(stub, "sglang")
    stream = server.stream("q", documents=["a passage"])
    assert list(stub.corpora.values()) == [["a passage"]]
    stream.complete()
    assert stub.corpora == {}


@pytest.mark.parametrize("how", ["close", "drop", "http_error", "broken_stream"])
def test_sglang_call_documents_are_removed_on_every_exit(stub: StubServer, how: str) -> None:
    server = engine(stub, "sglang")
    if how == "http_error":
        stub.reply(Failure(500))
        with pytest.raises(openai.InternalServerError):
            server.stream("q", documents=["a passage"])
    elif how == "broken_stream":
        stub.reply(Answer(finish=None))
        with pytest.raises(ServerError):
            server.complete("q", documents=["a passage"])
    else:
        stub.reply(Answer(("tok ",) * 5000, pause=0.005))
        stream = server.stream("q", documents=["a passage"])
        next(stream)
        if how == "close":
            stream.close()
        else:
            del stream
            gc.collect()
    assert stub.corpora == {}


def test_sglang_corpus_failures(stub: StubServer) -> None:
    server = engine(stub, "sglang")
    stub.fail_corpus.add("add_external_corpus")
    with pytest.raises(openai.BadRequestError, match="refused by the stub"):
        server.complete("q", documents=["doc"])
    assert not stub.completions()  # no answer without its corpus
    stub.fail_corpus.clear()
    scope = server.scope(["one"])
    scope.add(["two"])
    stub.fail_corpus.add("remove_external_corpus")
    with pytest.raises(openai.BadRequestError):
        scope.close()
    # Both removals were tried, and the scope is closed whatever the server said.
    assert [r.path for r in stub.requests].count("/remove_external_corpus") == 2
    assert scope.closed


def test_a_corpus_answer_that_is_not_success_is_an_error(stub: StubServer) -> None:
    from rag_lookahead.remote.corpus import SGLangCorpora

    class Client:
        def post(self, url: str, cast_to: Any, body: Any) -> str:
            return json.dumps({"success": False, "message": "no SAM budget"})

    with pytest.raises(CorpusError, match="no SAM budget"):
        SGLangCorpora(Client(), "http://127.0.0.1:1").add(["doc"])


def test_scopes_are_checked(stub: StubServer) -> None:
    server, other = engine(stub, "sglang"), engine(stub, "sglang")
    scope = other.scope(["doc"])
    with pytest.raises(ValueError, match="another engine"):
        server.stream("q", scope=scope)
    scope.close()
    with pytest.raises(ValueError, match="closed"):
        other.stream("q", scope=scope)
    with pytest.raises(RuntimeError, match="closed"):
        scope.add(["more"])


# ---------------------------------------------------------------------------- vLLM documents


def test_vllm_documents_must_be_in_the_prompt(stub: StubServer) -> None:
    server = engine(stub, "vllm")
    messages = [{"role": "user", "content": "Context: the sky is blue.\nQuestion: what colour?"}]
    server.complete(messages, documents=["the sky is blue."])
    with pytest.raises(ValueError, match="append_documents_to_prompt"):
        server.stream(messages, documents=["grass is green."])
    with server.scope(["grass is green."]) as scope, pytest.raises(ValueError, match="not in the prompt"):
        server.stream(messages, scope=scope)
    assert not stub.corpora and len(stub.completions()) == 1
    with pytest.raises(ValueError, match="tokenizer"):
        server.stream([1, 2, 3], documents=["grass"])


def test_vllm_documents_appended_when_asked(stub: StubServer) -> None:
    server = engine(stub, "vllm", append_documents_to_prompt=True)
    server.complete([*CHAT, {"role": "assistant", "content": "?"}], documents=["Doc A", "Who won?"])
    messages = last_body(stub)["messages"]
    assert messages[1]["content"] == "Who won?\n\nDoc A"  # the last user message; shown ones not again
    assert messages[2] == {"role": "assistant", "content": "?"}
    server.complete("Question", documents=["Doc B"])
    assert last_body(stub)["prompt"] == "Question\n\nDoc B"


def test_token_id_prompts_use_the_tokenizer(stub: StubServer) -> None:
    tokenizer = tiny_engine().tokenizer
    server = engine(stub, "vllm", append_documents_to_prompt=True, tokenizer=tokenizer)
    ids = tokenizer("the sky is blue", add_special_tokens=False).input_ids
    server.complete(ids, documents=["sky"])
    assert last_body(stub)["prompt"] == ids
    server.complete(ids, documents=["grass"])
    assert last_body(stub)["prompt"][: len(ids)] == ids
    assert len(last_body(stub)["prompt"]) > len(ids)


# ---------------------------------------------------------------------------- surface


def test_both_engines_have_the_engine_surface(stub: StubServer) -> None:
    server = engine(stub, "sglang", context_window=2048)
    assert isinstance(server, Engine) and isinstance(tiny_engine(), Engine)
    assert (server.model_name, server.context_window, server.chat) == ("served-model", 2048, True)
    assert server.drafts_from_documents and not engine(stub, "vllm").drafts_from_documents
    assert tiny_engine().supports_plain and not server.supports_plain  # asked before plain()
    with pytest.raises(ValueError, match="second server"):
        server.plain()


def test_speculation_counters(stub: StubServer) -> None:
    stub.metrics_text = (
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 50.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 5.0\n'
    )
    counters = engine(stub, "vllm").speculation_counters()
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (10, 50, 25)
    assert counters.acceptance_rate == 0.5 and counters.tokens_per_step == 3.5
    assert (counters - counters).drafts == 0
    assert parse_speculation_counters("vllm:spec_decode_num_drafts_total 4\ngarbage {\n").drafts == 4
    with pytest.raises(ValueError, match="vLLM"):
        engine(stub, "sglang").speculation_counters()
    with pytest.raises(ValueError, match="SGLang"):
        engine(stub, "vllm").list_corpora()


def test_server_commands() -> None:
    vllm = server_command("vllm", "/models/m", port=8001, python="/venv/bin/python")
    assert vllm[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] > 0
    assert "--speculative-config" not in server_command("vllm", "/m", speculative=False)
    sglang = server_command("sglang", "/models/m")
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "NGRAM"
    assert int(sglang[sglang.index("--speculative-ngram-external-sam-budget") + 1]) > 0
    with pytest.raises(ValueError, match="backend"):
        server_command("tgi", "/m")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- hostile input

BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"base_url": "localhost:8000"}, "base_url"),
    ({"base_url": "ftp://host/v1"}, "base_url"),
    ({"base_url": "http:///v1"}, "base_url"),
    ({"base_url": ""}, "base_url"),
    ({"base_url": None}, "base_url"),
    ({"model": ""}, "model"),
    ({"model": "  "}, "model"),
    ({"model": 3}, "model"),
    ({"kind": "tgi"}, "kind"),
    ({"kind": "VLLM"}, "kind"),
    ({"api_key": ""}, "api_key"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": -1.0}, "timeout"),
    ({"timeout": math.nan}, "timeout"),
    ({"timeout": math.inf}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"timeout": "10"}, "timeout"),
    ({"deadline": 0}, "deadline"),
    ({"deadline": -1.0}, "deadline"),
    ({"deadline": math.nan}, "deadline"),
    ({"deadline": math.inf}, "deadline"),
    ({"deadline": True}, "deadline"),
    ({"deadline": "10"}, "deadline"),
    ({"max_retries": -1}, "max_retries"),
    ({"max_retries": 1.5}, "max_retries"),
    ({"max_retries": True}, "max_retries"),
    ({"max_retries": 10_000}, "max_retries"),
    ({"append_documents_to_prompt": "yes"}, "append_documents_to_prompt"),
    ({"context_window": 0}, "context_window"),
    ({"context_window": 2.5}, "context_window"),
]


@pytest.mark.parametrize(("change", "field"), BAD_CONFIGS)
def test_bad_server_settings_are_refused(change: dict[str, Any], field: str) -> None:
    settings = {"base_url": "http://127.0.0.1:8000/v1", "model": "m", **change}
    with pytest.raises(ValueError, match=field):
        ServerConfig(**settings)


def test_server_config_normalises_and_hides_the_key() -> None:
    config = ServerConfig("http://127.0.0.1:8000/v1/", "m", api_key="s3cret")
    assert config.base_url == "http://127.0.0.1:8000/v1" and config.root_url == "http://127.0.0.1:8000"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("prompt", "error"),
    [
        ("", ValueError),
        ([], ValueError),
        ([1, -2], ValueError),
        (3.5, TypeError),
        ([{"role": "user"}], TypeError),
    ],
)
def test_bad_prompts_are_refused_before_any_request(stub: StubServer, prompt: Any, error: type) -> None:
    with pytest.raises(error):
        engine(stub).stream(prompt)
    assert not stub.requests


def test_serve_prints_or_launches(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_lookahead import cli
    from rag_lookahead.cli import serve

    assert cli.main(["serve", "--backend", "vllm", "--model", "/models/m", "--port", "8123"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("python -m vllm.entrypoints.openai.api_server --model /models/m")
    assert "--port 8123" in printed[0] and "ngram" in printed[0]
    assert "ServerEngine(base_url='http://127.0.0.1:8123/v1'" in printed[1]

    launched: list[list[str]] = []

    class Done:
        returncode = 3

    monkeypatch.setattr(serve.subprocess, "run", lambda command, check: launched.append(command) or Done())
    argv = ["serve", "--backend", "sglang", "--model", "/m", "--launch", "--python", "/venv/bin/python"]
    assert cli.main(argv) == 3
    assert launched == [server_command("sglang", "/m", python="/venv/bin/python")]
    with pytest.raises(SystemExit):
        cli.main(["serve", "--backend", "tgi", "--model", "/m"])


# ---------------------------------------------------------------------------- hostile servers
# A server that ignores what the request asked for, or breaks the stream: the answer is cut where
# the request said it ends, or the call fails with an error naming the server. After each, the
# engine still answers.


class VocabTokenizer:
    """Only what the engine reads of a tokenizer to bound a call's text: its vocabulary."""

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "Ġhello": 1, "xyz": 2}


def event(*choices: dict[str, Any]) -> str:
    chunk = {"id": "e", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return "data: " + json.dumps({**chunk, "choices": list(choices)}) + "\n\n"


def said(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": {"content": text}, "finish_reason": finish}


THIRTY_MB = Answer(("x" * 1000,) * 30_000)
KEEP_ALIVE = Events((": keep-alive\n\n",) * 2000, pause=0.005)  # 10 s at most, cut long before

# (case, what the server sends, engine settings, call settings, the text or the error, the
# finish reason or words of the error's message)
HOSTILE_SERVERS: list[tuple[str, Answer | Events, dict[str, Any], dict[str, Any], Any, str]] = [
    ("30 MB for 5 tokens", THIRTY_MB, {}, {"max_new_tokens": 5}, "x" * 5 * 1024, "length"),
    # The longest entry, "Ġhello", is 6 characters: 7 with a space between tokens.
    (
        "30 MB, tokenizer known",
        THIRTY_MB,
        {"tokenizer": VocabTokenizer()},
        {"max_new_tokens": 5},
        "x" * 35,
        "length",
    ),
    (
        "a stop string ignored",
        Answer(("Hello, wor", "ld###and more", " leaked"), finish="length"),
        {},
        {"stop_strings": ["###"]},
        "Hello, world",
        "stop_string",
    ),
    (
        "a stop string over three chunks",
        Answer(("ab#", "#", "#cd")),
        {},
        {"stop_strings": "###"},
        "ab",
        "stop_string",
    ),
    (
        "the earliest of two stop strings",
        Answer(("one<END>two\n\n",)),
        {},
        {"stop_strings": ["\n\n", "<END>"]},
        "one",
        "stop_string",
    ),
    ("a held prefix that is no stop", Answer(("a#", "#b")), {}, {"stop_strings": "###"}, "a##b", "eos"),
    ("a stop's prefix at the end", Answer(("a", "##")), {}, {"stop_strings": "###"}, "a##", "eos"),
    (
        "a stop past the budget",
        Answer(("x" * 5000 + "###",)),
        {},
        {"max_new_tokens": 2, "stop_strings": "###"},
        "x" * 2048,
        "length",
    ),
    ("keep-alive comments only", KEEP_ALIVE, {"deadline": 0.2}, {}, ServerTimeout, "deadline of 0.2 s"),
    (
        "text past the deadline",
        Answer(("tok ",) * 2000, pause=0.005),
        {"deadline": 0.2},
        {},
        ServerTimeout,
        "deadline",
    ),
    ("no answer by the deadline", Answer(stall=3.0), {"deadline": 0.2}, {}, ServerTimeout, "deadline"),
    (
        "a malformed event",
        Events(('data: {"choices": [\n\n',)),
        {},
        {},
        ServerError,
        "malformed server-sent event",
    ),
    (
        "text that is not a string",
        Events((event({"index": 0, "delta": {"content": 5}}),)),
        {},
        {},
        ServerError,
        "not a string",
    ),
    (
        "two choices in one chunk",
        Events(
            (
                event(said(0, "A"), said(1, "B")),
                event(said(1, "D", "length"), said(0, "C", "stop")),
                "data: [DONE]\n\n",
            )
        ),
        {},
        {},
        "AC",
        "eos",
    ),
    ("no finish", Answer(finish=None), {}, {}, ServerError, "ended the stream before"),
]


@pytest.mark.parametrize(
    ("case", "reply", "settings", "call", "expected", "words"),
    HOSTILE_SERVERS,
    ids=[c[0] for c in HOSTILE_SERVERS],
)
def test_a_hostile_server_is_cut_or_named(
    stub: StubServer, case, reply, settings, call, expected, words
) -> None:
    server = engine(stub, **settings)
    stub.reply(reply)
    if isinstance(expected, str):
        completion = server.complete(CHAT, **call)
        assert completion.text == expected
        assert completion.stats.finish_reason == words
        assert completion.stats.new_tokens <= call.get("max_new_tokens", GenerationParams().max_new_tokens)
    else:
        with pytest.raises(expected) as raised:
            server.complete(CHAT, **call)
        assert words in str(raised.value) and stub.base_url in str(raised.value), str(raised.value)
    assert server.complete(CHAT).text == "Hello, world"  # and the engine still answers


def test_text_past_the_budget_is_not_read(stub: StubServer) -> None:
    stub.reply(THIRTY_MB)
    stream = engine(stub).stream(CHAT, max_new_tokens=5)
    assert all(len(text) <= 1000 for text in stream)
    assert stub.disconnected.wait(10)
    assert stub.pieces_sent < 30_000


def test_text_is_held_back_only_while_it_could_begin_a_stop(stub: StubServer) -> None:
    stub.reply(Answer(("ab#", "#", "c#", "d###e")))
    assert list(engine(stub).stream(CHAT, stop_strings="###")) == ["ab", "##c", "#d"]


def test_a_deadline_ends_a_stream_of_keep_alive_comments(stub: StubServer) -> None:
    stub.reply(KEEP_ALIVE)
    stream = engine(stub, deadline=0.2).stream(CHAT)
    with pytest.raises(ServerTimeout) as raised:
        stream.complete()
    assert isinstance(raised.value, TimeoutError)
    assert stub.disconnected.wait(10) and stub.pieces_sent < 2000
    assert stream.stats.finish_reason == "abandoned"


def test_a_failed_removal_keeps_the_answer_and_is_retried(stub: StubServer) -> None:
    server = engine(stub, "sglang")
    stub.fail_corpus.add("remove_external_corpus")
    with pytest.warns(CorpusWarning, match="the answer stands"):
        assert server.complete("q", documents=["a passage"]).text == "Hello, world"
    with pytest.warns(CorpusWarning), server.scope(["doc"]) as scope:
        assert server.complete("q", scope=scope).text == "Hello, world"
    assert len(stub.corpora) == 2
    stub.fail_corpus.clear()
    with server.scope(["another"]):
        pass
    assert stub.corpora == {}  # both retried when the next scope closed


def test_a_failed_removal_from_a_dropped_stream_is_no_unraisable_error(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    server = engine(stub, "sglang")
    stub.reply(Answer(("tok ",) * 5000, pause=0.005))
    stub.fail_corpus.add("remove_external_corpus")
    stream = server.stream("q", documents=["a passage"])
    next(stream)
    with pytest.warns(CorpusWarning):
        del stream
        gc.collect()
    assert not unraisable
    stub.fail_corpus.clear()
    server.complete("q")
    assert stub.corpora == {}  # retried when the next call ended
