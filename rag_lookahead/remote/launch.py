"""The command that starts a vLLM or SGLang server with speculative settings suited to RAG.

RAG answers quote their prompt's documents, so both use prompt n-gram drafting (no draft model):
vLLM's ``ngram`` speculator matches the last tokens in the prompt and proposes what followed;
SGLang's ``NGRAM`` keeps a trie of past tokens (PIA's) and, with an external SAM budget,
also drafts from the corpora `ServerEngine` loads for each query.
"""

from __future__ import annotations

import json
from typing import Literal

__all__ = ["BACKENDS", "Backend", "server_command"]

Backend = Literal["vllm", "sglang"]
BACKENDS: tuple[Backend, ...] = ("vllm", "sglang")

# vLLM ngram: drafts of up to 5 tokens after a match of 2 to 4 prompt tokens. Quoted spans run
# longer than 5 tokens, but each rejected draft token is a wasted verification slot.
_VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# SGLang NGRAM: a tree of 12 draft tokens per step, 4 of them reserved for the external corpora.
_SGLANG_DRAFT_TOKENS = 12
_SGLANG_CORPUS_BUDGET = 4


def server_command(
    backend: Backend,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    python: str = "python",
    speculative: bool = True,
) -> list[str]:
    """The argument list that serves ``model`` (a directory or hub id) on ``host:port``.

    ``python`` is the interpreter of the environment the server is installed in (vLLM pins
    its own transformers, so it usually lives in an environment of its own). Modules are run
    with ``-m`` rather than through the ``vllm`` script, which some builds (the CPU wheel)
    cannot start. ``speculative=False`` gives the same server without drafting, the reference.
    """
    if backend == "vllm":
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        command += ["--host", host, "--port", str(port)]
        if speculative:
            command += ["--speculative-config", json.dumps(_VLLM_NGRAM)]
        return command
    if backend == "sglang":
        command = [python, "-m", "sglang.launch_server", "--model-path", model]
        command += ["--host", host, "--port", str(port)]
        if speculative:
            command += [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-num-draft-tokens",
                str(_SGLANG_DRAFT_TOKENS),
                "--speculative-ngram-external-sam-budget",
                str(_SGLANG_CORPUS_BUDGET),
            ]
        return command
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
