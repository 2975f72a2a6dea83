"""What a replica of the server serves (`rag_lookahead.serve.replica`), in process and without
Ray: its answers name it, corpus routes are refused in OpenAI's error shape, its loading
options are checked where they are made. The replicas themselves, under Ray Serve, are
tested by ``make test-ray`` (tests_ray/)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx
import pytest

from rag_lookahead import LookaheadConfig
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.serve.replica import CORPORA_REFUSED, REPLICA_HEADER, EngineLoad, replica_app
from rag_lookahead.testing import tiny_engine

MODEL = "tiny"


def replica(name: str = "replica-1") -> Any:
    return replica_app(create_app(tiny_engine(), ServeSettings(model_name=MODEL)), name)


async def request(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.request(method, path, **kwargs)


def test_every_answer_names_the_replica() -> None:
    app = replica()
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "documents": ["Hi there"]}
    for method, path, kwargs in [
        ("POST", "/v1/completions", {"json": body}),
        ("GET", "/health", {}),
        ("GET", "/v1/models/other", {}),  # an error too
    ]:
        response = asyncio.run(request(app, method, path, **kwargs))
        assert response.headers[REPLICA_HEADER] == "replica-1", (path, response.status_code)
    assert asyncio.run(request(app, "GET", "/v1/models/other")).status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/corpora"), ("GET", "/v1/corpora"), ("DELETE", "/v1/corpora/corpus-1")],
)
def test_corpora_are_refused_on_a_replica(method: str, path: str) -> None:
    response = asyncio.run(request(replica(), method, path, json={"documents": ["a"]}))
    assert response.status_code == 501
    assert response.json()["error"] == {
        "message": CORPORA_REFUSED,
        "type": "invalid_request_error",
        "code": "corpora_unavailable",
        "param": None,
    }
    assert response.headers[REPLICA_HEADER] == "replica-1"


def test_a_route_that_only_starts_alike_is_not_refused() -> None:
    response = asyncio.run(request(replica(), "GET", "/v1/corporations"))
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        ({"model": ""}, ValueError, "model must be a non-empty string"),
        ({"model": 3}, ValueError, "model must be"),
        ({"device": " "}, ValueError, "device must be"),
        ({"dtype": ["bfloat16"]}, ValueError, "dtype must be"),
        ({"config": {"mode": "trie"}}, TypeError, "config must be a LookaheadConfig"),
    ],
)
def test_loading_options_are_checked(fields: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        EngineLoad(**fields)


def test_loading_options_say_where_the_engine_runs() -> None:
    assert EngineLoad(device="cuda:1").on_gpu and not EngineLoad().on_gpu
    assert not EngineLoad(device="cpu", config=LookaheadConfig(mode="trie")).on_gpu


@pytest.mark.parametrize("name", ["", "a\nb", 7])
def test_a_replica_name_that_is_no_header_value_is_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="replica must be"):
        replica_app(create_app(tiny_engine()), name)


def test_serve_ray_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from rag_lookahead import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # as where the ray extra is not installed
    monkeypatch.delitem(sys.modules, "rag_lookahead.serve.ray_serve", raising=False)
    assert cli.main(["serve", "--backend", "ray", "--replicas", "2"]) == 2
    assert "pip install 'rag-lookahead[ray,serve]'" in capsys.readouterr().err
