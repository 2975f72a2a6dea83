"""The FastAPI app: OpenAI's chat, completion and (stateless) Responses routes over one
engine, corpora, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from rag_lookahead.interface import Engine
from rag_lookahead.protocol import CallPlan, ReplyHeader, plan_chat, plan_completion
from rag_lookahead.protocol.responses import plan_response, response_header
from rag_lookahead.rag.embedding import Embedder
from rag_lookahead.serve.admission import Admission
from rag_lookahead.serve.bodies import BodyDeadline, json_body
from rag_lookahead.serve.calls import Caller, OpenAIShape, ReplyShape
from rag_lookahead.serve.corpora import Corpora
from rag_lookahead.serve.corpus_routes import corpus_routes
from rag_lookahead.serve.echo import echo_reply
from rag_lookahead.serve.embeddings import Embeddings
from rag_lookahead.serve.errors import CLIENT_CLOSED, ApiError, install_handlers
from rag_lookahead.serve.metrics import ServerMetrics
from rag_lookahead.serve.readiness import measure_ahead
from rag_lookahead.serve.responses import ResponsesShape
from rag_lookahead.serve.settings import ServeSettings
from rag_lookahead.serve.utility import engine_backend, utility_routes, version_route

__all__ = ["ServerState", "create_app"]

_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# How often unused corpora are looked for, as a share of their TTL (and its bounds, in seconds):
# a corpus outlives its TTL by at most this much. Each corpus route also looks first.
_SWEEP_SHARE, _SWEEP_MIN_S, _SWEEP_MAX_S = 0.25, 0.05, 30.0
T = TypeVar("T")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerState:
    """What an app serves with, at ``app.state.lookahead``."""

    engine: Engine
    settings: ServeSettings
    model_name: str
    admission: Admission
    metrics: ServerMetrics
    corpora: Corpora
    caller: Caller
    created: int
    embeddings: Embeddings


def create_app(
    engine: Engine, settings: ServeSettings | None = None, *, embedder: Embedder | None = None
) -> FastAPI:
    """An OpenAI-compatible app serving ``engine``: ``GET /v1/models``, ``POST
    /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, the corpus
    routes (``/v1/corpora``), ``GET /metrics`` and ``GET /health``. Its startup (before a
    server listens) measures what the engine's first call would (`measure_ahead`), as `ask`,
    `chat` and `demo` do. ``POST /v1/embeddings`` embeds with ``embedder`` (one already loaded,
    a `DocumentIndex`'s say), else with the model ``settings.embedder`` names (see
    `rag_lookahead.serve.embeddings`); vLLM's ``/tokenize``, ``/detokenize`` and ``/version``
    are served too."""
    settings = settings or ServeSettings()
    state = _state(engine, settings, embedder)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Before the server listens (uvicorn, Ray Serve): no request pays for it.
        await anyio.to_thread.run_sync(measure_ahead, engine)
        _log.info("rag-lookahead: serving on %s", engine_backend(engine) or "a remote engine")
        sweeper = asyncio.create_task(_sweep_forever(state.corpora))
        try:
            yield
        finally:
            state.admission.close()  # requests arriving while the server stops are told so (503)
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            state.corpora.close()  # the engine may outlive the app: its trie is left clean
            state.embeddings.close()

    app = FastAPI(title="rag-lookahead", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.lookahead = state
    app.add_middleware(
        BodyDeadline,
        timeout_s=settings.body_timeout_s,
        min_rate=settings.min_body_rate,
        grace_s=settings.body_rate_grace_s,
    )
    install_handlers(app)
    authorized = [Depends(_authorizer(settings.api_key))]
    # While the server stops, every new request is 503 but a scrape of its metrics.
    serving = [*authorized, Depends(_serving(state.admission))]
    app.include_router(_api_routes(state), dependencies=serving)
    app.include_router(corpus_routes(state.corpora, settings.max_body_bytes), dependencies=serving)
    check_model = functools.partial(_check_model, state)
    app.include_router(utility_routes(engine, check_model, settings.max_body_bytes), dependencies=serving)
    app.include_router(version_route(engine))
    app.include_router(_metrics_route(state.metrics), dependencies=authorized)

    @app.get("/health", dependencies=[Depends(_serving(state.admission))])
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app


def _state(engine: Engine, settings: ServeSettings, embedder: Embedder | None) -> ServerState:
    metrics = ServerMetrics()
    admission = Admission(settings.max_running, settings.max_waiting, settings.retry_after_s, metrics)
    corpora = Corpora(engine, settings, metrics)
    return ServerState(
        engine=engine,
        settings=settings,
        model_name=settings.model_name or engine.model_name,
        admission=admission,
        metrics=metrics,
        corpora=corpora,
        caller=Caller(engine, admission, corpora, metrics),
        created=int(time.time()),
        embeddings=Embeddings(embedder or settings.embedder),
    )


async def _sweep_forever(corpora: Corpora) -> None:
    """Remove unused corpora past their TTL, until cancelled."""
    interval = min(max(corpora.ttl_s * _SWEEP_SHARE, _SWEEP_MIN_S), _SWEEP_MAX_S)
    while True:
        await asyncio.sleep(interval)
        try:
            await anyio.to_thread.run_sync(corpora.sweep)
        except Exception:  # a scope that failed to close is out of the table: go on sweeping
            _log.exception("removing corpora left unused failed")


def _api_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> JSONResponse:
        cards = [_model_card(state), _model_card(state, state.embeddings.name)]
        return JSONResponse({"object": "list", "data": cards})

    @router.get("/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        if model == state.embeddings.name:
            return JSONResponse(_model_card(state, model))
        _check_model(state, model)
        return JSONResponse(_model_card(state))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        body = await json_body(request, state.settings.max_body_bytes)
        return await _answer(state, request, plan_chat(body, state.engine, state.settings.defaults), started)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        started = time.perf_counter()
        body = await json_body(request, state.settings.max_body_bytes)
        plan = plan_completion(body, state.settings.defaults)
        if plan.echo:
            return await _echo_answer(state, request, plan, started)
        return await _answer(state, request, plan, started)

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await json_body(request, state.settings.max_body_bytes)
        # A client that leaves cancels its request: the embedding stops at its next slice.
        reply = await _unless_disconnected(request, state.embeddings.answer(body, state.admission))
        return JSONResponse(reply) if reply is not None else Response(status_code=CLIENT_CLOSED)

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        started = time.perf_counter()
        body = await json_body(request, state.settings.max_body_bytes)
        plan = plan_response(body, state.engine, state.settings.defaults)
        shape = ResponsesShape(plan, response_header(state.model_name))
        return await _answer(state, request, plan.call, started, shape)

    return router


def _metrics_route(metrics: ServerMetrics) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics")
    async def exposition() -> Response:
        return Response(metrics.exposition(), media_type=_METRICS_TYPE)

    return router


async def _answer(
    state: ServerState, request: Request, plan: CallPlan, started: float, shape: ReplyShape | None = None
) -> Response:
    """``plan``'s call answered in ``shape`` (OpenAI's chat and completion replies unless told)."""
    if plan.model is not None:
        _check_model(state, plan.model)
    header = ReplyHeader.new(plan.kind, state.model_name)
    shape = shape or OpenAIShape(plan, header)
    if not plan.stream:
        whole = await _unless_disconnected(request, state.caller.whole(plan, header, started))
        return JSONResponse(shape.whole(whole)) if whole is not None else Response(status_code=CLIENT_CLOSED)
    call = await state.caller.open(plan, started)
    # The events' own cleanup closes the call; the background task closes it too when the
    # client left before the events were ever read.
    return EventSourceResponse(
        state.caller.events(call, shape.events()),
        background=BackgroundTask(call.close),
        sep="\n",
        shutdown_grace_period=state.settings.drain_s,  # a stopping server lets it finish
    )


async def _echo_answer(state: ServerState, request: Request, plan: CallPlan, started: float) -> Response:
    """A completion that echoes its prompt (see `rag_lookahead.serve.echo`): whole replies only."""
    if plan.model is not None:
        _check_model(state, plan.model)
    header = ReplyHeader.new(plan.kind, state.model_name)
    work = echo_reply(state.engine, state.admission, state.caller, plan, header, started)
    whole = await _unless_disconnected(request, work)
    return JSONResponse(whole) if whole is not None else Response(status_code=CLIENT_CLOSED)


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or ``None`` once the client has gone: the work is cancelled then, so a
    whole reply nobody waits for stops generating (its call closes as a stream's does)."""
    results: list[T] = []
    failures: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            try:
                results.append(await work)
            except Exception as err:  # raised below, not as the task group's ExceptionGroup
                failures.append(err)
            group.cancel_scope.cancel()

        async def watch() -> None:
            # The body is read: what the server receives next is the client's disconnect.
            while (await request.receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(watch)
    if failures:
        raise failures[0]
    return results[0] if results else None


def _model_card(state: ServerState, name: str | None = None) -> dict[str, Any]:
    """The served model's card (or the embedding model's, by its ``name``)."""
    return {
        "id": name or state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "rag-lookahead",
    }


def _check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise ApiError(
            404,
            f"the model {name!r} is not served here; this server serves {state.model_name!r}",
            code="model_not_found",
            param="model",
        )


def _serving(admission: Admission) -> Callable[[], None]:
    """A dependency that refuses a request (503) once the server is stopping."""

    def serving() -> None:
        if admission.closing:
            raise ApiError(503, "the server is shutting down", code="shutting_down")

    return serving


def _authorizer(api_key: str | None) -> Callable[[Request], None]:
    """A dependency that lets a request through when it carries ``Bearer <api_key>``."""
    expected = api_key.encode() if api_key is not None else None

    def authorize(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest takes as long whatever the token: no timing hint of the key.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise ApiError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorize
