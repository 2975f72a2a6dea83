"""instructor (unmodified) against the local server on 127.0.0.1: a pydantic object from a
forced tool call (``Mode.TOOLS``) and from a JSON schema response format
(``Mode.JSON_SCHEMA``), each the in-process engine's greedy answer to the request instructor
sent (recorded off the wire), in one request (no re-ask). (instructor's objects carry the raw
reply besides: their fields are compared.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest

instructor = pytest.importorskip("instructor", reason="instructor is installed by `make test-clients`")

import openai  # noqa: E402
from client_support import MODEL, in_process  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from rag_lookahead import LookaheadEngine  # noqa: E402
from rag_lookahead.testing.local_server import LiveServer  # noqa: E402

MESSAGES = [{"role": "user", "content": "Pick a pair and a number."}]
N = 120  # a forced call or an object of the tiny models closes within it


class Answer(BaseModel):
    """A pair and a small number."""

    model_config = ConfigDict(extra="forbid")
    pair: Literal["xy", "zw"]
    number: int = Field(ge=0, le=99)


@pytest.fixture
def sent() -> list[dict[str, Any]]:
    """The bodies of the requests the client sends, in order."""
    return []


@pytest.fixture
def http(sent: list[dict[str, Any]]) -> Iterator[httpx.Client]:
    def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    with httpx.Client(event_hooks={"request": [record]}) as client:
        yield client


def patched(live: LiveServer, http: httpx.Client, mode: Any) -> Any:
    client = openai.OpenAI(base_url=live.base_url, api_key="none", max_retries=0, http_client=http)
    return instructor.from_openai(client, mode=mode)


def test_tools_mode(
    tool_live: LiveServer, tool_engine: LookaheadEngine, http: httpx.Client, sent: list[dict[str, Any]]
) -> None:
    client = patched(tool_live, http, instructor.Mode.TOOLS)
    answer = client.chat.completions.create(
        model=MODEL, response_model=Answer, messages=MESSAGES, max_tokens=N, temperature=0, max_retries=1
    )
    (body,) = sent
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Answer"}}
    (call,) = in_process(tool_engine, body["messages"], N, tools=body["tools"], tool_choice="Answer").calls
    assert answer.model_dump() == Answer.model_validate(dict(call.arguments)).model_dump()


def test_json_schema_mode(
    live: LiveServer, engine: LookaheadEngine, http: httpx.Client, sent: list[dict[str, Any]]
) -> None:
    client = patched(live, http, instructor.Mode.JSON_SCHEMA)
    answer = client.chat.completions.create(
        model=MODEL, response_model=Answer, messages=MESSAGES, max_tokens=N, temperature=0, max_retries=1
    )
    (body,) = sent
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    expected = in_process(engine, body["messages"], N, schema=schema)
    assert answer.model_dump() == Answer.model_validate_json(expected.content).model_dump()
