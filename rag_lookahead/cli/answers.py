"""`index`, `ask`, `chat` and `demo`: documents in, streamed answers with their sources out."""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rag_lookahead.cli.setup import (
    bundled_index,
    bundled_questions,
    chunking_config,
    make_embedder,
    make_engine,
    make_pipeline,
    progress,
    retrieval_config,
)
from rag_lookahead.files import held
from rag_lookahead.interface import Engine
from rag_lookahead.planning.load import MachineLoad, watch_load
from rag_lookahead.progress import progress_bar
from rag_lookahead.rag import (
    AnswerStream,
    ChunkingConfig,
    DocumentIndex,
    IndexFormatError,
    RagPipeline,
    Skipped,
    load_documents,
)
from rag_lookahead.rag.chunking import long_lines
from rag_lookahead.rag.pipeline import Answer, source_label
from rag_lookahead.rag.store import META_FILE, refuse_foreign
from rag_lookahead.serve.readiness import measure_ahead
from rag_lookahead.streaming.stats import DecodeStats

__all__ = ["run_ask", "run_chat", "run_demo", "run_index"]


def run_index(args: argparse.Namespace) -> int:
    """Build the index at ``--out``, or bring an existing one in line with the paths.

    One run at a time per index: a second waits for the first to save, then updates its result.
    """
    config = chunking_config(args)
    out = Path(args.out)
    refuse_foreign(out)  # before anything is embedded
    with _locked(out):
        index, skipped = _index_paths(args, out, config)
        for item in skipped:
            print(f"skipped {item}")  # printable, even for a file name that is not UTF-8
        index.save(out)
    return 0


def _index_paths(
    args: argparse.Namespace, out: Path, config: ChunkingConfig
) -> tuple[DocumentIndex, tuple[Skipped, ...]]:
    links = args.follow_symlinks
    if not (out / META_FILE).is_file():
        _warn_long_lines(args, {})
        embedder = make_embedder(args.embedder)
        index, skipped = DocumentIndex.build(
            args.paths,
            embedder,
            config,
            progress("embedding"),
            text_field=args.text_field,
            follow_symlinks=links,
        )
        print(f"built {out}: {len(index.sources)} sources, {len(index)} chunks")
        return index, tuple(skipped)
    try:
        index = DocumentIndex.load(out, make_embedder(args.embedder) if args.embedder else None)
    except IndexFormatError as err:  # e.g. an older format: `index` cannot update it
        raise IndexFormatError(f"{err} (to rebuild it there, remove {out} first)") from None
    if index.config != config:
        print(f"note: keeping the index's chunking {index.config}; rebuild it elsewhere to change it")
    _warn_long_lines(args, index.sources)
    report = index.update(
        args.paths, progress("embedding"), text_field=args.text_field, follow_symlinks=links
    )
    print(
        f"updated {out}: {report.added} sources added or changed, {report.removed} removed or "
        f"changed, {report.unchanged} unchanged ({report.chunks_added} chunks in, "
        f"{report.chunks_removed} out)"
    )
    return index, report.skipped


def _warn_long_lines(args: argparse.Namespace, indexed: Mapping[str, str]) -> None:
    """Say so before a file with a line of megabytes is chunked and embedded (a minified or
    binary-like file, mostly), which takes long; unchanged ones are not embedded again."""
    documents, _ = load_documents(
        args.paths, text_field=args.text_field, follow_symlinks=args.follow_symlinks
    )
    fresh = [
        doc for doc in documents if indexed.get(doc.source) != hashlib.sha256(doc.text.encode()).hexdigest()
    ]
    for source, length in long_lines(fresh):
        print(
            f"warning: {source} has a line of {length:,} characters: with no sentence breaks it is "
            "cut into chunks by tokens, and embedding them all takes a while",
            file=sys.stderr,
            flush=True,
        )


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold the lock of the index at `out`, saying so when another run holds it first."""
    with held(DocumentIndex.lock(out), f"waiting for another `rag-lookahead index` to finish with {out} ..."):
        yield


def run_ask(args: argparse.Namespace) -> int:
    pipeline = make_pipeline(args)
    stream = pipeline.stream(args.question, max_new_tokens=args.max_new_tokens)
    if not args.json:
        _answer(stream, sys.stdout, args.max_new_tokens, debug=args.debug, engine=pipeline.engine)
        return 0
    for note in stream.notes:  # stdout holds the JSON object alone
        print(f"note: {note}", file=sys.stderr)
    with stream:
        answer = stream.answer()
    print(json.dumps(_as_json(answer), ensure_ascii=False))
    return 0


def _as_json(answer: Answer) -> dict[str, Any]:
    """The answer as `ask --json` prints it: its text, its sources as the human output numbers
    them, why it stopped and the decode stats."""
    sources = [
        {
            "id": i,
            "chunk_id": hit.chunk.id,
            "title": source_label(hit.chunk),
            "source": hit.chunk.source,
            "similarity": hit.similarity,  # None for a keyword match
            "score": hit.score,
            "text": hit.chunk.text,
        }
        for i, hit in enumerate(answer.sources, 1)
    ]
    return {
        "question": answer.question,
        "answer": answer.text,
        "sources": sources,
        "notes": list(answer.notes),
        "finish_reason": answer.stats.finish_reason,
        "stats": answer.stats.as_dict(),
    }


def run_chat(args: argparse.Namespace) -> int:
    pipeline = make_pipeline(args)
    print(f"Chatting over {args.index} ({len(pipeline.index)} chunks). An empty line or Ctrl-D ends.")
    history: list[tuple[str, str]] = []  # earlier turns: each question sees the conversation
    while True:
        try:
            question = input("\nyou> ").strip()
        except EOFError:
            print()
            return 0
        if not question or question in {"exit", "quit"}:
            return 0
        try:
            stream = pipeline.stream(question, max_new_tokens=args.max_new_tokens, history=history)
        except ValueError as err:
            print(f"error: {err}")
            continue
        answer = _answer(stream, sys.stdout, args.max_new_tokens, debug=args.debug, engine=pipeline.engine)
        history.append((question, answer.text))


def run_demo(args: argparse.Namespace) -> int:
    """The main job on bundled data: index a small real corpus, then answer its questions with
    and without lookahead, timed fairly (both warmed up, in alternating order). Says what it is
    doing at each step, streams each lookahead answer as it decodes, and flushes every line, so
    that a pipe shows it as it comes."""
    index = bundled_index(announce=True)
    questions = bundled_questions()[: args.questions]
    _say("Loading the model (a built-in one is converted to safetensors once, on first use)...")
    # The two paths answer the same prompts: neither may start from the other's prefix cache.
    engine = make_engine(args, measure=False, reuse_prefixes=False)
    if engine.config.mode == "auto":
        _say(
            "Measuring the model's forward costs, which lookahead plans its drafts with "
            "(once per model and machine, then read from the cache)..."
        )
        started = time.perf_counter()
        measure_ahead(engine, remeasure=args.remeasure, batches=False)  # one question at a time
        took = time.perf_counter() - started
        measured = engine.cost_curve is not None
        _say(f"  done in {took:.1f} s" if measured else "  none needed: the model verifies no drafts")
    pipelines = {
        "lookahead": RagPipeline(engine, index, retrieval_config(args)),
        "plain": RagPipeline(engine.plain(), index, retrieval_config(args)),
    }
    for name, pipeline in pipelines.items():  # first calls pay one-off costs (allocations, kernels)
        _say(f"Warming up the {name} path (not timed)...")
        # Under a bar too: a busy machine takes tens of seconds over it, and it prints nothing.
        with progress_bar(True, f"warming up the {name} path", total=1, unit="call") as bar:
            pipeline.ask(_WARM_UP, max_new_tokens=8)
            bar.update(1)
    _say(f"Asking {len(questions)} questions, each with lookahead (shown as it decodes) and without.")
    with watch_load() as seen:
        seconds, identical = _timed_answers(args, pipelines, questions)
    _summarize(seconds, identical, seen[0])
    return 0


def _timed_answers(
    args: argparse.Namespace, pipelines: dict[str, RagPipeline], questions: list[str]
) -> tuple[list[tuple[float, float]], int]:
    """Each question answered by both paths, in alternating order, the lookahead answer streamed:
    the seconds of each (plain, lookahead), and how many answers came out identical."""
    seconds, identical = [], 0
    for i, question in enumerate(questions):
        _say(f"\n=== Question {i + 1}/{len(questions)}: {question}")
        order = list(pipelines) if i % 2 == 0 else list(reversed(pipelines))
        answers: dict[str, Answer] = {}
        for name in order:
            stream = pipelines[name].stream(question, max_new_tokens=args.max_new_tokens)
            if name == "lookahead":
                answers[name] = _stream_answer(stream, sys.stdout, args.max_new_tokens)
            else:
                _say(
                    "  (plain decoding first this time: the order alternates)"
                    if not answers
                    else "  plain decoding, to compare..."
                )
                answers[name] = _decode_quietly(stream, args.max_new_tokens)
        fast, plain = answers["lookahead"], answers["plain"]
        for name, answer in (("lookahead", fast), ("plain", plain)):
            s = answer.stats
            _say(
                f"  {name:>9}: {s.new_tokens} tokens in {s.seconds:.2f} s, {s.tokens_per_s:.1f} tok/s, "
                f"{s.tokens_per_step:.2f} tokens per forward"
            )
        seconds.append((plain.stats.seconds, fast.stats.seconds))
        identical += plain.text == fast.text
        _say(f"  identical: {plain.text == fast.text}; lookahead: {seconds[-1][0] / seconds[-1][1]:.2f}x")
    return seconds, identical


def _decode_quietly(stream: AnswerStream, max_new_tokens: int) -> Answer:
    """``stream`` decoded without showing its text (the other path's was shown), with a line at
    most every `_QUIET_LINE_EVERY` seconds saying how far it got."""
    tokens, said = 0, time.monotonic()
    with stream:
        for chunk in stream.chunks():
            tokens += len(chunk.token_ids)
            if time.monotonic() - said >= _QUIET_LINE_EVERY:
                _say(f"    {tokens} of at most {max_new_tokens} tokens so far...")
                said = time.monotonic()
        return stream.answer()


def _summarize(seconds: list[tuple[float, float]], identical: int, load: MachineLoad) -> None:
    """Each answer's speed-up, and their median and range: one long answer cannot carry it."""
    ratios = [plain / fast for plain, fast in seconds]
    total = sum(plain for plain, _ in seconds) / sum(fast for _, fast in seconds)
    _say(f"\nLookahead against plain decoding, per answer: {', '.join(f'{r:.2f}' for r in ratios)}")
    _say(f"While timing, {load.describe()}.")
    verdict = " (timed on a busy machine)" if load.busy else ""
    _say(
        f"All {len(ratios)} answers: median {statistics.median(ratios):.2f}x, from {min(ratios):.2f}x "
        f"to {max(ratios):.2f}x, {total:.2f}x over their time together{verdict}; "
        f"{identical}/{len(ratios)} identical."
    )


def _say(line: str) -> None:
    """A line of the demo, flushed: a pipe shows it now, not when a buffer fills."""
    print(line, flush=True)


# Asked once by each path before the timed questions, and about none of them.
_WARM_UP = "What is this text about?"
# While the plain path decodes unseen, a line at least this often (seconds).
_QUIET_LINE_EVERY = 10.0


def _answer(
    stream: AnswerStream,
    out: TextIO,
    max_new_tokens: int,
    debug: bool = False,
    engine: Engine | None = None,
) -> Answer:
    """Stream an answer to ``out``, then its sources and stats; return it."""
    answer = _stream_answer(stream, out, max_new_tokens, debug, engine)
    s = answer.stats
    out.write(
        f"[{s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, {s.tokens_per_step:.2f} tokens per "
        f"forward, {s.steps} forwards]\n"
    )
    if debug:
        out.write(_undrafted_line(s) + "\n")
    return answer


def _undrafted_line(stats: DecodeStats) -> str:
    """The steps that verified no draft, by why (`DecodeStats.undrafted_steps`)."""
    if not stats.undrafted_steps:
        return "[every forward verified a draft]"
    counts = ", ".join(f"{count} {reason}" for reason, count in sorted(stats.undrafted_steps.items()))
    off = stats.drafting_off_reason
    lead = f"drafting off ({off}): " if off else ""
    return f"[{lead}forwards without a draft: {counts}]"


def _stream_answer(
    stream: AnswerStream,
    out: TextIO,
    max_new_tokens: int,
    debug: bool = False,
    engine: Engine | None = None,
) -> Answer:
    """Stream an answer to ``out`` (its notes first), then its sources; return it."""
    for note in stream.notes:
        out.write(f"note: {note}\n")
    with stream:
        if debug and engine is not None:
            _debug_steps(stream, engine, out)
        else:
            for text in stream:
                out.write(text)
                out.flush()
        answer = stream.answer()
    out.write("\n")
    if _was_cut(answer):
        out.write(_cut_mark(max_new_tokens) + "\n")
    _print_sources(answer, out)
    out.flush()
    return answer


def _was_cut(answer: Answer) -> bool:
    return answer.stats.finish_reason == "length"


def _cut_mark(max_new_tokens: int) -> str:
    return f"[cut at --max-new-tokens {max_new_tokens}: the answer may be incomplete]"


def _debug_steps(stream: AnswerStream, engine: Engine, out: TextIO) -> None:
    """Each step's drafted tokens as ``[source|text]``, then the model's own token (special
    tokens left out, as in the plain answer)."""

    def decode(ids: list[int]) -> str:
        return str(engine.tokenizer.decode(ids, skip_special_tokens=True))

    for n, chunk in enumerate(stream.chunks()):
        stats = stream.stats
        step = n - 1  # the first chunk is the prefill's token, which belongs to no step
        if not chunk.token_ids or step < 0 or step >= stats.steps:
            out.write(chunk.text)
            continue
        accepted = stats.accepted_per_step[step]
        drafted = decode(chunk.token_ids[:accepted]) if accepted else ""
        own = decode(chunk.token_ids[accepted:])
        out.write(f"[{stats.draft_sources[step]}|{drafted}]{own}" if drafted else own)
        out.flush()


def _print_sources(answer: Answer, out: TextIO) -> None:
    if not answer.sources:
        out.write("sources: none (the answer is not grounded in the index)\n")
        return
    out.write("sources:\n")
    for i, hit in enumerate(answer.sources, 1):
        snippet = " ".join(hit.chunk.text.split())[:90]
        score = "keyword match" if hit.similarity is None else f"similarity {hit.similarity:.2f}"
        out.write(f"  [{i}] {source_label(hit.chunk)} ({score}): {snippet}...\n")
