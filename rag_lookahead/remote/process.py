"""A server run as a child process: started, waited for until it answers, and stopped.

The real-server tests and the peer benchmark start vLLM servers this way; it is also how to
script a reference server beside a speculative one. The server's output goes to a log file,
whose tail is quoted when the server exits or never becomes ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

__all__ = ["ServerStartError", "running_server"]

_POLL_SECONDS = 1.0
_STOP_SECONDS = 30.0
_LOG_TAIL_CHARS = 4000


class ServerStartError(RuntimeError):
    """The server exited, or did not answer its health check in time."""


@contextmanager
def running_server(
    command: Sequence[str],
    root_url: str,
    log_path: Path,
    *,
    start_timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` until the ``with`` block ends, entering it once ``root_url/health``
    answers 200.

    ``env`` is added to this process's environment. The server runs in a process group of its
    own, so that stopping it (SIGTERM, then SIGKILL after a grace period) also stops the worker
    processes it started.
    """
    if start_timeout <= 0:
        raise ValueError(f"start_timeout must be > 0, got {start_timeout}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            _wait_ready(process, root_url.rstrip("/") + "/health", log_path, start_timeout)
            yield process
        finally:
            _stop(process)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(
                f"the server exited with status {process.returncode}:\n{_log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=_POLL_SECONDS) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(_POLL_SECONDS)
    raise ServerStartError(f"the server did not answer {url} within {timeout:.0f} s:\n{_log_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(_STOP_SECONDS)
    # Workers the server started may outlive it; the group is this server's alone.
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, sig)


def _log_tail(path: Path) -> str:
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return text[-_LOG_TAIL_CHARS:]
