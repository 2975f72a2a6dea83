"""`serve` answers from its first second: ``/health`` is 503 with the start-up's stage while the
engine is made (a slow build, held by the test), then 200; other routes 503 ``starting``; each
stage logged with its seconds (on the test's clock); a failed build said so, and the server
stops."""

from __future__ import annotations

import itertools
import logging
import threading

import httpx
import pytest
from fastapi import FastAPI

from rag_lookahead.serve import ServeSettings, StartingApp, StartupStages, create_app
from rag_lookahead.serve.startup import STARTUP_LOGGER
from rag_lookahead.testing.local_server import WAIT_S, LiveServer, served_engine, wait_until

MODEL = "tiny"
STAGES = ("loading the model", "measuring forward costs")


class HeldBuild:
    """A build whose stages each wait for the test to let them end."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.entered = {name: threading.Event() for name in STAGES}
        self.release = {name: threading.Event() for name in STAGES}

    def __call__(self, stages: StartupStages) -> FastAPI:
        for name in STAGES:
            with stages.stage(name):
                self.entered[name].set()
                assert self.release[name].wait(WAIT_S)
                if self.fails:
                    raise FileNotFoundError("no such model")
        return create_app(served_engine(), ServeSettings(model_name=MODEL))


def _ticks() -> StartupStages:
    """Stages on a clock that moves 2 s at each reading."""
    clock = itertools.count(0.0, 2.0)
    return StartupStages(clock=lambda: next(clock))


def test_health_says_the_stage_while_starting_then_ok(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=STARTUP_LOGGER)
    build = HeldBuild()
    app = StartingApp(build, ServeSettings(model_name=MODEL), _ticks())
    with LiveServer(app) as live:  # listening before the build has begun its first stage
        for name in STAGES:
            assert build.entered[name].wait(WAIT_S)
            health = httpx.get(f"{live.url}/health", timeout=WAIT_S)
            assert health.status_code == 503 and health.json() == {"status": "starting", "stage": name}
            assert health.headers["retry-after"] == "1"
            models = httpx.get(f"{live.url}/v1/models", timeout=WAIT_S)
            assert models.status_code == 503 and models.json()["error"]["code"] == "starting"
            assert name in models.json()["error"]["message"]
            build.release[name].set()
        wait_until(lambda: httpx.get(f"{live.url}/health", timeout=WAIT_S).status_code == 200)
        assert httpx.get(f"{live.url}/health", timeout=WAIT_S).json() == {"status": "ok"}
        assert httpx.get(f"{live.url}/v1/models", timeout=WAIT_S).json()["data"][0]["id"] == MODEL
    assert list(app.stages.seconds) == [*STAGES, "starting the app"]
    assert all(seconds == 2.0 for seconds in app.stages.seconds.values())
    said = [r.getMessage() for r in caplog.records if r.name == STARTUP_LOGGER]
    for name in STAGES:
        assert f"start-up: {name} ..." in said and f"start-up: {name} done in 2.0 s" in said
    assert said[-1] == "start-up: ready"


def test_a_failed_build_is_said_and_stops_the_server() -> None:
    build = HeldBuild(fails=True)
    app = StartingApp(build, ServeSettings(model_name=MODEL))
    live = LiveServer(app)
    assert build.entered[STAGES[0]].wait(WAIT_S)
    build.release[STAGES[0]].set()
    wait_until(lambda: app.failed is not None)
    assert isinstance(app.failed, FileNotFoundError)
    live.thread.join(WAIT_S)  # the server stopped by itself
    assert not live.thread.is_alive()


def test_stopped_while_starting_it_stops_at_once() -> None:
    build = HeldBuild()
    live = LiveServer(StartingApp(build, ServeSettings(model_name=MODEL)))
    assert build.entered[STAGES[0]].wait(WAIT_S)
    live.server.handle_exit(15, None)  # SIGTERM: nothing runs yet, nothing to drain
    live.thread.join(WAIT_S)
    assert not live.thread.is_alive()
    build.release[STAGES[0]].set()  # (the build's thread ends on its own)
    build.release[STAGES[1]].set()
