"""The one translation core between OpenAI-style requests and the engine.

A request (a mapping, as a server or an adapter receives it) becomes one frozen `CallPlan`
(`plan_chat`, `plan_completion`), or a `RequestError` naming the parameter at fault; the
engine's text and `DecodeStats` become OpenAI's reply objects and stream chunks (`reply`,
`ReplyStream`), as plain dicts. A library's LLM class plans its calls the same way
(`plan_call`) and streams replies through the same `ReplyText`. The core never imports
this package.
"""

from rag_lookahead.adapters.errors import RequestError
from rag_lookahead.adapters.llm_calls import ReplyText, display_name, plan_call
from rag_lookahead.adapters.replies import FINISH_REASONS, ReplyHeader, ReplyStream, reply, usage
from rag_lookahead.adapters.requests import (
    MAX_STOP_STRINGS,
    CallKind,
    CallPlan,
    ToolPlan,
    plan_chat,
    plan_completion,
)

__all__ = [
    "FINISH_REASONS",
    "MAX_STOP_STRINGS",
    "CallKind",
    "CallPlan",
    "ReplyHeader",
    "ReplyStream",
    "ReplyText",
    "RequestError",
    "ToolPlan",
    "display_name",
    "plan_call",
    "plan_chat",
    "plan_completion",
    "reply",
    "usage",
]
