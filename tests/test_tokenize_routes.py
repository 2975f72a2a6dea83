"""vLLM's ``/tokenize``, ``/detokenize`` and ``/version`` on the local server.

A text or chat comes back as the ids a call reads, and those ids back as the text; the routes
take the API key as ``/v1`` does (``/version`` none, as ``/health``); hostile requests get a
400 naming their field.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rag_lookahead import LookaheadEngine, __version__
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing.local_server import error_of, served_engine

MODEL = "tiny"
KEY = "test-key"
TEXT = "The Normans gave their name to Normandy."
MESSAGES = [{"role": "user", "content": "Who were the Normans?"}]


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


def send(engine: LookaheadEngine, path: str, body: Any = None, key: str | None = KEY) -> httpx.Response:
    app = create_app(engine, ServeSettings(model_name=MODEL, api_key=KEY))
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=headers
        ) as http:
            if body is None:
                return await http.get(path)
            return await http.post(path, json=body)

    return asyncio.run(run())


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def test_a_text_round_trips(engine: LookaheadEngine) -> None:
    tokenized = ok(send(engine, "/tokenize", {"model": MODEL, "prompt": TEXT}))
    assert tokenized["tokens"] == engine.encode(TEXT)  # as a completion reads it
    assert (tokenized["count"], tokenized["max_model_len"]) == (
        len(tokenized["tokens"]),
        engine.context_window,
    )
    assert tokenized["token_strs"] is None
    assert ok(send(engine, "/detokenize", {"model": MODEL, "tokens": tokenized["tokens"]})) == {
        "prompt": TEXT
    }


def test_token_strings_and_special_tokens(engine: LookaheadEngine) -> None:
    body = {"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True}
    tokenized = ok(send(engine, "/tokenize", body))
    assert tokenized["tokens"] == list(engine.tokenizer(TEXT, add_special_tokens=False).input_ids)
    assert tokenized["token_strs"] == engine.tokenizer.convert_ids_to_tokens(tokenized["tokens"])


def test_messages_are_read_as_a_chat_call_reads_them(engine: LookaheadEngine) -> None:
    tokenized = ok(send(engine, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": True}))
    assert tokenized["tokens"] == engine.encode(MESSAGES)
    text = ok(send(engine, "/detokenize", {"tokens": tokenized["tokens"]}))["prompt"]
    assert "Who were the Normans?" in text


def test_version_needs_no_key(engine: LookaheadEngine) -> None:
    assert ok(send(engine, "/version", key=None)) == {
        "version": __version__,
        "backend": engine.backend.as_dict(),  # what the forwards run on
    }
    assert send(engine, "/tokenize", {"prompt": TEXT}, key=None).status_code == 401
    assert send(engine, "/detokenize", {"tokens": [1]}, key="wrong").status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": TEXT, "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": ["a"]}, "prompt"),
        ("/tokenize", {"prompt": TEXT, "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"prompt": TEXT, "tools": []}, "tools"),
        ("/tokenize", {"prompt": TEXT, "truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
        ("/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}, "add_generation_prompt"),
        ("/tokenize", {"messages": MESSAGES, "add_special_tokens": True}, "add_special_tokens"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/tokenize", {"prompt": TEXT, "model": 3}, "model"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": [1, True]}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [10**6]}, "tokens"),
        ("/detokenize", {"tokens": [1], "prompt": "x"}, "prompt"),
    ],
)
def test_hostile_requests(engine: LookaheadEngine, path: str, body: dict[str, Any], param: str) -> None:
    assert error_of(send(engine, path, body), 400)["param"] == param


def test_another_model_is_not_found(engine: LookaheadEngine) -> None:
    assert error_of(send(engine, "/tokenize", {"model": "other", "prompt": TEXT}), 404)["param"] == "model"
    assert error_of(send(engine, "/tokenize", ["x"]), 400)["message"]
