"""Retrieval-augmented answers: retrieve chunks, prompt with them, draft from them, stream.

Each question's retrieved chunks reach the trie as branches owned by that call, inserted before
it generates and eliminated when it ends (also on an error, a cancelled or an abandoned stream):
the chunks the prompt shows as part of the prompt, the ones it has no room for as documents.
Concurrent questions never draft from each other's documents; the model's own past answers stay
in the trie and help later questions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_lookahead.config import GenerationParams, LookaheadConfig
from rag_lookahead.interface import Engine
from rag_lookahead.loading import LoadKeywords, LoadOptions
from rag_lookahead.prompts import RAG_SYSTEM, check_history, conversation_messages
from rag_lookahead.rag.chunking import Chunk
from rag_lookahead.rag.index import DocumentIndex, Hit
from rag_lookahead.rag.retrieval import RetrievalConfig
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.streaming.stream import StreamChunk, TextStream

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Answer", "AnswerStream", "History", "PreparedQuery", "RagPipeline", "RetrievalConfig"]

NO_SOURCES = "No relevant documents were found for this question."

# Earlier ``(question, answer)`` turns of a conversation, oldest first.
History = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class PreparedQuery:
    """A question ready for the engine: its prompt, the sources in it and its draft documents."""

    question: str
    prompt_ids: list[int]
    sources: tuple[Hit, ...]  # the chunks the prompt shows, best first
    documents: tuple[str, ...]  # retrieved chunks the prompt has no room for: extra draft branches
    notes: tuple[str, ...] = ()  # what the user should know (no sources, cut sources)


@dataclass(frozen=True)
class Answer:
    """A finished answer with its sources and the engine's stats."""

    question: str
    text: str
    sources: tuple[Hit, ...]
    stats: DecodeStats
    notes: tuple[str, ...] = ()

    @property
    def grounded(self) -> bool:
        """Whether the answer was given with sources from the index."""
        return bool(self.sources)


@dataclass
class AnswerStream(Iterator[str]):
    """The answer's text as it is decided; the sources and notes are known from the start."""

    query: PreparedQuery
    stream: TextStream

    @property
    def sources(self) -> tuple[Hit, ...]:
        return self.query.sources

    @property
    def notes(self) -> tuple[str, ...]:
        return self.query.notes

    @property
    def stats(self) -> DecodeStats:
        return self.stream.stats

    def __iter__(self) -> AnswerStream:
        return self

    def __next__(self) -> str:
        return next(self.stream)

    def chunks(self) -> Iterator[StreamChunk]:
        """(token ids, text) per decoding step, for views that show where tokens came from."""
        return self.stream.chunks()

    def close(self) -> None:
        """Stop generating and release the question's trie branches."""
        self.stream.close()

    def __enter__(self) -> AnswerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def answer(self) -> Answer:
        """Run to the end and return the whole answer."""
        completion = self.stream.complete()
        q = self.query
        return Answer(q.question, completion.text, q.sources, completion.stats, q.notes)


class RagPipeline:
    """Questions answered from a `DocumentIndex` by a `LookaheadEngine`, or by a server through
    `rag_lookahead.remote.ServerEngine` (given the served model's tokenizer).

    Thread-safe for concurrent questions: the engine serialises model forwards and trie updates,
    and the index is only read.
    """

    def __init__(
        self,
        engine: Engine,
        index: DocumentIndex,
        config: RetrievalConfig | None = None,
        *,
        system_prompt: str | None = RAG_SYSTEM,
    ) -> None:
        if engine.tokenizer is None:
            # The prompt is formatted and fitted to the context window here, in tokens.
            raise ValueError(
                "RagPipeline needs the model's tokenizer to fit sources to the context window: "
                "pass ServerEngine(..., tokenizer=MODEL_DIR)"
            )
        self.engine = engine
        self.index = index
        self.config = config or RetrievalConfig()
        self.system_prompt = system_prompt

    @classmethod
    def from_pretrained(
        cls,
        index: DocumentIndex,
        name_or_path: str | None = None,
        config: RetrievalConfig | None = None,
        *,
        system_prompt: str | None = RAG_SYSTEM,
        lookahead_config: LookaheadConfig | None = None,
        load: LoadOptions | None = None,
        **loading: Unpack[LoadKeywords],
    ) -> RagPipeline:
        """A pipeline over ``index`` with a model loaded offline, your way.

        The model loads as ``load`` (`LoadOptions`) says, or as the same options given one by
        one (``name_or_path`` is `LoadOptions.model`), e.g.
        ``chat_template_kwargs={"enable_thinking": False}`` so that a Qwen3 model answers
        without a thinking block; ``lookahead_config`` is the engine's drafting settings.
        """
        options = LoadOptions.of(load, name_or_path, **loading)
        from rag_lookahead.engine import LookaheadEngine  # torch loads with the model only

        engine = LookaheadEngine.from_pretrained(config=lookahead_config, load=options)
        return cls(engine, index, config, system_prompt=system_prompt)

    def retrieve(self, question: str) -> list[Hit]:
        """The relevant chunks for ``question``, best first (possibly none)."""
        if not len(self.index):
            raise ValueError("the index holds no documents; add some with `rag-lookahead index`")
        hits = self.index.search(question, self.config.top_k, self.config.mode)
        return [hit for hit in hits if hit.similarity is None or hit.similarity >= self.config.min_score]

    def prepare(self, question: str, max_new_tokens: int, history: History = ()) -> PreparedQuery:
        """Retrieve, and build the prompt through the chat template within the token budget.

        ``history``'s oldest turns are dropped (with a note) while the prompt with the best
        source would not fit: the sources come before the conversation. A history of anything
        but ``(question, answer)`` pairs of strings is an error before anything is retrieved.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question is empty")
        history = check_history(history)
        hits = self.retrieve(question)
        budget = self._budget(max_new_tokens)
        turns, notes = self._fit_history(question, hits[:1], history, budget)
        if not hits:
            ids = self._encode(question, NO_SOURCES, turns)
            note = f"{NO_SOURCES} The answer is not grounded in the index."
            return PreparedQuery(question, ids, (), (), (*notes, note))
        shown, cut = self._fit(question, hits, budget, turns)
        if not shown:
            raise ValueError("the question alone fills the context window; shorten it")
        ids = self._encode(question, format_sources(shown), turns)
        # The prompt's branches already hold what it shows; the rest feeds drafts as documents.
        in_full = {h.chunk.id for h in shown}
        documents = tuple(h.chunk.text for h in hits if h.chunk.id not in in_full)
        return PreparedQuery(question, ids, tuple(shown), documents, (*notes, *cut))

    def stream(
        self,
        question: str,
        params: GenerationParams | None = None,
        *,
        history: History = (),
        **overrides: Any,
    ) -> AnswerStream:
        """Answer ``question`` (after the conversation's earlier ``(question, answer)`` turns in
        ``history``, oldest first), streaming the text; sources and notes are on the returned stream."""
        params = (params or GenerationParams()).with_overrides(**overrides)
        query = self.prepare(question, params.max_new_tokens, history)
        # An engine that drafts only from the prompt (vLLM) is not given what the prompt left out.
        documents = query.documents if self.engine.drafts_from_documents else ()
        return AnswerStream(query, self.engine.stream(query.prompt_ids, params, documents=documents))

    def ask(
        self,
        question: str,
        params: GenerationParams | None = None,
        *,
        history: History = (),
        **overrides: Any,
    ) -> Answer:
        """Blocking `stream`."""
        with self.stream(question, params, history=history, **overrides) as stream:
            return stream.answer()

    def _encode(self, question: str, context: str, history: History = ()) -> list[int]:
        """The prompt's ids, ``history`` checked already (`prepare`)."""
        return self.engine.encode(conversation_messages(question, context, self.system_prompt, history))

    def _fit_history(
        self, question: str, best: list[Hit], history: History, budget: int | None
    ) -> tuple[History, list[str]]:
        """The latest turns of ``history`` that fit ``budget`` with the question and ``best``:
        the prompt the oldest turns dropped one at a time would leave, found in O(log n)
        prompts no longer than twice the one kept (a turn less never lengthens a prompt)."""
        if budget is None:
            return history, []

        def fits(count: int) -> bool:
            return self._measure(question, best, history[len(history) - count :]) <= budget

        kept = history[len(history) - _most_that_fit(len(history), fits) :]
        dropped = len(history) - len(kept)
        if not dropped:
            return kept, []
        note = f"The {dropped} oldest turn(s) of the conversation were left out to fit the context window."
        return kept, [note]

    def _budget(self, max_new_tokens: int) -> int | None:
        window = self.engine.context_window
        room = None if window is None else window - max_new_tokens
        limits = [x for x in (room, self.config.max_context_tokens) if x is not None]
        return min(limits) if limits else None

    def _fit(
        self, question: str, hits: list[Hit], budget: int | None, history: History = ()
    ) -> tuple[list[Hit], list[str]]:
        """As many sources as fit ``budget`` prompt tokens; the first that does not is cut to fit."""
        shown: list[Hit] = []
        for hit in hits:
            if budget is None or self._measure(question, [*shown, hit], history) <= budget:
                shown.append(hit)
                continue
            notes = []
            cut = self._trim(question, shown, hit, budget, history)
            if cut is not None:
                shown.append(cut)
                notes.append(
                    f"Source [{len(shown)}] ({source_label(hit.chunk)}) was cut from "
                    f"{len(hit.chunk.text)} to {len(cut.chunk.text)} characters to fit the context window."
                )
            left = len(hits) - len(shown)
            if left:
                notes.append(f"{left} retrieved source(s) did not fit the context window and were left out.")
            return shown, notes
        return shown, []

    def _measure(self, question: str, hits: list[Hit], history: History = ()) -> int:
        return len(self._encode(question, format_sources(hits) if hits else NO_SOURCES, history))

    def _trim(self, question: str, shown: list[Hit], hit: Hit, budget: int, history: History) -> Hit | None:
        """``hit`` cut to the tokens that still fit after ``shown``, or None if none do."""
        encoded = self.engine.tokenizer(hit.chunk.text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [end for _, end in encoded.offset_mapping]  # where each token's text ends
        keep = len(ends)
        for _ in range(4):  # a cut text may tokenize a little differently in the prompt: re-measure
            over = self._measure(question, [*shown, _prefix(hit, ends[keep - 1])], history) - budget
            if over <= 0:
                return _prefix(hit, ends[keep - 1])
            keep -= over
            if keep < 1:
                return None
        return None


def _most_that_fit(count: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``1..count`` with ``fits(n)`` (0 if none), for a ``fits`` true up to
    some ``n`` and false after it: doubling ``n`` from 1, then halving the gap, so that it asks
    about O(log n) values, none past twice the answer."""
    if count < 1:
        return 0
    fitting, n = 0, 1
    while n < count and fits(n):
        fitting, n = n, 2 * n
    if n >= count:
        if fits(count):
            return count
        n = count
    while n - fitting > 1:  # fits(fitting) (or fitting is 0) and not fits(n)
        middle = (fitting + n) // 2
        fitting, n = (middle, n) if fits(middle) else (fitting, middle)
    return fitting


def _prefix(hit: Hit, end: int) -> Hit:
    chunk = hit.chunk
    cut = Chunk.make(chunk.source, chunk.text[:end], chunk.start, chunk.start + end, chunk.headings)
    return Hit(cut, hit.score, hit.similarity)


def format_sources(hits: list[Hit] | tuple[Hit, ...]) -> str:
    """The prompt's context: numbered sources, each headed by its document's name and headings."""
    return "\n\n".join(f"[{i}] {source_label(h.chunk)}\n{h.chunk.text}" for i, h in enumerate(hits, 1))


def source_label(chunk: Chunk) -> str:
    """The source's short name and the chunk's heading path: ``stdlib.md § textwrap > dedent``."""
    name = source_name(chunk.source)
    return f"{name} § {' > '.join(chunk.headings)}" if chunk.headings else name


def source_name(source: str) -> str:
    """A short name for a chunk's source: the file name (with a ``#record`` suffix if any)."""
    path, sep, record = source.partition("#")
    return Path(path).name + sep + record
