"""``POST /v1/embeddings``: vectors from a sentence-transformers model beside the served model.

A RAG application pointed at the server gets its vectors from the same place as its answers:
the built-in all-MiniLM-L6-v2 (its wheel is a dependency, nothing is downloaded) or the model
directory ``ServeSettings.embedder`` names (``rag-lookahead serve --embedder DIR``). The model is
loaded on the first request for vectors; its torch work (loading, encoding) runs where the
engines' forwards do, in the process's shared `ModelThread` (a single OpenMP team, whatever
thread the request came on). A request's texts are handed over in slices of at most
``slice_tokens`` of the model's tokens (a text longer than that alone), similar lengths
together: the decoding loop steps between two slices, so a running stream goes on while a
thousand texts are embedded, and a request whose client has left (it is cancelled) stops at
the next slice. Each request holds a running slot while it is embedded, as a generating call
does.

OpenAI's request: ``input`` as a string, a list of strings, a list of token ids or a list of
such lists; ``encoding_format`` ``"float"`` or ``"base64"`` (little-endian float32, what the
``openai`` client asks for by default); ``dimensions`` (only the model's own: its vectors are
not shortened); ``user`` (bookkeeping, not acted on). Token ids are OpenAI's: LangChain's
``OpenAIEmbeddings`` sends texts as tiktoken's ``cl100k_base`` ids unless
``check_embedding_ctx_length=False``, so they are decoded with it back to text (tiktoken
fetches the encoding once into its cache if it is not there); where it cannot be loaded, a
request of token ids is refused (400) with that fix, never read as the model's own ids. A
text longer than the model reads is refused too (400), rather than cut without a word.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rag_lookahead.protocol import RequestError
from rag_lookahead.protocol.errors import checked_text
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, Embedder, SentenceTransformerEmbedder
from rag_lookahead.serve.admission import Admission
from rag_lookahead.serve.bodies import known_fields
from rag_lookahead.serve.errors import ApiError

__all__ = ["MAX_INPUTS", "OPENAI_ENCODING", "SLICE_TOKENS", "Embeddings"]

#: The most inputs one request embeds (OpenAI's bound).
MAX_INPUTS = 2048
#: The most tokens of one slice of a request (unless one text is longer): what a running stream
#: waits for at a time, against the steps the embedding waits for between its slices.
SLICE_TOKENS = 1024
#: The tiktoken encoding token-id inputs are read in: OpenAI's embedding models' own.
OPENAI_ENCODING = "cl100k_base"
_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_FORMATS = ("float", "base64")
_TOKEN_IDS_FIX = "send text instead: with LangChain, OpenAIEmbeddings(check_embedding_ctx_length=False, ...)"
T = TypeVar("T")

Inputs = list[str] | list[list[int]]


class Embeddings:
    """The server's embedding model, loaded on first use, and its requests.

    Args:
        source: A model directory (``None``: the built-in all-MiniLM-L6-v2), or an `Embedder`
            already loaded (a `DocumentIndex`'s, say, so that served vectors match the index's).
        slice_tokens: The most tokens (the model's own) embedded in one hand-over to the
            model's thread; a longer text goes alone.
    """

    def __init__(self, source: str | Embedder | None = None, *, slice_tokens: int = SLICE_TOKENS) -> None:
        if isinstance(slice_tokens, bool) or not isinstance(slice_tokens, int) or slice_tokens < 1:
            raise ValueError(f"slice_tokens must be a positive integer, got {slice_tokens!r}")
        self._slice_tokens = slice_tokens
        if isinstance(source, str) or source is None:
            self.name = DEFAULT_EMBEDDER if source is None else source
            self._path: str | None = source
            self._model: Embedder | None = None
        else:
            self.name, self._path, self._model = source.name, None, source
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-lookahead-embedder")
        self._encoding: Any = None
        self._encoding_problem: str | None = None

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in the embedding model's thread: every torch call of it goes through here."""
        context = contextvars.copy_context()
        return await asyncio.wrap_future(self._thread.submit(context.run, work))

    def close(self) -> None:
        """End the model's thread once the work handed to it is done."""
        self._thread.shutdown(wait=False)

    async def answer(self, body: object, admission: Admission) -> dict[str, Any]:
        """The reply to a request ``body``: its vectors in OpenAI's shape, embedded in a
        running slot; a request that cannot be served as it is raises `RequestError` (400).
        Cancelled (its client left), it stops at the next slice and frees its slot."""
        request = _checked(body, self.name)
        slot = await admission.enter()
        try:
            vectors, tokens = await self._embed(request["input"], request["dimensions"])
        finally:
            slot.release()
        encode = _base64 if request["encoding_format"] == "base64" else _floats
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)
            ],
            "model": self.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def _embed(self, inputs: Inputs, dimensions: int | None) -> tuple[np.ndarray, int]:
        """The vectors of ``inputs`` (``[N, D]``) and the tokens the model read of them, each
        slice of texts handed to the model's thread when the one before is back: the running
        calls step in between, and a cancelled request hands nothing more over."""
        model, texts, lengths = await self.run(lambda: self._read(inputs, dimensions))
        vectors = np.empty((len(texts), model.dimension), dtype=np.float32)
        for part in _slices(lengths, self._slice_tokens):
            vectors[part] = await self.run(functools.partial(model.embed, [texts[i] for i in part]))
        return vectors, sum(lengths)

    # ------------------------------------------------------------------ in the model's thread

    def _read(self, inputs: Inputs, dimensions: int | None) -> tuple[Embedder, list[str], list[int]]:
        """The model, ``inputs``' texts and each one's length in its tokens, once the request
        is one it can serve (all of it checked before any text is embedded)."""
        model = self._loaded()
        if dimensions is not None and dimensions != model.dimension:
            raise RequestError(
                f"dimensions={dimensions}: {self.name}'s vectors have {model.dimension} dimensions, "
                "and are not shortened (leave dimensions out)",
                "dimensions",
                "unsupported_value",
            )
        texts = self._texts(inputs)
        lengths = [
            len(ids) for ids in model.tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
        ]
        _check_lengths(lengths, getattr(model, "max_tokens", None), self.name)
        return model, texts, lengths

    def _loaded(self) -> Embedder:
        if self._model is None:
            if self._path is not None and not Path(self._path).expanduser().is_dir():
                raise ApiError(
                    500, f"the embedding model {self._path!r} is not a directory", code="embedder_missing"
                )
            try:
                self._model = SentenceTransformerEmbedder(self._path)
            except Exception as err:  # a broken model directory: the server's fault, said as it is
                raise ApiError(
                    500, f"the embedding model failed to load: {err}", code="embedder_failed"
                ) from None
        return self._model

    def _texts(self, inputs: Inputs) -> list[str]:
        """The texts of ``inputs``: token-id inputs decoded as OpenAI's tokens."""
        if not inputs or isinstance(inputs[0], str):
            return [str(text) for text in inputs]
        encoding = self._openai_encoding()
        vocab = int(encoding.n_vocab)
        for i, ids in enumerate(inputs):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise RequestError(
                    f"input[{i}] holds token id {bad}, outside OpenAI's {OPENAI_ENCODING} vocabulary "
                    f"({vocab} tokens)",
                    f"input[{i}]",
                )
        return [str(encoding.decode(list(ids))) for ids in inputs]

    def _openai_encoding(self) -> Any:
        """tiktoken's `OPENAI_ENCODING`, loaded once (the failure too: it is not retried)."""
        if self._encoding is None and self._encoding_problem is None:
            try:
                import tiktoken

                self._encoding = tiktoken.get_encoding(OPENAI_ENCODING)
            except Exception as err:  # not installed, or not in its cache and not fetched
                self._encoding_problem = f"{type(err).__name__}: {err}"
        if self._encoding is None:
            raise RequestError(
                f"input holds token ids, which are read as OpenAI's {OPENAI_ENCODING} tokens, and "
                f"this server cannot load that encoding with tiktoken ({self._encoding_problem}); "
                + _TOKEN_IDS_FIX,
                "input",
                "token_ids_unsupported",
            )
        return self._encoding


# ---------------------------------------------------------------------------- the request


def _checked(body: object, served: str) -> dict[str, Any]:
    """The request's fields, each checked: ``input`` (as texts or lists of ids), ``dimensions``
    and ``encoding_format``; a model other than ``served`` is HTTP 404."""
    given = known_fields(body, _KEYS, functools.partial(_check_served, served))
    encoding_format = given.get("encoding_format", "float")
    if encoding_format not in _FORMATS:
        raise RequestError(
            f"encoding_format is 'float' or 'base64', got {encoding_format!r}", "encoding_format"
        )
    dimensions = given.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise RequestError(f"dimensions is a positive integer, got {dimensions!r}", "dimensions")
    if "user" in given and not isinstance(given["user"], str):
        raise RequestError("user is a string", "user")
    return {
        "input": _inputs(given.get("input")),
        "encoding_format": encoding_format,
        "dimensions": dimensions,
    }


def _check_served(served: str, model: str) -> None:
    if model != served:
        raise ApiError(
            404,
            f"the model {model!r} gives no embeddings here; this server embeds with {served!r}",
            code="model_not_found",
            param="model",
        )


def _inputs(value: object) -> Inputs:
    """``input`` as texts, or as lists of token ids: one kind per request."""
    if value is None:
        raise RequestError("input is required", "input", "missing_parameter")
    if isinstance(value, str):
        return [checked_text(value, "input")]
    if not isinstance(value, list) or not value:
        raise RequestError(
            "input is a string, a list of strings or a list of token-id lists, non-empty", "input"
        )
    if len(value) > MAX_INPUTS:
        raise RequestError(f"input holds {len(value)} items; at most {MAX_INPUTS} a request", "input")
    if all(_is_id(t) for t in value):
        return [list(value)]
    if all(isinstance(text, str) for text in value):
        return [checked_text(text, f"input[{i}]") for i, text in enumerate(value)]
    for i, ids in enumerate(value):
        if not isinstance(ids, list) or not all(_is_id(t) for t in ids):
            raise RequestError(
                f"input[{i}] is not a list of token ids: input is a string, a list of strings, a list "
                "of token ids or a list of token-id lists, one kind a request",
                f"input[{i}]",
            )
    return [list(ids) for ids in value]


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_lengths(lengths: Sequence[int], limit: int | None, name: str) -> None:
    """Refuse a text longer than the model reads: it would be cut, its vector of a part of it."""
    if limit is None:
        return
    too_long = next((i for i, length in enumerate(lengths) if length > limit), None)
    if too_long is not None:
        raise RequestError(
            f"input[{too_long}] is {lengths[too_long]} tokens long; {name} reads at most {limit} "
            "(its own tokens, special ones included): split the text",
            f"input[{too_long}]",
            "input_too_long",
        )


def _slices(lengths: Sequence[int], most: int) -> list[list[int]]:
    """The texts' indices in slices of at most ``most`` tokens (a longer text alone), longest
    texts first: texts of similar lengths share a slice, as they would a batch, and pad little."""
    slices: list[list[int]] = []
    tokens = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if not slices or tokens + lengths[i] > most:
            slices.append([])
            tokens = 0
        slices[-1].append(i)
        tokens += lengths[i]
    return slices


def _floats(vector: np.ndarray) -> list[float]:
    return [float(x) for x in vector]


def _base64(vector: np.ndarray) -> str:
    """The vector as OpenAI's ``base64`` format: its float32 values' little-endian bytes."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
