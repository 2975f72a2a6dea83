"""The one translation core between OpenAI-style requests and the engine.

A request (a mapping, as a server or an adapter receives it) becomes one frozen `CallPlan`
(`plan_chat`, `plan_completion`), or a `RequestError` naming the parameter at fault; the
engine's text and `DecodeStats` become OpenAI's reply objects and stream chunks (`reply`,
`ReplyStream`), as plain dicts. A front end that builds its own prompt (an adapter's
message objects) plans its call's options the same way (`plan_call`), and reads a streamed
reply that may call tools off the same `HeldReply`, and names the model as the others do
(`display_name`), and keeps a run's scopes as they do (`RunScopes`). Its engine comes from
what its user gave, checked and resolved the same way (`EngineSource`), and its ``timeout``
bounds a local call the same way (`within_deadline`).
The core never imports this package.
"""

from rag_lookahead.protocol.deadline import within_deadline
from rag_lookahead.protocol.engines import EngineSource, plain_engine
from rag_lookahead.protocol.errors import RequestError
from rag_lookahead.protocol.logprobs import openai_logprobs
from rag_lookahead.protocol.names import display_name
from rag_lookahead.protocol.options import OPTION_KEYS, plan_call
from rag_lookahead.protocol.replies import FINISH_REASONS, ReplyHeader, ReplyStream, reply, usage
from rag_lookahead.protocol.requests import (
    MAX_STOP_STRINGS,
    CallKind,
    CallPlan,
    ToolPlan,
    plan_chat,
    plan_completion,
)
from rag_lookahead.protocol.run_scopes import RunScopes
from rag_lookahead.protocol.streaming import HeldReply

__all__ = [
    "FINISH_REASONS",
    "MAX_STOP_STRINGS",
    "OPTION_KEYS",
    "CallKind",
    "CallPlan",
    "EngineSource",
    "HeldReply",
    "ReplyHeader",
    "ReplyStream",
    "RequestError",
    "RunScopes",
    "ToolPlan",
    "display_name",
    "openai_logprobs",
    "plain_engine",
    "plan_call",
    "plan_chat",
    "plan_completion",
    "reply",
    "usage",
    "within_deadline",
]
