"""How the local server runs: a frozen, validated `ServeSettings`."""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_lookahead.config import GenerationParams

__all__ = ["ServeSettings"]

_MAX_DRAIN_S = 3600  # an hour: only there to refuse absurd values (and NaN)


def _count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")


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
            (`rag_lookahead.http.run_app`); ``0`` ends them at once.
        defaults: Generation settings of what a request leaves out (greedy by default).
    """

    model_name: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = 4 << 20
    max_running: int = 8
    max_waiting: int = 64
    retry_after_s: int = 1
    drain_s: float = 30.0
    defaults: GenerationParams = field(default_factory=GenerationParams)

    def __post_init__(self) -> None:
        if self.model_name is not None and (not isinstance(self.model_name, str) or not self.model_name):
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string (or None for no key)")
        _count("max_body_bytes", self.max_body_bytes, 1)
        _count("max_running", self.max_running, 1)
        _count("max_waiting", self.max_waiting, 0)
        _count("retry_after_s", self.retry_after_s, 1)
        drain = self.drain_s
        if isinstance(drain, bool) or not isinstance(drain, (int, float)) or not 0 <= drain <= _MAX_DRAIN_S:
            raise ValueError(f"drain_s must be a number of seconds from 0 to {_MAX_DRAIN_S}, got {drain!r}")
        if not isinstance(self.defaults, GenerationParams):
            raise TypeError(f"defaults must be GenerationParams, got {type(self.defaults).__name__}")
