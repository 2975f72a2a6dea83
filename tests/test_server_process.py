"""`running_server`: a server as a child process, waited for and stopped (no vLLM needed); and
the local server (`run_app`) as one, told to stop by a real SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_lookahead.remote.process import ServerStartError, running_server

# A server that answers /health once it has started, and starts a worker that would outlive it.
SERVER = """
import http.server, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("listening, worker", worker.pid, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process that nobody reaped yet is a zombie, not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_the_block_runs_once_the_server_answers_and_the_whole_group_stops_after(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "server.log"
    command = [sys.executable, "-c", SERVER, str(port)]
    with running_server(command, f"http://127.0.0.1:{port}", log, start_timeout=60) as process:
        assert process.poll() is None
        worker = int(log.read_text().split("worker")[1].split()[0])
    assert process.poll() is not None
    deadline = time.monotonic() + 10  # a signal is delivered, not acted on, by the time kill returns
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker)  # the worker went with it


@pytest.mark.parametrize(
    ("command", "timeout", "error", "match"),
    [
        ([sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"], 60, ServerStartError, "status 3"),
        ([sys.executable, "-c", "import time; time.sleep(60)"], 1.5, ServerStartError, "did not answer"),
        ([sys.executable, "-c", "pass"], 0, ValueError, "start_timeout"),
        ([sys.executable, "-c", "pass"], -1, ValueError, "start_timeout"),
    ],
)
def test_a_server_that_never_answers_is_an_error_with_its_log(
    tmp_path: Path, command: list[str], timeout: float, error: type[Exception], match: str
) -> None:
    port = _free_port()
    with (
        pytest.raises(error, match=match) as caught,
        running_server(command, f"http://127.0.0.1:{port}", tmp_path / "log", start_timeout=timeout),
    ):
        pass
    if "status" in match:
        assert "bad flag" in str(caught.value)


# The local server over the tiny engine, whose forwards past the third wait until the file
# argv[2] exists (a bounded wait): a stream runs for as long as the test wants.
LOCAL_SERVER = """
import os, sys, time
from rag_lookahead.serve import ServeSettings, create_app, run_app
from rag_lookahead.testing.local_server import WAIT_S, served_engine
port, gate = int(sys.argv[1]), sys.argv[2]
engine = served_engine()
forward, calls = engine.runner.forward, [0]
def gated(*args, **kwargs):
    calls[0] += 1
    deadline = time.monotonic() + WAIT_S
    while calls[0] > 3 and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return forward(*args, **kwargs)
engine.runner.forward = gated
run_app(create_app(engine, ServeSettings(model_name="tiny", drain_s=WAIT_S)), "127.0.0.1", port)
"""


def test_sigterm_drains_the_local_server_which_then_exits_0(tmp_path: Path) -> None:
    """On SIGTERM the server still listens, answering new requests and /health with 503,
    while the stream running goes on to its ``[DONE]``; then the process exits 0 (not -15)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    port, gate = _free_port(), tmp_path / "go"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-c", LOCAL_SERVER, str(port), str(gate)]
    lines: list[str] = []

    def read() -> None:
        body = {"model": "tiny", "prompt": "The Normans", "max_tokens": 40, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines.extend(line for line in response.iter_lines() if line.startswith("data:"))

    with running_server(command, url, tmp_path / "server.log", start_timeout=300) as process:
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:  # the stream has begun
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        health = httpx.get(f"{url}/health", timeout=60)
        assert health.status_code == 503 and health.json()["error"]["code"] == "shutting_down"
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi"}, timeout=60)
        assert refused.status_code == 503
        gate.touch()
        reader.join(60)
        assert process.wait(60) == 0, (tmp_path / "server.log").read_text()
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] in ("length", "stop")
