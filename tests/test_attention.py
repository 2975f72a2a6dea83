"""The grouped attention of the engine's CPU forwards: transformers' SDPA results, no head copies."""

from __future__ import annotations

import pytest
import torch

from rag_lookahead.config import CpuLinear
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime import attention
from rag_lookahead.runtime.attention import (
    ATTENTION_NAME,
    LAYOUT,
    CausalChunk,
    RaggedRows,
    attention_used,
    grouped_sdpa_attention,
)
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kernels import onednn_available
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.testing import FAMILIES, tiny_model
from rag_lookahead.tuning import ModelTuning


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
    runner = ModelTuning(model, direct=False).runner  # (built first: its probes call the model)
    seen: list[str] = []
    attention = model.model.layers[0].self_attn
    hook = attention.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    try:
        runner.forward(torch.tensor([[3, 14, 15]]), new_tree_cache())
        model(input_ids=torch.tensor([[3, 14, 15]]))
    finally:
        hook.remove()
    assert seen == [ATTENTION_NAME, "sdpa"]  # the runner's forward, then the model called directly


def _chunk_mask(chunk: int, cached: int, boolean: bool = True) -> torch.Tensor:
    """The model's causal mask of a prompt's chunk after ``cached`` columns: ``[1, 1, T, L]``."""
    visible = torch.ones(chunk, cached + chunk, dtype=torch.bool).tril(cached)[None, None]
    hidden = torch.finfo(torch.float32).min
    return visible if boolean else torch.zeros(visible.shape).masked_fill(~visible, hidden)


@pytest.mark.parametrize(("chunk", "cached"), [(5, 1), (5, 5), (12, 7)])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("boolean", [True, False])
def test_a_prompts_chunk_attends_through_the_causal_kernel_with_the_masked_result(
    chunk: int, cached: int, groups: int, boolean: bool
) -> None:
    """In a forward of a `CausalChunk`, a chunk at least as long as the columns cached before it is
    computed by the causal kernel after as many zero queries (no mask): the masked result."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = _Module()
    module.num_key_value_groups = groups
    torch.manual_seed(2)
    query = torch.randn(1, 2 * groups, chunk, 8)  # [1, H, T, D]
    key, value = torch.randn(1, 2, cached + chunk, 8), torch.randn(1, 2, cached + chunk, 8)  # [1, KV, L, D]
    mask = _chunk_mask(chunk, cached, boolean)
    masked, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    seen: list[object] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def watched(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(kwargs.get("attn_mask"))
        return kernel(*args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", watched)
        causal, _ = grouped_sdpa_attention(
            module, query, key, value, mask, scaling=0.3, **{LAYOUT: CausalChunk()}
        )
    assert seen == [None]  # the causal kernel, without the mask
    torch.testing.assert_close(causal, masked, rtol=1e-6, atol=1e-6)


def test_a_chunk_is_taken_as_causal_only_under_its_causal_mask() -> None:
    query, key = torch.randn(1, 6, 5, 8), torch.randn(1, 2, 8, 8)
    mask = _chunk_mask(5, 3)

    def columns(
        query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, **kwargs: object
    ) -> int | None:
        return attention._causal_columns(_Module(), query, key, mask, False, dict(kwargs))

    assert columns(query, key, mask) == 3
    assert columns(query, key[:, :, :5], None) == 0  # a whole prompt: no mask, causal
    assert columns(query, key, None) is None  # no mask over cached columns: not causal
    assert columns(query, key, mask, sliding_window=4) is None  # a windowed layer's mask
    assert columns(torch.randn(2, 6, 5, 8), key.expand(2, -1, -1, -1), mask.expand(2, -1, -1, -1)) is None
    padded_column = mask.clone()
    padded_column[..., 1] = False  # a padding mask hides a column from every row
    assert columns(query, key, padded_column) is None
    assert columns(query, key, torch.ones(1, 1, 5, 8, dtype=torch.bool)) is None  # not causal
    shifted = torch.ones(5, 8, dtype=torch.bool).tril()[None, None]  # aligned to the first column
    assert columns(query, key, shifted) is None
    # Padded with zero queries only where the chunk is at least as long as the cached columns.
    longer = torch.randn(1, 2, 12, 8)
    assert attention._causal_chunk(query, longer, longer, True, None, 7, CausalChunk()) is None


def test_without_a_layout_the_attention_is_transformers_sdpa() -> None:
    """A forward that hands over no `RowLayout` (the attention called as transformers calls it)
    attends as SDPA does: no causal kernel, no call per row."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = _Module()
    torch.manual_seed(4)
    query = torch.randn(2, 6, 5, 8)  # [B, H, T, D]
    key, value = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)  # [B, KV, L, D]
    mask = _chunk_mask(5, 4).expand(2, -1, -1, -1)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    calls: list[object] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def watched(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs.get("attn_mask"))
        return kernel(*args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", watched)
        out, _ = grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3)
    assert len(calls) == 1 and calls[0] is mask  # one masked call for the batch
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_rows_states_without_their_packed_layout_are_refused() -> None:
    """Keys of packed rows reaching the attention without the forward's `PackedRows` (a model
    that does not hand its forward's keywords on): an error, which the probe turns into padded
    batches, never an attention over the wrong keys."""
    from rag_lookahead.runtime.packed_cache import RowStates

    keys = RowStates((torch.randn(1, 2, 4, 8), torch.randn(1, 2, 3, 8)))
    with pytest.raises(RuntimeError, match="packed rows"):
        grouped_sdpa_attention(_Module(), torch.randn(1, 6, 5, 8), keys, keys, None, scaling=0.3)  # type: ignore[arg-type]


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
@pytest.mark.parametrize(("chunk", "cached"), [(7, 0), (7, 4), (10, 3), (4, 9)])
@pytest.mark.parametrize("groups", [1, 3])
def test_a_long_chunk_attends_block_by_block_with_the_masked_result(
    chunk: int, cached: int, groups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a forward of a `CausalChunk(onednn=True)`, a chunk of at least `_BLOCKS_FROM` queries and
    columns attends block by block on oneDNN (here blocks of 3: a partial last one too):
    the masked SDPA result, no SDPA call."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    monkeypatch.setattr(attention, "_BLOCKS_FROM", (2, 2))
    monkeypatch.setattr(attention, "_BLOCK", 3)
    module = _Module()
    module.num_key_value_groups = groups
    torch.manual_seed(3)
    query = torch.randn(1, 2 * groups, chunk, 8)  # [1, H, T, D]
    room = torch.randn(1, 2, cached + chunk + 5, 8)  # [1, KV, capacity, D]: the cache's own buffer
    key, value = room[:, :, : cached + chunk], torch.randn(1, 2, cached + chunk, 8)
    mask = _chunk_mask(chunk, cached) if cached else None
    expected, _ = sdpa_attention_forward(
        module, query, key, value, mask if cached else None, scaling=0.3, is_causal=not cached
    )
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", None)  # not called
    layout = {LAYOUT: CausalChunk(onednn=True)}
    blocks, _ = grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3, **layout)
    torch.testing.assert_close(blocks, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
@pytest.mark.parametrize("linear", ["torch", "onednn"])
def test_a_prompt_after_a_cached_prefix_gives_the_whole_prompts_logits(
    family: str, linear: CpuLinear, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt forwarded after its first tokens' cache (the prefix cache's case) and whole,
    by the model called directly: the same logits at its last token, for every family (sliding
    windows attend masked), with the chunk's attention on oneDNN too (blocks of 5)."""
    if linear == "onednn" and not onednn_available():
        pytest.skip("needs oneDNN")
    monkeypatch.setattr(attention, "_BLOCKS_FROM", (2, 2))
    monkeypatch.setattr(attention, "_BLOCK", 5)
    taken: list[str] = []  # how each layer's chunk after the prefix was attended
    chunk, blocks = attention._causal_chunk, attention._causal_blocks

    def attended(*args: object) -> torch.Tensor | None:
        out = chunk(*args)  # type: ignore[arg-type]
        taken.append("as handed over" if out is None else "causal")
        return out

    monkeypatch.setattr(attention, "_causal_chunk", attended)
    monkeypatch.setattr(attention, "_causal_blocks", lambda *args: taken.append("blocks") or blocks(*args))
    model = tiny_model(family)
    runner = ModelTuning(model, linear).runner
    prompt = torch.tensor([[3 + (7 * i) % 50 for i in range(24)]])
    whole, _ = runner.forward(prompt, new_tree_cache(), last_only=True)
    _, cache = runner.forward(prompt[:, :6], new_tree_cache(), last_only=True)
    rest, _ = runner.forward(prompt[:, 6:], cache, last_only=True)
    direct = model(input_ids=prompt).logits[0, -1]
    torch.testing.assert_close(rest[-1], direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole[-1], direct, rtol=1e-5, atol=1e-5)
    # The whole prompt (no mask) goes on oneDNN's blocks or, on torch's kernel, as handed over
    # (causal already); the chunk after the prefix is never attended under its mask.
    assert ("blocks" in taken) == (linear == "onednn")
    assert "causal" in taken


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("groups", [1, 3])
def test_ragged_rows_attend_their_own_columns_with_the_padded_result(width: int, groups: int) -> None:
    """Row 1 uses 4 of 20 columns: in a forward of `RaggedRows` each row is attended over its own span
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
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
        layout = {LAYOUT: RaggedRows.of([20, 4])}
        ragged, _ = grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3, **layout)
    assert len(calls) == 2  # a call per row
    torch.testing.assert_close(ragged, padded, rtol=1e-6, atol=1e-6)


def test_rows_of_like_lengths_stay_one_call() -> None:
    # 2 x 20 columns read for 19 + 17 used: not worth a call per row.
    query, key = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 20, 8)
    assert RaggedRows.of([20, 17]) is None
    rows = RaggedRows.of([20, 4])
    assert rows == RaggedRows((20, 4))
    assert attention._split_rows(query, key, False, rows)
    assert not attention._split_rows(query, key, True, rows)  # softcapping, biases: as is
    assert not attention._split_rows(query[:1], key[:1], False, rows)  # not these rows


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
def test_a_batch_of_a_long_and_a_short_row_gives_each_rows_logits(family: str) -> None:
    """Through the runner (rows attended ragged: 3 + 4 of 40 + 4 columns) and through the model
    called directly (padded): the same logits."""
    model = tiny_model(family)
    prompts = ([3 + i % 40 for i in range(40)], [2, 7, 1])
    ragged, padded = (_batch_logits(model, prompts, through_runner) for through_runner in (True, False))
    torch.testing.assert_close(ragged, padded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt2"])
@pytest.mark.parametrize("direct", [True, False])
def test_a_batched_forwards_row_layout_reaches_every_layers_attention_as_an_argument(
    family: str, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner hands its `RaggedRows` to the model's forward (its own code, or the direct
    one) as a keyword, and every layer's attention receives it: no state around the forward."""
    seen: list[RaggedRows] = []
    split = attention._split_rows

    def watched(query: torch.Tensor, key: torch.Tensor, plain: bool, rows: RaggedRows) -> bool:
        seen.append(rows)
        return split(query, key, plain, rows)

    monkeypatch.setattr(attention, "_split_rows", watched)
    model = tiny_model(family)
    tuning = ModelTuning(model, direct=direct)
    _batch_logits(model, ([3 + i % 40 for i in range(40)], [2, 7, 1]), True, tuning)
    assert seen == [RaggedRows((44, 7))] * model.config.num_hidden_layers


def _batch_logits(
    model: torch.nn.Module,
    prompts: tuple[list[int], ...],
    through_runner: bool,
    tuning: ModelTuning | None = None,
) -> torch.Tensor:
    """A step of two trees over a batch of ``prompts``, through the runner (its attention) or
    the model called directly (transformers' SDPA, padded)."""
    runner = (tuning or ModelTuning(model)).runner
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
