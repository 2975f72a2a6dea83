"""`ChatLookahead`: a LangChain chat model over the lookahead engine.

Messages are prompted through the model's own chat template.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import ConfigDict

from langchain_rag_lookahead._base import LookaheadSettings, Piece, usage
from rag_lookahead.streaming import aiterate

__all__ = ["ChatLookahead", "to_chat_messages"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool", "function": "function"}


class ChatLookahead(LookaheadSettings, BaseChatModel):
    """Chat model running a local Hugging Face model with lossless lookahead decoding.

    Drafts come from a token trie of the prompt, the documents retrieved in the same chain run
    (see `LookaheadCallbackHandler`) or passed as ``documents=``, and past answers; the model
    verifies each draft in one forward pass, so greedy answers equal plain greedy decoding.

    Example:
        ```python
        from langchain_rag_lookahead import ChatLookahead

        llm = ChatLookahead(max_tokens=128)  # the embedded SmolLM2-135M-Instruct
        llm.invoke("What is a lighthouse?", documents=[passage])
        ```

    Construction never loads the model; the first call does (``get_engine()``). Messages go
    through the model's chat template (``rag_lookahead.prompts.encode_prompt``), and only the
    new text comes back. Call-time options: ``stop``, ``documents``, ``max_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``seed``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    @property
    def _llm_type(self) -> str:
        return "rag-lookahead-chat"

    _ls_model_type: ClassVar[Literal["chat", "llm"]] = "chat"

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for piece in self._open(to_chat_messages(messages), stop, run_manager, kwargs):
            chunk = self._chunk(piece)
            # LangChain reports streamed chunks itself and passes no run manager then.
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        pieces = self._open(to_chat_messages(messages), stop, run_manager, kwargs)
        async for piece in aiterate(pieces):
            chunk = self._chunk(piece)
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The prompt's tokens as the model sees them, offline.

        The messages go through the chat template: the ``input_tokens`` a call reports.
        """
        if tools:
            # What the base class does too: this model takes no tool schemas.
            warnings.warn("ChatLookahead takes no tools; counting the messages only", stacklevel=2)
        return len(self.get_engine().encode(to_chat_messages(messages)))

    def _chunk(self, piece: Piece) -> ChatGenerationChunk:
        if isinstance(piece, str):
            return ChatGenerationChunk(message=AIMessageChunk(content=piece))
        # The stats come once, last: usage and metadata are counted exactly once when merged.
        metadata = self._response_metadata(piece)
        message = AIMessageChunk(
            content="",
            usage_metadata=usage(piece),  # type: ignore[arg-type]
            response_metadata=metadata,
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message, generation_info=metadata)


def to_chat_messages(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as ``{"role", "content"}`` dicts for the model's chat template."""
    converted = []
    for message in messages:
        role = message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type)
        if role is None:
            raise ValueError(f"unsupported message type {message.type!r}")
        content = message.content
        if isinstance(content, list):
            kinds = {str(b.get("type")) for b in content if isinstance(b, dict)} - {"text"}
            if kinds:
                raise ValueError(f"ChatLookahead takes text only; got content blocks {sorted(kinds)}")
        converted.append({"role": role, "content": message.text})
    return converted
