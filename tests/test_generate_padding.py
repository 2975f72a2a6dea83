"""The `generate` drop-in against `model.generate` on a batch padded either way: left padding
gives the same tensor; right padding (SmolLM2's tokenizer's default) does not, because
`model.generate` continues a right-padded row after its padding, where the drop-in decodes every
row without it. What the README's padding note says."""

import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, tiny_model

TEXTS = ["The capital of France is", "Hi"]
KWARGS = {"max_new_tokens": 8, "do_sample": False}


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    tokenizer = ascii_fast_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    model.generation_config.pad_token_id = ASCII_VOCAB
    return LookaheadEngine(model, tokenizer, LookaheadConfig(mode="trie"))


def alone(engine: LookaheadEngine, text: str) -> list[int]:
    """One row's new tokens from `model.generate` without any padding."""
    single = engine.tokenizer([text], return_tensors="pt")
    out = engine.model.generate(**single, **KWARGS)
    return out[0, single["input_ids"].shape[1] :].tolist()


def test_left_padding_gives_what_model_generate_gives(engine) -> None:
    engine.tokenizer.padding_side = "left"
    batch = engine.tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert torch.equal(engine.generate(**batch, **KWARGS), engine.model.generate(**batch, **KWARGS))


def test_right_padding_differs_from_model_generate_for_the_shorter_row(engine) -> None:
    engine.tokenizer.padding_side = "right"
    batch = engine.tokenizer(TEXTS, return_tensors="pt", padding=True)
    width = batch["input_ids"].shape[1]
    got = engine.generate(**batch, **KWARGS)
    want = engine.model.generate(**batch, **KWARGS)
    assert torch.equal(got[:, :width], want[:, :width])  # the inputs, padding kept, either way
    assert torch.equal(got[0], want[0])  # the longest row has no padding
    # The short row: the drop-in continues its text, model.generate its padding.
    assert got[1, width:].tolist()[: len(alone(engine, TEXTS[1]))] == alone(engine, TEXTS[1])
    assert not torch.equal(got[1], want[1])
