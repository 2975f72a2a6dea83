"""Fixtures for the tests against real vLLM servers (``make test-vllm``, not ``make test``).

vLLM pins another transformers than this package, so it lives in a virtual environment of its
own, named with ``--vllm-python``; without it, or where that environment cannot import vLLM,
every test here is skipped with the reason. Servers run one at a time (two would share the two
cores of a small CI machine): the reference server without speculation answers the prompts
first and is stopped, then the ``ngram`` server serves the rest of the session.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rag_lookahead import rag_messages
from rag_lookahead.models import default_model_dir
from rag_lookahead.remote import ServerEngine, server_command
from rag_lookahead.remote.process import ServerStartError, running_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MAX_NEW_TOKENS = 64
# Small caches and context: the model is 135M parameters, the machine may have 8 GB.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
SERVER_ARGS = ["--max-model-len", "4096", "--dtype", "float32"]
START_TIMEOUT = 900.0  # a first start compiles kernels; a loaded 2-core machine is slow


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--vllm-python",
        default=None,
        help="the Python interpreter of the virtual environment vLLM (vllm-cpu) is installed in",
    )


@pytest.fixture(scope="session")
def vllm_python(request: pytest.FixtureRequest) -> str:
    python = request.config.getoption("--vllm-python")
    if python is None:
        pytest.skip("no --vllm-python given: `make test-vllm` creates vLLM's environment and passes it")
    if not Path(python).is_file():
        pytest.skip(f"--vllm-python {python} does not exist")
    check = subprocess.run(
        [python, "-c", "import vllm, vllm.entrypoints.openai.api_server"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **SERVER_ENV},
    )
    if check.returncode != 0:
        pytest.skip(f"vLLM is not importable from {python}:\n{check.stderr[-2000:]}")
    return str(python)


@pytest.fixture(scope="session")
def model_dir() -> str:
    return str(default_model_dir())


@pytest.fixture(scope="session")
def prompts() -> list[list[dict[str, str]]]:
    """RAG prompts over the bundled Dolly records, and one that asks for a quotation."""
    from rag_lookahead.bench.run import load_records

    records = load_records(Path(__file__).parents[1] / "rag_lookahead" / "data" / "sample.jsonl")
    prompts = [rag_messages(r["question"], r["context"]) for r in records]
    first = records[0]["context"]
    prompts.append(rag_messages("Quote the context's first two sentences word for word.", first))
    return prompts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@contextmanager
def vllm_server(python: str, model: str, log: Path, *, speculative: bool) -> Iterator[ServerEngine]:
    """A vLLM server for ``model`` while the block runs, and a `ServerEngine` on it."""
    port = free_port()
    command = [
        *server_command("vllm", model, port=port, python=python, speculative=speculative),
        *SERVER_ARGS,
    ]
    root = f"http://127.0.0.1:{port}"
    with running_server(command, root, log, start_timeout=START_TIMEOUT, env=SERVER_ENV):
        yield ServerEngine(base_url=f"{root}/v1", model=model, kind="vllm", timeout=300, tokenizer=model)


@pytest.fixture(scope="session")
def plain_answers(
    vllm_python: str, model_dir: str, prompts: list[list[dict[str, str]]], server_logs: Path
) -> list[str]:
    """Greedy answers of a server without speculation (stopped before the ngram server starts).

    Where vLLM installs but cannot serve on this machine's CPU, everything here is skipped with
    the server's own words; once one server has served, a failing start is a failure."""
    try:
        with vllm_server(vllm_python, model_dir, server_logs / "plain.log", speculative=False) as engine:
            return [engine.complete(p, max_new_tokens=MAX_NEW_TOKENS).text for p in prompts]
    except ServerStartError as err:
        pytest.skip(f"vLLM could not serve on this machine: {err}")


@pytest.fixture(scope="session")
def ngram_engine(
    vllm_python: str, model_dir: str, plain_answers: list[str], server_logs: Path
) -> Iterator[ServerEngine]:
    """A `ServerEngine` on a vLLM server with ``ngram`` speculation, for the rest of the session."""
    with vllm_server(vllm_python, model_dir, server_logs / "ngram.log", speculative=True) as engine:
        yield engine
