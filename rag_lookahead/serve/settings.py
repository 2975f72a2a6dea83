"""How the local server runs: a frozen, validated `ServeSettings`."""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_lookahead.config import GenerationParams

__all__ = ["ServeSettings", "check_api_key"]

_MAX_DRAIN_S = 3600  # an hour: only there to refuse absurd values (and NaN)
_MAX_CORPUS_TTL_S = 7 * 24 * 3600  # a week: only there to refuse absurd values (and NaN)
_MAX_READ_S = 3600  # the read timeouts' bound: only there to refuse absurd values (and NaN)


def _count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")


def _seconds(name: str, value: object, most: float, *, zero: bool) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= 0 if zero else value > 0)  # NaN fails both
        or not value <= most
    ):
        bounds = f"from 0 to {most}" if zero else f"above 0, at most {most}"
        raise ValueError(f"{name} must be a number of seconds {bounds}, got {value!r}")


def check_api_key(key: object, name: str) -> None:
    """Refuse an API key that no client can send as it is: ``Authorization: Bearer <key>`` is
    an ASCII header whose value's surrounding spaces are not part of it (``name`` says where
    the key came from, for the error)."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"{name} must be a non-empty string (or None for no key)")
    if not all(" " <= char <= "~" for char in key):
        raise ValueError(
            f"{name} must be printable ASCII (letters, digits, punctuation): an HTTP header "
            "carries no other characters, so no client could send this key"
        )
    if key != key.strip():
        raise ValueError(
            f"{name} must not start or end with a space: a header's value is read without "
            "them, so no client could send this key"
        )


@dataclass(frozen=True)
class ServeSettings:
    """The server's settings.

    Attributes:
        model_name: The name ``/v1/models`` lists and requests must name (``None``: the
            engine's model name).
        api_key: When set, every ``/v1`` route and ``/metrics`` need
            ``Authorization: Bearer <api_key>``; ``/health`` never does.
        max_body_bytes: The largest request body read (documents included); larger is HTTP 413.
        max_running: Most requests generating at once (the engine batches them).
        max_waiting: Most requests waiting for a running slot; one more is HTTP 429.
        retry_after_s: The ``Retry-After`` a 429 answer gives, in seconds.
        drain_s: Seconds running requests get to finish once the server is told to stop
            (`rag_lookahead.serve.run_app`), while new ones get 503; what still runs then is
            cut (a stream ends with an error event, a whole reply is a 503); ``0`` cuts at once.
        defaults: Generation settings of what a request leaves out (greedy by default).
        corpus_ttl_s: Seconds a corpus (``POST /v1/corpora``) lives unused before the server
            removes it, so that a client that dies cannot grow the trie; a request may ask for
            less. A call using a corpus keeps it alive to its end.
        max_corpora: Most corpora alive at once; one more is HTTP 429.
        max_corpus_bytes: Most bytes (UTF-8) of documents all live corpora hold together; a
            corpus larger on its own is HTTP 413, one that fits only once others go is 429.
        header_timeout_s: Seconds a request's headers may take to arrive in full, from its
            first byte (a new connection's: from its opening); the connection is closed after
            (`run_app`'s server only).
        body_timeout_s: Seconds a request's body may take to arrive in full once its headers
            are in; a slower one is HTTP 408 and its connection closed.
        min_body_rate: Bytes a second a request's body must keep up once its first
            ``body_rate_grace_s`` are over: ``t`` seconds after its headers, at least
            ``(t - body_rate_grace_s) * min_body_rate`` of its bytes have come, else HTTP 408
            and its connection closed, so that a body dripped a byte at a time holds its
            connection for the grace, not for ``body_timeout_s``; ``0``: no minimum.
        body_rate_grace_s: Seconds a request's body has before ``min_body_rate`` applies.
        keep_alive_s: Seconds an idle connection stays open between requests
            (`run_app`'s server only).
        max_connections: Most connections open at once; one more is answered 503 and closed
            (`run_app`'s server only).
        embedder: The sentence-transformers model directory ``/v1/embeddings`` serves, named
            by this path (``None``: the built-in all-MiniLM-L6-v2); loaded on the first request
            for vectors.
    """

    model_name: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = 4 << 20
    max_running: int = 8
    max_waiting: int = 64
    retry_after_s: int = 1
    drain_s: float = 30.0
    defaults: GenerationParams = field(default_factory=GenerationParams)
    corpus_ttl_s: float = 600.0
    max_corpora: int = 256
    max_corpus_bytes: int = 64 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    min_body_rate: int = 1024
    body_rate_grace_s: float = 5.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    embedder: str | None = None

    def __post_init__(self) -> None:
        if self.model_name is not None and (not isinstance(self.model_name, str) or not self.model_name):
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")
        if self.api_key is not None:
            check_api_key(self.api_key, "api_key")
        _count("max_body_bytes", self.max_body_bytes, 1)
        _count("max_running", self.max_running, 1)
        _count("max_waiting", self.max_waiting, 0)
        _count("retry_after_s", self.retry_after_s, 1)
        _seconds("drain_s", self.drain_s, _MAX_DRAIN_S, zero=True)
        _seconds("corpus_ttl_s", self.corpus_ttl_s, _MAX_CORPUS_TTL_S, zero=False)
        _count("max_corpora", self.max_corpora, 1)
        _count("max_corpus_bytes", self.max_corpus_bytes, 1)
        _seconds("header_timeout_s", self.header_timeout_s, _MAX_READ_S, zero=False)
        _seconds("body_timeout_s", self.body_timeout_s, _MAX_READ_S, zero=False)
        _count("min_body_rate", self.min_body_rate, 0)
        _seconds("body_rate_grace_s", self.body_rate_grace_s, _MAX_READ_S, zero=True)
        _seconds("keep_alive_s", self.keep_alive_s, _MAX_READ_S, zero=False)
        _count("max_connections", self.max_connections, 1)
        if self.embedder is not None and (not isinstance(self.embedder, str) or not self.embedder):
            raise ValueError(
                f"embedder must be a model directory (a non-empty string), got {self.embedder!r}"
            )
        if not isinstance(self.defaults, GenerationParams):
            raise TypeError(f"defaults must be GenerationParams, got {type(self.defaults).__name__}")
