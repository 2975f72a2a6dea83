"""A front end's call (LangChain's, LlamaIndex's) as one `CallPlan`, read as a request is.

A front end builds the prompt from its own message objects; its call's options (its settings,
then the call's own arguments over them) are a request's keys, read by the same code as a
server's request (`plan_chat`, `plan_completion`): the same accepted values, the same
`RequestError` texts, temperature 0 greedy. The keys that only a request carries (its prompt,
the model it names, the server's corpus, how it streams, whether it echoes the prompt) are the
front end's own business, unknown here (``echo: false`` is accepted, as what it does anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag_lookahead.config import GenerationParams
from rag_lookahead.interface import Engine
from rag_lookahead.prompts import Prompt
from rag_lookahead.protocol.requests import (
    _CHAT_KEYS,
    _COMPLETION_KEYS,
    _COMPLETION_NEUTRAL,
    _NEUTRAL,
    CallKind,
    CallPlan,
    _checked_keys,
    plan_body,
)

__all__ = ["OPTION_KEYS", "plan_call"]

_REQUEST_ONLY = frozenset({"messages", "prompt", "model", "corpus", "n", "stream", "stream_options", "echo"})
# A front end returns the new text alone: OpenAI's ``echo`` (the prompt before it, scored) is a
# server's, taken with the value that changes nothing only.
_ECHO_OFF = {"echo": False}

#: The options a front end's call takes, by the kind of call.
OPTION_KEYS: Mapping[CallKind, frozenset[str]] = {
    "chat": _CHAT_KEYS - _REQUEST_ONLY,
    "completion": _COMPLETION_KEYS - _REQUEST_ONLY,
}


def plan_call(
    kind: CallKind,
    prompt: Prompt,
    options: Mapping[str, Any],
    engine: Engine | None = None,
    defaults: GenerationParams | None = None,
) -> CallPlan:
    """The plan of a call of ``prompt`` (built by the front end) with ``options``.

    ``engine`` is read for a chat's tools (its chat template); ``defaults`` fill what the
    options leave out. A key that is not an option is a `RequestError` whose ``code`` is
    ``"unknown_parameter"``.
    """
    neutral = _NEUTRAL if kind == "chat" else {**_COMPLETION_NEUTRAL, **_ECHO_OFF}
    return plan_body(kind, prompt, _checked_keys(options, OPTION_KEYS[kind], neutral), engine, defaults)
