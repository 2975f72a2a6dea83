"""`rag-lookahead serve --backend ray` as a user runs it: the command starts its own local Ray
instance with one replica, answers over HTTP, and on SIGTERM removes the application, stops
Ray and exits 0, freeing the port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag_lookahead.serve.replica import REPLICA_HEADER
from rag_lookahead.testing import save_tiny_model

_START_S = 600.0  # bounds for what would otherwise hang, never measurements
_STOP_S = 120.0


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_S
    while True:
        assert server.poll() is None, f"the command exited with {server.returncode}"
        assert time.monotonic() < deadline, "the command did not serve in time"
        try:
            if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1.0)


def test_the_command_serves_then_stops_on_sigterm(tmp_path: Path) -> None:
    directory = save_tiny_model(tmp_path / "model")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["serve", "--backend", "ray", "--model", str(directory), "--port", str(port), "--mode", "trie"]
    # Its own session, so that whatever is left of it after a failure is ended with it.
    server = subprocess.Popen([sys.executable, "-m", "rag_lookahead", *argv], start_new_session=True)
    try:
        wait_for(url, server)
        body = {"model": str(directory), "prompt": "The Normans were", "max_tokens": 8}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=_STOP_S)
        assert answer.status_code == 200 and answer.headers[REPLICA_HEADER]
        assert answer.json()["usage"]["completion_tokens"] == 8
        server.send_signal(signal.SIGTERM)
        assert server.wait(_STOP_S) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5.0)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(_STOP_S)
