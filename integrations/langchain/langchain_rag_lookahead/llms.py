"""`LookaheadLLM`: a LangChain text-completion model over the lookahead engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import ConfigDict

from langchain_rag_lookahead._base import LookaheadSettings, Piece, areported, reported, usage
from rag_lookahead import DecodeStats
from rag_lookahead.protocol import openai_logprobs
from rag_lookahead.streaming import TokenLogprob

__all__ = ["LookaheadLLM"]


class LookaheadLLM(LookaheadSettings, BaseLLM):
    """Completion model running a local Hugging Face model with lossless lookahead decoding.

    The prompt string is tokenized as it is (no chat template; use `ChatLookahead` for chat
    models). Only the new text comes back; each generation's ``generation_info`` carries
    ``usage_metadata``, ``model_name``, ``finish_reason`` and the ``lookahead`` stats.

    Example:
        ```python
        from langchain_rag_lookahead import LookaheadLLM

        llm = LookaheadLLM(model="/models/my-causal-lm", max_tokens=64)
        llm.invoke("The lighthouse at Alexandria", stop=["."])
        ```
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    @property
    def _llm_type(self) -> str:
        return "rag-lookahead"

    _ls_model_type: ClassVar[Literal["chat", "llm"]] = "llm"

    # BaseLLM.batch runs every prompt through one `_generate` call with the first prompt's run
    # manager only; one call per prompt on a thread pool keeps callbacks and runs per prompt.
    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[str]:
        """Invoke on each input, on a thread pool of ``max_concurrency`` workers."""
        return Runnable.batch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[str]:
        """Invoke asynchronously on each input, at most ``max_concurrency`` at a time."""
        return await Runnable.abatch(self, inputs, config, return_exceptions=return_exceptions, **kwargs)

    # With several prompts LangChain hands over the first prompt's run manager only, so tokens
    # are reported for a single prompt (`batch` makes one call per prompt).

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        reporter = run_manager if len(prompts) == 1 else None
        return self._result(
            [[_merge(list(reported(self._chunks(p, stop, run_manager, kwargs), reporter)))] for p in prompts]
        )

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        reporter = run_manager if len(prompts) == 1 else None
        generations = []
        for prompt in prompts:
            chunks = areported(self._chunks(prompt, stop, run_manager, kwargs), reporter)
            generations.append([_merge([c async for c in chunks])])
        return self._result(generations)

    def _chunks(
        self,
        prompt: str,
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> Iterator[GenerationChunk]:
        _, pieces = self._open("completion", prompt, stop, run_manager, kwargs)
        return self._generation_chunks(pieces)

    def _generation_chunks(self, pieces: Iterator[Piece]) -> Iterator[GenerationChunk]:
        """A chunk per piece of text, then the stats' chunk.

        The log probabilities, when asked for, come whole in the stats' chunk's
        ``generation_info``, in OpenAI's legacy completion shape.
        """
        logprobs: list[TokenLogprob] | None = None
        for piece in pieces:
            if isinstance(piece, DecodeStats):
                info = {**self._response_metadata(piece), "usage_metadata": usage(piece)}
                if logprobs is not None:
                    info["logprobs"] = openai_logprobs("completion", logprobs)
                yield GenerationChunk(text="", generation_info=info)
                continue
            if piece.logprobs is not None:
                logprobs = logprobs or []
                logprobs += piece.logprobs
            if piece.text:
                yield GenerationChunk(text=piece.text)

    def _result(self, generations: list[list[Generation]]) -> LLMResult:
        totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        for (generation,) in generations:
            counts = (generation.generation_info or {}).get("usage_metadata", {})
            for key in totals:
                totals[key] += counts.get(key, 0)
        return LLMResult(
            generations=generations, llm_output={"model_name": self.model_name, "token_usage": totals}
        )


def _merge(chunks: list[GenerationChunk]) -> Generation:
    text = "".join(chunk.text for chunk in chunks)
    info = chunks[-1].generation_info if chunks else None
    return Generation(text=text, generation_info=info)
