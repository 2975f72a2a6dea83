"""Replies in OpenAI's shapes, as plain dicts, from an engine's text and `DecodeStats`.

A whole reply (``chat.completion`` / ``text_completion``) and a streamed one
(``chat.completion.chunk`` / ``text_completion`` chunks) say the same: when the plan parses
tool calls, the streamed text is held back from where a call may begin (see
`ToolFormat.content_end`) and that rest is parsed at the end, exactly as the whole reply is.
``usage`` carries the decode stats under ``"lookahead"``. A call that asked for ``logprobs``
has them in each choice (and each chunk, with the text they came with: a token whose text is
held back has its log probability in the chunk that shows it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag_lookahead.protocol.logprobs import LogprobsOut, openai_logprobs
from rag_lookahead.protocol.requests import CallKind, CallPlan
from rag_lookahead.protocol.streaming import HeldReply
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.structured import ParsedReply

__all__ = ["FINISH_REASONS", "ReplyHeader", "ReplyStream", "reply", "usage"]

# OpenAI's finish reasons; the engine's own stays in ``usage.lookahead.finish_reason``.
FINISH_REASONS = {
    "eos": "stop",
    "stop_string": "stop",
    "length": "length",
    "context_window": "length",
    "abandoned": "stop",
}
_OBJECTS = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECTS = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_ID_PREFIXES = {"chat": "chatcmpl", "completion": "cmpl"}


@dataclass(frozen=True)
class ReplyHeader:
    """What every object of one reply repeats: its id, creation time and model."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: CallKind, model: str) -> ReplyHeader:
        """A fresh id (``chatcmpl-...`` or ``cmpl-...``), created now."""
        return cls(f"{_ID_PREFIXES[kind]}-{uuid.uuid4().hex}", int(time.time()), model)

    def fields(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


def usage(stats: DecodeStats) -> dict[str, Any]:
    """Token counts as OpenAI's ``usage``, and the decode stats under ``"lookahead"``.

    ``completion_tokens_details`` counts a prediction's tokens as `DecodeStats` does, as OpenAI
    defines them: accepted, those that appear in the answer; rejected, the others (both 0
    without a prediction). Unlike OpenAI, ``completion_tokens`` counts the answer's tokens only,
    not the rejected ones. ``lookahead.undrafted_steps`` counts the steps that verified no
    draft by why, and ``lookahead.drafting_off_reason`` says why none did where none did
    (`DecodeStats.undrafted_steps`, `DecodeStats.drafting_off_reason`).
    """
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens,
        },
        "lookahead": {
            "steps": stats.steps,
            "tokens_per_step": stats.tokens_per_step,
            "accepted_draft_tokens": sum(stats.accepted_per_step),
            "drafted_tokens": sum(stats.drafted_per_step),
            "acceptance_rate": stats.acceptance_rate,
            "finish_reason": stats.finish_reason,
            "undrafted_steps": dict(stats.undrafted_steps),
            "drafting_off_reason": stats.drafting_off_reason,
        },
    }


def reply(
    plan: CallPlan,
    header: ReplyHeader,
    text: str,
    stats: DecodeStats,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, Any]:
    """The whole reply to ``plan``: its ``text`` generated, its ``stats``, and the log
    probabilities of its tokens when the plan asks for them."""
    shape = openai_logprobs(plan.kind, logprobs or ()) if plan.params.logprobs else None
    if plan.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": shape}
        finish = _finish_reason(stats, False)
    else:
        held = HeldReply(plan.tools.format)
        message, called = _message(held.add(text), held.end())
        choice = {"index": 0, "message": message, "logprobs": shape}
        finish = _finish_reason(stats, called)
    choice["finish_reason"] = finish
    return {**header.fields(_OBJECTS[plan.kind]), "choices": [choice], "usage": usage(stats)}


class ReplyStream:
    """The chunks of one streamed reply: `start`, `add` for each piece of text, then `end`."""

    def __init__(self, plan: CallPlan, header: ReplyHeader) -> None:
        self._plan = plan
        self._header = header
        self._held = HeldReply(plan.tools.format if plan.kind == "chat" else None)
        self._logprobs = LogprobsOut(plan.kind, plan.params.logprobs)

    def start(self) -> list[dict[str, Any]]:
        """The chunks before any text: a chat reply's role."""
        if self._plan.kind == "chat":
            return [self._chunk({"role": "assistant", "content": ""})]
        return []

    def add(self, text: str, logprobs: Sequence[TokenLogprob] | None = None) -> list[dict[str, Any]]:
        """The chunks for ``text``, the next piece of the reply, and its tokens' ``logprobs``
        (none while it is held back)."""
        self._logprobs.add(logprobs)
        piece = self._held.add(text)
        if not piece:
            return []
        return [self._chunk({"content": piece} if self._plan.kind == "chat" else piece)]

    def end(self, stats: DecodeStats) -> list[dict[str, Any]]:
        """The last chunks: what was held back (parsed for tool calls), the finish reason, and
        the usage chunk when the plan asks for it."""
        chunks: list[dict[str, Any]] = []
        rest = self._held.end()
        called = False
        if self._plan.kind == "chat":
            message, called = _message("", rest)
            delta = {k: v for k, v in message.items() if k != "role" and v}
            if delta:
                chunks.append(self._chunk(_indexed(delta)))
        elif rest.content:
            chunks.append(self._chunk(rest.content))
        chunks.append(self._chunk({} if self._plan.kind == "chat" else "", _finish_reason(stats, called)))
        if self._plan.include_usage:
            chunks.append(
                {**self._header.fields(_CHUNK_OBJECTS[self._plan.kind]), "choices": [], "usage": usage(stats)}
            )
        return chunks

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        choice.update({"delta": delta} if isinstance(delta, dict) else {"text": delta})
        choice.update({"logprobs": self._logprobs.take(), "finish_reason": finish_reason})
        chunk = {**self._header.fields(_CHUNK_OBJECTS[self._plan.kind]), "choices": [choice]}
        if self._plan.include_usage:
            chunk["usage"] = None  # OpenAI's shape: only the last chunk carries it
        return chunk


def _message(shown: str, parsed: ParsedReply) -> tuple[dict[str, Any], bool]:
    """An assistant message of ``shown`` content and the ``parsed`` rest (see `HeldReply`),
    and whether it calls any tool. A block that does not parse is kept under
    ``invalid_tool_calls``."""
    if not (parsed.calls or parsed.invalid):
        return {"role": "assistant", "content": shown + parsed.content}, False
    message: dict[str, Any] = {"role": "assistant", "content": (shown + parsed.content) or None}
    if parsed.calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))},
            }
            for call in parsed.calls
        ]
    if parsed.invalid:
        message["invalid_tool_calls"] = [{"text": bad.text, "error": bad.error} for bad in parsed.invalid]
    return message, bool(parsed.calls)


def _indexed(delta: dict[str, Any]) -> dict[str, Any]:
    """A delta whose tool calls carry their ``index``, as streamed calls do."""
    if "tool_calls" in delta:
        delta = {**delta, "tool_calls": [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]}
    return delta


def _finish_reason(stats: DecodeStats, called: bool) -> str:
    if called:
        return "tool_calls"
    reason = stats.finish_reason
    return FINISH_REASONS[reason] if reason is not None else "stop"
