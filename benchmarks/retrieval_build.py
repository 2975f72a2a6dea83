"""Index build time against a previous rag-lookahead: the same contexts, the same embedder.

Each set's distinct contexts are indexed as `eval-retrieval` and `bench --retrieval` index them
(`DocumentIndex.add` with the default chunking), once by this checkout and once by the package
at ``--baseline`` (a directory holding an older ``rag_lookahead/``, e.g. made with
``git archive <commit> rag_lookahead | tar -x -C /tmp/base``), each in a process of its own
and in alternating order, so that both see the same machine. Loading the embedder is not timed.

    python benchmarks/retrieval_build.py --baseline /tmp/base --data set.jsonl ... \\
        --json benchmarks/retrieval-build.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def child(data: str, threads: int) -> None:
    import torch

    from rag_lookahead.rag import Document, DocumentIndex, SentenceTransformerEmbedder

    torch.set_num_threads(threads)

    contexts: dict[str, None] = {}
    for line in Path(data).read_text(encoding="utf-8").split("\n"):
        if line.strip():
            contexts.setdefault(json.loads(line)["context"], None)
    name = Path(data).name
    documents = [Document(f"{name}#{i}", text) for i, text in enumerate(contexts, 1)]
    embedder = SentenceTransformerEmbedder()
    embedder.embed(["warm-up"])
    index = DocumentIndex(embedder)
    started = time.perf_counter()
    index.add(documents)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": round(seconds, 2), "chunks": len(index), "contexts": len(documents)}))


def run(code: Path, data: str, threads: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", data, "--threads", str(threads)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def cpu_name() -> str:
    """The CPU's model name and, where that is generic (a VM's "AMD EPYC"), its family, model
    and whether it has AVX-512: the kinds these machines come in differ there."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not key.strip():  # the first processor's block is enough
            break
    if "model name" not in fields:
        return "unknown"
    avx512 = "AVX-512" if "avx512f" in fields.get("flags", "").split() else "no AVX-512"
    kind = f"family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}, {avx512}"
    return f"{fields['model name']} ({kind})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[])
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each build")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads)
        return 0
    if args.baseline is None or not args.data:
        parser.error("--baseline and --data are required")
    results = {}
    for i, data in enumerate(args.data):
        order = [("baseline", args.baseline), ("current", HERE)]
        runs = order if i % 2 == 0 else order[::-1]
        timed: dict[str, Any] = {name: run(code, data, args.threads) for name, code in runs}
        timed["ratio"] = round(timed["current"]["seconds"] / timed["baseline"]["seconds"], 2)
        results[Path(data).name] = timed
        print(Path(data).name, timed, flush=True)
    summary = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "sets": results}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
