"""A call as an OpenAI API request: which endpoint, and its body.

Chat messages go to ``/chat/completions``, where the server formats them with the model's chat
template; text and token ids go to ``/completions`` as they are. The sampling fields are
`GenerationParams` written back as OpenAI's (`params_to_openai`). Those beyond the OpenAI
API's own (``top_k``, ``repetition_penalty``, stop token ids) go in the body's extra fields
on vLLM and SGLang, which take them, and are refused for other servers rather than dropped,
since dropping them would change the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, cast

from rag_lookahead.config import GenerationParams
from rag_lookahead.prompts import Prompt, read_prompt
from rag_lookahead.protocol.sampling import params_to_openai
from rag_lookahead.remote.config import ServerConfig
from rag_lookahead.structured.grammar import Grammar

__all__ = ["Request", "build_request", "is_chat", "normalise_prompt", "prompt_text", "with_documents"]

Endpoint = Literal["chat", "completions"]

ServerPrompt = str | list[int] | list[dict[str, str]]


@dataclass(frozen=True)
class Request:
    """One streamed request: the endpoint and the keyword arguments of its ``create`` call."""

    endpoint: Endpoint
    kwargs: dict[str, Any]

    def with_fields(self, fields: Mapping[str, Any]) -> Request:
        """This request with ``fields`` added to its body (the client's ``extra_body``)."""
        if not fields:
            return self
        extra = {**self.kwargs.get("extra_body", {}), **fields}
        return Request(self.endpoint, {**self.kwargs, "extra_body": extra})


def normalise_prompt(prompt: Prompt) -> ServerPrompt:
    """Text, token ids or chat messages, in the shapes the API takes (as `encode_prompt` reads them)."""
    kind, value = read_prompt(prompt)
    if not value:
        raise ValueError("the prompt is empty")
    if kind == "chat":
        return [_message(m) for m in value]
    if kind == "ids" and any(t < 0 for t in value):
        raise ValueError("token ids must be non-negative")
    return cast(ServerPrompt, value)


def _message(message: Mapping[str, Any]) -> dict[str, str]:
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        raise TypeError(f"a chat message has a string 'role' and 'content', got {dict(message)!r}")
    return {"role": role, "content": content}


def is_chat(prompt: ServerPrompt) -> TypeGuard[list[dict[str, str]]]:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def prompt_text(prompt: ServerPrompt, tokenizer: Any) -> str:
    """The prompt's text, to look for documents in (token ids need the tokenizer)."""
    if isinstance(prompt, str):
        return prompt
    if is_chat(prompt):
        return "\n".join(m["content"] for m in prompt)
    if tokenizer is None:
        raise ValueError(
            "documents= with a token-id prompt needs the model's tokenizer to check that the "
            "prompt shows them: pass ServerEngine(tokenizer=...), or pass the prompt as text"
        )
    return str(tokenizer.decode(prompt))


def with_documents(prompt: ServerPrompt, documents: Sequence[str], tokenizer: Any) -> ServerPrompt:
    """``prompt`` with ``documents`` appended: to the text, to the last user message, or as
    token ids after the prompt's."""
    block = "\n\n" + "\n\n".join(documents)
    if isinstance(prompt, str):
        return prompt + block
    if is_chat(prompt):
        messages = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise ValueError("documents can only be appended to a chat prompt with a user message")
        messages[users[-1]]["content"] += block
        return messages
    if tokenizer is None:
        raise ValueError(
            "appending documents to a token-id prompt needs the model's tokenizer: pass "
            "ServerEngine(tokenizer=...), or pass the prompt as text"
        )
    return [*cast(list[int], prompt), *tokenizer(block, add_special_tokens=False).input_ids]


def _constrain(config: ServerConfig, grammar: Grammar, kwargs: dict[str, Any], extra: dict[str, Any]) -> None:
    """``grammar`` as the server's structured-output fields: JSON through the OpenAI
    ``response_format`` every kind takes, a regular expression through vLLM's or SGLang's own
    field; a grammar of other kinds has no request field to go in. Its ``closes_in_budget``
    has no field either: the server's own grammar library decodes, as it does."""
    if grammar.kind == "json_schema":
        schema = {"name": "answer", "schema": json.loads(grammar.value)}
        kwargs["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif grammar.kind == "json":
        kwargs["response_format"] = {"type": "json_object"}
    elif grammar.kind == "regex" and config.kind == "vllm":
        extra["structured_outputs"] = {"regex": grammar.value}
    elif grammar.kind == "regex" and config.kind == "sglang":
        extra["regex"] = grammar.value
    else:
        raise NotImplementedError(
            f"a {grammar.kind!r} grammar has no request field on a {config.kind!r} server "
            "(JSON schemas and JSON go as response_format, regular expressions to vLLM and SGLang)"
        )


# The sampling fields beyond the OpenAI API's that `rag-lookahead serve` takes.
_LOOKAHEAD_EXTRA = frozenset({"top_k", "repetition_penalty"})


def _check_extra(config: ServerConfig, extra: Mapping[str, Any]) -> None:
    """Refuse the fields a server would ignore (answering otherwise) or refuse."""
    if config.kind == "openai":
        raise ValueError(
            f"{', '.join(sorted(extra))} are not OpenAI API fields, and a kind='openai' server "
            "may ignore them and answer otherwise; use kind='vllm' or 'sglang' if it takes them"
        )
    unknown = sorted(set(extra) - _LOOKAHEAD_EXTRA)
    if config.kind == "rag-lookahead" and unknown:
        raise ValueError(
            f"a rag-lookahead server takes no {', '.join(unknown)} (a call's own eos_token_id): "
            "use the served model's end of sequence"
        )


def build_request(config: ServerConfig, prompt: ServerPrompt, params: GenerationParams) -> Request:
    """The streamed request for ``prompt`` with ``params`` on this server."""
    fields, extra = params_to_openai(params, chat=is_chat(prompt))
    kwargs: dict[str, Any] = {
        "model": config.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }
    if params.eos_token_id is not None:
        # The call's EOS replaces the model's, as in the local engine.
        extra.update(ignore_eos=True, stop_token_ids=list(params.eos_token_id))
    if params.grammar is not None:
        _constrain(config, params.grammar, kwargs, extra)
    if extra:
        _check_extra(config, extra)
        kwargs["extra_body"] = extra
    if is_chat(prompt):
        return Request("chat", {**kwargs, "messages": prompt})
    return Request("completions", {**kwargs, "prompt": prompt})
