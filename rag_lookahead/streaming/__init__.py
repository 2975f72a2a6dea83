"""Streaming: text chunks out of the engine's steps, stopping, stats, and an asyncio bridge."""

from rag_lookahead.streaming.aio import aiterate
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats, FinishReason, StepRecorder, UndraftedReason
from rag_lookahead.streaming.stopping import Released, Stopping
from rag_lookahead.streaming.stream import Completion, StreamChunk, TextStream

__all__ = [
    "Completion",
    "DecodeStats",
    "FinishReason",
    "Released",
    "StepRecorder",
    "Stopping",
    "StreamChunk",
    "TextStream",
    "TokenLogprob",
    "UndraftedReason",
    "aiterate",
]
