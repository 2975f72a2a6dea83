"""Can this model verify a draft tree? Checked once, by running one, never assumed.

A model that ignores a custom 4-D mask (or, with sliding-window layers, one mask per layer
type), rejects explicit position ids, or builds a cache that cannot be rolled back would give
wrong tokens silently; the probe compares a small tree forward
with plain causal forwards of the same paths and reports the first problem it finds.
"""

from __future__ import annotations

from typing import Any

import torch

from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.runtime.kv_cache import new_tree_cache, supports_tree
from rag_lookahead.runtime.layer_masks import LayerMasks

__all__ = ["tree_support_problem"]


def tree_support_problem(model: Any, cache_arg: str, masks: LayerMasks) -> str | None:
    """``None`` when the model verifies trees exactly, else what is wrong. With sliding layers
    the prompt outgrows their window, so that the window's cut is checked too."""
    if masks.unsupported:
        return f"it has layers whose attention a tree mask cannot express ({', '.join(masks.unsupported)})"
    vocab = int(model.config.vocab_size)
    prompt = [(7 * i + 3) % vocab for i in range(6 + (masks.window or 0))]
    a, b, c = (prompt[-1] + 1) % vocab, (prompt[-1] + 2) % vocab, (prompt[-1] + 3) % vocab
    # Root, then a sibling the others must not see, then a two-token branch.
    tree = DraftTree((prompt[-1], a, b, c), (-1, 0, 0, 2))
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            cache = new_tree_cache()
            model(input_ids=torch.tensor([prompt[:-1]], device=device), use_cache=True, **{cache_arg: cache})
            if not supports_tree(cache):
                return f"its cache ({type(cache).__name__}) cannot be rolled back"
            inputs = tree.inputs(len(prompt) - 1, device, model.dtype)
            got = (
                model(
                    input_ids=inputs.input_ids,
                    position_ids=inputs.position_ids,
                    attention_mask=masks(inputs, [len(prompt) - 1]),
                    use_cache=True,
                    **{cache_arg: cache},
                )
                .logits[0]
                .float()
            )
            want = model(input_ids=torch.tensor([[*prompt, b, c]], device=device)).logits[0].float()
    except Exception as err:  # any failure means "no tree verification", never a crash
        return f"a tree forward failed: {type(err).__name__}: {err}"
    want = want[[-3, -2, -1]]  # root, b, c
    got = got[[0, 2, 3]]
    tolerance = 1e-3 if model.dtype == torch.float32 else 5e-2
    error = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    if error > tolerance:
        return f"a custom 4-D attention mask changed its logits (relative error {error:.2g})"
    return None
