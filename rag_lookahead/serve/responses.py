"""``POST /v1/responses``: a Responses request answered as the chat call it means
(`plan_response`), behind the same walls as chat (admission, auth, body limits,
disconnects), in the Responses shapes: a response object, or named server-sent events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rag_lookahead.protocol.replies import ReplyHeader
from rag_lookahead.protocol.responses import ResponseEvents, ResponsePlan, response_object
from rag_lookahead.serve.calls import ReplyEvents
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats

__all__ = ["ResponsesShape"]


class ResponsesShape:
    """How a Responses request is answered (a `ReplyShape`): its response object, or its
    events, each named by its type (``event: response.output_text.delta``), with no
    ``[DONE]`` (OpenAI sends none on this route)."""

    def __init__(self, plan: ResponsePlan, header: ReplyHeader) -> None:
        self._plan = plan
        self._header = header

    def whole(self, reply: dict[str, Any]) -> dict[str, Any]:
        return response_object(self._plan, self._header, reply)

    def events(self) -> ReplyEvents:
        return _NamedEvents(ResponseEvents(self._plan, self._header))


class _NamedEvents:
    """`ResponseEvents` as server-sent events."""

    def __init__(self, out: ResponseEvents) -> None:
        self._out = out

    def start(self) -> list[dict[str, str]]:
        return _named(self._out.start())

    def add(self, text: str, logprobs: Sequence[TokenLogprob] | None) -> list[dict[str, str]]:
        return _named(self._out.add(text, logprobs))

    def end(self, stats: DecodeStats) -> list[dict[str, str]]:
        return _named(self._out.end(stats))

    def failed(self, error: dict[str, Any]) -> list[dict[str, str]]:
        return _named(self._out.failed(error))


def _named(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"event": event["type"], "data": json.dumps(event, ensure_ascii=False)} for event in events]
