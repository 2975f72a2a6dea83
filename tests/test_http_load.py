"""A bounded load test of the local server: `REQUESTS` requests from `CLIENTS` client threads
with random (seeded) arrivals against one server on 127.0.0.1, a third of them misbehaving.

The misbehaving ones disconnect mid-stream, send a schema the grammar library refuses, a body
over the limit, a wrong API key, or a grammar that dead-ends while generating; or, over a raw
socket, send their headers or their body a byte at a time (cut off by the read timeouts), or
leave mid-body (quietly: no error is logged). Every good
request's answer (greedy or seeded-sampled, chat or completion, streamed or not, with
documents or not) is its solo answer, computed in process beforehand; every bad one gets its
own error; every stream its client left ended as abandoned; afterwards the server is alive
and holds no request, call or trie branch; and its memory after the load is what it was after
a warm-up round of the same mix: the Python heap (tracemalloc) within a few hundred KiB, the
resident set (native memory: tensors, caches) within a generous bound.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import random
import select
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from rag_lookahead import LookaheadEngine
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.testing.local_server import (
    DEAD_END_FORMAT,
    WAIT_S,
    LiveServer,
    leftovers,
    logged_errors,
    served_engine,
    wait_until,
)

REQUESTS = 200
WARM_UP = 48  # requests of the same mix before the memory baseline
CLIENTS = 16
SEED = 2024
MEAN_GAP_S = 0.01  # a client's mean pause before each request (exponential: random arrivals)
MAX_TOKENS = 16
LONG = 400  # a stream its client leaves: far from its end when the client goes
MODEL = "tiny"
KEY = "load-key"
MAX_BODY = 8 << 10
# How much more memory the server may hold after the load than after the warm-up. Keeping one
# finished stream per request grows the Python heap by about twice HEAP_SLACK_BYTES; the
# resident set also moves with the allocator's fragmentation, hence its looser bound.
HEAP_SLACK_BYTES = 512 << 10
RSS_SLACK_BYTES = 128 << 20

PROMPTS = [f"Question {i}: who were the Normans, and where did they live?" for i in range(4)]
DOCUMENTS = ("The Normans were the people who gave their name to Normandy, a region in France.",)
REFUSED_SCHEMA = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}}
BAD = (
    *("disconnect", "refused_schema", "oversized", "wrong_key", "dead_end"),
    *("slow_headers", "slow_body", "mid_body"),
)
READ_TIMEOUT_S = 2.0  # the server's header and body timeouts
DRIP_GAP_S = 0.05  # between a slow client's bytes: its request would take far longer
RAW = ("slow_headers", "slow_body", "mid_body")


@dataclass(frozen=True)
class Ask:
    """One request of the load: a good one (``bad is None``) or a misbehaving one."""

    chat: bool
    prompt: int
    stream: bool
    sampled: bool
    documents: bool
    pause_s: float
    bad: str | None = None

    def solo_key(self) -> tuple[bool, int, bool, bool]:
        return (self.chat, self.prompt, self.sampled, self.documents)


def schedule(count: int, rng: random.Random) -> list[Ask]:
    """``count`` requests, every third a misbehaving one, in a random order."""
    asks = []
    for i in range(count):
        ask = Ask(
            chat=rng.random() < 0.6,
            prompt=rng.randrange(len(PROMPTS)),
            stream=rng.random() < 0.5,
            sampled=rng.random() < 0.4,
            documents=rng.random() < 0.3,
            pause_s=rng.expovariate(1 / MEAN_GAP_S),
            bad=BAD[rng.randrange(len(BAD))] if i % 3 == 2 else None,
        )
        asks.append(ask)
    rng.shuffle(asks)
    return asks


def sampling(ask: Ask) -> dict[str, Any]:
    # One seed per prompt: the same request always samples the same answer.
    return {"do_sample": True, "temperature": 0.8, "seed": 100 + ask.prompt} if ask.sampled else {}


def solo(engine: LookaheadEngine, ask: Ask) -> str:
    """The request's answer in process, alone."""
    prompt: Any = [{"role": "user", "content": PROMPTS[ask.prompt]}] if ask.chat else PROMPTS[ask.prompt]
    documents = list(DOCUMENTS) if ask.documents else []
    return engine.complete(prompt, max_new_tokens=MAX_TOKENS, documents=documents, **sampling(ask)).text


def body(ask: Ask) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": ask.stream}
    if ask.chat:
        out["messages"] = [{"role": "user", "content": PROMPTS[ask.prompt]}]
    else:
        out["prompt"] = PROMPTS[ask.prompt]
    if ask.sampled:
        out |= {"temperature": 0.8, "seed": sampling(ask)["seed"]}
    else:
        out["temperature"] = 0
    if ask.documents:
        out["documents"] = list(DOCUMENTS)
    return out


# ---------------------------------------------------------------------------- a client


@dataclass
class Outcome:
    """What a request got: its status, its text, and an error message if one came."""

    status: int
    text: str = ""
    error: str | None = None


def send(http: httpx.Client, ask: Ask) -> Outcome:
    path = "/v1/chat/completions" if ask.chat else "/v1/completions"
    payload = body(ask)
    headers = {"Authorization": f"Bearer {KEY}"}
    if ask.bad == "disconnect":
        return leave_mid_stream(http, path, {**payload, "stream": True, "max_tokens": LONG}, headers)
    if ask.bad in RAW:
        return send_raw(http.base_url, path, payload, ask.bad)
    if ask.bad == "refused_schema":
        payload["response_format"] = REFUSED_SCHEMA
    elif ask.bad == "oversized":
        payload["documents"] = ["x" * MAX_BODY]
    elif ask.bad == "wrong_key":
        headers = {"Authorization": "Bearer not-the-key"}
    elif ask.bad == "dead_end":
        payload["response_format"] = DEAD_END_FORMAT
    if not payload["stream"]:
        response = http.post(path, json=payload, headers=headers)
        if response.status_code != 200:
            return Outcome(response.status_code, error=response.json()["error"]["message"])
        choice = response.json()["choices"][0]
        return Outcome(200, choice["message"]["content"] if ask.chat else choice["text"])
    with http.stream("POST", path, json=payload, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            return Outcome(response.status_code, error=response.json()["error"]["message"])
        return read_events(response, ask.chat)


def read_events(response: httpx.Response, chat: bool) -> Outcome:
    outcome = Outcome(200)
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        if "error" in event:
            outcome.error = event["error"]["message"]
        elif event["choices"]:
            choice = event["choices"][0]
            outcome.text += (choice["delta"].get("content") or "") if chat else choice["text"]
    return outcome


def leave_mid_stream(
    http: httpx.Client, path: str, payload: dict[str, Any], headers: dict[str, str]
) -> Outcome:
    """Read the first piece of a long stream, then leave: the connection closes under it."""
    with http.stream("POST", path, json=payload, headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and '"role"' not in line:
                return Outcome(200, error="left")
    return Outcome(200)  # it ended before a piece came: nothing to leave


def send_raw(base: httpx.URL, path: str, payload: dict[str, Any], bad: str) -> Outcome:
    """A slow or broken client over a raw socket: what came back before the server closed."""
    body = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {base.host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    with socket.create_connection((base.host, base.port or 80), timeout=WAIT_S) as sock:
        if bad == "mid_body":
            sock.sendall(head + b"\r\n" + body[: len(body) // 2])
            return Outcome(0, error="left")
        sent, dripped = (b"", head) if bad == "slow_headers" else (head + b"\r\n", body)
        sock.sendall(sent)
        for byte in dripped:
            if select.select([sock], [], [], DRIP_GAP_S)[0]:
                break  # answered, or closed
            sock.sendall(bytes([byte]))
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    if not received:
        return Outcome(0, error="closed")
    status = int(received.split(b" ", 2)[1])
    return Outcome(status, error=json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]["message"])


def run_load(url: str, asks: list[Ask]) -> list[Outcome | BaseException]:
    """``asks`` sent by `CLIENTS` threads, each taking the next one, pausing, then sending it."""
    outcomes: list[Outcome | BaseException | None] = [None] * len(asks)
    order = iter(range(len(asks)))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            while True:
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                time.sleep(asks[i].pause_s)
                try:
                    outcomes[i] = send(http, asks[i])
                except Exception as err:  # reported with its request below
                    outcomes[i] = err

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not any(thread.is_alive() for thread in threads), "a client never finished"
    assert all(outcome is not None for outcome in outcomes)
    return outcomes  # type: ignore[return-value]


# ---------------------------------------------------------------------------- checks


EXPECTED_STATUS = {"refused_schema": 400, "oversized": 413, "wrong_key": 401, "slow_body": 408}


def check(asks: list[Ask], outcomes: list[Outcome | BaseException], answers: dict[Any, str]) -> None:
    for ask, outcome in zip(asks, outcomes, strict=True):
        assert isinstance(outcome, Outcome), (ask, outcome)
        if ask.bad is None:
            assert (outcome.status, outcome.error) == (200, None), (ask, outcome)
            assert outcome.text == answers[ask.solo_key()], ask
        elif ask.bad in EXPECTED_STATUS:
            assert outcome.status == EXPECTED_STATUS[ask.bad] and outcome.error, (ask, outcome)
        elif ask.bad == "dead_end":
            assert outcome.status == (200 if ask.stream else 500), (ask, outcome)
            assert outcome.error is not None and "dead end" in outcome.error, (ask, outcome)
        elif ask.bad in ("slow_headers", "mid_body"):
            assert outcome.status == 0, (ask, outcome)  # the connection closed with no answer
        else:
            assert outcome.status == 200, (ask, outcome)


def memory() -> tuple[int, int]:
    """What the Python heap allocated since `tracemalloc.start` and still holds, and the
    resident set without tracemalloc's own records, in bytes."""
    gc.collect()
    with open("/proc/self/statm") as statm:  # Linux: resident pages are the second field
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return tracemalloc.get_traced_memory()[0], resident - tracemalloc.get_tracemalloc_memory()


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S).text
    values = [line.split(" ")[1] for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(values[0])


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    # Running and waiting slots for every client: a good request is never refused (429).
    settings = ServeSettings(
        model_name=MODEL,
        api_key=KEY,
        max_body_bytes=MAX_BODY,
        max_running=8,
        max_waiting=CLIENTS,
        header_timeout_s=READ_TIMEOUT_S,
        body_timeout_s=READ_TIMEOUT_S,
    )
    server = LiveServer(create_app(engine, settings))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ended(live: LiveServer) -> list[str | None]:
    """Each call's finish reason, as the server counts the call in its metrics once it ended."""
    reasons: list[str | None] = []
    metrics = live.app.state.lookahead.metrics
    record = metrics.record

    def recording(stats: DecodeStats) -> None:
        reasons.append(stats.finish_reason)
        record(stats)

    metrics.record = recording
    return reasons


@pytest.fixture
def errors_logged() -> Iterator[list[logging.LogRecord]]:
    """What the server logs at ERROR meanwhile (uvicorn's "Exception in ASGI application")."""
    with logged_errors() as records:
        yield records


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_load_with_misbehaving_clients(
    live: LiveServer, engine: LookaheadEngine, ended: list[str | None], errors_logged: list[logging.LogRecord]
) -> None:
    rng = random.Random(SEED)
    warm_up, load = schedule(WARM_UP, rng), schedule(REQUESTS, rng)
    answers = {ask.solo_key(): solo(engine, ask) for ask in warm_up + load if ask.bad is None}
    state = live.app.state.lookahead

    check(warm_up, run_load(live.url, warm_up), answers)
    wait_until(lambda: not leftovers(state))
    tracemalloc.start()  # after the warm-up: the heap counted is what the load left allocated
    try:
        heap, resident = memory()
        outcomes = run_load(live.url, load)
        check(load, outcomes, answers)
        wait_until(lambda: not leftovers(state))
        del outcomes
        heap_after, resident_after = memory()
    finally:
        tracemalloc.stop()
    assert {ask.bad for ask in load} == {*BAD, None}  # every kind of misbehaviour was in it
    # A client that left ended its call at the next step, and nothing stayed behind.
    # (a call that fails, a dead end, ends as abandoned too; the refused never reach the engine)
    called = [ask for ask in warm_up + load if ask.bad in (None, "disconnect", "dead_end")]
    assert len(ended) == len(called)
    assert ended.count("abandoned") == sum(ask.bad is not None for ask in called)
    assert metric(live.url, "rag_lookahead_requests_running") == 0
    assert metric(live.url, "rag_lookahead_requests_waiting") == 0
    assert httpx.get(f"{live.url}/health", timeout=WAIT_S).json() == {"status": "ok"}
    assert not errors_logged, [record.getMessage() for record in errors_logged]
    assert heap_after - heap < HEAP_SLACK_BYTES, f"the Python heap grew by {(heap_after - heap) >> 10} KiB"
    grown = (resident_after - resident) >> 20
    assert resident_after - resident < RSS_SLACK_BYTES, f"the resident set grew by {grown} MiB"
    with httpx.Client(base_url=live.url, timeout=WAIT_S) as http:  # and it still answers
        last = next(ask for ask in load if ask.bad is None)
        assert send(http, last).text == answers[last.solo_key()]
