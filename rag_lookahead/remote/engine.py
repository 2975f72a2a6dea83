"""`ServerEngine`: the local engine's calls over a vLLM, SGLang, rag-lookahead or other
OpenAI-compatible server.

The server decodes (and drafts, with its own speculative decoding); this engine turns the calls
into streamed OpenAI API requests through the ``openai`` client, which also does timeouts and
retries, and turns the answers back into `TextStream`s with `DecodeStats`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rag_lookahead.config import GenerationParams
from rag_lookahead.engine.scope import document_texts
from rag_lookahead.interface import EngineBase, check_scope
from rag_lookahead.prompts import Prompt, SpecialText, encode_prompt
from rag_lookahead.remote.call import ReadLimits, ServerCall
from rag_lookahead.remote.config import ServerConfig, ServerKind
from rag_lookahead.remote.corpus import CallDocuments, CorpusClient, LookaheadCorpora, SGLangCorpora
from rag_lookahead.remote.metrics import SpeculationCounters, parse_speculation_counters
from rag_lookahead.remote.requests import (
    Request,
    ServerPrompt,
    build_request,
    normalise_prompt,
    prompt_text,
    with_documents,
)
from rag_lookahead.remote.scope import ServerScope
from rag_lookahead.streaming.stats import StepRecorder
from rag_lookahead.streaming.stream import TextStream

__all__ = ["ServerEngine"]

_INSTALL_HINT = "pip install 'rag-lookahead[server]'"
# Servers started without --api-key accept any bearer token; the client insists on one.
_NO_KEY = "EMPTY"
# The most characters a token may decode to when the served model's tokenizer is not given: far
# above the longest token of any vocabulary in use, and a call's text is cut only when its
# tokens average more than this (real text averages a few characters).
_FALLBACK_CHARS_PER_TOKEN = 1024
# The error code of a request naming a corpus the server does not have (rag-lookahead's).
_CORPUS_GONE = "corpus_not_found"
# Tools would need the served model's tool parser and a grammar on the server's side.
_NO_TOOLS = (
    "tools are not supported on a server engine yet: the server would render and parse them "
    "itself (vLLM's --tool-call-parser); use a local LookaheadEngine for tool calls"
)


class ServerEngine(EngineBase):
    """`stream`, `complete` and `scope` of `LookaheadEngine`, answered by a serving engine.

    ``kind`` says what the server does with documents: SGLang (``--speculative-algorithm
    NGRAM``) drafts from external corpora, so a call's ``documents=`` and a scope's documents
    are loaded into the server for their life and removed after it; ``rag-lookahead serve
    --backend local`` (``kind="rag-lookahead"``) takes a call's ``documents=`` in its request
    and a scope's as a corpus (``POST /v1/corpora`` when the scope gets its first documents,
    named by each of its calls, deleted when it closes); vLLM's ``ngram`` and ``suffix``
    drafters, and any other server, see only the prompt, so documents must already be in it
    (an error otherwise, unless ``append_documents_to_prompt``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        kind: ServerKind = "openai",
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        deadline: float | None = None,
        max_retries: int = 2,
        append_documents_to_prompt: bool = False,
        context_window: int | None = None,
        tokenizer: Any = None,
    ) -> None:
        """Connect lazily to the server at ``base_url`` (see `ServerConfig` for each setting).

        ``tokenizer``, the served model's (an object, or a local directory to load offline),
        is needed only for token-id prompts with documents and for `RagPipeline`, which fits
        its sources to the context window in tokens. Its longest token also bounds the text
        read for a call: a server that sends more than ``max_new_tokens`` tokens can hold is
        cut there (finish reason ``"length"``).
        """
        self.config = ServerConfig(
            base_url=base_url,
            model=model,
            kind=kind,
            api_key=api_key,
            timeout=timeout,
            deadline=deadline,
            max_retries=max_retries,
            append_documents_to_prompt=append_documents_to_prompt,
            context_window=context_window,
        )
        self._tokenizer = _load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self._chars_per_token = _chars_per_token(self._tokenizer)
        self._client = _openai_client(self.config)
        self._corpus = _corpus_client(self.config, self._client)

    def __repr__(self) -> str:
        return f"ServerEngine({self.config.base_url!r}, {self.config.model!r}, kind={self.config.kind!r})"

    # ------------------------------------------------------------------ what adapters read

    @property
    def model_name(self) -> str:
        return self.config.model

    @property
    def context_window(self) -> int | None:
        return self.config.context_window

    @property
    def chat(self) -> bool:
        """Always: the server formats chat messages with the served model's template."""
        return True

    @property
    def drafts_from_documents(self) -> bool:
        """Only SGLang and rag-lookahead draft from documents that are not in the prompt."""
        return self._corpus is not None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def encode(self, prompt: Prompt, *, tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """``prompt``'s token ids by the served model's tokenizer (given at construction)."""
        if tools:
            raise NotImplementedError(_NO_TOOLS)
        if self._tokenizer is None:
            raise ValueError("this server engine has no tokenizer: pass ServerEngine(tokenizer=MODEL_DIR)")
        return encode_prompt(self._tokenizer, prompt, special_text=self._special_text)

    @functools.cached_property
    def _special_text(self) -> SpecialText:
        """The tokenizer's special tokens, found once (message text spelling one stays text)."""
        return SpecialText.of(self._tokenizer)

    @property
    def client(self) -> Any:
        """The ``openai.OpenAI`` client every request goes through."""
        return self._client

    @property
    def supports_plain(self) -> bool:
        """Never: the server decides its own speculative decoding (`plain` says what to do)."""
        return False

    def plain(self) -> ServerEngine:
        raise ValueError(
            "a server decides its own speculative decoding: to compare with plain decoding, "
            "start a second server without it and connect another ServerEngine"
        )

    # ------------------------------------------------------------------ public calls

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: ServerScope | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> TextStream:
        """Generate for ``prompt`` on the server, yielding new text as it arrives.

        The request is sent now: an HTTP error (after the client's retries) is raised here,
        an error in the middle of the stream while it is read. Closing the stream (or
        dropping it) closes the HTTP response, which the server takes as a cancellation.
        Chunks carry no token ids (the API sends text); with ``logprobs=True`` they carry the
        server's log probabilities (see `rag_lookahead.remote.logprobs`). The answer is checked
        as it is read (stop strings, the text ``max_new_tokens`` can hold, the config's
        ``deadline``), since a server may ignore what it was asked; see `ServerCall`.
        A ``prediction`` goes as OpenAI's ``prediction`` field to a rag-lookahead or OpenAI
        server; vLLM and SGLang have no such field (an error).
        """
        if tools:
            raise NotImplementedError(_NO_TOOLS)
        params = (params or GenerationParams()).with_overrides(**overrides)
        predicted = _prediction_field(self.config, prediction)
        texts = [t for t in document_texts(documents) if t]
        server_prompt = normalise_prompt(prompt)
        check_scope(scope, self)
        if self._corpus is None:
            shown = [*(scope.documents if scope is not None else ()), *texts]
            server_prompt = self._documents_in_prompt(server_prompt, shown)
            texts = []
        request = build_request(self.config, server_prompt, params)  # refused before any load
        request = request.with_fields(predicted)
        limits = self._limits(params)
        sent = CallDocuments()
        if self._corpus is not None:
            sent = self._corpus.for_call(texts, scope.corpus_ids if scope is not None else ())
            request = request.with_fields(sent.fields)
        release = functools.partial(self._release, sent.corpus_id)
        call = ServerCall(StepRecorder(prompt_tokens=0), release, limits)
        try:
            call.response = self._send(request, texts, scope)
            call.check_deadline()
        except BaseException as err:
            call.end()
            if isinstance(err, Exception):
                call.check_deadline()  # a deadline passed while waiting is the error to raise
            raise
        return TextStream(call.steps(), call.recorder, cancel=call.end)

    def scope(self, documents: Iterable[str] = ()) -> ServerScope:
        """Documents for several calls: on SGLang and rag-lookahead loaded into the server now
        and removed when the scope closes (use it in a ``with`` block); elsewhere checked
        against each prompt."""
        scope = ServerScope(self, self._corpus)
        scope.add(documents)
        return scope

    def list_corpora(self) -> dict[str, int]:
        """SGLang's loaded external corpora and their token counts (all clients' corpora)."""
        if not isinstance(self._corpus, SGLangCorpora):
            raise ValueError(f"external corpora are SGLang's; this server is kind={self.config.kind!r}")
        return self._corpus.list()

    def speculation_counters(self) -> SpeculationCounters:
        """vLLM's server-wide speculative-decoding counters; subtract two readings to measure a
        run (only that run's when nothing else ran on the server meanwhile)."""
        if self.config.kind != "vllm":
            raise ValueError(f"these are vLLM's counters; this server is kind={self.config.kind!r}")
        text = self._client.get(f"{self.config.root_url}/metrics", cast_to=str)
        return parse_speculation_counters(text)

    # ------------------------------------------------------------------ helpers

    def _send(self, request: Request, texts: list[str], scope: ServerScope | None) -> Any:
        """The streamed response to ``request``. A scope's corpus that the server no longer
        has (a rag-lookahead corpus left unused past its TTL) is loaded again, and the request
        sent once more: drafts never change the answer, and the scope's calls keep theirs."""
        create = self._client.chat.completions if request.endpoint == "chat" else self._client.completions
        try:
            return create.create(**request.kwargs, **self._request_timeout())
        except Exception as err:
            gone = getattr(err, "status_code", None) == 404 and getattr(err, "code", None) == _CORPUS_GONE
            if not gone or scope is None or self._corpus is None:
                raise
        scope.reload()
        request = request.with_fields(self._corpus.for_call(texts, scope.corpus_ids).fields)
        return create.create(**request.kwargs, **self._request_timeout())

    def _documents_in_prompt(self, prompt: ServerPrompt, documents: list[str]) -> ServerPrompt:
        """``prompt``, checked to show ``documents``, or with the missing ones appended."""
        if not documents:
            return prompt
        text = prompt_text(prompt, self._tokenizer)
        missing = list(dict.fromkeys(d for d in documents if d not in text))
        if not missing:
            return prompt
        if not self.config.append_documents_to_prompt:
            raise ValueError(
                f"{len(missing)} document(s) are not in the prompt, and a {self.config.kind} server "
                "drafts only from the prompt: put them in the prompt, or set "
                "append_documents_to_prompt=True (which changes the prompt, and so the answer)"
            )
        return with_documents(prompt, missing, self._tokenizer)

    def _limits(self, params: GenerationParams) -> ReadLimits:
        return ReadLimits(
            server=self.config.base_url,
            max_new_tokens=params.max_new_tokens,
            chars_per_token=self._chars_per_token,
            stop_strings=tuple(params.stop_strings),
            deadline=self.config.deadline,
            logprobs=params.logprobs,
        )

    def _request_timeout(self) -> dict[str, float]:
        """Each try of the request waits at most the deadline for the answer to start."""
        deadline = self.config.deadline
        return {} if deadline is None else {"timeout": min(self.config.timeout, deadline)}

    def _release(self, corpus_id: str | None) -> None:
        """Remove the call's corpus, and retry earlier ones that failed. Never raises: the call
        ends here (after its answer, or from a finaliser), and a failure is retried later."""
        if self._corpus is None or (corpus_id is None and not self._corpus.stranded):
            return
        failure = self._corpus.remove_all([corpus_id] if corpus_id is not None else [])
        if failure is not None:
            self._corpus.warn(failure, "a call")


def _prediction_field(config: ServerConfig, prediction: str | None) -> dict[str, Any]:
    """A call's ``prediction`` as the request field of OpenAI's Predicted Outputs."""
    if prediction is None or prediction == "":
        return {}
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a string, got {type(prediction).__name__}")
    if config.kind not in ("rag-lookahead", "openai"):
        raise ValueError(
            f"a {config.kind} server has no predicted outputs (OpenAI's prediction field): "
            "leave the prediction out, or use a rag-lookahead server or a local engine"
        )
    return {"prediction": {"type": "content", "content": prediction}}


def _corpus_client(config: ServerConfig, client: Any) -> CorpusClient | None:
    """What loads documents into this kind of server (``None``: documents go in the prompt)."""
    if config.kind == "sglang":
        return SGLangCorpora(client, config.root_url)
    if config.kind == "rag-lookahead":
        return LookaheadCorpora(client, config.base_url)
    return None


def _openai_client(config: ServerConfig) -> Any:
    try:
        import openai
    except ImportError:
        raise ImportError(f"ServerEngine needs the openai package: {_INSTALL_HINT}") from None
    return openai.OpenAI(
        base_url=config.base_url,
        api_key=config.api_key or _NO_KEY,
        timeout=config.timeout,
        max_retries=config.max_retries,
    )


def _chars_per_token(tokenizer: Any) -> int:
    """The most characters one token can add to decoded text.

    A vocabulary entry spells its token with at least one character per character of text
    (byte-level BPE spells each byte as a character, and a UTF-8 character is one byte or
    more; SentencePiece's "▁" is one space; a byte-fallback entry is six characters for one
    byte); one more covers the space a decoder may put between tokens.
    """
    vocab = getattr(tokenizer, "get_vocab", None)
    entries = vocab() if callable(vocab) else None
    if not isinstance(entries, Mapping) or not entries:
        return _FALLBACK_CHARS_PER_TOKEN
    return max(len(str(entry)) for entry in entries) + 1


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
