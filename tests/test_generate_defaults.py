"""The `generate` drop-in samples with what `model.generate` samples with when a parameter is
left unset by the call and by the model's generation config: transformers' own defaults."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.testing import CharTokenizer, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 26]])


@pytest.fixture
def engine() -> LookaheadEngine:
    return LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie"))


def sampled_with(engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> GenerationParams:
    seen: list[GenerationParams] = []
    stream = engine.stream

    def recording(prompt: Any, params: GenerationParams | None = None, **rest: Any) -> Any:
        assert params is not None
        seen.append(params)
        return stream(prompt, params, **rest)

    monkeypatch.setattr(engine, "stream", recording)
    engine.generate(PROMPT, max_new_tokens=2, do_sample=True, seed=0, **kwargs)
    return seen[0]


def test_an_unset_top_k_is_transformers_default(engine, monkeypatch) -> None:
    engine.model.generation_config.top_k = None
    want = engine.model.generation_config._get_default_generation_params()["top_k"]
    assert sampled_with(engine, monkeypatch).top_k == want == 50


def test_a_set_top_k_wins_over_the_default(engine, monkeypatch) -> None:
    engine.model.generation_config.top_k = 7
    assert sampled_with(engine, monkeypatch).top_k == 7
    assert sampled_with(engine, monkeypatch, top_k=3).top_k == 3
