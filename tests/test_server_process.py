"""`running_server`: a server as a child process, waited for and stopped (no vLLM needed)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from rag_lookahead.server.process import ServerStartError, running_server

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
