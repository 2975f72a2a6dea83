"""The one translation core between OpenAI-style requests and the engine.

A request (a mapping, as a server or an adapter receives it) becomes one frozen `CallPlan`
(`plan_chat`, `plan_completion`), or a `RequestError` naming the parameter at fault, its
sampling options read as `GenerationParams` by the module that also writes them back
(`openai_to_params`, `params_to_openai`); the
engine's text and `DecodeStats` become OpenAI's reply objects and stream chunks (`reply`,
`ReplyStream`), as plain dicts. A front end that builds its own prompt (an adapter's
message objects) plans its call's options the same way (`plan_call`), and reads a streamed
reply that may call tools off the same `HeldReply`, and keeps a run's scopes as they do
(`RunScopes`); its ``timeout`` bounds a local call the same way (`within_deadline`). Its
engine comes from `rag_lookahead.frontends`.
The core never imports this package; the remote client imports its sampling mapping.
"""

from rag_lookahead.protocol.deadline import within_deadline
from rag_lookahead.protocol.errors import RequestError
from rag_lookahead.protocol.logprobs import openai_logprobs
from rag_lookahead.protocol.options import OPTION_KEYS, plan_call
from rag_lookahead.protocol.replies import FINISH_REASONS, ReplyHeader, ReplyStream, reply, usage
from rag_lookahead.protocol.requests import CallKind, CallPlan, ToolPlan, plan_chat, plan_completion
from rag_lookahead.protocol.run_scopes import RunScopes
from rag_lookahead.protocol.sampling import MAX_STOP_STRINGS, openai_to_params, params_to_openai
from rag_lookahead.protocol.streaming import HeldReply

__all__ = [
    "FINISH_REASONS",
    "MAX_STOP_STRINGS",
    "OPTION_KEYS",
    "CallKind",
    "CallPlan",
    "HeldReply",
    "ReplyHeader",
    "ReplyStream",
    "RequestError",
    "RunScopes",
    "ToolPlan",
    "openai_logprobs",
    "openai_to_params",
    "params_to_openai",
    "plan_call",
    "plan_chat",
    "plan_completion",
    "reply",
    "usage",
    "within_deadline",
]
