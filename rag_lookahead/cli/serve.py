"""`rag-lookahead serve`: this engine over OpenAI's HTTP API (``--backend local``, or ``--backend
ray`` for replicas under Ray Serve), or the vLLM or SGLang command for a model, printed or run."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rag_lookahead.cli.lines import logged_lines
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.remote.launch import BACKENDS, server_command
from rag_lookahead.serve.settings import ServeSettings, check_api_key

if TYPE_CHECKING:
    from fastapi import FastAPI

    from rag_lookahead.loading import LoadOptions
    from rag_lookahead.serve.startup import StartupStages

__all__ = ["API_KEY_VARIABLE", "SERVE_BACKENDS", "run_serve"]

SERVE_BACKENDS = ("local", "ray", *BACKENDS)
#: Where `--api-key` is read from when the flag is not given (here only, never in the library).
API_KEY_VARIABLE = "RAG_LOOKAHEAD_API_KEY"

_CORPUS_FLAGS = ("corpus_ttl_s", "max_corpora", "max_corpus_bytes")
# What uvicorn's connections take (`run_app`): Ray Serve's proxy holds the connections there.
_CONNECTION_FLAGS = ("header_timeout_s", "keep_alive_s", "max_connections")
_SETTINGS = (
    *("max_running", "max_waiting", "max_body_bytes", "drain_s", "embedder"),
    *("body_timeout_s", "min_body_rate", "body_rate_grace_s"),
    *_CORPUS_FLAGS,
    *_CONNECTION_FLAGS,
)
_LOCAL_FLAGS = ("api_key", *_SETTINGS, "mode", "device", "dtype", "threads")
_RAY_FLAGS = ("replicas", "ray_address")
# Flags whose name is not their setting's.
_FLAGS = {
    "drain_s": "--drain-seconds",
    "corpus_ttl_s": "--corpus-ttl-seconds",
    "header_timeout_s": "--header-timeout-seconds",
    "body_timeout_s": "--body-timeout-seconds",
    "body_rate_grace_s": "--body-rate-grace-seconds",
    "keep_alive_s": "--keep-alive-seconds",
}
_REMOTE_FLAGS = ("python", "no_speculation", "launch")


def run_serve(args: argparse.Namespace) -> int:
    if args.backend in ("local", "ray"):
        _refuse(args, _REMOTE_FLAGS, "vllm and sglang")
        if args.backend == "ray":
            # Replicas refuse corpora (http/replica.py) and take their CPUs from Ray; Ray's
            # proxy, not uvicorn, holds the connections.
            _refuse(args, (*_CORPUS_FLAGS, *_CONNECTION_FLAGS, "threads"), "local")
            return _run_ray(args)
        _refuse(args, _RAY_FLAGS, "ray")
        return _run_local(args)
    _refuse(args, (*_LOCAL_FLAGS, *_RAY_FLAGS), "local and ray")
    if not args.model:
        raise ValueError(f"--backend {args.backend} needs --model: the model directory (or hub id) to serve")
    return _run_backend(args)


def _refuse(args: argparse.Namespace, flags: tuple[str, ...], backends: str) -> None:
    # A flag given as 0 is given: only None (not given) and False (a switch left off) are not.
    given = [_flag(name) for name in flags if all(getattr(args, name) is not off for off in (None, False))]
    if given:
        raise ValueError(f"{', '.join(given)} apply only to --backend {backends}, not {args.backend}")


def _flag(dest: str) -> str:
    return _FLAGS.get(dest, f"--{dest.replace('_', '-')}")


def _run_backend(args: argparse.Namespace) -> int:
    python = args.python or "python"
    command = server_command(
        args.backend,
        args.model,
        host=args.host,
        port=args.port,
        python=python,
        speculative=not args.no_speculation,
    )
    print(shlex.join(command), flush=True)
    if not args.launch:
        api = f"http://{args.host}:{args.port}/v1"
        print(f"# then: ServerEngine(base_url={api!r}, model={args.model!r}, kind={args.backend!r})")
        return 0
    try:
        return subprocess.run(command, check=False).returncode
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{python!r} was not found: pass --python with the interpreter of the "
            f"environment {args.backend} is installed in"
        ) from None


def _run_local(args: argparse.Namespace) -> int:
    from rag_lookahead.cli.settings import load_options
    from rag_lookahead.models import is_missing_directory
    from rag_lookahead.serve.startup import STARTUP_LOGGER

    settings = _serve_settings(args)
    if settings.embedder is not None and not Path(settings.embedder).expanduser().is_dir():
        raise FileNotFoundError(f"--embedder {settings.embedder!r} is not a directory")  # before a long load
    if args.model and is_missing_directory(args.model):  # before the server listens
        raise FileNotFoundError(f"model path {args.model!r} is not a model directory")
    serve = _server()  # before a long load
    _announce(args, settings)
    build = functools.partial(_built_app, args, settings, load_options(args))
    with logged_lines(STARTUP_LOGGER, "rag-lookahead: %(message)s"):
        serve(build, settings, args.host, args.port)
    return 0


def _built_app(
    args: argparse.Namespace, settings: ServeSettings, load: LoadOptions, stages: StartupStages
) -> FastAPI:
    """The app over the engine the flags describe, made stage by stage while the server
    already answers (`StartingApp`): the model loaded (converted on first use, its kernels
    chosen and its forwards probed), its costs measured, then the app."""
    import torch

    from rag_lookahead.engine import LookaheadEngine
    from rag_lookahead.runtime.memory import reserve_heap, retain_freed_memory, working_set_bytes
    from rag_lookahead.serve import create_app
    from rag_lookahead.serve.readiness import measure_ahead

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    retained = retain_freed_memory()  # a server's process: before the engine's threads start
    with stages.stage("loading the model (converting it on first use, choosing kernels, probing)"):
        engine = LookaheadEngine.from_pretrained(config=_config(args), load=load)
    if retained and engine.runner.device.type == "cpu":
        prefix_cache = engine.config.prefix_cache_mb << 20
        reserve_heap(working_set_bytes(engine.model, settings.max_running, prefix_cache))
    print(f"backend: {engine.backend}", file=sys.stderr, flush=True)
    with stages.stage("measuring forward costs (once per model and machine)"):
        measure_ahead(engine)
    return create_app(engine, settings)


def _run_ray(args: argparse.Namespace) -> int:
    settings = _serve_settings(args)
    try:
        from rag_lookahead.serve.ray_serve import run_ray
        from rag_lookahead.serve.replica import EngineLoad
    except ImportError as err:
        raise ValueError(
            f"--backend ray needs the ray and serve extras: pip install 'rag-lookahead[ray,serve]' ({err})"
        ) from None
    from rag_lookahead.cli.settings import load_options

    # No bars: a replica's output is no terminal.
    load = EngineLoad(**dataclasses.asdict(load_options(args, progress=False)), config=_config(args))
    _announce(args, settings)
    run_ray(load, settings, args.host, args.port, replicas=args.replicas or 1, address=args.ray_address)
    return 0


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    from rag_lookahead.models import DEFAULT_MODEL

    return ServeSettings(
        model_name=args.model or DEFAULT_MODEL,
        api_key=_api_key(args.api_key),
        **{name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None},
    )


def _config(args: argparse.Namespace) -> LookaheadConfig | None:
    return LookaheadConfig(mode=args.mode) if args.mode is not None else None


def _announce(args: argparse.Namespace, settings: ServeSettings) -> None:
    if settings.api_key is None and not _loopback(args.host):
        print(
            f"rag-lookahead: warning: listening on {args.host} with no API key: anyone who reaches "
            f"it may use it (pass --api-key or set {API_KEY_VARIABLE})",
            file=sys.stderr,
        )
    print(f"serving {settings.model_name} at http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)


def _api_key(flag: str | None) -> str | None:
    """The key from the flag, else the variable: refused at once when no client could send it."""
    if flag is not None:
        check_api_key(flag, "--api-key")
        return flag
    value = os.environ.get(API_KEY_VARIABLE)
    if value is not None and not value.strip():
        raise ValueError(f"{API_KEY_VARIABLE} is set but empty: unset it, or give it the key")
    if value is not None:
        check_api_key(value, API_KEY_VARIABLE)
    return value


def _server() -> Callable[[Callable[[StartupStages], FastAPI], ServeSettings, str, int], None]:
    """What runs the app ``build`` makes (listening while it builds, `StartingApp`) until a
    signal stops it (draining), or a clear error without the serve extra."""
    try:
        from rag_lookahead.serve import StartingApp, run_app
    except ImportError as err:
        raise ValueError(
            f"--backend local needs the serve extra: pip install 'rag-lookahead[serve]' ({err})"
        ) from None

    def serve(
        build: Callable[[StartupStages], FastAPI], settings: ServeSettings, host: str, port: int
    ) -> None:
        run_app(StartingApp(build, settings), host, port)

    return serve


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
