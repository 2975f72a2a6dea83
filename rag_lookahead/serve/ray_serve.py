"""The OpenAI-compatible app as a Ray Serve deployment: N replicas, each with its own engine.

Each replica loads its engine from an `EngineLoad` and serves `create_app` over it under
``serve.ingress``; Ray's proxy spreads requests over the replicas. Replicas share nothing: a
request carries its documents, and corpus routes answer 501 (`rag_lookahead.serve.replica`).
Needs the ``ray`` extra (``ray[serve]``) besides ``serve``; nothing else imports this module.
"""

from __future__ import annotations

import signal
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve

from rag_lookahead.serve.app import create_app
from rag_lookahead.serve.replica import EngineLoad, replica_app
from rag_lookahead.serve.settings import ServeSettings

__all__ = ["APP_NAME", "LookaheadDeployment", "deployment", "ray_application", "run_ray"]

#: The name of the Serve application `run_ray` deploys.
APP_NAME = "rag-lookahead"


class _Replica:
    """One replica: an engine loaded in this process and the app serving it. Its process ends
    with the replica (after Ray drains it: `ServeSettings.drain_s`), and the engine with it."""

    def __init__(self, load: EngineLoad, settings: ServeSettings) -> None:
        self._engine = load.load()
        self._settings = settings

    def __serve_build_asgi_app__(self) -> FastAPI:
        replica = serve.get_replica_context().replica_id.unique_id
        return replica_app(create_app(self._engine, self._settings), replica)


#: The deployment: `ray_application` sets its replicas and binds its loading options. The app
#: is built late, in each replica, over that replica's own engine (no app given to ingress).
LookaheadDeployment: Any = serve.deployment(name="LookaheadReplica")(serve.ingress()(_Replica))


def deployment(
    load: EngineLoad,
    settings: ServeSettings | None = None,
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float | None = None,
) -> Any:
    """`LookaheadDeployment` with ``replicas`` replicas, each reserving ``cpus_per_replica``
    CPUs and ``gpus_per_replica`` GPUs from Ray (``None``: one when ``load.device`` is CUDA,
    else none; Ray hides the GPUs from a replica that reserves none)."""
    settings = settings or ServeSettings()
    if not isinstance(load, EngineLoad):
        raise TypeError(f"load must be an EngineLoad, got {type(load).__name__}")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer of at least 1, got {replicas!r}")
    gpus = (1.0 if load.on_gpu else 0.0) if gpus_per_replica is None else gpus_per_replica
    _resource("cpus_per_replica", cpus_per_replica)
    _resource("gpus_per_replica", gpus)
    if load.on_gpu and gpus == 0:
        raise ValueError(f"device {load.device!r} needs a GPU per replica: gpus_per_replica must be above 0")
    return LookaheadDeployment.options(
        num_replicas=replicas,
        # One more than a replica admits: a full replica answers 429 (with Retry-After) itself,
        # as the local server does, rather than Ray holding the request in a queue of its own.
        max_ongoing_requests=settings.max_running + settings.max_waiting + 1,
        graceful_shutdown_timeout_s=settings.drain_s,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus},
    )


def ray_application(
    load: EngineLoad,
    settings: ServeSettings | None = None,
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float | None = None,
) -> serve.Application:
    """The application for ``serve.run``: `deployment` bound to its loading options."""
    settings = settings or ServeSettings()
    chosen = deployment(
        load,
        settings,
        replicas=replicas,
        cpus_per_replica=cpus_per_replica,
        gpus_per_replica=gpus_per_replica,
    )
    return chosen.bind(load, settings)


def _resource(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")


def run_ray(
    load: EngineLoad,
    settings: ServeSettings,
    host: str,
    port: int,
    *,
    replicas: int = 1,
    address: str | None = None,
) -> None:
    """Serve on ``host``:``port`` through Ray (the cluster at ``address``; ``None``: Ray's own
    choice, ``RAY_ADDRESS`` or a new local instance) until SIGTERM or Ctrl-C, then remove the
    application, letting running requests finish within ``settings.drain_s``."""
    app = ray_application(load, settings, replicas=replicas)  # checked before Ray starts
    ray.init(address=address)
    try:
        # After ray.init, which installs handlers of its own: SIGTERM stops as Ctrl-C does,
        # also while the replicas load.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler)
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=True)
        except KeyboardInterrupt:
            pass
        finally:
            serve.delete(APP_NAME)  # this application only: others on the cluster stay
    finally:
        ray.shutdown()
