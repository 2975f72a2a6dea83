"""The grouped attention of the engine's CPU forwards: transformers' SDPA results, no head copies."""

from __future__ import annotations

import pytest
import torch

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime import attention
from rag_lookahead.runtime.attention import (
    ATTENTION_NAME,
    attention_used,
    grouped_sdpa_attention,
    ragged_rows,
)
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.testing import FAMILIES, tiny_model


class _Module(torch.nn.Module):
    num_key_value_groups = 3


@pytest.mark.parametrize("width", [1, 2, 5])
def test_masked_grouped_attention_equals_repeated_heads(width: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    query = torch.randn(2, 6, width, 8)  # [B, H, T, D]
    key, value = torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)  # [B, KV, L, D]
    mask = torch.zeros(2, 1, width, 11)
    mask[0, :, :, 7:] = torch.finfo(torch.float32).min  # row 0 is shorter
    grouped, _ = grouped_sdpa_attention(_Module(), query, key, value, mask, scaling=0.3)
    plain, _ = sdpa_attention_forward(_Module(), query, key, value, mask, scaling=0.3)
    assert grouped.shape == plain.shape == (2, width, 6, 8)
    torch.testing.assert_close(grouped, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
def test_the_engine_attends_grouped_only_within_its_forwards(family: str) -> None:
    """A batch of two rows with trees through the runner (grouped) and through the model
    called directly (transformers' SDPA): the same logits; outside, the model is as it was."""
    model = tiny_model(family)
    assert model.config._attn_implementation == "sdpa"
    assert attention_used(model, torch.device("cpu")) == ATTENTION_NAME
    assert attention_used(model, torch.device("cuda")) == "sdpa"
    logits = [
        _batch_logits(model, ([3, 14, 15, 9], [2, 7, 1]), through_runner) for through_runner in (True, False)
    ]
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_the_runners_forwards_select_the_grouped_attention() -> None:
    model = tiny_model("llama")
    seen: list[str] = []
    attention = model.model.layers[0].self_attn
    hook = attention.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    try:
        ModelRunner(model).forward(torch.tensor([[3, 14, 15]]), new_tree_cache())
        model(input_ids=torch.tensor([[3, 14, 15]]))
    finally:
        hook.remove()
    assert seen == [ATTENTION_NAME, "sdpa"]  # the runner's forward, then the model called directly


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("groups", [1, 3])
def test_ragged_rows_attend_their_own_columns_with_the_padded_result(width: int, groups: int) -> None:
    """Row 1 uses 4 of 20 columns: within `ragged_rows` each row is attended over its own span
    (the padded columns, hidden, weigh nothing), the same output as the padded batch."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = _Module()
    module.num_key_value_groups = groups
    torch.manual_seed(1)
    query = torch.randn(2, 2 * groups, width, 8)  # [B, H, T, D]
    key, value = torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8)  # [B, KV, L, D]
    mask = torch.zeros(2, 1, width, 20)
    mask[1, :, :, 4:] = torch.finfo(torch.float32).min  # row 1: its 4 columns only
    calls: list[int] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return kernel(*args, **kwargs)  # type: ignore[arg-type]

    padded, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    with pytest.MonkeyPatch.context() as patch, ragged_rows([20, 4]):
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
        ragged, _ = grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3)
    assert len(calls) == 2  # a call per row
    torch.testing.assert_close(ragged, padded, rtol=1e-6, atol=1e-6)


def test_rows_of_like_lengths_stay_one_call() -> None:
    # 2 x 20 columns read for 19 + 17 used: not worth a call per row.
    query, key = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 20, 8)
    with ragged_rows([20, 17]):
        assert attention._split_rows(query, key, plain=False) is None
    with ragged_rows([20, 4]):
        assert attention._split_rows(query, key, plain=False) == (20, 4)
        assert attention._split_rows(query, key, plain=True) is None  # softcapping, biases: as is
        assert attention._split_rows(query[:1], key[:1], plain=False) is None  # not these rows
    assert attention._split_rows(query, key, plain=False) is None  # outside a batched forward


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
def test_a_batch_of_a_long_and_a_short_row_gives_each_rows_logits(family: str) -> None:
    """Through the runner (rows attended ragged: 3 + 4 of 40 + 4 columns) and through the model
    called directly (padded): the same logits."""
    model = tiny_model(family)
    prompts = ([3 + i % 40 for i in range(40)], [2, 7, 1])
    ragged, padded = (_batch_logits(model, prompts, through_runner) for through_runner in (True, False))
    torch.testing.assert_close(ragged, padded, rtol=1e-5, atol=1e-5)


def _batch_logits(
    model: torch.nn.Module, prompts: tuple[list[int], ...], through_runner: bool
) -> torch.Tensor:
    """A step of two trees over a batch of ``prompts``, through the runner (its attention) or
    the model called directly (transformers' SDPA, padded)."""
    runner = ModelRunner(model)
    drafts = [StepDraft(DraftTree((7, 8, 9, 10), (-1, 0, 1, 0))), StepDraft(DraftTree((1, 2), (-1, 0)))]
    batch = BatchCache()
    for prompt in prompts:
        cache = new_tree_cache()
        runner.forward(torch.tensor([prompt]), cache, last_only=True)
        batch.add_row(cache)
    batch.prepare()
    inputs = batch_inputs(drafts, batch.lengths, runner.device, torch.float32)
    if through_runner:
        return runner.forward_batch(inputs, batch.cache, batch.lengths)
    with torch.inference_mode():
        out = model(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            attention_mask=inputs.attention_mask,
            cache=batch.cache,
            use_cache=True,
        )
    return out.logits
